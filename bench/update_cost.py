"""Benchmark: the policy update's time and peak memory scale with m (rollouts kept), not n (sampled).

    python bench/update_cost.py                 # the embedded SmolLM2-135M, B=2, prompt 40 + completion 64
    python bench/update_cost.py --quick         # a tiny random Llama: checks the machinery in about a minute
    python bench/update_cost.py --model PATH --prompts 4 --repeats 5 --micro-batch-size 16
    python bench/update_cost.py --model PATH --device cuda --prompts 16 --repeats 5

What is measured, per configuration (GRPO n=16 keeping all 16; PODS max-variance n=64 keeping
m=16; and a sweep m in {4, 8, 16, 32} at n=64), with B prompts per step:

- **select**: the trainer's selection + advantage calls on rewards [B, n] (binary, p = 0.5):
  ``get_rule(rule)(rewards, m)`` and ``group_advantages(rewards, keep)``. This is the only part
  that sees all n rollouts (median of 200 calls).
- **update**: podsrl's own ``run_update`` (forward, loss, backward, clip, AdamW step) on the B*m
  kept rollouts, built as the trainer builds them (each kept rollout carries its prompt). Prompts
  are B random 40-token sequences, completions random tokens of 64 (every rollout the full
  length, as when all are truncated: the same shapes in every configuration, so differences are
  the sequence count alone). Median of ``--repeats`` timed updates after one small warm-up update.
- **peak memory**: on the CPU, the growth of the process's peak resident set size (``getrusage``
  ru_maxrss) over the timed updates, relative to its value after the warm-up update (weights,
  gradients and AdamW state are then allocated, so the growth is the update's activations and
  logits). Each configuration runs in a fresh subprocess, because the peak RSS of a process never
  goes down. tracemalloc does not see torch's allocations, hence RSS. It is a coarse measure
  (allocator caching rounds it up), but the same for every configuration. On a GPU
  (``--device``, default ``auto``: the GPU when torch sees one), the growth of torch's peak
  allocated GPU memory over the same stretch, and the timings synchronise the GPU.

The whole update is one micro-batch by default (``--micro-batch-size 0``), so activation memory
shows the B*m scaling; with gradient accumulation (podsrl's ``optim.micro_batch_size``, default
16) peak memory is capped by the micro-batch and only time keeps scaling with m.

PODS's update only ever sees the kept rollouts, so its cost equals GRPO's with n = m by
construction; the point of measuring is to check that nothing else (selection over all n, the
kept-rollout gathering) adds to it. Headline, the last line printed:
``update time PODS(n=64,m=16)/GRPO(n=16): R``, R = (select + update) of PODS over GRPO's (target
<= 1.1). Because the per-row processes run one after another, a change in the machine's load
between them shows up as a difference; so the headline pair is measured once more in one
process, alternating one GRPO and one PODS update per round, and R is the median of the
per-round ratios. Generation, which does scale with n, is not part of this benchmark.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT_LEN = 40
COMPLETION_LEN = 64


def configurations() -> list[tuple[str, str, int, int]]:
    """(label, rule, n, m): GRPO, PODS, then the m sweep at n=64 (m=16 is PODS itself)."""
    return [
        ("GRPO", "all", 16, 16),
        ("PODS", "max_variance", 64, 16),
        *[(f"PODS m={m}", "max_variance", 64, m) for m in (4, 8, 32)],
    ]


# ---------------------------------------------------------------------------------------------
# Worker: one configuration in a fresh process


def _load_model(name: str, seed: int, device: str):
    """(model, pad id, vocab size), on ``device`` (podsrl's ``model.device``). ``tiny``: a random
    2-layer Llama, hidden 64, vocab 8192."""
    import torch

    from podsrl.models import resolve_device

    torch.manual_seed(seed)
    if name == "tiny":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
        return LlamaForCausalLM(config).to(resolve_device(device)), 0, config.vocab_size
    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    policy = load_policy(ModelConfig(name=name, device=device))
    return policy.model, policy.tokenizer.pad_token_id, len(policy.tokenizer)


class _PeakMemory:
    """Peak memory growth over a stretch of updates, in MiB: the process's peak resident set size
    on the CPU (ru_maxrss never goes down, hence one configuration per process), torch's peak
    allocated GPU memory on a GPU."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"

    def start(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            self.base = self.torch.cuda.memory_allocated()
        else:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    def growth_mib(self) -> float:
        if self.cuda:
            return (self.torch.cuda.max_memory_allocated() - self.base) / 2**20
        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base) / 2**20


def worker(spec: dict) -> dict:
    """Time (and, for a single configuration, peak memory of) select + update for each of
    ``spec["configs"]`` [(rule, n, m), ...]; several configurations are timed alternately, one
    update of each per round, so that a change in the machine's load hits them alike."""
    import torch

    from podsrl.core.advantages import group_advantages
    from podsrl.core.selection import get_rule
    from podsrl.core.loss import LossSettings
    from podsrl.train.update import UpdateBatch, UpdateSettings, run_update

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    B = spec["prompts"]
    model, pad_id, vocab = _load_model(spec["model"], spec["seed"], spec["device"])
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    gen = torch.Generator().manual_seed(spec["seed"])
    prompts = [torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist() for _ in range(B)]

    def update(b: UpdateBatch, micro_batch_size: int):
        loss = LossSettings(eps_low=0.2, aggregation="sequence", max_completion_len=COMPLETION_LEN)
        settings = UpdateSettings(loss=loss, pad_id=pad_id, micro_batch_size=micro_batch_size, temperature=1.0, grad_clip=1.0)
        return run_update(model, optimizer, scheduler, b, settings)

    jobs = []
    for rule_name, n, m in spec["configs"]:
        completions = [torch.randint(0, vocab, (COMPLETION_LEN,), generator=gen).tolist() for _ in range(B * n)]
        rewards = torch.bernoulli(torch.full((B, n), 0.5), generator=gen)  # [B, n]
        rule = get_rule(rule_name)

        def select(rule=rule, rewards=rewards, m=m):
            keep = rule(rewards, m, generator=gen)  # [B, n] bool
            return keep, group_advantages(rewards, keep)  # adv [B, n], 0 off the kept set

        select_times = []
        for _ in range(200):
            start = time.perf_counter()
            keep, adv = select()
            select_times.append(time.perf_counter() - start)
        kept = keep.flatten().nonzero().flatten().tolist()
        batch = UpdateBatch(
            prompt_ids=[prompts[i // n] for i in kept],  # the trainer's gathering of the kept rollouts
            completion_ids=[completions[i] for i in kept],
            advantages=adv.flatten()[kept],
        )
        jobs.append(dict(batch=batch, mbs=spec["micro_batch_size"] or len(kept), select_s=statistics.median(select_times), times=[]))

    # Warm-up on two rollouts: allocates gradients and AdamW state, warms kernels and the allocator.
    b = jobs[0]["batch"]
    update(UpdateBatch(b.prompt_ids[:2], b.completion_ids[:2], b.advantages[:2]), 2)
    memory = _PeakMemory(device)
    memory.start()
    for _ in range(spec["repeats"]):
        for job in jobs:
            sync()
            start = time.perf_counter()
            stats = update(job["batch"], job["mbs"])
            sync()
            job["times"].append(time.perf_counter() - start)
            job["sequences"], job["tokens"] = stats.sequences, stats.tokens_total
    peak_mib = memory.growth_mib()
    return {
        "threads": torch.get_num_threads(),
        "device": str(device),
        "results": [
            {
                "sequences": j["sequences"],
                "tokens": j["tokens"],
                "select_s": j["select_s"],
                "update_s": statistics.median(j["times"]),
                "update_all_s": j["times"],
                "peak_delta_mib": peak_mib if len(jobs) == 1 else None,  # one configuration per process
            }
            for j in jobs
        ],
    }


# ---------------------------------------------------------------------------------------------
# Driver


def run_worker(args, configs: list[tuple[str, int, int]]) -> dict:
    spec = dict(model=args.model, prompts=args.prompts, configs=configs, repeats=args.repeats,
                micro_batch_size=args.micro_batch_size, threads=args.threads, seed=args.seed, device=args.device)  # fmt: skip
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"update_cost: the worker for {configs} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="podsrl model name/path, or 'tiny' (random)")
    parser.add_argument("--prompts", type=int, default=2, help="B, prompts per step")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per configuration (median)")
    parser.add_argument("--micro-batch-size", type=int, default=0, help="0: the whole update in one micro-batch")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="podsrl's model.device: auto (the GPU if torch sees one), cpu, cuda, cuda:N")
    parser.add_argument("--quick", action="store_true", help="the tiny random model: checks the machinery only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.quick:
        args.model = "tiny"

    print(f"model {args.model}, B={args.prompts} prompts, prompt {PROMPT_LEN} + completion {COMPLETION_LEN} tokens, "
          f"micro-batch {args.micro_batch_size or 'whole update'}, median of {args.repeats} updates, one fresh process per row")  # fmt: skip
    header = f"{'config':<12} {'rule':<13} {'n':>3} {'m':>3} {'seqs':>5} {'select ms':>10} {'update s':>9} {'s/seq':>7} {'total s':>8} {'peak +MiB':>10}"
    rows = {}
    for label, rule, n, m in configurations():
        out = run_worker(args, [(rule, n, m)])
        if not rows:
            memory = "torch's peak allocated GPU memory" if out["device"].startswith("cuda") else "the process's peak RSS"
            print(f"device {out['device']} ({out['threads']} CPU threads); peak +MiB: growth of {memory} over the timed updates")
            print(header)
            print("-" * len(header))
        r = {"label": label, "rule": rule, "n": n, "m": m, **out["results"][0]}
        rows[label] = r
        total = r["select_s"] + r["update_s"]
        print(f"{label:<12} {rule:<13} {n:>3} {m:>3} {r['sequences']:>5} {1e3 * r['select_s']:>10.3f} {r['update_s']:>9.3f} "
              f"{r['update_s'] / r['sequences']:>7.3f} {total:>8.3f} {r['peak_delta_mib']:>10.0f}", flush=True)  # fmt: skip
    sweep = [rows["PODS m=4"], rows["PODS m=8"], rows["PODS"], rows["PODS m=32"]]
    print("\nm sweep at n=64 (relative to m=4):  " + "  ".join(
        f"m={r['m']}: time x{r['update_s'] / sweep[0]['update_s']:.2f}, mem x{r['peak_delta_mib'] / max(sweep[0]['peak_delta_mib'], 1e-9):.2f}"
        for r in sweep))  # fmt: skip
    # The headline pair again, in one process, alternating GRPO and PODS updates round by round:
    # the separate rows above can differ by whatever else the machine was doing at the time.
    grpo, pods = run_worker(args, [("all", 16, 16), ("max_variance", 64, 16)])["results"]
    per_round = [
        (pods["select_s"] + tp) / (grpo["select_s"] + tg) for tg, tp in zip(grpo["update_all_s"], pods["update_all_s"])
    ]
    print(f"\nalternating in one process: GRPO {grpo['select_s'] + grpo['update_s']:.3f} s, "
          f"PODS {pods['select_s'] + pods['update_s']:.3f} s (select {1e3 * pods['select_s']:.2f} ms); "
          f"per-round ratios {', '.join(f'{r:.2f}' for r in per_round)}")  # fmt: skip
    ratio = statistics.median(per_round)
    print(f"update time PODS(n=64,m=16)/GRPO(n=16): {ratio:.2f}")


if __name__ == "__main__":
    main()
