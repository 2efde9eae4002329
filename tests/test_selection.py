"""Selection rules against brute force, a per-group loop reference, and randomness checks."""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from podsrl.core.advantages import group_advantages
from podsrl.core.selection import (
    RULES,
    d3s_cross,
    d3s_intra,
    drop_zero_variance_groups,
    get_rule,
    max_reward,
    max_variance,
    nonzero_variance_groups,
    random_subset,
)


# ----------------------------------------------------------------------------- references


@lru_cache(maxsize=None)
def _combos(n: int, m: int) -> torch.Tensor:
    return torch.tensor(list(combinations(range(n), m)), dtype=torch.long).reshape(-1, m)  # [C, m]


def brute_max_var(values: torch.Tensor, m: int) -> torch.Tensor:
    """[B, n] -> [B] the maximal population variance over all size-m subsets of each row."""
    subsets = values.double()[:, _combos(values.shape[1], m)]  # [B, C, m]
    return subsets.var(dim=-1, unbiased=False).amax(dim=1)


def kept_var(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """[B, n] values, keep with the same count per row -> [B] population variance of kept values."""
    m = int(keep[0].sum())
    return values.double()[keep].view(values.shape[0], m).var(dim=1, unbiased=False)


def loop_max_var(row: list[float], m: int) -> float:
    """PODS Algorithm 2 style: sort, then try every (m - k lowest, k highest) split from scratch."""
    ordered = sorted(row)
    n = len(ordered)
    best = -1.0
    for k in range(m + 1):
        subset = ordered[: m - k] + ordered[n - k :]
        mean = sum(subset) / m
        best = max(best, sum((x - mean) ** 2 for x in subset) / m)
    return best


def draw(kind: str, B: int, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "binary":
        return torch.randint(0, 2, (B, n), generator=gen).float()
    if kind == "integer":
        return torch.randint(-2, 3, (B, n), generator=gen).float()
    if kind == "continuous":
        return torch.randn(B, n, generator=gen)
    if kind == "float64":  # not representable in float32: exercises the two-sort path
        return torch.randn(B, n, generator=gen, dtype=torch.float64) * 1e3 + 1e6
    raise AssertionError(kind)


KINDS = ["binary", "integer", "continuous", "float64"]


# ----------------------------------------------------------------------------- brute force


@pytest.mark.parametrize("kind", KINDS)
def test_max_variance_matches_brute_force_exhaustively(kind):
    gen = torch.Generator().manual_seed(1)
    for n in range(1, 13):
        rewards = draw(kind, 4, n, gen)
        for m in range(1, n + 1):
            keep = max_variance(rewards, m, generator=gen)
            assert (keep.sum(dim=1) == m).all()
            torch.testing.assert_close(kept_var(rewards, keep), brute_max_var(rewards, m), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_d3s_intra_matches_brute_force_on_advantages(kind):
    gen = torch.Generator().manual_seed(2)
    for n in range(1, 13):
        rewards = draw(kind, 4, n, gen)
        for scale_std in (True, False):
            adv = group_advantages(rewards, scale_std=scale_std)
            for m in range(1, n + 1):
                keep = d3s_intra(rewards, m, generator=gen, scale_std=scale_std)
                assert (keep.sum(dim=1) == m).all()
                torch.testing.assert_close(kept_var(adv, keep), brute_max_var(adv, m), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_d3s_cross_matches_brute_force_on_pooled_advantages(kind):
    gen = torch.Generator().manual_seed(3)
    for B in (1, 2, 3):
        for n in range(1, 12 // B + 1):
            rewards = draw(kind, B, n, gen)
            adv = group_advantages(rewards)
            pooled = adv.reshape(1, B * n)
            for m in range(1, n + 1):
                keep = d3s_cross(rewards, m, generator=gen)
                assert int(keep.sum()) == B * m
                got = kept_var(pooled, keep.reshape(1, B * n))
                torch.testing.assert_close(got, brute_max_var(pooled, B * m), rtol=1e-6, atol=1e-9)


def test_d3s_cross_can_keep_unequal_numbers_per_group():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    keep = d3s_cross(rewards, 2, generator=torch.Generator().manual_seed(0))
    assert int(keep.sum()) == 6
    assert keep[1].sum() == 0  # a constant group has all-zero advantages: never the best pick
    # The lone success of group 0 has the most extreme advantage of the pool.
    assert keep[0, 3]


def _rows_and_m(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.integers(1, 12).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(values, min_size=n, max_size=n), min_size=1, max_size=3),
            st.integers(1, n),
        )
    )


@settings(max_examples=60, deadline=None)
@given(
    data=st.one_of(
        _rows_and_m(st.sampled_from([0.0, 1.0])),
        _rows_and_m(st.integers(-3, 3).map(float)),
        _rows_and_m(st.floats(-1e3, 1e3, allow_nan=False, width=32)),
    ),
    seed=st.integers(0, 2**31 - 1),
)
def test_variance_rules_property(data, seed):
    rows, m = data
    rewards = torch.tensor(rows, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    keep = max_variance(rewards, m, generator=gen)
    torch.testing.assert_close(kept_var(rewards, keep), brute_max_var(rewards, m), rtol=1e-6, atol=1e-6)
    adv = group_advantages(rewards)
    keep = d3s_intra(rewards, m, generator=gen)
    torch.testing.assert_close(kept_var(adv, keep), brute_max_var(adv, m), rtol=1e-5, atol=1e-6)
    B, n = rewards.shape
    if B * n > 12:  # brute force over the pooled batch: C(B*n, B*m) subsets, e.g. C(36, 18) ~ 9e9
        return
    keep = d3s_cross(rewards, m, generator=gen)
    pooled = adv.reshape(1, B * n)
    got = kept_var(pooled, keep.reshape(1, B * n))
    torch.testing.assert_close(got, brute_max_var(pooled, B * m), rtol=1e-5, atol=1e-6)


def test_max_variance_matches_per_group_loop_over_many_seeds():
    for seed in range(30):
        gen = torch.Generator().manual_seed(seed)
        n = [8, 16, 32, 64][seed % 4]
        m = 1 + seed % n
        rewards = draw(KINDS[seed % len(KINDS)], 32, n, gen)
        keep = max_variance(rewards, m, generator=gen)
        expected = torch.tensor([loop_max_var(row, m) for row in rewards.double().tolist()], dtype=torch.float64)
        torch.testing.assert_close(kept_var(rewards, keep), expected, rtol=1e-9, atol=1e-9)


def test_max_variance_large_offset_is_exact():
    # Prefix sums of squares would lose these differences without centring.
    gen = torch.Generator().manual_seed(0)
    rewards = 1e9 + torch.randn(64, 16, generator=gen, dtype=torch.float64)
    for m in (2, 5, 8):
        keep = max_variance(rewards, m, generator=gen)
        expected = torch.tensor([loop_max_var((row - 1e9).tolist(), m) for row in rewards], dtype=torch.float64)
        torch.testing.assert_close(kept_var(rewards - 1e9, keep), expected, rtol=1e-6, atol=1e-9)


def test_max_variance_accepts_bf16():
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.25, 1.0, 0.0]], dtype=torch.bfloat16)
    keep = max_variance(rewards, 2)
    assert sorted(rewards[keep].float().tolist()) == [0.0, 1.0]


# ----------------------------------------------------------------------------- counts and rules


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_keeps_b_times_m(name):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (7, 10), generator=gen).float()
    for m in ([10] if name == "all" else [1, 4, 10]):
        keep = get_rule(name)(rewards, m, generator=gen)
        assert keep.dtype == torch.bool and keep.shape == rewards.shape
        assert int(keep.sum()) == 7 * m
        if name != "d3s_cross":
            assert (keep.sum(dim=1) == m).all()


