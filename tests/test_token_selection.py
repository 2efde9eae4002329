"""Token entropy, D3S token scores and top-fraction masks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from podsrl.core.logits import entropy_from_logits
from podsrl.core.token_selection import entropy_top_fraction_mask, token_scores, top_fraction_mask


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
