"""No timing of its own: how a time budget (``train.max_seconds``) ends on the committed runs, with
and without the prediction of the next step (issue 68).

    python bench/budget_stop.py                      # every results/*/runs/**/metrics.jsonl
    python bench/budget_stop.py --runs results/compare-long

Each run whose ``config.toml`` sets ``train.max_seconds`` and whose last ``train_seconds`` reached it
(a run that ended on ``train.max_steps`` or was stopped is left out) is replayed from its steps'
lengths (the differences of ``train_seconds``, the training clock, which ``time/step`` undercounts by
the step's bookkeeping): from the start, a step is taken unless the rule says the next one would not
fit, and a step that ends at or past the budget ends the run. Each rule is a prediction of the next
step's length from the steps before it (none before the first: it always runs):

- "none": podsrl before issue 68 (the run ends at the first step that ends at or past the budget,
  which overruns it by up to a step);
- the rule podsrl uses (``TrainState.done``, ``podsrl.run.checkpoint.STEP_MARGIN`` x the longest of
  the last ``RECENT_STEPS``), run through TrainState itself, and a few alternatives beside it;
- "oracle": knows the next step's length (the least any rule can leave unused without overrunning).

A run's replay is exact only up to its last recorded step, which is enough: a rule stops no later
than the run did. Per rule: how many runs overran the budget and by how much at most, and the budget
left unused by those that did not (mean and worst, in % of the budget and in the run's median steps).

Last line: ``budget stop, RULE: overruns K/N (none: K0/N, up to S s); unused mean U% of the budget
(oracle: U0%)``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from podsrl.run.checkpoint import RECENT_STEPS, STEP_MARGIN, TrainState  # noqa: E402

Rule = Callable[[list[float], float, float], bool]  # (steps so far, training clock, budget) -> take another step


def runs(root: Path) -> list[tuple[str, float, list[float]]]:
    """(directory, budget, step lengths) of each run under ``root`` that a time budget ended."""
    out = []
    for metrics in sorted({*root.glob("**/runs/**/metrics.jsonl"), *root.glob("runs/**/metrics.jsonl")}):
        config = metrics.parent / "config.toml"
        if not config.is_file():
            continue
        budget = tomllib.loads(config.read_text()).get("train", {}).get("max_seconds")
        if not isinstance(budget, (int, float)):
            continue
        rows: dict[int, dict] = {}
        for line in metrics.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = row  # a step logged again after a resume: its last row
        clock = [rows[k]["train_seconds"] for k in sorted(rows)]
        if not clock or clock[-1] < budget:
            continue
        out.append((str(metrics.parent), float(budget), [clock[0]] + [b - a for a, b in zip(clock, clock[1:])]))
    return out


def by_prediction(predict: Callable[[list[float]], float]) -> Rule:
    return lambda steps, clock, budget: not steps or clock + predict(steps) <= budget


def podsrl_rule(steps: list[float], clock: float, budget: float) -> bool:
    """podsrl's own rule, through TrainState (rebuilt from the steps, as a checkpoint would hold it)."""
    state = TrainState(step=len(steps))
    for seconds in steps:
        state.record_step(seconds)
    return not state.done(_Budget(budget))


class _Budget:
    """The part of a Config that TrainState.done reads."""

    def __init__(self, seconds: float):
        self.train = type("Train", (), {"max_steps": None, "max_seconds": seconds})()


def replay(budget: float, steps: list[float], rule: Rule) -> float:
    """The training clock at which the run ends under ``rule``."""
    clock, taken = 0.0, []
    for seconds in steps:
        if not rule(taken, clock, budget):
            return clock
        clock += seconds
        taken.append(seconds)
        if clock >= budget:
            return clock
    return clock


def oracle(budget: float, steps: list[float]) -> float:
    clock = 0.0
    for seconds in steps:
        if clock + seconds > budget:
            break
        clock += seconds
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    args = parser.parse_args()
    found = runs(args.runs)
    if not found:
        sys.exit(f"no run under {args.runs} ended on its train.max_seconds")
    mean_sd = lambda s, k, c: statistics.mean(s[-k:]) + c * statistics.pstdev(s[-k:])  # noqa: E731
    rules: dict[str, Rule] = {
        "none": lambda steps, clock, budget: True,
        "last step": by_prediction(lambda s: s[-1]),
        "max of last 3": by_prediction(lambda s: max(s[-3:])),
        "max of last 5": by_prediction(lambda s: max(s[-5:])),
        "max of last 10": by_prediction(lambda s: max(s[-10:])),
        "mean + 3 sd of last 10": by_prediction(lambda s: mean_sd(s, 10, 3)),
        "1.5 x max of last 5": by_prediction(lambda s: 1.5 * max(s[-5:])),
        "max of all": by_prediction(max),
        f"podsrl: {STEP_MARGIN:g} x max of last {RECENT_STEPS}": podsrl_rule,
    }
    print(f"{len(found)} runs ended by train.max_seconds under {args.runs}")
    print(f"{'rule':34s} {'overruns':>9s} {'mean':>6s} {'worst':>7s} {'unused mean':>12s} {'worst':>7s} {'steps mean':>11s} {'worst':>6s}")
    table = {}
    for name, rule in [*rules.items(), ("oracle", None)]:
        over, unused, steps_left = [], [], []
        for _, budget, steps in found:
            end = oracle(budget, steps) if rule is None else replay(budget, steps, rule)
            if end > budget:
                over.append(end - budget)
            else:
                unused.append((budget - end) / budget)
                steps_left.append((budget - end) / statistics.median(steps))
        table[name] = (over, unused)
        mean = lambda xs: statistics.mean(xs) if xs else math.nan  # noqa: E731
        print(f"{name:34s} {len(over):4d}/{len(found):<4d} {mean(over):5.1f}s {max(over, default=0):6.1f}s {100 * mean(unused):11.1f}% "
              f"{100 * max(unused, default=0):6.1f}% {mean(steps_left):11.2f} {max(steps_left, default=0):6.2f}")  # fmt: skip
    ours = f"podsrl: {STEP_MARGIN:g} x max of last {RECENT_STEPS}"
    over, unused = table[ours]
    before, _ = table["none"]
    print(f"budget stop, {STEP_MARGIN:g} x the longest of the last {RECENT_STEPS} steps: overruns {len(over)}/{len(found)} "
          f"(none: {len(before)}/{len(found)}, up to {max(before, default=0):.1f} s); unused mean {100 * statistics.mean(unused):.1f}% "
          f"of the budget (oracle: {100 * statistics.mean(table['oracle'][1]):.1f}%)")  # fmt: skip


if __name__ == "__main__":
    main()
