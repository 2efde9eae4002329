"""How a comparison's figures are read and worded in the docs, in one place (issue 68). The tables
scripts of ``results/<name>/tables.py`` and :mod:`podsrl.docs_render` word every figure of README.md
and docs/results.md through these functions, so a sentence's numbers and its wording come from one
computation over the committed files:

- **A paired difference** (method minus another, seed by seed: :func:`podsrl.compare.stats.paired_difference`)
  is "+2.1 [-1.2, +5.5]" in points, and its verdict is "resolved" when the 95% interval excludes 0,
  else "not resolved" (:func:`verdict`). Nothing stronger: an interval that holds 0 is never "no
  slower" or "at least as good" (it holds differences of either sign).
- **A ratio of times** is the method's time to the target as a fraction of the reference's
  (:data:`RATIO`, :func:`fraction`): "0.61x GRPO(16)'s time" is sooner, below 1. ``podsrl compare``'s
  report printed speedups the other way (the baseline's time over the method's) when issue 68 was
  filed; the older sections of docs/results.md quote them so and say so.
- **Held-out accuracy at a training time** is each run's own evaluations read linearly at that time
  (:func:`podsrl.compare.stats.value_at`), then the mean over seeds (:meth:`Comparison.accuracy_at`):
  every arm read at the same minute, the budget included. Before issue 68 a run's last evaluation came
  at the first step end after the budget, up to a step late (0.3-28 s in results/compare-vs-trl); since
  then a run stops within its budget and a finished run is read at its last evaluation past it
  (:meth:`Comparison.eval_at`).

:class:`Comparison` reads one results directory (``compare.json``, ``runs/<method>/seed<k>/``) once.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from podsrl.compare.stats import Summary, paired_difference, value_at
from podsrl.compare.table import difference

RATIO = "a method's time to a target as a fraction of the baseline's (below 1: sooner)"  # README names it once


class Comparison:
    """One committed comparison: its report (compare.json, or another report of the same runs, such as
    one with another target) and its runs' metrics and eval files, each file read once."""

    def __init__(self, root: Path | str, report: str = "compare.json"):
        self.root = Path(root)
        path = self.root / report
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no compare.json; a results directory holds a comparison's report (podsrl compare ... --report-only)")
        self.report: dict[str, Any] = json.loads(path.read_text())
        self.methods: dict[str, dict[str, Any]] = self.report["methods"]
        self.baseline: str = self.report["baseline"]

    def entry(self, method: str) -> dict[str, Any]:
        if method not in self.methods:
            raise KeyError(f"{self.root}: no method {method!r} in compare.json; methods: {', '.join(self.methods)}")
        return self.methods[method]

    def seeds(self, method: str) -> list[int]:
        return [r["seed"] for r in self.entry(method)["runs"]]

    def run_dir(self, method: str, seed: int) -> Path:
        return self.root / "runs" / method / f"seed{seed}"

    def evals(self, method: str, seed: int) -> list[dict]:
        """The run's eval.jsonl rows, by training time."""
        return sorted(_jsonl(self.run_dir(method, seed) / "eval.jsonl"), key=lambda r: r["train_seconds"])

    def metrics(self, method: str, seed: int) -> list[dict]:
        return _jsonl(self.run_dir(method, seed) / "metrics.jsonl")

    def per_seed(self, method: str, key: str) -> dict[int, float | None]:
        """A per-run summary of compare.json (``time_auc``, ``final_accuracy``, ``auc``), by seed."""
        return {r["seed"]: r.get(key) for r in self.entry(method)["runs"]}

    def eval_at(self, method: str, seed: int, key: str, seconds: float) -> float | None:
        """An eval.jsonl figure (``accuracy``, ``mean_length``, ``truncated``) of one run at ``seconds``
        of training, linear between the run's own evaluations. Past its last evaluation: that
        evaluation's value when the run finished (its done.json is there: it trained no further, and
        since issue 68 a run stops within its budget, no step starting that is predicted not to fit,
        so its last evaluation can come a step before the budget), else None (a run cut short)."""
        rows = self.evals(method, seed)
        if rows and seconds > rows[-1]["train_seconds"] and (self.run_dir(method, seed) / "done.json").is_file():
            seconds = rows[-1]["train_seconds"]
        return value_at([r["train_seconds"] for r in rows], [r[key] for r in rows], seconds)

    def accuracy_at(self, method: str, seconds: float) -> dict[int, float | None]:
        """Each seed's held-out accuracy at ``seconds`` of training (:meth:`eval_at`)."""
        return {seed: self.eval_at(method, seed, "accuracy", seconds) for seed in self.seeds(method)}

    def paired(self, method: str, other: str, key: str) -> Summary:
        """``method`` minus ``other`` by seed: ``key`` a compare.json per-run summary, or
        ``"accuracy_at:SECONDS"`` for :meth:`accuracy_at`."""
        if key.startswith("accuracy_at:"):
            seconds = float(key.split(":", 1)[1])
            return paired_difference(self.accuracy_at(method, seconds), self.accuracy_at(other, seconds))
        return paired_difference(self.per_seed(method, key), self.per_seed(other, key))

    def first_reach(self, method: str, target: float) -> tuple[float | None, dict[int, float | None]]:
        """Training seconds at which ``method`` first reaches ``target`` accuracy: on its seed-mean
        curve (compare.json ``curves``, the report's rule for time to a target) and per seed, on the
        seed's own evaluations. Both at an evaluation, never between two."""
        curve = self.entry(method)["curves"]["train_seconds"]
        mean = next((x for x, a in zip(curve["x"], curve["accuracy"]) if a >= target - 1e-12), None)
        per_seed = {}
        for seed in self.seeds(method):
            per_seed[seed] = next((r["train_seconds"] for r in self.evals(method, seed) if r["accuracy"] >= target - 1e-12), None)
        return mean, per_seed


