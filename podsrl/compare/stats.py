"""Report math, pure: lists of eval rows in, numbers out (seed-mean curves on either axis, peaks,
first points at a target, the robust summaries of a run and paired differences between methods).
The intervals themselves are :mod:`podsrl.intervals`'.

An eval row is one line of a run's eval.jsonl: ``step``, ``train_seconds``, ``accuracy`` (and
``ci_low``/``ci_high``, its Wilson interval). A curve is read on one of two axes (:data:`AXES`):
optimizer steps or training wall-clock seconds (evaluation excluded).

**At the budget.** Every arm is read at the same training time: a run's evaluations after the budget
(a last step that ended past ``train.max_seconds``, as runs did before they stopped within it) are
left out of everything (:func:`within_budget`), so a run's accuracy "at the budget" is its last
evaluation at or before it, and the AUC per training minute covers [0, budget].

**Ratios.** One convention: a method's steps or time to a target as a fraction of the reference's
(:func:`fraction`; 0.61: in 61% of the baseline's time). Reports before issue 68 kept the inverse,
``speedup`` (the baseline's over the method's).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from podsrl.intervals import paired_t_interval, t_interval

AXES = ("step", "train_seconds")  # x of a curve: optimizer steps, training wall-clock seconds
# compare.json signal zero_variance_groups_start: over the first 5 steps (40 groups at B = 8), not 1 (8)
SIGNAL_START_STEPS = 5


@dataclass
class Curve:
    """A method's seed-mean accuracy curve at common points of one axis."""

    x: list[float]  # [P] the axis: optimizer steps or training seconds (seed means when aligned by index)
    accuracy: list[float]  # [P] mean over seeds
    per_seed: list[list[float]]  # [S][P] each seed's accuracy at the points
    band_low: list[float]  # [P] 95% band: t over seeds, or the run's own interval (eval.jsonl's ci_low) for one seed
    band_high: list[float]  # [P]
    aligned_by: str  # "index" or "interpolation"
    axis: str = "train_seconds"  # one of AXES


def aligned_by_index(runs: list[list[dict]], *, time_based_eval: bool) -> bool:
    """Whether the seeds' i-th evaluations are the same point of training: all seeds have as many
    evaluations, and either evaluation is time-based (evaluation i happens at about i x
    every_seconds in every seed) or the seeds evaluated at exactly the same steps."""
    if len({len(r) for r in runs}) != 1:
        return False
    return time_based_eval or len({tuple(row["step"] for row in r) for r in runs}) == 1


def mean_curve(runs: list[list[dict]], *, time_based_eval: bool, axis: str = "train_seconds") -> Curve:
    """Seed-mean of eval.jsonl rows on ``axis`` ("step" or "train_seconds"). Aligned by index when
    :func:`aligned_by_index` (x: the seeds' mean at each index, so both axes share their points),
    else every seed is linearly interpolated onto the union of the seeds' x within their common
    range (no extrapolation)."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
    runs = [sorted(r, key=lambda row: row["train_seconds"]) for r in runs if r]
    if not runs:
        return Curve([], [], [], [], [], "index", axis)
    if len(runs) == 1:
        rows = runs[0]
        acc = [r["accuracy"] for r in rows]
        return Curve([r[axis] for r in rows], acc, [acc],
                     [r.get("ci_low", a) for r, a in zip(rows, acc)], [r.get("ci_high", a) for r, a in zip(rows, acc)], "index", axis)  # fmt: skip
    if aligned_by_index(runs, time_based_eval=time_based_eval):
        xs = [statistics.fmean(r[i][axis] for r in runs) for i in range(len(runs[0]))]
        per_seed = [[row["accuracy"] for row in r] for r in runs]
        aligned = "index"
    else:
        lo = max(r[0][axis] for r in runs)
        hi = min(r[-1][axis] for r in runs)
        xs = sorted({row[axis] for r in runs for row in r if lo <= row[axis] <= hi})
        # np.interp holds the ends constant; xs lies inside every seed's range, so it never has to.
        per_seed = [np.interp(xs, [row[axis] for row in r], [row["accuracy"] for row in r]).tolist() for r in runs]
        aligned = "interpolation"
    mean = [statistics.fmean(col) for col in zip(*per_seed)]
    bands = [t_interval(list(col)) for col in zip(*per_seed)]
    return Curve(xs, mean, per_seed, [b[0] for b in bands], [b[1] for b in bands], aligned, axis)


def peak(curve: Curve) -> tuple[int, float] | None:
    """(index, accuracy) of the curve's maximum (the first, if tied); None for an empty curve."""
    if not curve.accuracy:
        return None
    i = max(range(len(curve.accuracy)), key=lambda j: (curve.accuracy[j], -j))
    return i, curve.accuracy[i]


def first_reach(curve: Curve, target: float) -> float | None:
    """x (step or training seconds) of the first point of the mean curve at or above ``target``,
    not interpolated between evaluations; None if never."""
    for x, acc in zip(curve.x, curve.accuracy):
        if acc >= target - 1e-12:
            return x
    return None


def seed_first_reach(rows: list[dict], target: float, axis: str) -> float | None:
    """The same on one run's own evaluations (eval.jsonl rows)."""
    for row in sorted(rows, key=lambda r: r["train_seconds"]):
        if row["accuracy"] >= target - 1e-12:
            return row[axis]
    return None


