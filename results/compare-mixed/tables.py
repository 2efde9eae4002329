"""The tables of issue 66's item 5 (does mixed precision learn the same?) in docs/results.md, from the
report and the runs' files in this directory (``python -m podsrl.docs_render --write`` puts them into
the page; the test suite checks that the page holds what this script renders):

    podsrl compare configs/compare-mixed.toml --out results/compare-mixed --report-only
    .venv/bin/python results/compare-mixed/tables.py              # prints the tables (podsrl importable)
    .venv/bin/python results/compare-mixed/tables.py --dir /tmp/out   # another copy of the runs and report

1. Per arm (:func:`arms`): median seconds a step (generation, update: compare.json
   ``median_seconds``, every step of every seed), the update's median as a fraction of its float32
   twin's, training minutes for the 60 steps (mean over seeds) and held-out accuracy at steps 0, 15,
   30, 45 and 60 (eval.jsonl, mean over seeds), and the sampler gap: the k3 KL per token between
   the sampler (vLLM in float32 in every arm) and the update's forward at the weights that sampled,
   and the share of tokens the ``sequence_mask`` correction masked (compare.json ``sampler``: means
   over steps, then seeds).
2. Per method, bfloat16 autocast minus float32, paired by seed (:func:`pairs`), with its 95% interval
   and verdict: **at equal steps** the accuracy at step 60 (compare.json ``final_accuracy``, each
   run's evaluation after its 60th step) and the AUC over steps (``auc``: each seed's mean accuracy
   over its evaluations after step 0); **at equal training time** the AUC per training minute over
   the shortest run's training time (``time_auc``, its horizon in compare.json) and the accuracy at
   the horizon (each run read linearly between its evaluations: :meth:`podsrl.figures.Comparison.accuracy_at`),
   and the training minutes each arm's seed mean took to 99% of its float32 twin's peak (compare.json:
   the baseline's target for GRPO(8), ``targets`` for PODS(16, 4)).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from podsrl.figures import Comparison, paired_text, percent, verdict

HERE = Path(__file__).resolve().parent
NAMES = {"grpo_n8": "GRPO(8), float32", "grpo_n8_bf16": "GRPO(8), bf16 autocast",
         "pods_n16_m4": "PODS(16, 4), float32", "pods_n16_m4_bf16": "PODS(16, 4), bf16 autocast"}  # fmt: skip
TWINS = {"grpo_n8_bf16": "grpo_n8", "pods_n16_m4_bf16": "pods_n16_m4"}  # the bf16 arm: its float32 twin
METHOD = {"grpo_n8": "GRPO(8)", "pods_n16_m4": "PODS(16, 4)"}
STEPS = (0, 15, 30, 45, 60)


def label(c: Comparison, name: str) -> str:
    k = len(c.entry(name)["runs"])
    return NAMES[name] + ("" if k == 3 else f" ({k} seed{'s' * (k != 1)})")


def accuracy_at_step(c: Comparison, method: str, step: int) -> float | None:
    """The seed mean of the held-out accuracy evaluated at ``step`` (None if a seed has no evaluation there)."""
    values = [next((row["accuracy"] for row in c.evals(method, seed) if row["step"] == step), None) for seed in c.seeds(method)]
    return None if None in values or not values else statistics.fmean(values)


def training_minutes(c: Comparison, method: str) -> float:
    """The mean over seeds of the training seconds at each run's last step, in minutes."""
    return statistics.fmean(c.metrics(method, seed)[-1]["train_seconds"] for seed in c.seeds(method)) / 60


def arms(c: Comparison) -> str:
    head = ["arm", "s / step: generation, update (median)", "update / float32 twin's", "training min for 60 steps",
            f"held-out % at step {' / '.join(map(str, STEPS))}", "sampler KL / token, tokens masked"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for name in NAMES:
        med = c.entry(name)["median_seconds"]
        twin = TWINS.get(name)
        ratio = "-" if twin is None else f"{med['update'] / c.entry(twin)['median_seconds']['update']:.2f}"
        at = " / ".join("-" if (a := accuracy_at_step(c, name, s)) is None else percent(a) for s in STEPS)
        gap = c.entry(name)["sampler"]
        lines.append(f"| {label(c, name)} | {med['step']:.1f}: {med['generate']:.1f}, {med['update']:.1f} | {ratio} "
                     f"| {training_minutes(c, name):.1f} | {at} | {gap['sampler_kl']:.1e}, {gap['is_clip_frac']:.2%} |")  # fmt: skip
    return "\n".join(lines)


def _to_twins_peak(c: Comparison, name: str, twin: str) -> str:
    """Training minutes of ``name``'s seed mean to 99% of ``twin``'s peak, against ``twin``'s own, and the level."""
    if twin == c.baseline:
        own, ref, level = c.entry(name)["time_to_target_seconds"], c.entry(twin)["time_to_target_seconds"], c.report["target_accuracy"]
    else:
        (target,) = [t for t in c.report["targets"] if t["method"] == twin]
        own, ref = (target["methods"][m]["time_to_target_seconds"] for m in (name, twin))
        level = target["target_accuracy"]

    def minutes(seconds: float | None) -> str:
        return "never" if seconds is None else f"{seconds / 60:.1f}"

    return f"{minutes(own)} against {minutes(ref)} ({percent(level)}%)"


def pairs(c: Comparison) -> str:
    horizon = c.report.get("time_auc_horizon_seconds")
    head = ["bf16 autocast - float32, paired by seed (points)", "accuracy at step 60", "AUC over steps",
            f"AUC per training min (first {horizon / 60:.1f} min)", f"accuracy at {horizon / 60:.1f} training min",
            "training min to 99% of the float32 arm's peak: bf16 against float32"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, twin in TWINS.items():
        cells = [paired_text(c.paired(name, twin, key), with_verdict=True) for key in ("final_accuracy", "auc", "time_auc", f"accuracy_at:{horizon}")]
        lines.append(f"| {METHOD[twin]} | " + " | ".join(cells) + f" | {_to_twins_peak(c, name, twin)} |")
    return "\n".join(lines)


def verdicts(c: Comparison) -> str:
    """The pairs' verdicts in words, for the prose: "resolved" only where an interval excludes 0."""
    horizon = c.report.get("time_auc_horizon_seconds")
    keys = {"final_accuracy": "at step 60", "auc": "AUC over steps", "time_auc": "AUC per training min",
            f"accuracy_at:{horizon}": f"at {horizon / 60:.1f} training min"}  # fmt: skip
    return "; ".join(f"{METHOD[twin]}: " + ", ".join(f"{words} {verdict(c.paired(name, twin, key))}" for key, words in keys.items())
                     for name, twin in TWINS.items())  # fmt: skip


FIGURES = {"arms": arms, "pairs": pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the comparison's output directory (compare.json, runs/)")
    c = Comparison(parser.parse_args().dir)
    print(arms(c), pairs(c), verdicts(c), sep="\n\n")


if __name__ == "__main__":
    main()