def test_max_reward_keeps_the_largest():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(20, 9, generator=gen)
    keep = max_reward(rewards, 4, generator=gen)
    kept_min = torch.where(keep, rewards, torch.inf).amin(dim=1)
    dropped_max = torch.where(keep, -torch.inf, rewards).amax(dim=1)
    assert (kept_min > dropped_max).all()
    torch.testing.assert_close(torch.where(keep, rewards, 0.0).sum(1), rewards.topk(4, dim=1).values.sum(1))


def test_all_rule_keeps_everything():
    rewards = torch.zeros(3, 5)
    assert get_rule("all")(rewards, 5).all()


def _chi_square(counts: torch.Tensor) -> float:
    expected = counts.sum() / counts.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def test_random_rule_is_uniform_over_positions():
    rewards = torch.arange(8.0).repeat(4000, 1)
    keep = random_subset(rewards, 3, generator=torch.Generator().manual_seed(0))
    counts = keep.sum(dim=0).double()  # expected 1500 each
    assert _chi_square(counts) < 30  # 7 dof: p ~ 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rule", [max_variance, d3s_intra, d3s_cross, max_reward])
def test_ties_are_broken_uniformly_not_by_position(rule, dtype):
    # 0.3 / 0.1 are not exact in float32: float64 takes the two-sort path.
    row = torch.tensor([0.3, 0.3, 0.3, 0.3, 0.1, 0.1, 0.1, 0.1], dtype=dtype)
    rewards = row.repeat(4000, 1)
    keep = rule(rewards, 2, generator=torch.Generator().manual_seed(0))
    counts = keep.sum(dim=0).double()
    for block in (counts[:4], counts[4:]):
        if block.sum() > 0:
            assert (block > 0).all()
            assert _chi_square(block) < 25  # 3 dof: p ~ 1e-5
    if rule is max_variance:  # one success and one failure per group
        assert counts[:4].sum() == counts[4:].sum() == 4000


