"""Token entropy, D3S token scores and top-fraction masks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from podsrl.core.logits import entropy_from_logits
from podsrl.core.token_selection import (
    SCORES,
    entropy_top_fraction_mask,
    score_tokens,
    select_tokens,
    selectable,
    token_scores,
    top_fraction_mask,
)


def test_entropy_matches_categorical():
    logits = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(0)) * 3
    expected = torch.distributions.Categorical(logits=logits).entropy()
    got = entropy_from_logits(logits)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_entropy_of_bf16_logits_is_float32():
    logits = (torch.randn(4, 6, 33, generator=torch.Generator().manual_seed(1)) * 2).to(torch.bfloat16)
    expected = torch.distributions.Categorical(logits=logits.float()).entropy()
    got = entropy_from_logits(logits)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])
def test_chunked_equals_unchunked(chunk_size):
    logits = torch.randn(5, 7, 21, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=chunk_size), entropy_from_logits(logits, chunk_size=35))


def test_non_viewable_logits_slice():
    logits = torch.randn(3, 6, 11, generator=torch.Generator().manual_seed(3))
    sliced = logits[:, :-1]  # the usual "drop the last position" slice: not viewable as [P, V]
    torch.testing.assert_close(entropy_from_logits(sliced, chunk_size=4), entropy_from_logits(sliced.contiguous()))


def test_entropy_hand_values_and_masked_vocab():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -torch.inf, 0.0, -torch.inf], [100.0, 0.0, 0.0, 0.0]])
    got = entropy_from_logits(logits)
    torch.testing.assert_close(got[:2], torch.tensor([math.log(4), math.log(2)]))
    assert 0 <= got[2] < 1e-6  # nearly one-hot
    assert torch.isfinite(got).all()


def test_entropy_is_detached():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    assert not entropy_from_logits(logits).requires_grad


def test_token_scores():
    adv = torch.tensor([-2.0, 0.5])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    torch.testing.assert_close(token_scores(adv, entropy), torch.tensor([[2.0, 4.0], [1.5, 2.0]]))
    with pytest.raises(ValueError, match="same N"):
        token_scores(adv, torch.zeros(3, 2))
    per_token = torch.tensor([[-2.0, 1.0], [0.5, 0.0]])  # [N, T] advantages (a TRL subclass's)
    torch.testing.assert_close(token_scores(per_token, entropy), torch.tensor([[2.0, 2.0], [1.5, 0.0]]))


def test_score_rules_by_name():
    adv, entropy = torch.tensor([-2.0, 0.5]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert set(SCORES) == {"adv_entropy", "entropy"}
    torch.testing.assert_close(score_tokens("adv_entropy", adv, entropy), token_scores(adv, entropy))
    torch.testing.assert_close(score_tokens("entropy", adv, entropy), entropy)
    with pytest.raises(ValueError, match="unknown token score 'kl'; valid: adv_entropy, entropy"):
        score_tokens("kl", adv, entropy)


def test_the_budget_is_over_the_rows_with_a_signal():
    """Issue 36: rows of advantage 0 do not count in the budget. Row 0 has a signal and 4 tokens;
    rows 1 and 2 (12 tokens) have A = 0. K = 0.5 keeps ceil(0.5 x 4) = 2 tokens of row 0, the two
    highest-scoring; a budget over all 16 tokens (8) would have kept all 4, whatever the scores."""
    adv = torch.tensor([1.5, 0.0, 0.0])
    entropy = torch.tensor([[0.1, 0.9, 0.4, 0.7, 0.0, 0.0], [2.0] * 6, [3.0] * 6])
    valid = torch.tensor([[True] * 4 + [False] * 2, [True] * 6, [True] * 6])
    assert selectable(valid, adv).tolist() == [[True] * 4 + [False] * 2, [False] * 6, [False] * 6]
    expected = [[False, True, False, True, False, False], [False] * 6, [False] * 6]
    for score in SCORES:  # the 80/20 rule too: row 1 and 2's high entropies are not selectable
        assert select_tokens(adv, entropy, valid, 0.5, score).tolist() == expected
    assert select_tokens(adv, entropy, valid, 1.0).tolist() == selectable(valid, adv).tolist()
    assert not select_tokens(torch.zeros(3), entropy, valid, 0.5).any()  # no signal: nothing to select
    assert selectable(valid.long(), adv).dtype == torch.bool


@settings(max_examples=40, deadline=None)
@given(shape=st.tuples(st.integers(1, 6), st.integers(1, 12)), fraction=st.floats(0.01, 1.0), seed=st.integers(0, 1000))
def test_select_tokens_keeps_the_fraction_of_the_selectable_tokens(shape, fraction, seed):
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randint(-1, 2, (shape[0],), generator=gen).float()  # many rows of advantage 0
    entropy = torch.rand(shape, generator=gen)
    valid = torch.rand(shape, generator=gen) < 0.7
    keep = select_tokens(adv, entropy, valid, fraction)
    eligible = valid & (adv != 0)[:, None]
    assert not (keep & ~eligible).any()
    num = int(eligible.sum())
    assert int(keep.sum()) == (0 if num == 0 else max(1, math.ceil(round(fraction * num, 6))))


def test_top_fraction_hand_example():
    scores = torch.tensor([[5.0, 1.0, 9.0, 3.0], [7.0, 2.0, 8.0, 0.0]])
    valid = torch.tensor([[True, True, True, True], [True, True, False, False]])
    # 6 valid tokens; 0.5 keeps 3: 9, 7, 5 (8 is not valid)
    keep = top_fraction_mask(scores, valid, 0.5)
    assert keep.tolist() == [[True, False, True, False], [True, False, False, False]]
    assert torch.equal(top_fraction_mask(scores, valid, 1.0), valid)
    assert int(top_fraction_mask(scores, valid, 1e-6).sum()) == 1  # at least one
    assert int(top_fraction_mask(scores, valid, 0.34).sum()) == 3  # ceil(2.04)


def test_top_fraction_count_is_robust_to_float_error():
    valid = torch.ones(1, 10, dtype=torch.bool)
    scores = torch.arange(10.0)[None]
    assert int(top_fraction_mask(scores, valid, 0.7).sum()) == 7  # 0.7 * 10 = 7.000000000000001


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 6), st.integers(1, 12)),
    fraction=st.floats(0.01, 1.0),
    seed=st.integers(0, 1000),
)
def test_top_fraction_keeps_the_right_count_of_the_highest(shape, fraction, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, shape, generator=gen).float()  # many ties
    valid = torch.rand(shape, generator=gen) < 0.7
    keep = top_fraction_mask(scores, valid, fraction)
    num_valid = int(valid.sum())
    assert not (keep & ~valid).any()
    expected = 0 if num_valid == 0 else max(1, math.ceil(round(fraction * num_valid, 6)))
    assert int(keep.sum()) == expected
    if 0 < expected < num_valid:
        assert scores[keep].min() >= scores[valid & ~keep].max()


def test_entropy_top_fraction_is_the_entropy_special_case():
    entropy = torch.tensor([[0.1, 2.0, 0.5, 3.0]])
    valid = torch.tensor([[True, True, True, False]])
    assert entropy_top_fraction_mask(entropy, valid, 0.2).tolist() == [[False, True, False, False]]


def test_no_valid_tokens():
    keep = top_fraction_mask(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), 0.5)
    assert not keep.any()


def test_top_fraction_validation():
    scores, valid = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    for fraction in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            top_fraction_mask(scores, valid, fraction)
    with pytest.raises(ValueError, match="bool"):
        top_fraction_mask(scores, torch.ones(2, 3), 0.5)
    with pytest.raises(ValueError, match="shape|\\[N, T\\]"):
        top_fraction_mask(scores, torch.ones(2, 4, dtype=torch.bool), 0.5)
    nan_scores = scores.clone()
    nan_scores[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        top_fraction_mask(nan_scores, valid, 0.5)
