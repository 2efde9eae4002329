"""What the number_format runs answer (issue 47): whether held-out accuracy near 50% is the comparison
or a shortcut. A number_format problem has two candidates, so answering with either one blindly
scores 50%; above that needs the comparison, and a rule that ignores it (always the first candidate,
always the one in plain notation, always the larger) shows as a lopsided split below.

Input: `podsrl eval --run RUN --completions FILE.jsonl` of each run's final checkpoint (the run's own
held-out problems, samples and seed: the same numbers as its eval.jsonl's last line). Each completion's
answer is what the dataset's checker scores (podsrl.grading.reasoning_gym.extract), compared with the
two candidates of its question as float() reads them (within 0.01, number_format's own tolerance).

    .venv/bin/python results/compare-reasoning-gym/answers.py NAME=FILE.jsonl [NAME=FILE.jsonl ...]

Columns, as shares of all completions: "right" (full credit: held-out accuracy), "a candidate" (right
or the other candidate), "right of candidates" (right / a candidate: 50% is a blind pick), then the
same over the problems whose two candidates are written in the same notation ("same notation") and
over those with one in scientific notation and one not ("mixed notation", about half of them),
"first" / "larger" (of the candidate answers, the share that picked the first-written candidate, the
larger number), "plain" (of the candidate answers to the mixed-notation problems, the share that
picked the one not in scientific notation), "other" (a number that is neither candidate), "none" (no
number). FILE may be gzipped (.gz), as results/compare-reasoning-gym/answers/ holds them.

    .venv/bin/python results/compare-reasoning-gym/answers.py --regrade NAME=FILE.jsonl [NAME=FILE.jsonl ...]

grades every completion again with podsrl's grader as it is now (the held-out problems rebuilt from
runs/grpo/seed1/config.toml: every run's task and held-out set are the same) and counts the verdicts
(full credit or not) that differ from the grade the file recorded (issue 57: the marked answer).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from podsrl.grading.reasoning_gym import extract


def candidates(question: str) -> list[str]:
    """The candidates as written, from the question's last line ("... candidates: 57.351000 63.396")."""
    return question.strip().splitlines()[-1].split(":", 1)[1].split()


def classify(text: str, answer: str, written: list[str]) -> dict:
    """One completion: which candidate it answered (index or None), whether it is a number at all."""
    got = extract(text, answer)
    try:
        value = float(got) if got is not None else None
    except ValueError:
        value = None
    picked = None if value is None else next((i for i, c in enumerate(written) if abs(float(c) - value) < 1e-2), None)
    return {"number": value is not None, "picked": picked}


def summarize(rows: list[dict]) -> dict:
    n = right = cand = first = plain = mixed = mixed_right = larger = other = none = 0
    for row in rows:
        written = candidates(row["question"])
        values = [float(c) for c in written]
        mixed_notation = len({"e" in w.lower() for w in written}) == 2  # one candidate in scientific notation, one not
        for c in row["completions"]:
            n += 1
            right += c["grade"] >= 1.0
            k = classify(c["text"], row["answer"], written)
            if k["picked"] is None:
                other += k["number"]
                none += not k["number"]
                continue
            cand += 1
            first += k["picked"] == 0
            if mixed_notation:
                mixed += 1
                mixed_right += c["grade"] >= 1.0
                plain += "e" not in written[k["picked"]].lower()
            larger += values[k["picked"]] == max(values)
    pct = lambda x, d: round(100 * x / d, 1) if d else None  # noqa: E731
    return {"completions": n, "right": pct(right, n), "a candidate": pct(cand, n), "right of candidates": pct(right, cand),
            "same notation": pct(right - mixed_right, cand - mixed), "mixed notation": pct(mixed_right, mixed),
            "first": pct(first, cand), "plain": pct(plain, mixed), "larger": pct(larger, cand),
            "other": pct(other, n), "none": pct(none, n)}  # fmt: skip


def regrade(rows: list[dict]) -> dict:
    """The completions whose verdict podsrl's grader as it is now gives otherwise than the file recorded."""
    from podsrl.config import load
    from podsrl.grading.graders import is_right
    from podsrl.tasks import load_task

    cfg = load(str(Path(__file__).parent / "runs/grpo/seed1/config.toml"), [])
    examples = {ex.id: ex for ex in load_task(cfg.task.name, **cfg.task.options).eval}
    n = up = down = 0
    for row in rows:
        example = examples[row["id"]]
        assert example.answer == row["answer"], row["id"]
        for c in row["completions"]:
            n += 1
            was, now = c["grade"] >= 1.0, is_right(c["text"], example)
            up += now and not was
            down += was and not now
    return {"completions": n, "verdicts changed": up + down, "wrong -> right": up, "right -> wrong": down}


def main(argv: list[str]) -> int:
    again = argv[:1] == ["--regrade"]
    argv = argv[1:] if again else argv
    if not argv or any("=" not in a for a in argv):
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    header = None
    for arg in argv:
        name, path = arg.split("=", 1)
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        stats = regrade(rows) if again else summarize(rows)
        if header is None:
            header = list(stats)
            print("| run | " + " | ".join(header) + " |")
            print("|---" * (len(header) + 1) + "|")
        print(f"| {name} | " + " | ".join("-" if stats[h] is None else str(stats[h]) for h in header) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
