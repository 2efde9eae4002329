"""Clipped policy-gradient loss of GRPO / PODS / D3S with the usual aggregation variants.

With ratio rho_{i,t} = exp(logp_{i,t} - old_logp_{i,t}) and advantage A_i of sequence i, the
per-token objective (maximised) is the PPO/GRPO clipped surrogate

    min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)

(DAPO "clip-higher" when eps_high > eps_low); the loss returned is its negative, aggregated over
the completion tokens, plus beta times the k3 estimator of KL(pi_theta || pi_ref),
exp(ref - logp) - (ref - logp) - 1, aggregated the same way. PODS (arXiv 2504.13818, Sec. 3)
uses the GRPO objective over the m selected rollouts (1/m in front); D3S (arXiv 2509.22115)
additionally selects tokens (``token_mask``, from :mod:`podsrl.core.token_selection`). With a
sampler whose probabilities differ from the trainer's (vLLM), token i,t's surrogate is also
multiplied by its importance weight (``is_weights``, from :mod:`podsrl.core.importance`: truncated or
masked pi_old / pi_sampler), as TRL's GRPOTrainer multiplies ``per_token_loss`` by its
``importance_sampling_ratio``; like the token mask, it changes no normaliser and not the KL term.

Aggregations (:data:`AGGREGATIONS`), over the completion tokens (``mask``):

- ``sequence`` (GRPO, the paper's formula): mean over each sequence's completion tokens, summed
  over sequences, divided by ``total_sequences``.
- ``token`` (DAPO): sum over all completion tokens / ``total_tokens``.
- ``constant`` (Dr. GRPO): sum over completion tokens / (``total_sequences`` * ``max_completion_len``).

The default is ``token``, as in TRL's GRPOConfig (``loss_type = "dapo"``) and verl (``token-mean``):
``sequence`` gives each token of a long completion less weight than one of a short completion, a
short right answer more per token and a long wrong one less penalty per token (Dr. GRPO; DAPO
section 3.3). Issue 67's runs on answers of about 150 tokens found no reason to differ
(docs/results.md, "The loss aggregation on long answers"); ``sequence`` was podsrl's default before.
A deviation from the papers: PODS (Sec. 3) and D3S write GRPO's objective, ``sequence``; set it to
reproduce their setups (the shipped comparisons with committed runs pin it).

**A token mask selects where the policy gradient flows, nothing else.** Token i,t's surrogate is
multiplied by ``token_mask[i, t]``; every normaliser (|o_i| of ``sequence``, the token count of
``token``) stays over all completion tokens, and the KL term covers every completion token. This is
the objective of the 80/20 paper that D3S's token level extends (Wang et al., arXiv 2506.01939:
1/sum_i |o_i| outside, the indicator I[H_{i,t} >= tau] inside the sum) and what TRL's GRPOTrainer
computes with ``top_entropy_quantile``, so ``podsrl train`` and :class:`podsrl.integrations.trl.PODSTrainer`
train D3S identically. The D3S paper gives no formula of its own (no code is public). Normalising
by the selected tokens instead would give a rollout with one selected token a whole sequence's
weight in ``sequence``, and the KL is a regulariser of the whole distribution, not a carrier of the
advantage signal that the token score picks out. With K the kept fraction, the policy-gradient
term is therefore about K times smaller than the unmasked one (the paper's choice; a larger
learning rate is the knob, not the normaliser).

Choices made where the papers are silent:

- ``total_sequences`` / ``total_tokens`` (``batch``, :class:`BatchCounts`) default to this call's N
  and completion-token count. A trainer that splits a batch into micro-batches passes the whole
  batch's numbers, so that the sum of the micro-batch losses (and gradients) equals the full-batch
  loss exactly; a trainer that skips rows whose advantage is 0 (no KL term) passes the numbers of
  the batch including them, and the gradient is unchanged.
- A sequence without completion tokens contributes 0 but still counts in ``total_sequences``.
- Empty mask: loss 0, still attached to the graph (backward gives zero gradients), never NaN.
- Positions outside ``mask`` get log-ratio 0 before the exponential, so padding with -inf or
  garbage log-probs cannot produce NaN in the forward or the backward pass.
- The loss is computed in float32 at least (bf16 log-probs are upcast).
- Metrics describe this call: ``loss`` and ``pg_loss`` are this call's additive contributions
  (they sum over micro-batches like the loss); the clip fractions and ``ratio_mean`` are means over
  the tokens in the policy-gradient term (``tokens``), ``kl`` (mean k3) over all completion tokens
  (``completion_tokens``): weight them by those counts to combine micro-batches. ``kl`` is reported
  whenever ``ref_logprobs`` is given, even with beta = 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import Tensor

__all__ = [
    "AGGREGATIONS", "Aggregation", "BatchCounts", "LossMetrics", "LossSettings", "clipped_surrogate", "k3_kl", "policy_loss", "token_ratio",
]  # fmt: skip


@dataclass
class LossMetrics:
    """Python-float summary of one :func:`policy_loss` call."""

    loss: float  # pg_loss + beta * kl
    pg_loss: float  # clipped-surrogate part of the loss
    kl: float | None  # mean k3 KL to the reference per completion token, None without ref_logprobs
    clip_frac_low: float  # fraction of policy-gradient tokens with rho < 1 - eps_low and A < 0
    clip_frac_high: float  # fraction of policy-gradient tokens with rho > 1 + eps_high and A > 0
    ratio_mean: float  # mean rho over policy-gradient tokens (1.0 when none)
    tokens: int  # tokens in this call's policy-gradient term (completion tokens in token_mask)
    sequences: int  # sequences in this call (N)
    completion_tokens: int  # completion tokens in this call (mask): the KL's and the normalisers' tokens

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


Aggregation = Callable[[Tensor, Tensor, int, int, "int | None"], Tensor]


def _sequence_mean(per_token: Tensor, mask: Tensor, total_sequences: int, total_tokens: int, max_len: int | None) -> Tensor:
    per_sequence = per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [N]
    return per_sequence.sum() / max(total_sequences, 1)


def _token_mean(per_token: Tensor, mask: Tensor, total_sequences: int, total_tokens: int, max_len: int | None) -> Tensor:
    return per_token.sum() / max(total_tokens, 1)


def _constant_norm(per_token: Tensor, mask: Tensor, total_sequences: int, total_tokens: int, max_len: int | None) -> Tensor:
    if max_len is None:
        raise ValueError("aggregation 'constant' (Dr. GRPO) needs max_completion_len")
    return per_token.sum() / (max(total_sequences, 1) * max_len)


# Each takes (per-token values [N, T], already 0 outside the completion; completion mask [N, T] bool;
# total_sequences; total_tokens; max_completion_len) and returns a scalar.
AGGREGATIONS: dict[str, Aggregation] = {
    "sequence": _sequence_mean,
    "token": _token_mean,
    "constant": _constant_norm,
}


def _check_like(name: str, tensor: Tensor, shape: torch.Size, *, bool_dtype: bool = False) -> None:
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if tensor.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} like logprobs, got {tuple(tensor.shape)}")
    if bool_dtype and tensor.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor, got {tensor.dtype}")
    if not bool_dtype and not tensor.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {tensor.dtype}")


def _check_inputs(logprobs, old_logprobs, advantages, mask, token_mask, ref_logprobs, is_weights=None) -> None:
    if not isinstance(logprobs, Tensor) or logprobs.dim() != 2 or not logprobs.is_floating_point():
        raise ValueError(f"logprobs must be a floating tensor [N, T], got {getattr(logprobs, 'shape', type(logprobs))}")
    N = logprobs.shape[0]
    _check_like("old_logprobs", old_logprobs, logprobs.shape)
    _check_like("mask", mask, logprobs.shape, bool_dtype=True)
    if token_mask is not None:
        _check_like("token_mask", token_mask, logprobs.shape, bool_dtype=True)
    if ref_logprobs is not None:
        _check_like("ref_logprobs", ref_logprobs, logprobs.shape)
    if is_weights is not None:
        _check_like("is_weights", is_weights, logprobs.shape)
    if not isinstance(advantages, Tensor) or advantages.shape != (N,) or not advantages.is_floating_point():
        raise ValueError(f"advantages must be a floating tensor [N={N}], got {getattr(advantages, 'shape', type(advantages))}")


@torch.no_grad()
def _metrics(loss, pg_loss, k3, ratio, adv, counted, mask, eps_low: float, eps_high: float) -> LossMetrics:
    """ratio, counted (the policy-gradient tokens), mask [N, T], adv [N, 1] -> the call's LossMetrics."""
    tokens = int(counted.sum())
    denominator = max(tokens, 1)
    completion_tokens = int(mask.sum())
    low = counted & (ratio < 1.0 - eps_low) & (adv < 0)  # [N, T]
    high = counted & (ratio > 1.0 + eps_high) & (adv > 0)  # [N, T]
    return LossMetrics(
        loss=float(loss),
        pg_loss=float(pg_loss),
        kl=None if k3 is None else float(k3.sum()) / max(completion_tokens, 1),
        clip_frac_low=int(low.sum()) / denominator,
        clip_frac_high=int(high.sum()) / denominator,
        ratio_mean=float(torch.where(counted, ratio, 0.0).sum()) / tokens if tokens else 1.0,
        tokens=tokens,
        sequences=counted.shape[0],
        completion_tokens=completion_tokens,
    )