def test_equally_good_splits_are_chosen_at_random():
    # m = 3 of 4 successes and 4 failures: keeping 2+1 or 1+2 has the same variance.
    rewards = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0]).repeat(2000, 1)
    keep = max_variance(rewards, 3, generator=torch.Generator().manual_seed(0))
    successes = keep[:, :4].sum(dim=1)
    assert set(successes.tolist()) == {1, 2}
    assert 0.4 < float((successes == 2).double().mean()) < 0.6


def test_generator_makes_selection_reproducible():
    rewards = torch.randint(0, 2, (16, 12), generator=torch.Generator().manual_seed(0)).float()
    for name in ["random", "max_reward", "max_variance", "d3s_intra", "d3s_cross"]:
        rule = get_rule(name)
        a = rule(rewards, 4, generator=torch.Generator().manual_seed(5))
        b = rule(rewards, 4, generator=torch.Generator().manual_seed(5))
        c = rule(rewards, 4, generator=torch.Generator().manual_seed(6))
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_negative_and_signed_zero_rewards_sort_correctly():
    tiny = 2.0**-100
    rewards = torch.tensor([[-0.0, 0.0, -1.5, 2.0, -3.0, tiny, -tiny]])
    keep = max_reward(rewards, 3)
    assert sorted(rewards[keep].tolist()) == [0.0, tiny, 2.0]
    keep = max_reward(-rewards, 3)
    assert sorted((-rewards)[keep].tolist()) == [tiny, 1.5, 3.0]
    keep = max_variance(rewards, 2)
    assert sorted(rewards[keep].tolist()) == [-3.0, 2.0]


# ----------------------------------------------------------------------------- DAPO filter


def test_zero_variance_filter():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.5]])
    assert nonzero_variance_groups(rewards).tolist() == [False, True, False]
    keep = torch.ones(3, 3, dtype=torch.bool)
    assert drop_zero_variance_groups(keep, rewards).tolist() == [[False] * 3, [True] * 3, [False] * 3]


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", sorted(RULES))
def test_bad_inputs_raise(name):
    rule = get_rule(name)
    good = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="2-D"):
        rule(torch.zeros(4), 4)
    with pytest.raises(ValueError, match="floating"):
        rule(torch.zeros(2, 4, dtype=torch.long), 4)
    bad = good.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="group 1, rollout 2"):
        rule(bad, 4)
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="finite"):
        rule(bad, 4)
    with pytest.raises(ValueError, match="m must be >= 1"):
        rule(good, 0)
    with pytest.raises(ValueError, match="m must be <= n"):
        rule(good, 5)
    with pytest.raises(ValueError, match="integer"):
        rule(good, 2.5)


def test_all_rule_requires_m_equal_n():
    with pytest.raises(ValueError, match="m must equal n"):
        get_rule("all")(torch.zeros(2, 4), 2)


def test_d3s_cross_message_mentions_pool():
    with pytest.raises(ValueError, match="B\\*m"):
        d3s_cross(torch.zeros(2, 4), 5)


def test_unknown_rule_lists_valid_names():
    with pytest.raises(ValueError, match="max_variance"):
        get_rule("max_varience")


def test_filter_validates_keep():
    with pytest.raises(ValueError, match="bool"):
        drop_zero_variance_groups(torch.ones(2, 3), torch.zeros(2, 3))
