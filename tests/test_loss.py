"""Policy loss: hand-computed values, gradients against a loop reference, micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

from float_bounds import U32, sum_bound
from podsrl.core.loss import AGGREGATIONS, BatchCounts, LossMetrics, LossSettings, clipped_surrogate, k3_kl, policy_loss, token_ratio


def loss_of(logprobs, old, adv, mask, *, token_mask=None, ref_logprobs=None, total_sequences=None, total_tokens=None, **settings):
    """policy_loss with the settings and the batch counts as flat keywords; the aggregation, where
    not given, GRPO's ``sequence`` (the hand values below; podsrl's default is ``token``)."""
    settings.setdefault("aggregation", "sequence")
    batch = None if total_sequences is None and total_tokens is None else BatchCounts(
        sequences=logprobs.shape[0] if total_sequences is None else total_sequences,
        tokens=int(mask.sum()) if total_tokens is None else total_tokens,
    )
    return policy_loss(logprobs, old, adv, mask, LossSettings(**settings), token_mask=token_mask, ref_logprobs=ref_logprobs, batch=batch)

# Ratios rho (old log-probs 0), advantages and mask of a tiny hand-computed example.
RATIOS = [[1.0, 1.5, 0.5], [1.1, 0.7, 1.0]]
ADVANTAGES = [1.0, -2.0]
MASK = [[True, True, True], [True, True, False]]
# Per-token objectives with eps = 0.2:
#   seq 0 (A = 1):  rho 1 -> 1;  rho 1.5 -> min(1.5, 1.2) = 1.2 (high clip);  rho 0.5 -> min(0.5, 0.8) = 0.5
#   seq 1 (A = -2): rho 1.1 -> -2.2;  rho 0.7 -> min(-1.4, -1.6) = -1.6 (low clip);  third masked
# Sums 2.7 and -3.8 over 3 and 2 tokens.


def _atol(*terms: float) -> float:
    """The float32 error a hand value's computation can have: each term's ratio exp(log rho) rounded
    twice (the log, the exp: 2 U32 of the term each), and the sum of the terms in any order."""
    return sum_bound(terms) + 4 * U32 * sum(abs(t) for t in terms)


K3 = math.exp(0.1) - 1.1
# k3 = e^d - d - 1 at d = 0.1 cancels: its float32 error is U32 of e^d + d + 1 per rounding (d itself
# from ref - logp, rounded at |log rho| + 0.1 <= 0.8; exp within 2 U32; two subtractions), a relative
# error of the small result ~0.005 far above U32.
K3_ATOL = U32 * (2 * math.exp(0.1) + 2 * (math.exp(0.1) + 1.1) + 2 * 0.8 * math.exp(0.1))


def _example(requires_grad: bool = False):
    logprobs = torch.tensor(RATIOS).log().requires_grad_(requires_grad)
    return logprobs, torch.zeros(2, 3), torch.tensor(ADVANTAGES), torch.tensor(MASK)


@pytest.mark.parametrize(
    "aggregation, kwargs, expected",
    [
        ("sequence", {}, -(2.7 / 3 - 3.8 / 2) / 2),  # 0.5
        ("token", {}, -(2.7 - 3.8) / 5),  # 0.22
        ("constant", {"max_completion_len": 4}, -(2.7 - 3.8) / (2 * 4)),  # 0.1375
    ],
)
def test_hand_computed_aggregations(aggregation, kwargs, expected):
    loss, metrics = loss_of(*_example(), aggregation=aggregation, **kwargs)
    per_token = {"sequence": [1.0 / 6, 1.2 / 6, 0.5 / 6, 2.2 / 4, 1.6 / 4], "token": [t / 5 for t in (1.0, 1.2, 0.5, 2.2, 1.6)],
                 "constant": [t / 8 for t in (1.0, 1.2, 0.5, 2.2, 1.6)]}[aggregation]  # fmt: skip
    atol = _atol(*per_token)
    assert loss.item() == pytest.approx(expected, rel=0, abs=atol)
    assert metrics.pg_loss == pytest.approx(expected, rel=0, abs=atol)
    assert metrics.clip_frac_low == pytest.approx(0.2)
    assert metrics.clip_frac_high == pytest.approx(0.2)
    assert metrics.ratio_mean == pytest.approx((1 + 1.5 + 0.5 + 1.1 + 0.7) / 5)
    assert metrics.tokens == 5
    assert metrics.kl is None



def test_the_default_aggregation_is_the_trainer_s_and_the_field_s():
    """``token`` (DAPO; TRL's "dapo", verl's "token-mean") in the library and the trainer's config alike (issue 67)."""
    from podsrl.config import LossConfig

    assert LossSettings().aggregation == LossConfig().aggregation == "token"

