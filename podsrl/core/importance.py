"""Importance correction for the gap between the sampler and the trainer (truncated / masked IS).

The rollouts are sampled by an engine (vLLM) whose probabilities differ slightly from the trainer's
at the same weights: another dtype (a bfloat16 sampler beside a float32 trainer), other kernels,
top-p renormalisation. The update's clipped surrogate takes pi_old to be the distribution that
sampled; it was pi_sampler. Weighting each token's policy-gradient term by

    w_{i,t} = pi_old(o_{i,t} | p, o_{i,<t}) / pi_sampler(o_{i,t} | p, o_{i,<t})

(pi_old: the trainer at the weights that sampled) makes the expectation over the sampler's rollouts
that of the trainer's own, and the ratio is truncated or masked so that a rare token the sampler
over-sampled cannot blow up the variance: truncated importance sampling (TIS, Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training") and masked importance
sampling (MIS, Liu, Li et al. 2025, "When speed kills stability"). The names and the formulas are
TRL 1.16's ``GRPOTrainer`` (``vllm_importance_sampling_mode`` and its bounds; the weight is computed
once per generation batch from TRL's ``old_per_token_logps``), which verl offers as ``rollout_is``
(truncate); verl's ``rollout_rs`` (rejection sampling) is the constraint ``reject``.

Modes (:data:`MODES`, ``<level>_<constraint>``; ``rollout.importance_sampling_mode``), with
d_{i,t} = log pi_old - log pi_sampler on the completion tokens (``mask``), |o_i| of them:

- level ``token`` (``token_truncate`` is TIS; ``token_mask`` is token-level MIS): one ratio per
  token, r_{i,t} = exp(d_{i,t}).
- level ``sequence``: one ratio per sequence, r_i = exp(sum_t d_{i,t}), the ratio of the whole
  completion's probabilities (the product of its token ratios), carried by every token of the
  sequence. The only level whose weight is the importance weight of what was sampled; its log has
  mean -|o_i| x KL per token, so on long completions it shrinks and spreads (docs/vllm.md, "Long
  completions").
- level ``geometric``: one ratio per sequence, the geometric mean of its token ratios,
  r_i = exp((1/|o_i|) sum_t d_{i,t}), carried by every token (verl's ``rollout_is_level`` /
  ``rollout_rs`` "geometric", SkyRL's geometric mask / truncate). Not an importance weight of the
  sequence: a per-token average whose spread does not grow with the length (bias traded for
  variance, as in GSPO's length-normalised ratio). It stays near 1 (exp(-KL) on average), so TRL's
  clip_max of 3 (a mean gap of 1.1 nats per token) almost never acts: bound it near 1 (verl
  suggests thresholds of about 1.0002-1.001 for it) if it is to reject anything.
- constraint ``truncate``: w = clamp(r, clip_min, clip_max); constraint ``mask`` (TRL's): w = r inside
  [clip_min, clip_max], 0 outside (the token, or the whole sequence, leaves the policy-gradient term),
  no lower bound unless clip_min is set; constraint ``reject`` (verl's ``rollout_rs``, rejection
  sampling): w = 1 inside the bounds, 0 outside, and the lower bound is 1 / clip_max unless clip_min
  is set (verl's default, ``rollout_rs_threshold_lower``).

**Two "geometric" modes users know.** verl's ``rollout_rs = "geometric"`` rejects a sequence whose
geometric ratio leaves [1 / upper, upper] and keeps the others with weight 1: that is podsrl's
``geometric_reject`` (``rollout_rs_threshold`` = clip_max). podsrl's ``geometric_mask`` is TRL's
mask at the geometric level: a kept sequence is weighted by its ratio, and without clip_min nothing
is rejected from below. ``geometric_truncate`` clips the ratio, as verl's ``rollout_is`` clips a
token's or a sequence's. Where they differ from verl all the same: verl takes a rejected token out
of the loss mask, so out of the normalisers; here the normalisers stay (below).

podsrl's defaults: ``token_truncate``, clip_max 3, no clip_min. TRL's are the same bounds with
``sequence_mask``: podsrl differs because a sequence ratio is a product over the completion's tokens,
so its weights spread and fall with the length (effective sample size 0.66 of the sequences at 512
tokens on GSM8K at a bfloat16 sampler's gap, against 1.00 for ``token_truncate``, of its sequences'
weights there and of its tokens' own at 64-256 tokens; issues 59 and 67, docs/vllm.md "Long
completions"). TRL 1.16 has the token and sequence levels and the truncate and mask constraints
only (:class:`podsrl.integrations.trl.PODSConfig` refuses the others).

What the weight multiplies, and what it does not (TRL's choices, followed here):

- It multiplies the token's clipped surrogate, i.e. the per-token policy-gradient loss
  (:func:`podsrl.core.loss.policy_loss`'s ``importance_weights``). **The normalisers do not change**:
  a masked token still counts in |o_i| (``sequence``), in the batch's token count (``token``) and in
  ``constant``'s N x L, as TRL multiplies ``per_token_loss`` by the ratio and then divides by the
  same ``completion_mask`` sums as without it. (verl's ``rollout_rs`` instead drops rejected tokens
  from the loss mask, so they leave the denominators too: a rejected half of a sequence doubles the
  other half's weight there, and not here.) The KL term is not weighted (TRL adds ``beta * kl`` after
  the multiplication).
- It is detached (both log-probs are constants): the gradient is the weighted surrogate's.
- A row whose advantage is 0 still adds 0 (w x 0), so rows skipped for a zero advantage stay
  skipped; D3S's token selection is unaffected (the sequence ratio is over every completion token,
  selected or not: it is the probability of the sequence that was sampled).

Choices made where TRL is silent or differs:

- **clip_min <= 1 <= clip_max is required**, so a token the sampler and the trainer agree on (r = 1)
  is never corrected: a zero gap is then exactly a no-op (w = exp(0) = 1, and x * 1.0 is x), and no
  setting scales the on-policy loss. TRL accepts clip_max = None (no upper bound); here clip_max is
  a number, since an unbounded weight is the variance TIS exists to cut.
- A token whose sampler log-prob is NaN gets d = 0 (no correction), as in TRL; it still counts in
  the geometric mean's |o_i|.
- The weight is computed in the log-probs' dtype, at least float32; the metrics from the log-ratio
  in float64 (a sequence ratio overflows float32 past 88 nats; the weight is then clip_max or 0).
- Positions outside ``mask`` get weight 0 and never reach the exponential's input (d = 0 there), so
  padding with garbage log-probs cannot produce NaN.

Metrics (:class:`ImportanceMetrics`) are over the tokens of ``token_mask`` (default ``mask``): the
caller passes the tokens of the policy-gradient term, those the weight acts on. They describe the
ratio r before truncation or masking (TRL logs the weight after it: its minimum is 0 whenever a
token is masked), and the share of tokens whose r fell outside [clip_min, clip_max], i.e. truncated
or weighted 0; a sequence ratio counts once per token. And they describe the weights after it by
Kish's effective sample size, ESS = (sum w)^2 / (n sum w^2), a share of the n weights (1: all weigh
alike; 1/n: one carries all the weight; 0: every weight is 0), the share of equally weighted terms
whose estimate would have the same variance, at two levels:

- **over the tokens** (``ess_tokens``): w_{i,t}, each counted token's own weight, n = the counted
  tokens. The level of the token modes' correction: each token's policy-gradient term is scaled by
  its own weight.
- **over the sequences** (``ess_sequences``, with the mean weight ``weight_mean``): w_i, a
  sequence's weight, the mean of its counted tokens' weights (for the sequence and geometric levels
  the one weight all its tokens carry), over the n sequences with a counted token. The level of the
  sequence and geometric modes' correction.

:meth:`ImportanceMetrics.ess` gives the one that matches a mode's level (``is_ess`` in
metrics.jsonl; both are logged). The other level can hide what the correction does: a token mode's
sequence weight averages its tokens' weights, so its spread shrinks with the length (log-ratios
spread 2 nats a token, truncated at 3: a token ESS of 0.28 where the sequence-mean one reads 0.98,
over 8 completions of 64 tokens; tests/test_importance.py), and a sequence mode's token ESS counts a
long sequence's weight once per token. Until issue 67 ``is_ess`` was the sequence-mean ESS for
every mode, so a token mode's read 1.00 on long completions by construction. They are sums, minima
and maxima, so calls on micro-batches and ranks combine exactly (:meth:`ImportanceMetrics.combine`).

Who calls it: ``podsrl train`` (:mod:`podsrl.train.update`) with the trainer's log-probs at the
weights that sampled (the first policy iteration's forward, or the scoring pass's pi_old with
several) and the engine's (``UpdateBatch.sampler_logprobs``). :class:`podsrl.integrations.trl.PODSTrainer`
leaves TRL's own correction to TRL, on the kept rows only; tests/test_trl.py checks that TRL's weights
equal this function's on them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

__all__ = ["MODES", "ImportanceMetrics", "ImportanceSettings", "importance_weights"]

# A mode is "<level>_<constraint>": level token | sequence | geometric, constraint truncate | mask | reject.
MODES: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_truncate", "geometric_mask",
                          "token_reject", "sequence_reject", "geometric_reject")  # fmt: skip


@dataclass(frozen=True)
class ImportanceSettings:
    """How the ratio is formed and bounded (TRL's ``vllm_importance_sampling_mode``,
    ``vllm_importance_sampling_clip_max``, ``vllm_importance_sampling_clip_min``; its bounds' defaults,
    podsrl's mode: the module docstring)."""

    mode: str = "token_truncate"  # a name in MODES
    clip_max: float = 3.0  # upper bound C_max of the ratio, >= 1
    clip_min: float | None = None  # lower bound C_min, in [0, 1]; None: none (constraint reject: 1 / clip_max)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown importance sampling mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        if not isinstance(self.clip_max, (int, float)) or not 1.0 <= self.clip_max < math.inf:
            raise ValueError(f"clip_max must be a finite number >= 1 (a ratio of 1 is never corrected), got {self.clip_max!r}")
        if self.clip_min is not None and not 0.0 <= self.clip_min <= 1.0:
            raise ValueError(f"clip_min must be in [0, 1] (a ratio of 1 is never corrected) or None, got {self.clip_min!r}")

    @property
    def level(self) -> str:
        return self.mode.split("_")[0]

    @property
    def constraint(self) -> str:
        return self.mode.split("_")[1]

    @property
    def lower(self) -> float | None:
        """The lower bound in force: clip_min, else 1 / clip_max for the constraint reject (verl's
        ``rollout_rs`` default), else none."""
        if self.clip_min is not None:
            return self.clip_min
        return 1.0 / self.clip_max if self.constraint == "reject" else None


@dataclass
class ImportanceMetrics:
    """Python-number summary of the ratio and the weights over the counted tokens of one
    :func:`importance_weights` call (or several, :meth:`combine`)."""

    tokens: int  # tokens counted (token_mask & mask)
    ratio_sum: float  # sum of the ratio r (before truncation / masking) over them
    ratio_min: float  # smallest r (inf when no token)
    ratio_max: float  # largest r (-inf when no token)
    clipped: int  # tokens whose r fell outside [clip_min, clip_max]: truncated, or weighted 0
    sequences: int = 0  # sequences with a counted token
    weight_sum: float = 0.0  # sum over them of the sequence weight w_i (the mean of its counted tokens' weights)
    weight_sq_sum: float = 0.0  # sum of w_i^2
    token_weight_sum: float = 0.0  # sum over the counted tokens of their weight w_{i,t} (after truncation / masking)
    token_weight_sq_sum: float = 0.0  # sum of w_{i,t}^2

    @property
    def ratio_mean(self) -> float | None:
        return self.ratio_sum / self.tokens if self.tokens else None

    @property
    def clip_frac(self) -> float | None:
        return self.clipped / self.tokens if self.tokens else None

    @property
    def weight_mean(self) -> float | None:
        """The mean sequence weight (after truncation or masking)."""
        return self.weight_sum / self.sequences if self.sequences else None

    @property
    def ess_sequences(self) -> float | None:
        """The effective sample size of the sequence weights as a share of the sequences,
        (sum w_i)^2 / (n sum w_i^2): 1 when every sequence weighs the same, 1/n when one carries all
        the weight, 0 when every weight is 0; None without a sequence."""
        return _kish(self.weight_sum, self.weight_sq_sum, self.sequences)

    @property
    def ess_tokens(self) -> float | None:
        """The effective sample size of the counted tokens' own weights as a share of the tokens,
        (sum w_{i,t})^2 / (n sum w_{i,t}^2); None without a token."""
        return _kish(self.token_weight_sum, self.token_weight_sq_sum, self.tokens)

    def ess(self, level: str) -> float | None:
        """The effective sample size that matches a mode's ``level`` (:attr:`ImportanceSettings.level`):
        over the tokens for the token modes, over the sequences for the sequence and geometric ones."""
        if level not in _LEVELS:
            raise ValueError(f"unknown importance sampling level {level!r}; valid levels: {', '.join(_LEVELS)}")
        return self.ess_tokens if level == "token" else self.ess_sequences

    @classmethod
    def combine(cls, parts: list[ImportanceMetrics]) -> ImportanceMetrics:
        """The metrics of the union of the parts' tokens."""
        return cls(
            tokens=sum(p.tokens for p in parts),
            ratio_sum=sum(p.ratio_sum for p in parts),
            ratio_min=min((p.ratio_min for p in parts), default=math.inf),
            ratio_max=max((p.ratio_max for p in parts), default=-math.inf),
            clipped=sum(p.clipped for p in parts),
            sequences=sum(p.sequences for p in parts),
            weight_sum=sum(p.weight_sum for p in parts),
            weight_sq_sum=sum(p.weight_sq_sum for p in parts),
            token_weight_sum=sum(p.token_weight_sum for p in parts),
            token_weight_sq_sum=sum(p.token_weight_sq_sum for p in parts),
        )

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


_LEVELS = ("token", "sequence", "geometric")


def _kish(total: float, squares: float, n: int) -> float | None:
    """Kish's effective sample size (sum w)^2 / (n sum w^2) as a share of the n weights, from their
    sum and sum of squares; 0 when every weight is 0, None when n is 0."""
    if not n:
        return None
    return total**2 / (n * squares) if squares > 0 else 0.0


def _check(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, token_mask: Tensor | None) -> None:
    if not isinstance(trainer_logprobs, Tensor) or trainer_logprobs.dim() != 2 or not trainer_logprobs.is_floating_point():
        raise ValueError(f"trainer_logprobs must be a floating tensor [N, T], got {getattr(trainer_logprobs, 'shape', type(trainer_logprobs))}")
    shape = trainer_logprobs.shape
    if not isinstance(sampler_logprobs, Tensor) or sampler_logprobs.shape != shape or not sampler_logprobs.is_floating_point():
        raise ValueError(f"sampler_logprobs must be a floating tensor of shape {tuple(shape)}, got {getattr(sampler_logprobs, 'shape', type(sampler_logprobs))}")
    for name, m in (("mask", mask), ("token_mask", token_mask)):
        if m is not None and (not isinstance(m, Tensor) or m.shape != shape or m.dtype != torch.bool):
            raise ValueError(f"{name} must be a bool tensor of shape {tuple(shape)}, got {getattr(m, 'dtype', type(m))} {tuple(getattr(m, 'shape', ()))}")


@torch.no_grad()
def importance_weights(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    settings: ImportanceSettings = ImportanceSettings(),
    *,
    token_mask: Tensor | None = None,
) -> tuple[Tensor, ImportanceMetrics]:
    """Each token's importance weight, truncated or masked, and the ratio's metrics.

    Args:
        trainer_logprobs: [N, T] log pi_old of the sampled tokens: the trainer at the weights that
            sampled (treated as a constant).
        sampler_logprobs: [N, T] the sampling engine's log-probs of the same tokens.
        mask: [N, T] bool, the completion tokens (False on padding); a sequence ratio is over these.
        settings: mode and bounds (:class:`ImportanceSettings`).
        token_mask: [N, T] bool, the tokens the metrics count (the policy-gradient term's, e.g. after
            D3S token selection); None: ``mask``. It does not change the weights.

    Returns:
        (weights [N, T] in the log-probs' dtype (at least float32), 0 outside ``mask``;
        :class:`ImportanceMetrics` over ``mask & token_mask``).
    """
    _check(trainer_logprobs, sampler_logprobs, mask, token_mask)
    dtype = torch.promote_types(trainer_logprobs.dtype, torch.float32)
    diff = trainer_logprobs.to(dtype) - sampler_logprobs.to(device=trainer_logprobs.device, dtype=dtype)  # [N, T]
    diff = torch.where(mask & ~diff.isnan(), diff, 0.0)  # [N, T]: no correction outside the completion or where the sampler gave NaN
    if settings.level == "token":
        log_ratio = diff  # [N, T]
    elif settings.level == "sequence":  # the sum over the completion, carried by every token
        log_ratio = diff.sum(dim=1, keepdim=True).expand_as(diff)  # [N, T]
    else:  # geometric: the mean over the completion, carried by every token
        length = mask.sum(dim=1, keepdim=True).clamp(min=1)  # [N, 1]
        log_ratio = (diff.sum(dim=1, keepdim=True) / length).expand_as(diff)  # [N, T]
    ratio = log_ratio.exp()  # [N, T], inf past float range: then truncated to clip_max or masked
    lower = -math.inf if settings.lower is None else settings.lower
    outside = (ratio > settings.clip_max) | (ratio < lower)  # [N, T]
    if settings.constraint == "truncate":
        weights = ratio.clamp(min=settings.clip_min, max=settings.clip_max)  # [N, T]
    elif settings.constraint == "mask":  # weight 0 outside the bounds, the ratio inside
        weights = torch.where(outside, 0.0, ratio)  # [N, T]
    else:  # reject: weight 0 outside the bounds, 1 inside
        weights = torch.where(outside, 0.0, torch.ones_like(ratio))  # [N, T]
    weights = torch.where(mask, weights, 0.0)  # [N, T]

    counted = mask if token_mask is None else mask & token_mask  # [N, T]
    r = log_ratio[counted].double().exp()  # [tokens] float64: a sequence ratio may overflow float32
    per_row = counted.sum(dim=1)  # [N] counted tokens of each sequence
    has = per_row > 0  # [N]
    token_w = weights[counted].double()  # [tokens] each counted token's weight
    w = (torch.where(counted, weights, 0.0).double().sum(dim=1)[has] / per_row[has])  # [n] each sequence's mean weight
    metrics = ImportanceMetrics(
        tokens=int(r.numel()),
        ratio_sum=float(r.sum()),
        ratio_min=float(r.min()) if r.numel() else math.inf,
        ratio_max=float(r.max()) if r.numel() else -math.inf,
        clipped=int((outside & counted).sum()),
        sequences=int(w.numel()),
        weight_sum=float(w.sum()),
        weight_sq_sum=float((w * w).sum()),
        token_weight_sum=float(token_w.sum()),
        token_weight_sq_sum=float((token_w * token_w).sum()),
    )
    return weights, metrics
