"""The tables of the default job with and without mixed precision (issue 66: what ``model.mixed_precision
= "auto"`` chooses on a CPU with native bfloat16) in docs/results.md, from the report and the runs'
files in this directory (``python -m podsrl.docs_render --write`` puts them into the page; the test
suite checks that the page holds what this script renders):

    podsrl compare configs/compare-demo-mixed.toml --out results/compare-demo-mixed --report-only
    .venv/bin/python results/compare-demo-mixed/tables.py              # prints the tables (podsrl importable)
    .venv/bin/python results/compare-demo-mixed/tables.py --dir /tmp/out   # another copy of the runs and report

1. Per arm (:func:`arms`): median seconds a step (generation, update: compare.json ``median_seconds``,
   every step of every seed), the update's median as a fraction of the float32 arm's, optimizer
   steps in the 4 training minutes (mean over seeds), held-out accuracy at 0, 1, 2, 3 and 4 training
   minutes (each run read at that minute: :meth:`podsrl.figures.Comparison.accuracy_at`, then the mean
   over seeds), and the sampler gap: the k3 KL per token between the sampler (vLLM in bfloat16 in both
   arms, the default "fast" on such a CPU) and the update's forward at the weights that sampled, and
   the share of tokens whose importance weight the ``token_truncate`` correction cut (compare.json
   ``sampler``: means over steps, then seeds).
2. bfloat16 autocast minus float32, paired by seed (:func:`pairs`), with its 95% interval and
   verdict, **at equal training time**: the AUC per training minute over the shortest run's training
   time (``time_auc``, its horizon in compare.json), the accuracy at 2 training minutes and at the
   budget's 4 (:meth:`~podsrl.figures.Comparison.accuracy_at`), and the training minutes each arm's
   seed mean took to 99% of the float32 arm's peak (compare.json ``time_to_target_seconds``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from podsrl.figures import Comparison, mean, minutes, paired_text, percent, verdict

HERE = Path(__file__).resolve().parent
NAMES = {"demo_f32": "the default job, float32 update", "demo_bf16": "the default job, bf16 autocast update"}
BF16, F32 = "demo_bf16", "demo_f32"
MINUTES = (0, 1, 2, 3, 4)


def label(c: Comparison, name: str) -> str:
    k = len(c.entry(name)["runs"])
    return NAMES[name] + ("" if k == 3 else f" ({k} seed{'s' * (k != 1)})")


def arms(c: Comparison) -> str:
    head = ["arm", "s / step: generation, update (median)", "update / float32's", "steps in 4 training min",
            f"held-out % at {' / '.join(map(str, MINUTES))} training min", "sampler KL / token, tokens truncated"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for name in NAMES:
        med = c.entry(name)["median_seconds"]
        ratio = "-" if name == F32 else f"{med['update'] / c.entry(F32)['median_seconds']['update']:.2f}"
        steps = statistics.fmean(c.entry(name)["steps"])
        at = " / ".join(percent(mean(c.accuracy_at(name, 60.0 * t).values())) for t in MINUTES)
        gap = c.entry(name)["sampler"]
        lines.append(f"| {label(c, name)} | {med['step']:.2f}: {med['generate']:.2f}, {med['update']:.2f} | {ratio} | {steps:.1f} "
                     f"| {at} | {gap['sampler_kl']:.1e}, {gap['is_clip_frac']:.2%} |")  # fmt: skip
    return "\n".join(lines)


def pairs(c: Comparison) -> str:
    horizon = c.report["time_auc_horizon_seconds"]
    head = ["bf16 autocast - float32, paired by seed (points)", f"AUC per training min (first {horizon / 60:.1f} min)",
            "accuracy at 2 training min", "accuracy at 4 training min", "training min to 99% of the float32 arm's peak: bf16 against float32"]  # fmt: skip
    cells = [paired_text(c.paired(BF16, F32, key), with_verdict=True) for key in ("time_auc", "accuracy_at:120.0", "accuracy_at:240.0")]
    own, ref = c.entry(BF16)["time_to_target_seconds"], c.entry(F32)["time_to_target_seconds"]
    reach = f"{minutes(own)} against {minutes(ref)} ({percent(c.report['target_accuracy'])}%)"
    return "\n".join(["| " + " | ".join(head) + " |", "|---" * len(head) + "|", "| the default job | " + " | ".join(cells) + f" | {reach} |"])


def verdicts(c: Comparison) -> str:
    """The pair's verdicts in words, for the prose: "resolved" only where an interval excludes 0."""
    keys = {"time_auc": "AUC per training min", "accuracy_at:120.0": "at 2 training min", "accuracy_at:240.0": "at 4 training min"}
    return "; ".join(f"{words} {verdict(c.paired(BF16, F32, key))}" for key, words in keys.items())


def update_ratio(c: Comparison) -> str:
    """The bf16 arm's median update seconds over the float32 arm's (the first table's third column)."""
    return f"{c.entry(BF16)['median_seconds']['update'] / c.entry(F32)['median_seconds']['update']:.2f}"


def steps_by_seed(c: Comparison) -> str:
    """Each seed's optimizer steps in the budget, the bf16 arm's against the float32 arm's (compare.json
    ``steps``), and in how many seeds the bf16 arm took more."""

    def listed(values: list[int]) -> str:
        return ", ".join(map(str, values[:-1])) + f" and {values[-1]}"

    bf16, f32 = c.entry(BF16)["steps"], c.entry(F32)["steps"]
    more = sum(b > f for b, f in zip(bf16, f32, strict=True))
    words = "more in each" if more == len(bf16) else "fewer or as many in each" if more == 0 else f"more in {more} of {len(bf16)}"
    return f"{listed(bf16)} steps against {listed(f32)} (seeds {listed(c.seeds(BF16))}: {words})"


def sampler_kl(c: Comparison, name: str) -> str:
    """An arm's sampler KL per token (compare.json ``sampler``, as the first table prints it)."""
    return f"{c.entry(name)['sampler']['sampler_kl']:.1e}"


FIGURES = {"arms": arms, "pairs": pairs, "update_ratio": update_ratio, "steps_by_seed": steps_by_seed, "sampler_kl": sampler_kl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the comparison's output directory (compare.json, runs/)")
    c = Comparison(parser.parse_args().dir)
    print(arms(c), pairs(c), verdicts(c), sep="\n\n")


if __name__ == "__main__":
    main()
