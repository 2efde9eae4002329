"""Schedules: a value that moves from ``start`` to ``end`` as training progress p goes 0 -> 1.

D3S (Wang et al.; arXiv 2509.22115, dynamic down-sampling schedule) anneals the number of kept
rollouts N and the kept token fraction K linearly,

    (N, K)(p) = (1 - p) * (N_init, K_init) + p * (N_final, K_final),

aggressive down-sampling early, relaxed towards full data later. ``constant``, ``cosine`` and
``step`` are the other natural shapes. All kinds share the signature
``f(start, end, progress, num_steps) -> float`` and are chosen by name from :data:`SCHEDULES`.

Choices made where the paper is silent:

- progress outside [0, 1] is an error (a float error of up to 1e-9 is tolerated and clamped),
  so a wrong progress computation in a trainer fails loudly instead of extrapolating.
- ``cosine``: end + (start - end) * (1 + cos(pi * p)) / 2 (half a cosine, flat at both ends).
- ``step``: ``num_steps`` equal pieces of progress, the value of piece i being
  start + (end - start) * i / (num_steps - 1): start on the first piece, end on the last
  (reached at p = (num_steps - 1) / num_steps). Needs num_steps >= 2.
- :func:`scheduled_m` rounds to the nearest integer, halves up (floor(x + 0.5), not Python's
  banker's rounding), then clamps to [1, n].
- **Progress** (:func:`training_progress`, the one rule every trainer uses): the step about to be
  taken over the last step's index, so the first step has 0 and the last one 1 and the schedules
  reach their final values (``step / max_steps`` would stop at (N - 1) / N). With a wall-clock
  budget instead, the training clock over the budget less one mean step (a step that starts within
  a mean step of the budget is expected to be the last); with both, the further of the two.
"""

from __future__ import annotations

import math
from typing import Callable

__all__ = ["Schedule", "SCHEDULES", "schedule_value", "scheduled_m", "training_progress"]

Schedule = Callable[[float, float, float, int], float]

_PROGRESS_TOL = 1e-9


def _constant(start: float, end: float, progress: float, num_steps: int) -> float:
    return start


def _linear(start: float, end: float, progress: float, num_steps: int) -> float:
    return (1.0 - progress) * start + progress * end


def _cosine(start: float, end: float, progress: float, num_steps: int) -> float:
    return end + (start - end) * (1.0 + math.cos(math.pi * progress)) / 2.0


def _step(start: float, end: float, progress: float, num_steps: int) -> float:
    if num_steps < 2:
        raise ValueError(f"the step schedule needs num_steps >= 2 (use 'constant' for one value), got {num_steps}")
    piece = min(int(progress * num_steps), num_steps - 1)
    return start + (end - start) * piece / (num_steps - 1)


SCHEDULES: dict[str, Schedule] = {
    "constant": _constant,
    "linear": _linear,
    "cosine": _cosine,
    "step": _step,
}


def schedule_value(kind: str, start: float, end: float, progress: float, *, num_steps: int = 4) -> float:
    """The value of schedule ``kind`` going from ``start`` (p = 0) to ``end`` (p = 1) at ``progress``."""
    try:
        schedule = SCHEDULES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown schedule {kind!r}; valid schedules: {', '.join(SCHEDULES)}") from None
    if not math.isfinite(progress) or not -_PROGRESS_TOL <= progress <= 1.0 + _PROGRESS_TOL:
        raise ValueError(f"progress must be in [0, 1], got {progress!r}")
    progress = min(max(float(progress), 0.0), 1.0)
    return float(schedule(float(start), float(end), progress, int(num_steps)))


def scheduled_m(n: int, m_start: int, m_end: int, kind: str, progress: float, *, num_steps: int = 4) -> int:
    """Rollouts kept per group at ``progress``: the schedule rounded half up, clamped to [1, n]."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for name, m in (("m_start", m_start), ("m_end", m_end)):
        if not 1 <= m <= n:
            raise ValueError(f"{name} must be in [1, n={n}], got {m}")
    value = schedule_value(kind, m_start, m_end, progress, num_steps=num_steps)
    return min(max(math.floor(value + 0.5), 1), n)


def training_progress(step: int, max_steps: int | None = None, *, seconds: float = 0.0, max_seconds: float | None = None) -> float:
    """Progress in [0, 1] of the step about to be taken (``step`` steps done, ``seconds`` of training
    so far): step / (max_steps - 1), and / or seconds / (max_seconds - seconds / step); the further
    of the budgets given (module docstring). No budget, or one step: 0."""
    parts = [0.0]
    if max_steps:
        parts.append(step / (max_steps - 1) if max_steps > 1 else 0.0)
    if max_seconds and step > 0:
        left = max_seconds - seconds / step  # the last step starts by then
        parts.append(seconds / left if left > 0 else 1.0)
    return min(1.0, max(parts))
