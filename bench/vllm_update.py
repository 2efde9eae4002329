"""Benchmark: podsrl's update with the vLLM engine in the process against the update without it.

    python bench/vllm_update.py                  # 32 rows of 64 tokens, one micro-batch, LoRA r=16 (bench/vs_trl.py's step)
    python bench/vllm_update.py --quick          # 2 pairs, 3 updates each: checks it runs
    python bench/vllm_update.py --pairs 6 --lora-rank 0   # full fine-tuning

What is measured: ``run_update`` (forward, loss, backward, clip, AdamW step) on one fixed batch of
kept rollouts, the same in every worker: --rows completions of --tokens random tokens behind the
built-in arithmetic prompts, all with a nonzero advantage (nothing skipped), on the embedded
SmolLM2-135M-Instruct in float32 with LoRA (--lora-rank; 0: full fine-tuning). Each worker is a
fresh process that builds podsrl's set-up with one rollout engine and then, --updates times, does
what a training step does around the update: the engine samples B x n rollouts (8 prompts x 16,
--max-new-tokens), the update runs (timed), the new weights go to the engine. The arms:

- ``transformers``: the transformers engine (no vLLM in the process);
- ``vllm``: podsrl's vLLM engine as ``podsrl train`` builds it.

Workers run one at a time, arm after arm, for --pairs rounds (the order alternating), so a change
in the machine's load hits every arm. Each worker's figure is its median time per completion token
over its updates after the first (the first after the engine starts is reported apart); the
headline is the median over rounds of the per-round ratio to the ``transformers`` worker of the
same round. The batch is fixed, so both arms pad alike: per-token times taken from a training run's
metrics (``time/update`` / ``tokens_run``) also move with the engine's completion lengths, since a
micro-batch runs padded to its longest row. Involuntary context switches of the process during the
timed updates are reported too (vLLM's in-process engine keeps 13 gloo process groups of one rank
whose network threads wake every 10 ms: about 8x the switches, which cost little here).

Last line: ``update time per token, vLLM in the process / without: R; median of K rounds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _isolated import run_isolated  # noqa: E402  (bench/_isolated.py)

ARMS = ("transformers", "vllm")


def worker(spec: dict) -> dict:
    import dataclasses
    import resource

    import torch

    from podsrl import config as config_mod
    from podsrl.engines import Sampling
    from podsrl.train.loop import setup
    from podsrl.train.update import UpdateBatch, UpdateSettings, run_update

    arm = spec["arm"]
    overrides = [
        f"--rollout.engine={arm}",
        f"--model.lora={'true' if spec['lora_rank'] else 'false'}",
        f"--model.lora_rank={spec['lora_rank'] or 16}",
        f"--model.lora_alpha={spec['lora_rank'] or 16}",
        f"--optim.micro_batch_size={spec['micro_batch_size']}",
        f"--rollout.max_new_tokens={spec['max_new_tokens']}",
    ]
    cfg = config_mod.load(None, overrides)
    run = setup(cfg)
    model = run.policy.model
    model.train()
    g = torch.Generator().manual_seed(0)
    rows = spec["rows"]
    completions = [torch.randint(0, model.config.vocab_size, (spec["tokens"],), generator=g).tolist() for _ in range(rows)]
    advantages = torch.randn(rows, generator=g)
    batch = UpdateBatch([run.train_prompts[i // 4] for i in range(rows)], completions, advantages)
    tokens = rows * spec["tokens"]
    settings = UpdateSettings.from_config(cfg, pad_id=run.policy.tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    prompts = run.train_prompts[:8]
    per_token, switches = [], []
    for i in range(spec["updates"]):
        run.engine.generate(prompts, Sampling(n=16, temperature=1.0, top_p=1.0, max_new_tokens=spec["max_new_tokens"], seed=i))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        start = time.perf_counter()
        run_update(model, optimizer, scheduler, batch, settings)
        seconds = time.perf_counter() - start
        switches.append(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - before)
        per_token.append(1000 * seconds / tokens)
        run.engine.sync_weights(model)
    run.close()
    return {
        "first_ms_per_token": per_token[0],
        "ms_per_token": statistics.median(per_token[1:]),
        "involuntary_switches_per_s": statistics.median(n / (t * tokens / 1000) for n, t in zip(switches[1:], per_token[1:])),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {ARMS}; the first is the baseline")
    parser.add_argument("--pairs", type=int, default=4, help="rounds (every arm once per round)")
    parser.add_argument("--updates", type=int, default=5, help="updates per worker (the first is reported apart)")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens of every row")
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--lora-rank", type=int, default=16, help="0: full fine-tuning")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="of the engine's sampling between updates")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 3 updates of 8 rows of 16 tokens")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker:
        Path(args.result).write_text(json.dumps(worker(json.loads(rest[0]))))
        return
    if args.quick:
        args.pairs, args.updates, args.rows, args.tokens, args.max_new_tokens = 2, 3, 8, 16, 16
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown {unknown}; choose from {ARMS}")
    spec = {k: getattr(args, k) for k in ("updates", "rows", "tokens", "micro_batch_size", "lora_rank", "max_new_tokens")}
    print(f"{args.rows} rows x {args.tokens} tokens, micro-batch {args.micro_batch_size}, "
          f"{'LoRA r=' + str(args.lora_rank) if args.lora_rank else 'full fine-tuning'}, {args.updates} updates per worker, {args.pairs} rounds")  # fmt: skip
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="vllm-update-") as logs:
        for r in range(args.pairs):
            for arm in arms if r % 2 == 0 else arms[:1] + arms[1:][::-1]:
                out = run_isolated(__file__, ["--worker"], {**spec, "arm": arm}, log=Path(logs) / f"{arm}-{r}.log", prefix="vllm-update-")
                if "error" in out:
                    sys.exit(f"worker {arm} (round {r + 1}) failed: {out['error']}")
                results[arm].append(out)
                print(f"round {r + 1} {arm:>12}: {out['ms_per_token']:6.2f} ms/token (first update {out['first_ms_per_token']:6.2f}), "
                      f"{out['involuntary_switches_per_s']:7.0f} involuntary switches/s", flush=True)  # fmt: skip
    base = arms[0]
    ratios = {arm: statistics.median(a["ms_per_token"] / b["ms_per_token"] for a, b in zip(results[arm], results[base])) for arm in arms[1:]}
    for arm in arms:
        print(f"{arm:>12}: median {statistics.median(x['ms_per_token'] for x in results[arm]):6.2f} ms/token"
              + (f", {ratios[arm]:.3f}x {base}" if arm in ratios else ""))  # fmt: skip
    if "vllm" in ratios:
        print(f"update time per token, vLLM in the process / without: {ratios['vllm']:.3f}; median of {args.pairs} rounds")


if __name__ == "__main__":
    main()
