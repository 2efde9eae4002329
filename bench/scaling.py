"""Step time of world size 2 against world size 1 at the same global batch, and what is communicated.

    python bench/scaling.py                      # embedded model, the demo's step (B=8, n=16, m=4)
    python bench/scaling.py --steps 4 --rounds 2 --engine transformers --parallel ddp

Each round trains the same config twice, alternating: once as one process (``podsrl train``, torch
on all cores) and once as ``torchrun --nproc-per-node=2`` (one core each), with evaluation off and
``train.max_steps`` steps; the first step of every run (start-up, allocator warm-up) is dropped. It
reports the median step time and its phases (generate / update / sync, and the time this rank spent
in podsrl's collectives), and the payload bytes this module sends per step and rank (the gradient
all-reduce of "ddp" is the trainable parameters: independent of n and of m).

On this project's 2-core CPU the two processes share the cores one process had, so this measures
the overhead of the distributed path (collectives, the reward gather, a second engine), not a
speed-up: the target is a ratio <= 1.2. On a machine with one GPU per process the same global
batch splits its sampling and its update over the GPUs.

The last line is ``step time world=2 / world=1 at equal global batch: <R>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(world: int, out: Path, args, threads: int) -> list[dict]:
    settings = [
        f"--train.max_steps={args.steps}", "--train.max_seconds=none", "--eval.at_start=false", "--eval.at_end=false",
        "--train.checkpoint_every=0", "--train.progress=false", f"--rollout.engine={args.engine}",
        f"--distributed.parallel={args.parallel}", f"--model.name={args.model}", f"--model.lora={str(args.lora).lower()}",
        "--rollout.kv_cache_gib=0.5", *args.overrides,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    launcher = [sys.executable, "-m", "podsrl"] if world == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", "-m", "podsrl"]
    cmd = [*launcher, "train", "--out", str(out), "--no-plot", *settings]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench/scaling.py: world={world} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows[1:]  # the first step carries the start-up


def summary(rows: list[dict]) -> dict[str, float]:
    med = lambda key: statistics.median(r[key] for r in rows) if rows and key in rows[0] else float("nan")  # noqa: E731
    out = {k: med(f"time/{k}") for k in ("step", "generate", "reward", "select", "update", "sync")}
    if rows and "rank_time/comm" in rows[0]:
        out["comm"] = statistics.median(max(r["rank_time/comm"]) for r in rows)
        out["comm_mb"] = statistics.median(max(r["comm_bytes"]) for r in rows) / 1e6
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--engine", default="auto", help="rollout engine of both runs (auto: vLLM when installed)")
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (default: full fine-tuning, as the demo)")
    p.add_argument("--steps", type=int, default=4, help="steps per run (the first is dropped)")
    p.add_argument("--rounds", type=int, default=2, help="alternating world=1 / world=2 rounds")
    p.add_argument("overrides", nargs="*", help="more --section.key=value settings for both runs")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    rows: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for world in (1, 2):
                got = run(world, Path(tmp) / f"w{world}-r{r}", args, threads=max(1, cores // world))
                rows[world] += got
                print(f"round {r + 1} world={world}: median step {summary(got)['step']:.2f} s", flush=True)
    s1, s2 = summary(rows[1]), summary(rows[2])
    print(f"\n{args.model}, {args.parallel}, {'LoRA' if args.lora else 'full fine-tuning'}, engine {args.engine}, {cores} cores, "
          f"medians over {len(rows[1])} / {len(rows[2])} steps")  # fmt: skip
    print(f"{'':>10} {'step':>7} {'generate':>9} {'update':>7} {'sync':>6} {'comm':>6} {'MB sent/rank':>13}")
    for world, s in ((1, s1), (2, s2)):
        print(
            f"world={world:<4} {s['step']:7.2f} {s['generate']:9.2f} {s['update']:7.2f} {s['sync']:6.2f} "
            f"{s.get('comm', 0.0):6.2f} {s.get('comm_mb', 0.0):13.1f}"
        )
    print(f"step time world=2 / world=1 at equal global batch: {s2['step'] / s1['step']:.2f}")


if __name__ == "__main__":
    main()
