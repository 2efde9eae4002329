"""Benchmark: what the stop checks of issue 68 cost a training step under torchrun.

    python bench/stop_check.py                 # 2 ranks on gloo (the CPU), a tiny random Llama, 4 steps
    python bench/stop_check.py --nproc 8       # one rank per GPU where there are GPUs (NCCL)

A stop check (podsrl.run.preemption) is one all-reduce (max) of one integer before each of podsrl's
collectives inside an abandonable region (sampling, scoring, the update up to its optimizer step,
evaluation), and one at the region's end. What is measured, on every rank of one ``torchrun`` job:

- the stop checks a step makes: ``podsrl train`` of a tiny random 2-layer Llama (hidden 32, the
  embedded SmolLM2 tokenizer) on one-digit additions, B = 4 prompts x n = 8, PODS m = 4, with
  ``Dist.stop_flag`` counted (the mean over the steps and ranks);
- the time of one stop check: the median of 500 timed calls of ``Dist.stop_flag(0)`` after 50 untimed
  ones, the ranks in step (what a check costs when no rank is late: the wait for a late rank is the
  collective's own, which the check only moves earlier);

and their product against the step's own time (``time/step``, median). The step's numbers depend on
the model and batch only through how many collectives the step makes, which they do not change
(one gather a sampling batch, a few in the update): the cost is a fixed number of microseconds per
step, and its share shrinks as steps grow.

Last line: ``stop checks: K a step, T us each (BACKEND, N ranks): C ms a step, S% of a median step of M s``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _tiny_model import tiny_llama  # bench/_tiny_model.py (this script's directory is on sys.path)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REWARD = "def length_reward(completion, example):\n    return len(completion) / 40.0\n"


def tiny_model(path: Path) -> Path:
    """A seeded random 2-layer Llama of hidden size 32 with the embedded model's tokenizer, saved to ``path``."""
    return tiny_llama(path, hidden=32, intermediate=64, heads=4, kv_heads=2, seed=1234)


def worker(out: Path, steps: int) -> None:
    """One rank: time stop checks alone, then count those of a short run (in the same process group:
    a second one in the same job can hang on the first one's keys, pytorch/pytorch#135712)."""
    from podsrl.config import load
    from podsrl.train import distributed, loop

    overrides = [f"model.name={out / 'model'}", f"reward.names={out / 'reward.py'}:length_reward", "rollout.engine=transformers",
                 "train.prompts_per_step=4", "rollout.n=8", "select.m=4", "rollout.max_new_tokens=16", f"train.max_steps={steps}",
                 "train.max_seconds=none", "train.checkpoint_every=0", "train.progress=false", "train.export_model=false",
                 "eval.at_start=false", "eval.at_end=false", "model.lora=false"]  # fmt: skip
    cfg = load(None, overrides)
    dist = distributed.init(cfg)
    for _ in range(50):
        dist.stop_flag(0)
    times = []
    for _ in range(500):
        start = time.perf_counter()
        dist.stop_flag(0)
        times.append(time.perf_counter() - start)
    counts: list[int] = []
    real_flag, real_step = distributed.Dist.stop_flag, loop.train_step

    def counted_flag(self, value: int) -> int:
        counts[-1] += 1
        return real_flag(self, value)

    def counted_step(*args, **kwargs):
        counts.append(0)
        return real_step(*args, **kwargs)

    distributed.Dist.stop_flag, loop.train_step = counted_flag, counted_step
    run = loop.train(cfg, run_dir=out / "run", log=lambda *_: None)  # reuses the process group, and leaves it
    record = {"backend": dist.backend, "counts": counts, "check_s": statistics.median(times)}
    if dist.is_main:
        record["step_s"] = [json.loads(line)["time/step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    (out / f"rank{dist.rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        tiny_model(out / "model")
        (out / "reward.py").write_text(REWARD)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}", __file__,
               f"--steps={args.steps}", "--worker", str(out)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.nproc)]
    report = {"backend": ranks[0]["backend"], "world": args.nproc, "ranks": ranks, "step_s": ranks[0]["step_s"]}
    per_step = [c for rank in report["ranks"] for c in rank["counts"]]
    checks = statistics.mean(per_step)
    check_us = 1e6 * statistics.median(rank["check_s"] for rank in report["ranks"])
    step_s = statistics.median(report["step_s"])
    print(f"stop checks per step, per rank and step: {[rank['counts'] for rank in report['ranks']]}")
    each = ", ".join(f"{1e6 * rank['check_s']:.0f} us" for rank in report["ranks"])
    print(f"one stop check, median per rank: {each}")
    print(f"time/step of the run: {[f'{s:.2f}' for s in report['step_s']]} s")
    cost_ms = checks * check_us / 1e3
    print(f"stop checks: {checks:.0f} a step, {check_us:.0f} us each ({report['backend']}, {report['world']} ranks): {cost_ms:.2f} ms a step, "
          f"{100 * cost_ms / 1e3 / step_s:.2f}% of a median step of {step_s:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