@cache
def _jsonl_cached(path: str, mtime: float) -> tuple[dict, ...]:
    return tuple(json.loads(line) for line in Path(path).read_text().splitlines() if line.strip())


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; the comparison's runs must be committed under runs/<method>/seed<k>/")
    return list(_jsonl_cached(str(path), path.stat().st_mtime))


# ----------------------------------------------------------------------------------------- wording


def load_script(path: Path, name: str) -> ModuleType:
    """A script that is no package's module (results/*/tables.py, bench/*.py, examples/*.py) loaded as
    module ``name``: its folder on ``sys.path`` while it loads (bench scripts import ``_isolated``
    beside them), itself in ``sys.modules`` from then on (a dataclass looks its module up there; the
    caller may pop it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(str(path.parent))
    return module


def verdict(d: Summary | dict[str, Any] | None) -> str:
    """"resolved" when the paired 95% interval excludes 0, "not resolved" when it holds 0, "no
    interval" with fewer than two pairs."""
    ci = _ci(d)
    if ci is None:
        return "no interval"
    return "resolved" if ci[0] > 0 or ci[1] < 0 else "not resolved"


def paired_text(d: Summary | dict[str, Any] | None, *, with_verdict: bool = False) -> str:
    """"+2.1 [-1.2, +5.5]" (points), with " (not resolved)" / " (resolved)" when asked."""
    data = d.to_json() if isinstance(d, Summary) else d
    text = difference(data, count=False).rstrip("*")
    return f"{text} ({verdict(d)})" if with_verdict else text


def _ci(d: Summary | dict[str, Any] | None) -> tuple[float, float] | None:
    if d is None:
        return None
    ci = d.ci95 if isinstance(d, Summary) else d.get("ci95")
    return tuple(ci) if ci else None


def fraction(seconds: float | None, reference: float | None) -> str:
    """A time as a fraction of the reference's (:data:`RATIO`): "0.61x"; "-" when either is missing."""
    if seconds is None or not reference:
        return "-"
    return f"{seconds / reference:.2f}x"


def minutes(seconds: float | None) -> str:
    """"6.2" (minutes), or "never"."""
    return "never" if seconds is None else f"{seconds / 60:.1f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def span(values: Iterable[float], fmt: Callable[[float], str] = lambda v: f"{v:.1f}") -> str:
    """"2.0-4.3": the smallest and largest as formatted (one value when they print the same)."""
    texts = sorted({fmt(v) for v in values}, key=float)
    if not texts:
        return "-"
    return texts[0] if len(texts) == 1 else f"{texts[0]}-{texts[-1]}"


def mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def claim(holds: bool, wording: str) -> str:
    """``wording`` when the files bear it out, else an error naming it: a template's fixed words ("lead
    early", "ahead on every mean") are checked like its numbers, so re-rendering after the files or
    their reading change fails instead of printing a sentence the numbers contradict."""
    if not holds:
        raise ValueError(f"the wording {wording!r} no longer holds for the files; rewrite the sentence")
    return wording


# ------------------------------------------------------------------------------------- summary tables

SUMMARY_MINUTES = (2, 4, 6, 8, 10)