def test_asymmetric_clipping():
    # eps_high = 0.6: rho 1.5 is no longer clipped -> seq 0 sums 3.0
    loss, metrics = loss_of(*_example(), eps_high=0.6, aggregation="token")
    assert loss.item() == pytest.approx(-(3.0 - 3.8) / 5, rel=0, abs=_atol(1.0 / 5, 1.5 / 5, 0.5 / 5, 2.2 / 5, 1.6 / 5))
    assert metrics.clip_frac_high == 0.0
    assert metrics.clip_frac_low == pytest.approx(0.2)


def test_token_mask_keeps_the_sequence_lengths():
    """The mask picks the policy-gradient tokens; |o_i| stays every completion token (80/20 paper)."""
    token_mask = torch.tensor([[True, False, True], [False, True, True]])
    # in the pg term: seq 0 tokens 0, 2 (1 + 0.5 = 1.5, over its 3 tokens); seq 1 token 1 (-1.6, over 2)
    loss, metrics = loss_of(*_example(), token_mask=token_mask)
    assert loss.item() == pytest.approx(-(1.5 / 3 - 1.6 / 2) / 2, rel=0, abs=_atol(1.0 / 6, 0.5 / 6, 1.6 / 4))
    assert metrics.tokens == 3 and metrics.completion_tokens == 5
    loss, _ = loss_of(*_example(), token_mask=token_mask, aggregation="token")
    assert loss.item() == pytest.approx(-(1.5 - 1.6) / 5, rel=0, abs=_atol(1.0 / 5, 0.5 / 5, 1.6 / 5))


def test_sequence_without_selected_tokens_still_counts_in_total():
    token_mask = torch.tensor([[True, True, True], [False, False, False]])
    loss, _ = loss_of(*_example(), token_mask=token_mask)
    assert loss.item() == pytest.approx(-(2.7 / 3) / 2, rel=0, abs=_atol(1.0 / 6, 1.2 / 6, 0.5 / 6))


def test_kl_covers_every_completion_token_under_a_token_mask():
    logprobs, old, adv, mask = _example()
    ref = logprobs.detach() + 0.1  # k3 = e^0.1 - 1.1 on every token
    k3 = K3
    token_mask = torch.tensor([[True, False, False], [False, False, False]])
    loss, metrics = loss_of(logprobs, old, adv, mask, token_mask=token_mask, ref_logprobs=ref, beta=0.5, aggregation="token")
    assert loss.item() == pytest.approx(-1.0 / 5 + 0.5 * k3, rel=0, abs=_atol(1.0 / 5) + 0.5 * K3_ATOL)
    assert metrics.kl == pytest.approx(k3, rel=0, abs=K3_ATOL)


def test_kl_term_hand_value():
    logprobs, old, adv, mask = _example()
    ref = logprobs.detach() + 0.1  # ref - logp = 0.1 everywhere: k3 = e^0.1 - 0.1 - 1
    k3 = K3
    pg = lambda n: _atol(*[t / n for t in (1.0, 1.2, 0.5, 2.2, 1.6)])  # noqa: E731  (the policy-gradient term over n)
    loss, metrics = loss_of(logprobs, old, adv, mask, ref_logprobs=ref, beta=0.5, aggregation="token")
    assert metrics.kl == pytest.approx(k3, rel=0, abs=K3_ATOL)  # mean per completion token
    assert loss.item() == pytest.approx(0.22 + 0.5 * k3, rel=0, abs=pg(5) + 0.5 * K3_ATOL)
    loss, metrics = loss_of(logprobs, old, adv, mask, ref_logprobs=ref, beta=0.5)
    assert loss.item() == pytest.approx(0.5 + 0.5 * k3, rel=0, abs=pg(2) + 0.5 * K3_ATOL)  # sequence means of a constant
    loss, metrics = loss_of(
        logprobs, old, adv, mask, ref_logprobs=ref, beta=0.5, aggregation="constant", max_completion_len=4
    )
    assert loss.item() == pytest.approx(0.1375 + 0.5 * k3 * 5 / 8, rel=0, abs=pg(8) + 0.5 * K3_ATOL)
    assert metrics.kl == pytest.approx(k3, rel=0, abs=K3_ATOL)
    _, metrics = loss_of(logprobs, old, adv, mask, ref_logprobs=ref)
    assert metrics.kl == pytest.approx(k3, rel=0, abs=K3_ATOL)  # reported with beta = 0
    assert metrics.loss == pytest.approx(0.5, rel=0, abs=pg(2))  # but not added