@dataclass(frozen=True)
class LossSettings:
    """What shapes the loss, fixed for a run."""

    eps_low: float = 0.2  # clip rho below at 1 - eps_low
    eps_high: float | None = None  # clip rho above at 1 + eps_high; None: eps_low (DAPO clip-higher: larger)
    aggregation: str = "token"  # a name in AGGREGATIONS (the trainer's default, podsrl.config.LossConfig)
    beta: float = 0.0  # weight of the k3 KL to the reference (needs ref_logprobs when > 0)
    max_completion_len: int | None = None  # L of the 'constant' aggregation (Dr. GRPO)

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high is not None and self.eps_high < 0.0:
            raise ValueError(f"eps_high must be >= 0, got {self.eps_high}")
        if self.beta < 0.0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; valid aggregations: {', '.join(AGGREGATIONS)}")
        if self.max_completion_len is not None and self.max_completion_len < 1:
            raise ValueError(f"max_completion_len must be >= 1, got {self.max_completion_len}")


@dataclass(frozen=True)
class BatchCounts:
    """The whole batch's sequences and completion tokens, when a :func:`policy_loss` call is one
    micro-batch of it (or its rows with a non-zero advantage): each call is normalised by them, so
    the micro-batches' losses sum to the full batch's."""

    sequences: int
    tokens: int


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings = LossSettings(),
    *,
    token_mask: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    batch: BatchCounts | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, LossMetrics]:
    """Clipped surrogate loss to minimise, and its metrics.

    Args:
        logprobs: [N, T] log pi_theta of the sampled tokens (carries the gradient).
        old_logprobs: [N, T] log pi_old of the same tokens (treated as a constant).
        advantages: [N] one advantage per sequence.
        mask: [N, T] bool, the completion tokens (False on padding).
        settings: clip range, aggregation, KL weight (:class:`LossSettings`).
        token_mask: [N, T] bool, tokens whose policy-gradient term is kept (D3S / 80-20); None keeps
            all. The normalisers and the KL term stay over ``mask`` (module docstring).
        ref_logprobs: [N, T] log pi_ref for the k3 KL; beta > 0 requires it.
        batch: the whole batch's counts when this call is a micro-batch (default: this call's).
        is_weights: [N, T] importance weight of each token's surrogate (sampler correction,
            :func:`podsrl.core.importance.importance_weights`; treated as a constant); None: 1. The
            normalisers, the KL term and the metrics stay as without it.

    Returns:
        (scalar loss tensor, :class:`LossMetrics`).
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, token_mask, ref_logprobs, is_weights)
    eps_low, beta = settings.eps_low, settings.beta
    eps_high = eps_low if settings.eps_high is None else settings.eps_high
    if beta > 0.0 and ref_logprobs is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logprobs for the KL term")
    counts = _normalisers(mask, batch)
    in_pg = mask if token_mask is None else mask & token_mask  # [N, T] the policy-gradient term's tokens

    dtype = torch.promote_types(logprobs.dtype, torch.float32)  # float32 at least: bf16 log-probs are upcast
    logp = logprobs.to(dtype)  # [N, T]
    ratio = token_ratio(logp, old_logprobs.to(dtype), mask)  # [N, T], 1 outside the completion
    adv = advantages.to(dtype).detach()[:, None]  # [N, 1]
    surrogate = clipped_surrogate(ratio, adv, eps_low, eps_high)  # [N, T]
    if is_weights is not None:  # the sampler correction: weights the surrogate only (module docstring)
        surrogate = surrogate * is_weights.to(dtype).detach()  # [N, T]
    pg_loss = _aggregate(settings, torch.where(in_pg, -surrogate, 0.0), mask, counts)

    k3 = None if ref_logprobs is None else k3_kl(logp, ref_logprobs.to(dtype), mask)  # [N, T]
    loss = pg_loss + beta * _aggregate(settings, k3, mask, counts) if beta > 0.0 else pg_loss
    metrics = _metrics(loss, pg_loss, k3, ratio, adv, in_pg, mask, eps_low, eps_high)
    return loss, metrics


def token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """rho = exp(logp - old_logp) per token, old_logp a constant. logp, old_logp [N, T] float, mask
    [N, T] bool -> [N, T]: exactly 1 outside ``mask`` (log-ratio 0 before the exponential, so -inf or
    garbage log-probs on padding cannot make a NaN, forward or backward)."""
    log_ratio = torch.where(mask, logp - old_logp.detach(), 0.0)  # [N, T]
    return log_ratio.exp()  # [N, T]


def clipped_surrogate(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """The PPO/GRPO clipped surrogate to maximise, min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A).
    ratio [N, T], adv [N, 1] (one advantage per sequence, broadcast over its tokens) -> [N, T]."""
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)  # [N, T]


def k3_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """The k3 estimator of KL(pi_theta || pi_ref) per token, exp(ref - logp) - (ref - logp) - 1, ref a
    constant. logp, ref_logp [N, T] float, mask [N, T] bool -> [N, T], 0 outside ``mask``."""
    ref_minus_logp = torch.where(mask, ref_logp.detach() - logp, 0.0)  # [N, T]
    return torch.where(mask, ref_minus_logp.exp() - ref_minus_logp - 1.0, 0.0)  # [N, T]


def _normalisers(mask: Tensor, batch: BatchCounts | None) -> BatchCounts:
    """The sequences and completion tokens the aggregation divides by: the whole batch's (``batch``)
    or, without it, this call's (mask [N, T]); a batch smaller than this call is a ValueError."""
    N, tokens = mask.shape[0], int(mask.sum())
    if batch is None:
        return BatchCounts(sequences=N, tokens=tokens)
    if batch.sequences < N:
        raise ValueError(f"batch.sequences={batch.sequences} is smaller than this call's N={N}")
    if batch.tokens < tokens:
        raise ValueError(f"batch.tokens={batch.tokens} is smaller than this call's {tokens} completion tokens")
    return batch


def _aggregate(settings: LossSettings, per_token: Tensor, mask: Tensor, counts: BatchCounts) -> Tensor:
    """per_token [N, T] (0 outside the completion), mask [N, T] -> the scalar of ``settings.aggregation``
    (:data:`AGGREGATIONS`) over the normalisers ``counts``."""
    aggregate = AGGREGATIONS[settings.aggregation]
    return aggregate(per_token, mask, counts.sequences, counts.tokens, settings.max_completion_len)
