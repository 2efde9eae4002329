"""The "in short" table of issue 39's comparison in docs/results.md, from the report and the runs' files
in this directory (``python -m podsrl.docs_render --write`` puts it into the page; the test suite
checks that the page holds what this script renders):

    podsrl compare configs/compare-rollouts.toml --out results/compare-rollouts --report-only
    .venv/bin/python results/compare-rollouts/tables.py     # prints the table (podsrl importable)

Per method (:func:`podsrl.figures.summary_table`): rollouts and groups with a signal a step
(compare.json ``signal``), steps in 10 training minutes (mean of the seeds), held-out accuracy at 2,
4, 6, 8 and 10 training minutes (each run read between its own evaluations, then the seed mean), AUC
per training minute and final accuracy (each run's last evaluation) minus GRPO's, paired by seed
(* resolved), and the seed mean's steps to 99% of GRPO's peak with that count as a fraction of GRPO's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from podsrl.figures import Comparison, summary_table

HERE = Path(__file__).resolve().parent
NAMES = {"grpo": "GRPO(4)", "grpo_no_skip": "GRPO(4) without skipping", "grpo_dynamic": "GRPO(4) + dynamic sampling",
         "pods_n8": "PODS(8, 4)", "pods_n16": "PODS(16, 4)", "pods_n32": "PODS(32, 4)",
         "pods_n16_dynamic": "PODS(16, 4) + dynamic sampling"}  # fmt: skip


def summary(c: Comparison) -> str:
    return summary_table(c, NAMES, ["rollouts", "groups", "steps", "at_minutes", "auc_per_min", "final", "steps_to_target"])


FIGURES = {"summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the comparison's output directory (compare.json, runs/)")
    print(summary(Comparison(parser.parse_args().dir)))


if __name__ == "__main__":
    main()
