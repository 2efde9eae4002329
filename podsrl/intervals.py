"""95% intervals, in one place: the normal and Student-t quantiles, Wilson's score interval for a
binomial proportion, the normal interval of a mean, the interval of an accuracy over problems
sampled several times each, and Student-t intervals for a mean and for a paired difference. A leaf: it imports nothing of podsrl's, so the evaluator
(:mod:`podsrl.train.evaluate`) and the comparison report (:mod:`podsrl.compare`) share it.

Choices:

- **z** is ``statistics.NormalDist().inv_cdf(0.975)`` (1.959964...), computed, not typed in.
- **t** comes from a table of t_{0.975, df} for df = 1..30 (three decimals, as printed in every
  statistics textbook; no scipy dependency for thirty numbers) and, above 30, from the
  Cornish-Fisher expansion of the t quantile in 1/df around z, within 1e-3 of the exact value there.
- **Accuracy over problems** (`accuracy_interval`), ``samples`` completions on each of P problems:
  with one, Wilson's interval on the P problems. With several, a problem's samples are correlated
  (a problem the model cannot do is failed by all of them), so the problems are the units: the
  normal interval over the P per-problem means (a cluster interval; its width carries the design
  effect, between 1 for independent samples and ``samples`` for samples that always agree). It is
  widened where needed to contain Wilson's interval on the P x samples completions counted as
  independent, the narrowest a design effect of at least 1 allows: near 0% and 100% the normal
  interval is too short (one right sample of 200 on 50 problems: 0-1.5% alone, 0-2.8% floored).
  When every problem has the same mean (all wrong, all right) there is no spread to estimate the
  design effect from, and the normal interval collapses to a point (it printed "95% CI 0.0-0.0",
  issue 57); the worst case is taken, samples that always agree: Wilson's interval on the P
  problems, the interval one sample per problem gives (0 of 20 problems: 0-16.1%, with any samples).
- **Student-t interval** for the mean of k values: mean +- t_{0.975, k-1} s / sqrt(k), s the sample
  standard deviation (k - 1 in the denominator); none for k < 2 (no spread to estimate). The
  interval is not clipped: a mean of accuracies can get an interval that leaves [0, 1] with few
  values, and callers that draw or print it clip it themselves, saying so.
- **Paired t interval** for mean(a - b) over pairs (a_i, b_i) measured on the same unit (here: the
  same seed, so the same prompt order and the same evaluation problems): the Student-t interval of
  the differences d_i = a_i - b_i, i.e. mean(d) +- t_{0.975, k-1} s_d / sqrt(k). Pairing removes
  what the two share (how lucky that seed's prompt order was), which an unpaired interval counts
  twice.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

Z975 = statistics.NormalDist().inv_cdf(0.975)  # the two-sided 95% normal quantile, 1.959964...

# Two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def t975(df: int) -> float:
    """The two-sided 95% Student-t quantile t_{0.975, df}, df >= 1."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, got {df!r}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z975  # Cornish-Fisher expansion in 1/df; within 1e-3 of the exact quantile for df > 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def wilson_interval(successes: float, total: int, z: float = Z975) -> tuple[float, float]:
    """Wilson's score interval for the proportion successes / total; (0, 1) when total is 0.
    ``successes`` may be fractional (a proportion times the count it is taken over)."""
    if total == 0:
        return 0.0, 1.0
    p = successes / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def normal_interval(values: Sequence[float], low: float = 0.0, high: float = 1.0) -> tuple[float, float]:
    """Normal 95% interval for the mean of ``values`` (mean +- z s / sqrt(n), s with n - 1 in the
    denominator, 0 for one value), clipped to [low, high]: the interval of a mean accuracy over many
    problems, where the normal approximation holds."""
    n = len(values)
    if n == 0:
        raise ValueError("normal_interval: no values")
    mean = sum(values) / n
    var = sum((x - mean) ** 2 for x in values) / max(1, n - 1)
    half = Z975 * math.sqrt(var / n)
    return max(low, mean - half), min(high, mean + half)


def accuracy_interval(correct: Sequence[int], samples: int) -> tuple[float, float]:
    """95% interval for the accuracy sum(correct) / (P x samples), ``correct`` the number of right
    samples on each of P problems (see the module docstring): Wilson's on P problems with one
    sample each or no spread between the problems' means; else the normal interval over the
    problems' means, widened to contain Wilson's on the P x samples completions."""
    problems = len(correct)
    if problems == 0:
        raise ValueError("accuracy_interval: no problems")
    if samples == 1 or len(set(correct)) == 1:  # independent problems, or no spread: the worst case
        return wilson_interval(sum(correct) / samples, problems)
    low, high = normal_interval([c / samples for c in correct])
    floor_low, floor_high = wilson_interval(sum(correct), problems * samples)
    return min(low, floor_low), max(high, floor_high)


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """Student-t 95% interval for the mean of ``values``; None for fewer than two."""
    k = len(values)
    if k < 2:
        return None
    mean = statistics.fmean(values)
    half = t975(k - 1) * statistics.stdev(values) / math.sqrt(k)
    return mean - half, mean + half


def paired_t_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """Paired Student-t 95% interval for mean(a_i - b_i) (pairs by position); None for fewer than
    two pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired_t_interval: {len(a)} values paired with {len(b)}; give one b per a")
    return t_interval([x - y for x, y in zip(a, b)])