# ----------------------------------------------------------------------------- reference


def reference_loss(logprobs, old, adv, mask, *, eps_low, eps_high, aggregation, token_mask=None, ref=None, beta=0.0, max_len=None):
    """Plain loops over sequences and tokens, one scalar at a time; ``token_mask`` gates the
    policy-gradient term only."""
    N, T = logprobs.shape
    sequence_terms, token_sum, tokens = [], 0.0, 0
    for i in range(N):
        seq_sum, seq_tokens = 0.0, 0
        for t in range(T):
            if not mask[i, t]:
                continue
            ratio = torch.exp(logprobs[i, t] - old[i, t])
            clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
            term = -torch.minimum(ratio * adv[i], clipped * adv[i])
            if token_mask is not None and not token_mask[i, t]:
                term = term * 0.0
            if ref is not None and beta > 0:
                d = ref[i, t] - logprobs[i, t]
                term = term + beta * (torch.exp(d) - d - 1)
            seq_sum = seq_sum + term
            seq_tokens += 1
        sequence_terms.append(seq_sum / max(seq_tokens, 1))
        token_sum = token_sum + seq_sum
        tokens += seq_tokens
    if aggregation == "sequence":
        return sum(sequence_terms) / N
    if aggregation == "token":
        return token_sum / max(tokens, 1)
    return token_sum / (N * max_len)


def _random_batch(seed: int, N: int = 6, T: int = 7):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=gen) * 3
    logprobs = (old + 0.4 * torch.randn(N, T, generator=gen)).requires_grad_(True)
    adv = torch.randn(N, generator=gen)
    mask = torch.rand(N, T, generator=gen) < 0.8
    mask[0] = False  # one empty sequence
    token_mask = torch.rand(N, T, generator=gen) < 0.7
    ref = old + 0.2 * torch.randn(N, T, generator=gen)
    return logprobs, old, adv, mask, token_mask, ref


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_and_gradient_match_loop_reference(aggregation, seed):
    logprobs, old, adv, mask, token_mask, ref = _random_batch(seed)
    kwargs = dict(eps_low=0.2, eps_high=0.28)
    max_len = 9 if aggregation == "constant" else None
    loss, _ = loss_of(
        logprobs, old, adv, mask, token_mask=token_mask, ref_logprobs=ref, beta=0.1,
        aggregation=aggregation, max_completion_len=max_len, **kwargs,
    )
    (grad,) = torch.autograd.grad(loss, logprobs)
    expected = reference_loss(
        logprobs, old, adv, mask, token_mask=token_mask, ref=ref, beta=0.1, aggregation=aggregation, max_len=max_len, **kwargs
    )
    (expected_grad,) = torch.autograd.grad(expected, logprobs)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_micro_batches_sum_to_full_batch(aggregation):
    logprobs, old, adv, mask, token_mask, ref = _random_batch(3, N=8)
    common = dict(aggregation=aggregation, max_completion_len=10, ref_logprobs=ref, beta=0.05, eps_high=0.3)
    full, full_metrics = loss_of(logprobs, old, adv, mask, token_mask=token_mask, **common)
    (full_grad,) = torch.autograd.grad(full, logprobs)

    totals = dict(total_sequences=8, total_tokens=full_metrics.completion_tokens)
    for splits in ([1] * 8, [3, 5], [2, 2, 4]):
        summed = 0.0
        start = 0
        for size in splits:
            part = slice(start, start + size)
            loss, _ = loss_of(
                logprobs[part], old[part], adv[part], mask[part], token_mask=token_mask[part],
                **common | {"ref_logprobs": ref[part]}, **totals,
            )
            summed = summed + loss
            start += size
        (grad,) = torch.autograd.grad(summed, logprobs)
        torch.testing.assert_close(summed, full)
        torch.testing.assert_close(grad, full_grad)


