"""Schedules: hand values at p = 0, 0.5, 1 for every kind; rounding of m; validation."""

from __future__ import annotations

import pytest

from podsrl.core.schedules import SCHEDULES, schedule_value, scheduled_m


@pytest.mark.parametrize(
    "kind, at_0, at_half, at_1",
    [
        ("constant", 16.0, 16.0, 16.0),
        ("linear", 16.0, 40.0, 64.0),
        ("cosine", 16.0, 40.0, 64.0),
        ("step", 16.0, 48.0, 64.0),  # 4 pieces: 16, 32, 48, 64; p = 0.5 is the third
    ],
)
def test_hand_values(kind, at_0, at_half, at_1):
    assert schedule_value(kind, 16, 64, 0.0) == pytest.approx(at_0)
    assert schedule_value(kind, 16, 64, 0.5) == pytest.approx(at_half)
    assert schedule_value(kind, 16, 64, 1.0) == pytest.approx(at_1)


def test_cosine_and_step_shapes():
    # cos(pi/4): 64 + (16 - 64) * (1 + 0.7071) / 2
    assert schedule_value("cosine", 16, 64, 0.25) == pytest.approx(64 - 48 * (1 + 2**-0.5) / 2)
    assert schedule_value("step", 0.2, 1.0, 0.24) == pytest.approx(0.2)
    assert schedule_value("step", 0.2, 1.0, 0.25) == pytest.approx(0.2 + 0.8 / 3)
    assert schedule_value("step", 0.2, 1.0, 0.75) == pytest.approx(1.0)
    assert schedule_value("step", 0.0, 1.0, 0.5, num_steps=2) == pytest.approx(1.0)
    assert schedule_value("step", 0.0, 1.0, 0.49, num_steps=2) == pytest.approx(0.0)


def test_linear_is_the_d3s_rule():
    for p in (0.0, 0.1, 0.37, 0.9, 1.0):
        assert schedule_value("linear", 0.2, 1.0, p) == pytest.approx((1 - p) * 0.2 + p * 1.0)


def test_progress_validation_tolerates_float_error():
    assert schedule_value("linear", 0.0, 1.0, 1.0 + 1e-12) == 1.0
    assert schedule_value("linear", 0.0, 1.0, -1e-12) == 0.0
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError, match="progress"):
            schedule_value("linear", 0.0, 1.0, bad)


def test_unknown_kind_lists_kinds():
    with pytest.raises(ValueError, match="cosine"):
        schedule_value("exponential", 0.0, 1.0, 0.5)
    assert set(SCHEDULES) == {"constant", "linear", "cosine", "step"}


def test_step_needs_two_pieces():
    with pytest.raises(ValueError, match="num_steps"):
        schedule_value("step", 0.0, 1.0, 0.5, num_steps=1)


def test_scheduled_m_rounding_and_clamping():
    assert scheduled_m(64, 16, 64, "linear", 0.5) == 40
    assert scheduled_m(64, 16, 64, "linear", 0.0) == 16
    assert scheduled_m(64, 16, 64, "linear", 1.0) == 64
    assert scheduled_m(8, 1, 2, "linear", 0.5) == 2  # 1.5 rounds half up
    assert scheduled_m(8, 2, 3, "linear", 0.5) == 3  # 2.5 rounds half up (not banker's 2)
    assert scheduled_m(8, 2, 3, "linear", 0.49) == 2
    assert scheduled_m(8, 8, 1, "cosine", 1.0) == 1
    assert isinstance(scheduled_m(8, 2, 3, "step", 0.5), int)


def test_scheduled_m_validation():
    with pytest.raises(ValueError, match="m_start"):
        scheduled_m(8, 0, 4, "linear", 0.5)
    with pytest.raises(ValueError, match="m_end"):
        scheduled_m(8, 4, 9, "linear", 0.5)
    with pytest.raises(ValueError, match="n must be"):
        scheduled_m(0, 1, 1, "linear", 0.5)


def test_training_progress_runs_from_the_first_step_to_the_last():
    from podsrl.core.schedules import training_progress

    assert [training_progress(s, 5) for s in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert training_progress(0, 1) == 0.0 and training_progress(3) == 0.0  # one step; no budget
    # A clock budget: 3 steps of 10 s done, 100 s budget -> 30 / (100 - 10); within a mean step: 1.
    assert training_progress(3, seconds=30.0, max_seconds=100.0) == pytest.approx(30 / 90)
    assert training_progress(9, seconds=92.0, max_seconds=100.0) == 1.0
    assert training_progress(0, seconds=0.0, max_seconds=100.0) == 0.0
    assert training_progress(2, 5, seconds=80.0, max_seconds=100.0) == 1.0  # the further of the two
