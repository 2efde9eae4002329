"""Benchmark: what the word rule (issue 68) costs a grade, beside the extraction it builds on.

    python bench/grading.py            # GSM8K's 1,319 test solutions and the 368 labelled word answers, 7 rounds
    python bench/grading.py --quick    # 200 solutions, 2 rounds: checks that it runs

What is timed, per completion, all in this process with every question already read (a prompt's n
rollouts share its question, whose reading is cached):

- numbers: the ``numeric`` grader (extract_answer, then the word rule's reading of the answer's
  sentence: podsrl.grading.naming.named_number) against extract_answer and number_value alone
  (the grader of before issue 68), on GSM8K's reference solutions without their "####" line, so
  that the answer is read from the reasoning (its last number);
- words: the ``auto`` grader on tests/data/word_answers.jsonl (the word rule) against the exact
  comparison of the answer's text it keeps for other references (graders._same_text).

The two sides alternate within each round, in alternating order, so a change in the machine's load
hits both; the figures are medians over the rounds of the per-round ratios.

Last line: ``grading time a completion, numeric/extraction: R (GSM8K solutions); word rule/exact
text: R2 (labelled word answers)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GSM8K = Path("/work/shared/data/gsm8k/test.jsonl") if Path("/work/shared/data/gsm8k/test.jsonl").is_file() else ROOT.parent / "shared/data/gsm8k/test.jsonl"


def _per_completion(fn, cases) -> float:
    start = time.perf_counter()
    for completion, example in cases:
        fn(completion, example)
    return (time.perf_counter() - start) / len(cases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from podsrl.grading import graders
    from podsrl.grading.answers import extract_answer, number_value
    from podsrl.tasks import Example
    from podsrl.tasks.jsonl import reference_answer
    from tests import word_answers

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()][: 200 if args.quick else None]
    numbers = [(r["answer"].rsplit("####", 1)[0].strip(), Example("q", r["question"], reference_answer(r["answer"]), grader="numeric")) for r in rows]
    words = [(r["completion"], word_answers.example(r)) for r in word_answers.load()]
    arms = {
        "numeric": (lambda c, e: graders.numeric(c, e), numbers),
        "extraction": (lambda c, e: number_value(extract_answer(c) or "") == number_value(e.answer), numbers),
        "word rule": (lambda c, e: graders.auto(c, e), words),
        "exact text": (lambda c, e: graders._same_text(c, e.answer), words),
    }
    for fn, cases in arms.values():  # warm: every question read once, as after a prompt's first rollout
        _per_completion(fn, cases)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(2 if args.quick else 7):
        for pair in (("numeric", "extraction"), ("word rule", "exact text")):
            for name in pair if r % 2 == 0 else pair[::-1]:
                seconds[name].append(_per_completion(*arms[name]))
    print(f"{'arm':<12} {'completions':>11} {'median ms':>10}")
    for name, (_, cases) in arms.items():
        print(f"{name:<12} {len(cases):>11} {1e3 * statistics.median(seconds[name]):>10.3f}")
    ratio = statistics.median(a / b for a, b in zip(seconds["numeric"], seconds["extraction"]))
    ratio_words = statistics.median(a / b for a, b in zip(seconds["word rule"], seconds["exact text"]))
    print(f"grading time a completion, numeric/extraction: {ratio:.2f} (GSM8K solutions); word rule/exact text: {ratio_words:.2f} (labelled word answers)")


if __name__ == "__main__":
    main()
