"""Report math, pure: lists of eval rows in, numbers out (seed-mean curves on either axis, peaks,
first points at a target, Student-t intervals).

An eval row is one line of a run's eval.jsonl: ``step``, ``train_seconds``, ``accuracy`` (and
``ci_low``/``ci_high``, its Wilson interval). A curve is read on one of two axes (:data:`AXES`):
optimizer steps or training wall-clock seconds (evaluation excluded).
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass

AXES = ("step", "train_seconds")  # x of a curve: optimizer steps, training wall-clock seconds

# Two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30 (no scipy dependency).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


@dataclass
class Curve:
    """A method's seed-mean accuracy curve at common points of one axis."""

    x: list[float]  # [P] the axis: optimizer steps or training seconds (seed means when aligned by index)
    accuracy: list[float]  # [P] mean over seeds
    per_seed: list[list[float]]  # [S][P] each seed's accuracy at the points
    band_low: list[float]  # [P] 95% band: t over seeds, or the run's Wilson interval for one seed
    band_high: list[float]  # [P]
    aligned_by: str  # "index" or "interpolation"
    axis: str = "train_seconds"  # one of AXES


def t_interval(values: list[float]) -> tuple[float, float] | None:
    """95% Student-t interval for the mean of ``values``; None for fewer than two."""
    k = len(values)
    if k < 2:
        return None
    mean = statistics.fmean(values)
    half = _t975(k - 1) * statistics.stdev(values) / math.sqrt(k)
    return mean - half, mean + half


def _t975(df: int) -> float:
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion in 1/df; within 1e-3 of the exact quantile for df > 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


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
        per_seed = [_interp(xs, [row[axis] for row in r], [row["accuracy"] for row in r]) for r in runs]
        aligned = "interpolation"
    mean = [statistics.fmean(col) for col in zip(*per_seed)]
    bands = [t_interval(list(col)) for col in zip(*per_seed)]
    return Curve(xs, mean, per_seed, [b[0] for b in bands], [b[1] for b in bands], aligned, axis)


def _interp(x: list[float], xp: list[float], fp: list[float]) -> list[float]:
    """Piecewise-linear interpolation of (xp, fp) at x; xp ascending, ends held constant."""
    out = []
    for t in x:
        j = bisect.bisect_right(xp, t)  # xp[j-1] <= t < xp[j]
        if j == 0:
            out.append(fp[0])
        elif j == len(xp):
            out.append(fp[-1])
        else:
            w = (t - xp[j - 1]) / (xp[j] - xp[j - 1])
            out.append(fp[j - 1] + w * (fp[j] - fp[j - 1]))
    return out


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


def speedup(baseline_x: float | None, method_x: float | None) -> float | None:
    """Baseline's steps or time to the target over the method's; None when either is missing or zero."""
    if baseline_x is None or method_x is None or baseline_x <= 0 or method_x <= 0:
        return None
    return baseline_x / method_x