def test_empty_mask_gives_zero_loss_with_backward():
    logprobs = torch.full((2, 3), -torch.inf).requires_grad_(True)  # padding garbage
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for aggregation in AGGREGATIONS:
        loss, metrics = loss_of(
            logprobs, torch.zeros(2, 3), torch.ones(2), mask, aggregation=aggregation, max_completion_len=3,
            ref_logprobs=torch.zeros(2, 3), beta=0.1,
        )
        loss.backward()
        assert loss.item() == 0.0
        assert torch.equal(logprobs.grad, torch.zeros(2, 3))
        assert metrics.tokens == 0 and metrics.ratio_mean == 1.0 and metrics.clip_frac_low == 0.0
        logprobs.grad = None


def test_masked_inf_logprobs_do_not_poison_gradients():
    logprobs = torch.tensor([[-1.0, -torch.inf], [-0.5, float("nan")]], requires_grad=True)
    mask = torch.tensor([[True, False], [True, False]])
    loss, _ = loss_of(logprobs, torch.tensor([[-1.2, 0.0], [-0.4, 0.0]]), torch.tensor([1.0, -1.0]), mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[0, 1] == 0 and logprobs.grad[1, 1] == 0


def test_zero_advantages_give_zero_gradient():
    logprobs, old, _, mask, _, _ = _random_batch(4)
    loss, _ = loss_of(logprobs, old, torch.zeros(6), mask)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_bf16_logprobs():
    logprobs, old, adv, mask = _example()
    loss, _ = loss_of(logprobs.to(torch.bfloat16), old, adv, mask)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(0.5, rel=1e-2)


def test_metrics_to_dict():
    _, metrics = loss_of(*_example())
    d = metrics.to_dict()
    assert isinstance(metrics, LossMetrics)
    assert {"loss", "pg_loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_mean", "tokens"} <= set(d)


def test_validation():
    logprobs, old, adv, mask = _example()
    with pytest.raises(ValueError, match="old_logprobs"):
        loss_of(logprobs, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        loss_of(logprobs, old, adv[:1], mask)
    with pytest.raises(ValueError, match="mask must be a bool"):
        loss_of(logprobs, old, adv, mask.float())
    with pytest.raises(ValueError, match="token_mask"):
        loss_of(logprobs, old, adv, mask, token_mask=mask[:, :2])
    with pytest.raises(ValueError, match="sequence, token, constant"):
        loss_of(logprobs, old, adv, mask, aggregation="mean")
    with pytest.raises(ValueError, match="eps_low"):
        loss_of(logprobs, old, adv, mask, eps_low=-0.1)
    with pytest.raises(ValueError, match="eps_high"):
        loss_of(logprobs, old, adv, mask, eps_high=-0.1)
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_of(logprobs, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="max_completion_len"):
        loss_of(logprobs, old, adv, mask, aggregation="constant")
    with pytest.raises(ValueError, match="batch.tokens"):
        loss_of(logprobs, old, adv, mask, total_tokens=2)
    with pytest.raises(ValueError, match="batch.sequences"):
        loss_of(logprobs, old, adv, mask, total_sequences=1)
    with pytest.raises(ValueError, match="logprobs"):
        loss_of(logprobs[0], old, adv, mask)


def test_the_pieces_of_the_loss_hand_values():
    """token_ratio, clipped_surrogate and k3_kl on the hand-computed example (module comment above),
    in float64 so that a 1e-12 bound covers a few roundings of exp and log on any CPU."""
    mask, adv, old = torch.tensor(MASK), torch.tensor(ADVANTAGES, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64)
    logprobs = torch.where(mask, torch.tensor(RATIOS, dtype=torch.float64).log(), -math.inf)  # padding: the ratio is 1 there
    ratio = token_ratio(logprobs, old, mask)
    assert ratio.flatten().tolist() == pytest.approx([1.0, 1.5, 0.5, 1.1, 0.7, 1.0], rel=1e-12)
    surrogate = clipped_surrogate(ratio, adv[:, None], 0.2, 0.2)
    assert surrogate.flatten().tolist() == pytest.approx([1.0, 1.2, 0.5, -2.2, -1.6, -2.0], rel=1e-12)
    assert clipped_surrogate(ratio, adv[:, None], 0.2, 0.6)[0, 1].item() == pytest.approx(1.5, rel=1e-12)  # clip-higher
    ref = torch.where(mask, logprobs + 0.1, 0.0)
    k3 = k3_kl(logprobs, ref, mask)
    assert k3.flatten().tolist() == pytest.approx([math.exp(0.1) - 1.1] * 5 + [0.0], rel=1e-12)
