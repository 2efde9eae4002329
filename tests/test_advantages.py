"""Group advantages: hand-computed values, degenerate groups, validation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from podsrl.core.advantages import group_advantages

S3 = math.sqrt(3.0)


def test_full_group_hand_values():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    # mean 0.5; sample std sqrt(1/3); population std 0.5
    expected_sample = torch.tensor([[1.0, -1.0, -1.0, 1.0]]) * 0.5 * S3
    torch.testing.assert_close(group_advantages(rewards), expected_sample)
    torch.testing.assert_close(group_advantages(rewards, unbiased=False), torch.tensor([[1.0, -1.0, -1.0, 1.0]]))
    torch.testing.assert_close(group_advantages(rewards, scale_std=False), torch.tensor([[0.5, -0.5, -0.5, 0.5]]))


def test_kept_subset_hand_values():
    rewards = torch.tensor([[3.0, 1.0, 2.0, 0.0], [4.0, 0.0, 2.0, 9.0]])
    keep = torch.tensor([[True, True, False, False], [True, True, True, False]])
    # Row 0: S = {3, 1}, mean 2, sample std sqrt(2). Row 1: S = {4, 0, 2}, mean 2, sample std 2.
    expected = torch.tensor([[1 / math.sqrt(2), -1 / math.sqrt(2), 0.0, 0.0], [1.0, -1.0, 0.0, 0.0]])
    torch.testing.assert_close(group_advantages(rewards, keep), expected)
    # Population std: row 0 std 1, row 1 std sqrt(8/3).
    expected_pop = torch.tensor([[1.0, -1.0, 0.0, 0.0], [2 / math.sqrt(8 / 3), -2 / math.sqrt(8 / 3), 0.0, 0.0]])
    torch.testing.assert_close(group_advantages(rewards, keep, unbiased=False), expected_pop)
    expected_dr = torch.tensor([[1.0, -1.0, 0.0, 0.0], [2.0, -2.0, 0.0, 0.0]])
    torch.testing.assert_close(group_advantages(rewards, keep, scale_std=False), expected_dr)


def test_pods_renormalises_over_subset_not_full_group():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]])
    keep = torch.tensor([[True, False, False, True, True, True]])
    adv = group_advantages(rewards, keep)
    full = group_advantages(rewards)
    assert not torch.allclose(adv[keep], full[keep])
    kept = adv[keep]
    torch.testing.assert_close(kept.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(kept.std(), torch.tensor(1.0))


@pytest.mark.parametrize("scale_std", [True, False])
@pytest.mark.parametrize("unbiased", [True, False])
def test_degenerate_groups_give_zero_never_nan(scale_std, unbiased):
    rewards = torch.tensor(
        [
            [0.1, 0.1, 0.1, 0.1],  # constant, and 0.1 is inexact: r - mean may round to non-zero
            [1.0, 0.0, 1.0, 0.0],  # only one kept
            [5.0, 6.0, 7.0, 8.0],  # none kept
            [2.0, 2.0, 3.0, 9.0],  # kept subset constant
        ]
    )
    keep = torch.tensor(
        [[True, True, True, True], [False, True, False, False], [False] * 4, [True, True, False, False]]
    )
    adv = group_advantages(rewards, keep, scale_std=scale_std, unbiased=unbiased)
    assert torch.equal(adv, torch.zeros_like(adv))
    adv = group_advantages(torch.full((3, 7), 0.7), scale_std=scale_std, unbiased=unbiased)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_single_rollout_groups():
    adv = group_advantages(torch.tensor([[1.0], [0.0]]))
    assert torch.equal(adv, torch.zeros(2, 1))


def test_tiny_spread_is_not_inflated_by_epsilon():
    # std + 1e-4 in the denominator would give about +-0.005; the exact population std gives +-1.
    rewards = torch.tensor([[0.0, 1e-6]], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(rewards, unbiased=False), torch.tensor([[-1.0, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize("std_over", ["group", "batch"])
def test_spread_below_float32_square_range_stays_finite(std_over):
    # (1e-30)^2 underflows to 0 in float32: squaring r - mean directly divided by a zero std (inf).
    rewards = torch.tensor([[0.0, 1e-30], [0.0, 1e-30]])
    adv = group_advantages(rewards, unbiased=False, std_over=std_over)
    torch.testing.assert_close(adv, torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]))  # population std over either scope
    torch.testing.assert_close(adv, group_advantages(rewards.double(), unbiased=False, std_over=std_over).float())


def test_dtype_is_preserved():
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        assert group_advantages(torch.tensor([[0.0, 1.0]], dtype=dtype)).dtype == dtype


@settings(max_examples=50, deadline=None)
@given(
    rows=st.integers(2, 10).flatmap(
        lambda n: st.lists(st.lists(st.floats(-100, 100, width=32), min_size=n, max_size=n), min_size=1, max_size=4)
    )
)
def test_informative_groups_are_standardised(rows):
    rewards = torch.tensor(rows, dtype=torch.float64)
    adv = group_advantages(rewards)
    for r, a in zip(rewards, adv):
        if r.max() == r.min():
            assert (a == 0).all()
        else:
            torch.testing.assert_close(a.mean(), torch.tensor(0.0, dtype=torch.float64), atol=1e-9, rtol=0)
            torch.testing.assert_close(a.std(), torch.tensor(1.0, dtype=torch.float64))
            torch.testing.assert_close(a * r.std() + r.mean(), r)


def test_validation():
    with pytest.raises(ValueError, match="2-D"):
        group_advantages(torch.zeros(3))
    with pytest.raises(ValueError, match="floating"):
        group_advantages(torch.zeros(2, 3, dtype=torch.int64))
    bad = torch.zeros(2, 3)
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="group 0, rollout 1"):
        group_advantages(bad)
    with pytest.raises(ValueError, match="bool"):
        group_advantages(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="shape"):
        group_advantages(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
