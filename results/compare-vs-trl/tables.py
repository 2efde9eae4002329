"""The markdown tables of issue 58's comparison (README's headline table, docs/results.md), from the
report and the runs' metrics files in this directory:

    podsrl compare configs/compare-vs-trl.toml --out results/compare-vs-trl --report-only
    .venv/bin/python results/compare-vs-trl/tables.py        # prints the tables (podsrl importable)
    .venv/bin/python results/compare-vs-trl/tables.py --dir /tmp/out   # another copy of the runs and report

Per arm: the trainer, n and m, steps in 10 training minutes (mean over seeds), median seconds a step
(generation, update), rows that ran the update's forward and backward a step and groups with a
signal a step (means over steps, then seeds: metrics.jsonl ``rows_run``, ``groups_with_signal``),
held-out accuracy at 2, 4, 6, 8 and 10 training minutes (the seed means read between each arm's own
evaluations, as the report's table), AUC per training minute minus GRPO(16)'s paired by seed with its
95% interval, and training minutes to 99% of GRPO(16)'s peak and to TRL GRPOTrainer(8)'s accuracy at
10 minutes (compare.json ``time_to_target_seconds`` and ``targets``), with that time as a fraction of
GRPO(16)'s and of TRL GRPOTrainer(8)'s own. Nothing here is computed that the report does not hold,
except the rows and groups a step (from metrics.jsonl), the reading at equal minutes, and the
second table's paired differences between two arms neither of which is the baseline (the report
pairs every arm with GRPO(16) only): PODSTrainer(16, 4) against GRPOTrainer(16), and every podsrl
arm against GRPOTrainer(8), by seed, with the report's own paired_difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from podsrl.compare.stats import paired_difference, value_at
from podsrl.compare.table import difference

HERE = Path(__file__).resolve().parent
NAMES = {"grpo_n4": "GRPO(4)", "grpo_n8": "GRPO(8)", "grpo_n16": "GRPO(16)", "pods_n16_m4": "PODS(16, 4)", "pods_n16_m8": "PODS(16, 8)",
         "trl_grpo_n8": "GRPOTrainer(8)", "trl_grpo_n16": "GRPOTrainer(16)", "trl_pods_n16_m4": "PODSTrainer(16, 4)"}  # fmt: skip
TOOL = {"podsrl": "podsrl", "trl": "TRL", "trl-pods": "TRL + podsrl's PODSTrainer"}
MINUTES = (2, 4, 6, 8, 10)


def per_step(run_dir: Path, key: str) -> float | None:
    """The mean over a run's steps of ``key`` in its metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def minutes(seconds: float | None, reference: float | None) -> str:
    if seconds is None:
        return "never"
    ratio = f" ({seconds / reference:.2f}x)" if reference else ""
    return f"{seconds / 60:.1f}{ratio}"


def headline(report: dict, root: Path) -> list[str]:
    methods = report["methods"]
    base = report["baseline"]
    final = next((t for t in report.get("targets", []) if t["method"] == "trl_grpo_n8" and t["of"] == "final"), None)
    base_time = methods[base]["time_to_target_seconds"]
    trl_time = final["methods"]["trl_grpo_n8"]["time_to_target_seconds"] if final else None
    lines = [
        f"| arm | tool | steps in 10 min | s/step (generate, update) | rows updated / step | groups with a signal / step (of 8) "
        f"| held-out % at {' / '.join(map(str, MINUTES))} training min | AUC per training min - GRPO(16), paired "
        f"| min to 99% of GRPO(16)'s peak ({100 * report['target_accuracy']:.1f}%) "
        + (f"| min to GRPOTrainer(8)'s 10-min accuracy ({100 * final['target_accuracy']:.1f}%) |" if final else "|"),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if final else ""),
    ]
    for name, e in methods.items():
        if not e["runs"]:
            continue
        runs = [root / "runs" / name / f"seed{r['seed']}" for r in e["runs"]]
        rows = mean([per_step(r, "rows_run") for r in runs])
        groups = mean([per_step(r, "groups_with_signal") for r in runs])
        curve = e["curves"]["train_seconds"]
        at = [value_at(curve["x"], curve["accuracy"], 60 * m) for m in MINUTES]
        med = e["median_seconds"]
        cells = [
            NAMES.get(name, name) + ("" if len(e["runs"]) == 3 else f" ({len(e['runs'])} seed{'s' * (len(e['runs']) != 1)})"),
            TOOL[e["trainer"]],
            f"{statistics.fmean(e['steps']):.0f}",
            f"{med['step']:.1f} ({med['generate']:.1f}, {med['update']:.1f})",
            "-" if rows is None else f"{rows:.1f} of {e['m'] * 8}",
            "-" if groups is None else f"{groups:.1f}",
            " / ".join("-" if a is None else f"{100 * a:.1f}" for a in at),
            difference((e.get("paired_vs_baseline") or {}).get("time_auc"), baseline=name == base, count=False),
            minutes(e["time_to_target_seconds"], base_time),
        ]
        if final:
            cells.append(minutes(final["methods"][name]["time_to_target_seconds"], trl_time))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# The paired questions: PODS against GRPO at the same n, in podsrl and inside TRL, and every
# podsrl arm against TRL GRPOTrainer(8), the trainer a user would otherwise run.
PAIRS = [("pods_n16_m4", "grpo_n16"), ("pods_n16_m8", "grpo_n16"), ("trl_pods_n16_m4", "trl_grpo_n16"),
         *((arm, "trl_grpo_n8") for arm in ("grpo_n4", "grpo_n8", "grpo_n16", "pods_n16_m4", "pods_n16_m8"))]  # fmt: skip


def per_seed(entry: dict, key: str) -> dict[int, float | None]:
    return {r["seed"]: r.get(key) for r in entry["runs"]}


def pairs(report: dict) -> list[str]:
    """Paired differences by seed (the report's own paired_difference: mean and 95% t-interval) of
    AUC per training minute and of accuracy at the budget, for PAIRS."""
    methods = report["methods"]
    lines = ["| arm - against | seeds | AUC per training min, paired | accuracy at 10 min, paired |", "|---|---|---|---|"]
    for arm, other in PAIRS:
        if not (methods.get(arm, {}).get("runs") and methods.get(other, {}).get("runs")):
            continue
        auc = paired_difference(per_seed(methods[arm], "time_auc"), per_seed(methods[other], "time_auc"))
        final = paired_difference(per_seed(methods[arm], "final_accuracy"), per_seed(methods[other], "final_accuracy"))
        cells = [f"{NAMES[arm]} - {NAMES[other]}", str(len(auc.seeds))]
        for d in (auc, final):
            cells.append(difference(d.to_json(), count=False))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the comparison's output directory (compare.json, runs/)")
    args = parser.parse_args()
    report = json.loads((args.dir / "compare.json").read_text())
    print("\n".join(headline(report, args.dir)))
    print()
    print("\n".join(pairs(report)))


if __name__ == "__main__":
    main()
