"""Token-level selection: which tokens of the kept rollouts enter the loss (D3S, "80/20").

D3S (Wang et al.; arXiv 2509.22115, token-level down-sampling) scores token t of kept rollout i by

    s_{i,t} = |A_i| * H_{i,t}

where A_i is the rollout's advantage and H_{i,t} the entropy of the current policy's next-token
distribution at that position (from the logits of the update's own forward pass, detached), and
keeps only the top fraction K of the tokens in the loss. The entropy-only rule ("80/20", keep the
top-rho fraction of tokens by entropy) is the special case without |A|. The rules are chosen by
name from :data:`SCORES`.

Choices made where the papers are silent, and one deviation:

- **The budget is over the tokens that can be selected** (:func:`selectable`): the valid tokens
  of the rows whose advantage is not 0. ALGORITHMS.md (section 3) reads the paper as "the top
  fraction K of all kept tokens"; taken literally, a kept row with A_i = 0 (a zero-variance group
  that D3S-I keeps, rule ``all``, a missing reward) counts in the budget, yet its tokens score 0
  under |A_i| x H and add nothing to the policy gradient whatever the mask. Once the rows with a
  signal hold no more than a fraction K of the batch's tokens, every one of their tokens would be
  selected and the rule would do nothing (the zero-scored tokens fill the rest of the budget); a
  quantile threshold (:func:`quantile_threshold_mask`, ties kept) over a pool mostly of zeros
  keeps every token outright. So K applies to the tokens of the rows with A_i != 0, for both
  scores: the 80/20 rule's entropy scores those rows' tokens above 0 too, but selecting them still
  spends budget on tokens without a gradient. In the 80/20 paper's setting (DAPO's dynamic
  sampling drops the groups of equal rewards) no kept row has A_i = 0 with binary rewards, and
  there the two readings agree. The tokens of rows with A_i = 0 are never in the mask.
- The top fraction is taken over the whole batch (all rollouts together), not per rollout.
  :func:`select_tokens` keeps exactly ceil(K * num_selectable) tokens (at least one when any token
  is selectable); the product is rounded to 6 decimals before the ceiling so that e.g. 0.7 * 10
  keeps 7 tokens, not 8.
- Ties at the threshold are broken by :func:`torch.topk`, which is deterministic for a given
  input on a given device but otherwise unspecified; the count is always exact.
- K = 1.0 returns the valid mask itself (no sort) in :func:`top_fraction_mask`.
- The entropies come from :func:`podsrl.core.logits.entropy_from_logits` (detached, float32).

Who calls what: ``podsrl train`` (:mod:`podsrl.train.update`) calls :func:`select_tokens` over
the whole batch; :class:`podsrl.integrations.trl.PODSTrainer` scores with :func:`score_tokens`,
restricts to :func:`selectable` and thresholds with :func:`quantile_threshold_mask` at TRL's
scope (one micro-batch, pooled over processes).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

__all__ = [
    "SCORES",
    "token_scores",
    "score_tokens",
    "selectable",
    "select_tokens",
    "top_fraction_mask",
    "entropy_top_fraction_mask",
    "quantile_threshold_mask",
]


def _per_token(advantages: Tensor, entropy: Tensor) -> Tensor:
    """advantages [N] or [N, T] -> a view that broadcasts against entropy [N, T]."""
    if entropy.dim() != 2 or advantages.dim() not in (1, 2) or advantages.shape[0] != entropy.shape[0] or (
        advantages.dim() == 2 and advantages.shape != entropy.shape
    ):
        raise ValueError(
            f"advantages must be [N] (or [N, T]) and entropy [N, T] with the same N, got "
            f"{tuple(advantages.shape)} and {tuple(entropy.shape)}"
        )
    return advantages[:, None] if advantages.dim() == 1 else advantages


def token_scores(advantages: Tensor, entropy: Tensor) -> Tensor:
    """D3S token score |A_i| * H_{i,t}. advantages [N] (or per token [N, T]), entropy [N, T] -> [N, T]."""
    return _per_token(advantages, entropy).abs() * entropy


def _entropy_score(advantages: Tensor, entropy: Tensor) -> Tensor:
    """The 80/20 score H_{i,t}. advantages [N] (unused but checked), entropy [N, T] -> [N, T]."""
    _per_token(advantages, entropy)
    return entropy


# Token score rules by name (``select.token_score``, ``pods_token_score``): (advantages, entropy) -> scores [N, T].
SCORES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"adv_entropy": token_scores, "entropy": _entropy_score}


def score_tokens(rule: str, advantages: Tensor, entropy: Tensor) -> Tensor:
    """The scores of rule ``rule`` (:data:`SCORES`). advantages [N] or [N, T], entropy [N, T] -> [N, T]."""
    if rule not in SCORES:
        raise ValueError(f"unknown token score {rule!r}; valid: {', '.join(SCORES)}")
    return SCORES[rule](advantages, entropy)


def selectable(valid: Tensor, advantages: Tensor) -> Tensor:
    """The tokens a token budget is over: the valid tokens of the rows whose advantage is not 0
    (see the module docstring). valid [N, T] bool (or 0/1), advantages [N] or [N, T] -> [N, T] bool."""
    return valid.bool() & (_per_token(advantages, valid).to(valid.device) != 0)


def select_tokens(advantages: Tensor, entropy: Tensor, valid: Tensor, fraction: float, score: str = "adv_entropy") -> Tensor:
    """``podsrl train``'s token mask: the ceil(fraction * num_selectable) highest-scoring
    :func:`selectable` tokens of the whole batch, by rule ``score`` (:data:`SCORES`).

    advantages [N], entropy [N, T] float, valid [N, T] bool, fraction in (0, 1] -> [N, T] bool, a
    subset of the valid tokens of rows with A_i != 0 (with fraction 1: all of those).
    """
    return top_fraction_mask(score_tokens(score, advantages, entropy), selectable(valid, advantages), fraction)


def top_fraction_mask(scores: Tensor, valid: Tensor, fraction: float) -> Tensor:
    """Keep the ceil(fraction * num_valid) highest-scoring valid tokens of the whole batch.

    scores [N, T] float, valid [N, T] bool, fraction in (0, 1] -> [N, T] bool, a subset of valid.
    """
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool tensor, got {getattr(valid, 'dtype', type(valid).__name__)}")
    if scores.shape != valid.shape or scores.dim() != 2:
        raise ValueError(
            f"scores and valid must both be [N, T], got {tuple(scores.shape)} and {tuple(valid.shape)}"
        )
    if not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    if fraction == 1.0:
        return valid.clone()
    positions = valid.flatten().nonzero().squeeze(1)  # [num_valid]
    num_valid = positions.numel()
    if num_valid == 0:
        return valid.clone()
    valid_scores = scores.flatten()[positions]  # [num_valid]
    if bool(valid_scores.isnan().any()):
        raise ValueError("scores contain NaN at valid positions")
    count = min(num_valid, max(1, math.ceil(round(fraction * num_valid, 6))))
    top = valid_scores.topk(count).indices  # [count]
    keep = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)  # [N*T]
    keep[positions[top]] = True
    return keep.view(valid.shape)


def entropy_top_fraction_mask(entropy: Tensor, valid: Tensor, fraction: float) -> Tensor:
    """"80/20" rule: keep the top ``fraction`` of valid tokens by entropy. [N, T] -> [N, T] bool."""
    return top_fraction_mask(entropy, valid, fraction)


def quantile_threshold_mask(scores: Tensor, valid: Tensor, level: float, *, pool: Tensor | None = None) -> Tensor:
    """Keep the valid tokens whose score is at least the ``level``-quantile of ``pool``.

    The threshold rule of TRL's ``top_entropy_quantile`` (the 80/20 paper's), as opposed to
    :func:`top_fraction_mask`'s exact count: q = ``torch.quantile(pool, level)`` (linear
    interpolation between order statistics, float32), and token i,t is kept when valid and
    ``scores[i, t] >= q``. Ties at q are all kept, so about (not exactly) a ``1 - level`` fraction
    of the pool survives; ``level`` 0 keeps every valid token.

    Scope: the threshold is over ``pool`` only, which the caller chooses. By default it is
    ``scores[valid]``, this call's tokens; :class:`podsrl.integrations.trl.PODSTrainer` passes as
    ``valid`` the :func:`selectable` tokens and as ``pool`` their scores in one micro-batch,
    gathered from every process (TRL's scope), whereas ``podsrl train`` selects over the whole
    batch with :func:`select_tokens`. An empty pool keeps nothing (as TRL).

    scores [N, T] float, valid [N, T] bool (or 0/1), level in [0, 1], pool [P] float -> [N, T] bool.
    """
    if scores.dim() != 2 or scores.shape != valid.shape:
        raise ValueError(f"scores and valid must both be [N, T], got {tuple(scores.shape)} and {tuple(valid.shape)}")
    if not 0.0 <= level <= 1.0:
        raise ValueError(f"level must be in [0, 1], got {level!r}")
    valid = valid.bool()
    pool = scores[valid] if pool is None else pool
    if pool.numel() == 0:
        return torch.zeros_like(valid)
    threshold = torch.quantile(pool.float(), level)  # scalar
    return (scores.float() >= threshold) & valid  # float32 compare: a bf16 score is not rounded against q
