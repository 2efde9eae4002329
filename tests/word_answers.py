"""The labelled word answers (tests/data/word_answers.jsonl) graded by a grader: its false positives
(scored right, a person says wrong) and false negatives (scored wrong, a person says right).

Each line of the data is one completion: its question, reference answer, the completion, ``right``
(what a person means: does it give the reference as its answer), ``kind`` (sentence, list, hedge,
negation, question, ...), ``shape`` (word: a free word answer; choice: the question lists the
options; number: digits or number words; task: a word task whose other answers are known, given in
``answers``, as `Example.task_answers`) and ``source`` ("issue 68" for the issue's own examples).

    python tests/word_answers.py                 # the auto grader: counts, then every disagreement
    python tests/word_answers.py --grader text

It runs against whichever podsrl is imported, so the grader of another commit is measured with
``PYTHONPATH=/path/to/that/checkout python tests/word_answers.py`` (docs/your-task.md: before/after).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "word_answers.jsonl"


def load(path: Path = DATA) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def example(row: dict, grader: str = "auto"):
    """The row's Example; its task's answers where the row gives them and this podsrl's Example has the field."""
    from podsrl.tasks import Example

    ex = Example("word_answers", row["question"], row["reference"], grader=grader)
    if "answers" in row and any(f.name == "task_answers" for f in dataclasses.fields(Example)):
        ex = dataclasses.replace(ex, task_answers=frozenset(row["answers"]))
    return ex


def disagreements(rows: list[dict], grader: str = "auto") -> tuple[list[dict], list[dict]]:
    """(false positives, false negatives) of ``grader`` on ``rows``."""
    from podsrl.grading.graders import GRADERS

    fn = GRADERS[grader]
    scored = [(row, fn(row["completion"], example(row, grader)) >= 1.0) for row in rows]
    return [r for r, right in scored if right and not r["right"]], [r for r, right in scored if not right and r["right"]]


def report(rows: list[dict], grader: str = "auto") -> str:
    false_pos, false_neg = disagreements(rows, grader)
    right = sum(r["right"] for r in rows)
    lines = [
        f"grader {grader!r} on {len(rows)} labelled completions ({right} right, {len(rows) - right} wrong by a person's reading): "
        f"{len(false_pos)} false positives, {len(false_neg)} false negatives"
    ]
    for name, rows_ in (("false positives", false_pos), ("false negatives", false_neg)):
        if rows_:
            by_shape = Counter(r["shape"] for r in rows_)
            lines.append(f"{name} by shape: " + ", ".join(f"{k} {v}" for k, v in sorted(by_shape.items())))
    for name, rows_ in (("false positive", false_pos), ("false negative", false_neg)):
        for r in rows_:
            lines.append(f"  {name} [{r['shape']}/{r['kind']}] {r['question']!r} ref {r['reference']!r}: {r['completion']!r}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grader", default="auto", help="a built-in grader (auto, text, numeric)")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    print(report(load(args.data), args.grader))


if __name__ == "__main__":
    main()
