"""Benchmark: sampling with exact early stopping against sampling all n rollouts, on the trainer's path.

    python bench/early_stop.py                          # the embedded SmolLM2-135M (the base model)
    python bench/early_stop.py --model runs/X/model     # a trained policy (a run's exported model)
    python bench/early_stop.py --quick                  # the tiny path check: 2 steps of 4 prompts

What is measured: the trainer's own sampling (``podsrl.train.sampling.sample_step``: generate, then score,
per round) for PODS max-variance with n = 16 rollouts per prompt and m = 4 kept, on the two-digit
task of configs/compare-2digit.toml (B = 8 training prompts a step, the step's own prompts and
seeds), with ``rollout.early_stop`` "off" (n per prompt in one call) and "exact" (rounds of
``--round-size`` rollouts per prompt, 4 by default; a group stops once it holds 2 correct and 2
wrong completions, podsrl/core/early_stop.py). The two alternate step by step, the order
alternating too, so a change in the machine's load hits both; the engine is the trainer's
(``rollout.engine``, vLLM when installed). Reported per setting: rollouts
generated and seconds of generation (the ``generate`` phase; scoring is a few ms) summed over
``--steps`` steps, and the mean accuracy of the sampled rollouts (the base model's is low, so most
groups have fewer than 2 correct and sample all 16).

Last line: ``sampling early-stop/fixed-n (max-variance n=16 m=4): rollouts R, time T (MODEL, rounds of S, STEPS steps)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or directory (a run's model/)")
    parser.add_argument("--steps", type=int, default=10, help="training steps' prompt sets to sample (each: both settings)")
    parser.add_argument("--engine", default="auto", help="rollout.engine: auto | vllm | transformers")
    parser.add_argument("--quick", action="store_true", help="2 steps of 4 prompts, 8 new tokens")
    parser.add_argument("--round-size", type=int, default=4, help="rollout.round_size: rollouts per prompt per round (the fair comparison: 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import tomllib

    from podsrl.config import from_dict
    from podsrl.run import checkpoint as ckpt
    from podsrl.train import loop as trainer
    from podsrl.train.sampling import sample_step

    overrides = {
        "model.name": args.model, "rollout.engine": args.engine, "rollout.n": 16, "select.rule": "max_variance",
        "select.m": 4, "rollout.early_stop": "exact", "rollout.round_size": args.round_size, "train.seed": args.seed, "train.progress": False,
    }  # fmt: skip
    if args.quick:
        overrides |= {"train.prompts_per_step": 4, "rollout.max_new_tokens": 8}
        args.steps = 2
    data = tomllib.loads((ROOT / "configs/compare-2digit.toml").read_text())
    del data["compare"]  # podsrl compare's own section; the rest is the runs' config
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = value
    exact = from_dict(data)
    fixed = dataclasses.replace(exact, rollout=dataclasses.replace(exact.rollout, early_stop="off"))
    run = trainer.setup(exact)
    try:
        totals = {name: dict(rollouts=0, seconds=0.0, correct=0.0) for name in ("fixed", "exact")}
        for step in range(args.steps):
            state = ckpt.TrainState(step=step)
            for name in (("fixed", "exact") if step % 2 == 0 else ("exact", "fixed")):
                run.cfg = fixed if name == "fixed" else exact
                timer = trainer._Timer()
                sample = sample_step(run, step, trainer.progress(run.cfg, state), timer)
                rewards = sample.groups.reward  # [B, n], NaN: not sampled
                sampled = ~rewards.isnan()
                t = totals[name]
                t["rollouts"] += int(sampled.sum())
                t["seconds"] += timer.seconds["generate"]
                t["correct"] += float(rewards[sampled].sum())
                print(f"step {step}: {name:>5} {int(sampled.sum()):4d} rollouts in {timer.seconds['generate']:6.2f} s "
                      f"({sample.rounds} round(s)), accuracy {float(rewards[sampled].mean()):.2f}", flush=True)  # fmt: skip
    finally:
        run.close()
    for name, t in totals.items():
        print(f"{name:>6}: {t['rollouts']} rollouts, {t['seconds']:.1f} s of generation, accuracy {t['correct'] / max(t['rollouts'], 1):.3f}")
    r = totals["exact"]["rollouts"] / totals["fixed"]["rollouts"]
    sec = totals["exact"]["seconds"] / totals["fixed"]["seconds"]
    print(f"sampling early-stop/fixed-n (max-variance n=16 m=4): rollouts {r:.2f}, time {sec:.2f} "
          f"({args.model}, rounds of {args.round_size}, {args.steps} steps)")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
