"""Benchmark: the update at short answers, its rows cut into micro-batches by rows or by tokens (issue 66).

    python bench/micro_batches.py                        # this CPU: SmolLM2-135M's architecture, random weights
    python bench/micro_batches.py --device cuda          # a GPU (bench/gpu_compare.py call 2)
    python bench/micro_batches.py --quick                # a tiny random model: checks the script runs

Why: a micro-batch costs about a fixed number of operator calls whatever its rows (on this project's
CPU about 40,000 for a 30-layer model with shared prompts, 22,000 without: podsrl/train/update.py).
On a lent H200 the 135M model's update took about 0.24 s a micro-batch of up to 16 rows of 40 + 15
tokens whatever the rows (results/compare-gpu, 2026-11-30): there the update is the calls, not the
arithmetic, and GRPO(16), which trains 4x PODS(16, 4)'s rows, pays it 4x.

What: podsrl's ``run_update`` (forward, loss, backward, clip, AdamW) on one GRPO(16) step of the GPU
comparison's shape: ``--prompts`` (8) random prompts of 40 tokens x 16 rollouts of 10 to 20 random
tokens, every advantage +-1 (every row runs), mixed precision as ``model.mixed_precision = "auto"``
chooses on the device. The ways, on the same model, optimizer and batch:

- ``rows-16``: ``optim.micro_batch_size = 16`` (the default), shared prompts;
- ``rows-16-unshared``: the same with ``optim.share_prompts = false`` (fewer calls, more arithmetic);
- ``tokens-8192``: ``optim.micro_batch_tokens = 8192`` (16 rows x 512 tokens: the padded size of a
  default micro-batch at 512-token answers), shared prompts: here the whole step in one micro-batch.

A warm-up update of each, then ``--repeats`` rounds (default 5), the ways' order rotating; medians.
The GPU is synchronised around each update. Last line: ``update time tokens-8192 / rows-16: R,
rows-16-unshared / rows-16: R2 (DEVICE)`` (below 1: faster). ``--out FILE`` writes the figures as JSON
(results/micro-batches/); ``--table FILE`` prints a saved one's table (docs/results.md; tests/
test_peak.py checks the page against every committed run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # podsrl from this working tree; gpu_check's architecture

WAYS = {"rows-16": dict(micro_batch_size=16), "rows-16-unshared": dict(micro_batch_size=16, share_prompts=False),
        "tokens-8192": dict(micro_batch_size=16, micro_batch_tokens=8192)}  # fmt: skip
PROMPT_LEN, GROUP = 40, 16


def step_batch(prompts: int, vocab: int, seed: int = 0):
    """A GRPO(16) step's kept rows: ``prompts`` x 16 rollouts of 10-20 tokens, advantages +-1."""
    import torch

    from podsrl.train.update import UpdateBatch

    g = torch.Generator().manual_seed(seed)
    ps = [torch.randint(3, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range(prompts)]
    rows = prompts * GROUP
    completions = [torch.randint(3, vocab, (int(torch.randint(10, 21, (1,), generator=g)),), generator=g).tolist() for _ in range(rows)]
    return UpdateBatch(prompt_ids=[ps[i // GROUP] for i in range(rows)], completion_ids=completions,
                       advantages=torch.tensor([1.0 if i % 2 else -1.0 for i in range(rows)]))  # fmt: skip


def measure(model, batch, *, mixed: bool, repeats: int) -> dict[str, list[float]]:
    """Each way's seconds an update, ``repeats`` rounds after a warm-up of each, the order rotating."""
    import torch

    from peak import _sync
    from podsrl.core.loss import LossSettings
    from podsrl.train.update import UpdateSettings, run_update

    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    loss = LossSettings(eps_low=0.2, aggregation="token", max_completion_len=20)
    settings = {way: UpdateSettings(loss=loss, pad_id=0, grad_clip=1.0, mixed_precision=mixed, **options) for way, options in WAYS.items()}
    for way in WAYS:
        run_update(model, optimizer, scheduler, batch, settings[way])
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    ways = list(WAYS)
    for r in range(repeats):
        for way in ways[r % len(ways):] + ways[: r % len(ways)]:
            _sync(device)
            start = time.perf_counter()
            run_update(model, optimizer, scheduler, batch, settings[way])
            _sync(device)
            times[way].append(time.perf_counter() - start)
    return times


def table(data: dict) -> str:
    """A saved run's table: each way's median seconds an update and its ratio to ``rows-16``."""
    median = data["median"]
    lines = [f"{data['device']}, torch {data['torch']}, mixed precision {'on' if data['mixed_precision'] else 'off'}, "
             f"{data['rows']} rows; {data['date'][:10]}; `{data['command']}`", "",
             "| micro-batches | median s an update | vs rows-16 |", "|---|---:|---:|"]  # fmt: skip
    lines += [f"| {way} | {median[way]:.3g} | {median[way] / median['rows-16']:.2f}x |" for way in WAYS if way in median]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="podsrl's model.device (cpu, cuda, auto)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts of the step (x 16 rollouts)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="a tiny random model, 2 prompts, 1 round")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    parser.add_argument("--table", type=Path, default=None, help="measure nothing: print docs/results.md's table of this JSON file")
    args = parser.parse_args(argv)
    if args.table:
        data = json.loads(args.table.read_text())
        print(table(data))
        return data
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gpu_check import SMOLLM2_135M
    from podsrl.models import resolve_device
    from podsrl.train.precision import resolve_mixed_precision

    if args.threads:
        torch.set_num_threads(args.threads)
    arch = dict(SMOLLM2_135M, vocab_size=512, num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2) if args.quick else SMOLLM2_135M  # fmt: skip
    prompts, repeats = (2, 1) if args.quick else (args.prompts, args.repeats)
    torch.manual_seed(0)
    device = resolve_device(args.device)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**arch))
    model.train()
    mixed = resolve_mixed_precision("auto", device)
    from podsrl.engines.dtype import cpu_model

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {cpu_model()}"
    print(f"micro_batches: {'tiny' if args.quick else 'SmolLM2-135M'} architecture, random weights, on {device} ({where}; "
          f"{torch.get_num_threads()} threads), mixed precision {'on' if mixed.enabled else 'off'} ({mixed.reason}); "
          f"{prompts} prompts x {GROUP} rows of {PROMPT_LEN} + 10-20 tokens", flush=True)  # fmt: skip
    times = measure(model, step_batch(prompts, arch["vocab_size"]), mixed=mixed.enabled, repeats=repeats)
    median = {way: statistics.median(t) for way, t in times.items()}
    for way, t in times.items():
        print(f"  {way:<17} median {median[way]:.3f} s an update (rounds {', '.join(f'{x:.3f}' for x in t)})", flush=True)
    data = {"benchmark": "micro_batches", "command": "python bench/micro_batches.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "device": where, "torch": torch.__version__,
            "mixed_precision": mixed.enabled, "prompts": prompts, "rows": prompts * GROUP, "seconds": times, "median": median}  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"update time tokens-8192 / rows-16: {median['tokens-8192'] / median['rows-16']:.2f}, "
          f"rows-16-unshared / rows-16: {median['rows-16-unshared'] / median['rows-16']:.2f} ({device.type})")  # fmt: skip
    return data


if __name__ == "__main__":
    main()
