"""The summary table of issue 44's comparison in docs/results.md, from the reports and the runs' files in
this directory (``python -m podsrl.docs_render --write`` puts it into the page; the test suite checks
that the page holds what this script renders):

    podsrl compare configs/compare-prompts.toml --out results/compare-prompts --report-only
    .venv/bin/python results/compare-prompts/tables.py     # prints the table (podsrl importable)

Per method (:func:`podsrl.figures.summary_table`): steps in 10 training minutes (mean of the seeds),
rollouts a group with a signal, the share of the groups sampled from the second epoch on that came
back silent (among the prompts explored although predicted silent / among the rest), held-out
accuracy at 2, 4, 6, 8 and 10 training minutes (each run read between its own evaluations, then the
seed mean), final accuracy (each run's last evaluation) minus GRPO's paired by seed (* resolved), and
from compare-85.json (the same runs, the target at 85% of GRPO's peak) the seed mean's training
minutes to that target.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from podsrl.figures import Comparison, summary_table

HERE = Path(__file__).resolve().parent
NAMES = {"grpo": "GRPO(4)", "grpo_dynamic": "GRPO(4) + dynamic sampling", "grpo_dynamic_skip": "GRPO(4) + dynamic + prompt selection",
         "grpo_dynamic_skip_fast": "the same, exploration moving 0.05 a step", "pods_n8": "PODS(8, 4)",
         "pods_n8_skip": "PODS(8, 4) + prompt selection", "pods_n16_dynamic_skip": "PODS(16, 4) + dynamic + prompt selection"}  # fmt: skip


def summary(c: Comparison) -> str:
    """The table: every column from compare.json's runs, the last from compare-85.json."""
    main = summary_table(c, NAMES, ["steps", "per_signal", "silent", "at_minutes", "final"]).split("\n")
    at85 = summary_table(Comparison(c.root, "compare-85.json"), NAMES, ["time_to_target"]).split("\n")
    return "\n".join(a + b.split("|")[-2] + "|" for a, b in zip(main, at85))


FIGURES = {"summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the comparison's output directory (compare.json, runs/)")
    print(summary(Comparison(parser.parse_args().dir)))


if __name__ == "__main__":
    main()