def summary_table(c: Comparison, names: dict[str, str], columns: Iterable[str]) -> str:
    """A markdown table, one row per method of ``names`` (label by method), of the ``columns`` named
    (:data:`SUMMARY_COLUMNS`): the "in short" tables of docs/results.md, from one comparison's files."""
    columns = list(columns)
    unknown = [col for col in columns if col not in SUMMARY_COLUMNS]
    if unknown:
        raise ValueError(f"summary column {unknown[0]!r} unknown; columns: {', '.join(SUMMARY_COLUMNS)}")
    base = c.baseline
    head = ["method", *(SUMMARY_COLUMNS[col][0](c, names) for col in columns)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for method, label in names.items():
        lines.append("| " + " | ".join([label, *(SUMMARY_COLUMNS[col][1](c, method, method == base) for col in columns)]) + " |")
    return "\n".join(lines)


def _signal_cell(key: str, spec: str) -> Callable:
    return lambda c, m, is_base: "-" if c.entry(m)["signal"].get(key) is None else format(c.entry(m)["signal"][key], spec)


def _paired_cell(key: str) -> Callable:
    def cell(c: Comparison, m: str, is_base: bool) -> str:
        if is_base:
            own = mean(c.per_seed(m, key).values())
            return f"({percent(own)}%)"
        d = c.paired(m, c.baseline, key)
        if d.ci95 is None:
            return f"{100 * d.mean:+.1f} ({len(d.seeds)} seed)"
        return paired_text(d) + ("*" if verdict(d) == "resolved" else "")

    return cell


def _steps_to_target_cell(c: Comparison, m: str, is_base: bool) -> str:
    value, base = c.entry(m)["steps_to_target"], c.entry(c.baseline)["steps_to_target"]
    if value is None:
        return "never"
    return f"{value:.0f}" if is_base else f"{value:.0f} ({value / base:.2f}x)"


def _time_to_target_cell(c: Comparison, m: str, is_base: bool) -> str:
    e = c.entry(m)
    value, per_seed = e["time_to_target_seconds"], e["time_to_target_seconds_per_seed"]
    if value is None:
        return "never"
    reached = sum(v is not None for v in per_seed)
    return minutes(value) + ("" if reached == len(per_seed) else f" ({reached} of {len(per_seed)} seeds)")


def _silent_cell(c: Comparison, m: str, is_base: bool) -> str:
    sig = c.entry(m)["signal"]
    if sig.get("revisits_silent") is None:
        return "-"
    text = f"{sig['revisits_silent']:.0%}"
    return text + (f" ({sig['explored_silent']:.0%} / {sig['rest_silent']:.0%})" if sig.get("explored_silent") is not None else "")


def _target_label(c: Comparison, names: dict[str, str]) -> str:
    return f"{100 * c.report['target_fraction']:.0f}% of {names[c.baseline]}'s peak ({percent(c.report['target_accuracy'])}%)"


SUMMARY_COLUMNS: dict[str, tuple[Callable, Callable]] = {
    "rollouts": (lambda c, n: "rollouts / step", _signal_cell("rollouts", ".0f")),
    "groups": (lambda c, n: "groups with a signal / step (of 8)", _signal_cell("groups_with_signal", ".1f")),
    "steps": (lambda c, n: "steps in 10 min", lambda c, m, b: f"{statistics.fmean(c.entry(m)['steps']):.0f}"),
    "per_signal": (lambda c, n: "rollouts / group with a signal", _signal_cell("rollouts_per_signal_group", ".1f")),
    "silent": (lambda c, n: "silent from the 2nd epoch on (explored / the rest)", _silent_cell),
    "at_minutes": (lambda c, n: f"held-out % at {' / '.join(map(str, SUMMARY_MINUTES))} training min",
                   lambda c, m, b: " / ".join(percent(mean(c.accuracy_at(m, 60 * t).values())) for t in SUMMARY_MINUTES)),
    "auc_per_min": (lambda c, n: f"AUC per training min - {n[c.baseline]}, paired", _paired_cell("time_auc")),
    "final": (lambda c, n: f"final (last evaluation) - {n[c.baseline]}, paired", _paired_cell("final_accuracy")),
    "steps_to_target": (lambda c, n: f"steps to {_target_label(c, n)} (x {n[c.baseline]}'s steps)", _steps_to_target_cell),
    "time_to_target": (lambda c, n: f"min to {_target_label(c, n)}", _time_to_target_cell),
}  # fmt: skip