def fraction(method_x: float | None, reference_x: float | None) -> float | None:
    """The method's steps or time to a target as a fraction of the reference's (the baseline's):
    0.5 reaches it in half the reference's time. None when either is missing or zero (a target met
    before training says nothing)."""
    if reference_x is None or method_x is None or reference_x <= 0 or method_x <= 0:
        return None
    return method_x / reference_x


def within_budget(rows: list[dict], max_seconds: float | None, max_steps: int | None) -> tuple[list[dict], list[dict]]:
    """(the run's evaluations at or before the budget, those after it), each in the order given: an
    evaluation after ``max_seconds`` of training or ``max_steps`` steps came from training no other
    run had."""
    def inside(row: dict) -> bool:
        return (not max_seconds or row["train_seconds"] <= max_seconds) and (not max_steps or row["step"] <= max_steps)

    return [r for r in rows if inside(r)], [r for r in rows if not inside(r)]


# ----------------------------------------------------------------------------------- robust summaries


def auc(rows: list[dict]) -> float | None:
    """The run's area under its accuracy-vs-step curve, as the mean held-out accuracy over its
    evaluations after step 0 (None if it has none). With evaluations every k steps up to the
    budget this is the right-endpoint Riemann sum of the curve divided by the budget; unlike the
    first step at a threshold it uses every evaluation, so one lucky or unlucky point on a plateau
    moves it by 1/(number of evaluations) of its size, not by a whole evaluation interval."""
    after = [row["accuracy"] for row in rows if row["step"] > 0]
    return statistics.fmean(after) if after else None


def value_at(xs: list[float], ys: list[float], x: float) -> float | None:
    """A curve's value at ``x``, linear between its points; None outside [xs[0], xs[-1]] (no extrapolation)."""
    if not xs or not xs[0] - 1e-9 <= x <= xs[-1] + 1e-9:
        return None
    return float(np.interp(x, xs, ys))


def time_auc(train_seconds: list[float], accuracy: list[float], horizon: float) -> float | None:
    """The wall-clock AUC: the run's mean held-out accuracy over its first ``horizon`` seconds of
    training (evaluation excluded), i.e. the area under its accuracy-vs-training-time curve up to the
    horizon, per second of it. The curve runs straight between evaluations (trapezoids), holds its
    first value back to time 0 and its last one past its last evaluation. A method whose steps are
    cheaper gets further in the same minutes: this is AUC per training minute, the time axis's
    counterpart of :func:`auc`. None without evaluations or with a horizon <= 0."""
    if not train_seconds or horizon <= 0:
        return None
    points = sorted(zip(train_seconds, accuracy))
    if points[0][0] > 0:
        points.insert(0, (0.0, points[0][1]))
    if points[-1][0] < horizon:
        points.append((horizon, points[-1][1]))
    area = 0.0
    for (t0, a0), (t1, a1) in zip(points, points[1:]):
        if t0 >= horizon:
            break
        if t1 > horizon:  # cut the last piece at the horizon
            a1, t1 = a0 + (a1 - a0) * (horizon - t0) / (t1 - t0), horizon
        area += (t1 - t0) * (a0 + a1) / 2
    return area / horizon


def final_accuracy(rows: list[dict]) -> float | None:
    """Held-out accuracy at the run's last evaluation of ``rows`` (the report passes those at or
    before the budget, :func:`within_budget`: the accuracy at the budget)."""
    if not rows:
        return None
    return max(rows, key=lambda row: (row["step"], row["train_seconds"]))["accuracy"]


@dataclass
class Summary:
    """A per-seed quantity of one method over its seeds: the mean and its 95% Student-t interval."""

    seeds: list[int]  # [k] seed indices
    per_seed: list[float]  # [k]
    mean: float | None
    ci95: tuple[float, float] | None  # None for fewer than two seeds

    def excludes_zero(self) -> bool | None:
        """Whether the interval lies wholly above or below 0; None without an interval."""
        if self.ci95 is None:
            return None
        return self.ci95[0] > 0 or self.ci95[1] < 0

    def to_json(self) -> dict[str, Any]:
        """As compare.json keeps it: mean, ci95 (a list or None), excludes_zero, seeds, per_seed."""
        return {"mean": self.mean, "ci95": list(self.ci95) if self.ci95 else None, "excludes_zero": self.excludes_zero(),
                "seeds": self.seeds, "per_seed": self.per_seed}  # fmt: skip


def summarize(by_seed: dict[int, float | None]) -> Summary:
    """Mean and t-interval over the seeds with a value."""
    seeds = sorted(s for s, v in by_seed.items() if v is not None)
    values = [by_seed[s] for s in seeds]
    return Summary(seeds, values, statistics.fmean(values) if values else None, t_interval(values))


def paired_difference(method: dict[int, float | None], baseline: dict[int, float | None]) -> Summary:
    """Method minus baseline seed by seed, over the seeds both have; the interval is the paired
    t-interval, mean(d) +- t_{0.975, k-1} s_d / sqrt(k) (:func:`podsrl.intervals.paired_t_interval`)."""
    seeds = sorted({s for s, v in method.items() if v is not None} & {s for s, v in baseline.items() if v is not None})
    a, b = [method[s] for s in seeds], [baseline[s] for s in seeds]
    diffs = [x - y for x, y in zip(a, b)]
    return Summary(seeds, diffs, statistics.fmean(diffs) if diffs else None, paired_t_interval(a, b))
