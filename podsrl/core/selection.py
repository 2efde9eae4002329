"""Down-sampling rules: which of the n rollouts of each prompt are trained on.

PODS (Xu, Savani, Fang, Kolter; arXiv 2504.13818, Sec. 3) generates n rollouts per prompt and
trains on m < n of them, chosen by a rule D(o, r; m). D3S (Wang et al.; arXiv 2509.22115) chooses
by the GRPO advantages of the full group instead of the rewards, within each group or over the
pooled batch. Every rule here has the signature

    rule(rewards: [B, n] float, m: int, *, generator=None, scale_std=True, valid=None) -> keep: [B, n] bool

and keeps B*m rollouts in total. ``scale_std`` is the advantage convention the run trains with
(GRPO's division by the group's std, or Dr. GRPO's centring only); only the D3S rules, which select
on advantages, read it. ``valid`` [B, n] bool marks the rollouts that may be kept (None: all); the
others (a completion without a reward, :mod:`podsrl.core.downsample`) are never kept, except by
``all``, and take no part in a group's statistics: a group with fewer than m valid rollouts keeps
all of them, ``d3s_cross`` keeps min(B*m, valid) of the pool, and the values at invalid positions
are never read. Rules are chosen by name from :data:`RULES` (:func:`get_rule`).

- ``all``: every rollout (plain GRPO), valid or not; requires m == n. An invalid rollout is then
  trained on with advantage 0, as TRL's GRPO trains on a completion without a reward.
- ``random``: m rollouts per group, uniformly without replacement.
- ``max_reward``: the m highest rewards per group.
- ``max_variance`` (PODS): per group, the m rollouts maximising Var(r_S).
- ``d3s_intra`` (D3S-I): per group, the m rollouts maximising the variance of their full-group
  advantages A (:func:`podsrl.core.advantages.group_advantages` with ``keep=None``).
- ``d3s_cross`` (D3S cross-group): B*m rollouts of the pooled B*n maximising Var(A) over the pool;
  groups may keep unequal numbers, some none.

All three variance rules rest on the PODS Lemma (Sec. 3.1): for values sorted ascending, a
size-m subset of maximal variance is the (m-k) lowest together with the k highest for some k in
0..m. :func:`_max_variance_keep` sorts once, scores the m+1 candidates with prefix sums of v and
v^2 and takes the best: O(n log n + m) per row, vectorised over rows (no Python loop over groups,
O(B*n) memory). The paper's Algorithm 2 recomputes every candidate's variance: O(n log n + m^2).

Choices made where the papers are silent:

- **Variance** is the population variance of the kept values. At a fixed subset size it is a
  constant multiple of the sample variance, so the argmax is the same.
- **Ties among equal values** (frequent with binary rewards) are broken uniformly at random with
  ``generator``, never by index: each row is sorted by (value, random 31-bit key), packed into
  one int64 sort key when the values are exact in float32 (otherwise: a random shuffle, then a
  stable sort by value). Without this the earliest rollouts would always be chosen (the PODS
  release uses a plain ``argsort``).
- **Ties among the m+1 candidates** (e.g. binary rewards, where keeping j successes or j failures
  gives the same variance) are also broken at random, among candidates within a relative 1e-9 of
  the best score, so a rule does not systematically prefer failures over successes.
- Candidate scores are computed in float64 on values centred on their row's mid-range, so that
  prefix sums of squares do not lose the variance to cancellation when rewards have a large
  offset.
- ``d3s_intra`` gives the same subsets as ``max_variance`` when A is an affine function of r per
  group (it is), but it is computed on A so that it is exact for the advantages actually used.
  The std convention of A does not change the selection: all groups have the same n, so it
  rescales every advantage by the same factor. ``scale_std=False`` selects on
  Dr. GRPO advantages (r - mean), which matters for ``d3s_cross`` (groups are then compared on
  the reward scale instead of in units of their own std).
- ``generator=None`` uses torch's global generator.

The DAPO dynamic-sampling filter is composable with any rule: :func:`drop_zero_variance_groups`
removes the groups whose rewards are all equal (they have zero advantage, hence no gradient).
It changes the number of rollouts kept to (number of informative groups) * m.
"""

from __future__ import annotations

import operator
import sys
from typing import Callable

import torch
from torch import Tensor

from podsrl.core.advantages import check_rewards, group_advantages

__all__ = [
    "Rule",
    "RULES",
    "get_rule",
    "keep_all",
    "random_subset",
    "max_reward",
    "max_variance",
    "d3s_intra",
    "d3s_cross",
    "nonzero_variance_groups",
    "drop_zero_variance_groups",
]

Rule = Callable[..., Tensor]

# Candidates whose score is within this relative distance of the best are treated as tied.
_CANDIDATE_REL_TOL = 1e-9


# ----------------------------------------------------------------------------- helpers


def _check_m(rewards: Tensor, m: int) -> int:
    check_rewards(rewards)
    try:
        m = operator.index(m)
    except TypeError:
        raise ValueError(f"m must be an integer, got {type(m).__name__} {m!r}") from None
    n = rewards.shape[1]
    if m < 1:
        raise ValueError(f"m must be >= 1 (rollouts kept per group), got m={m}")
    if m > n:
        raise ValueError(f"m must be <= n: cannot keep m={m} of n={n} rollouts per group")
    return m


def _check_valid(valid: Tensor | None, rewards: Tensor) -> None:
    if valid is not None and (not isinstance(valid, Tensor) or valid.dtype != torch.bool or valid.shape != rewards.shape):
        raise ValueError(
            f"valid must be None or a bool tensor of the rewards' shape {tuple(rewards.shape)}, got "
            f"{getattr(valid, 'dtype', type(valid).__name__)} {tuple(getattr(valid, 'shape', ()))}"
        )


def _uniform(
    shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Uniform [0, 1) noise of ``shape`` on ``like``'s device, drawn from ``generator``."""
    device = generator.device if generator is not None else like.device
    noise = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    return noise.to(like.device)


def _random_int31(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """Uniform int32 in [0, 2^31) of ``shape`` on ``like``'s device, drawn from ``generator``."""
    device = generator.device if generator is not None else like.device
    return torch.empty(shape, dtype=torch.int32, device=device).random_(generator=generator).to(like.device)


# Index of the high 32-bit half of an int64 in memory (torch tensors use the host byte order).
_HIGH = 1 if sys.byteorder == "little" else 0


def _random_tie_order(values: Tensor, generator: torch.Generator | None, descending: bool = False) -> Tensor:
    """Permutation [G, L] sorting each row of ``values`` [G, L], equal values in random order.

    When every value is exactly representable in float32 (always for float32/bf16/half input,
    and for float64 rewards such as 0/1), one int64 sort does it: the key's high 32 bits are the
    float32 bit pattern made order-preserving, its low 32 bits a uniform random 31-bit tie key.
    Otherwise: shuffle the row by a random permutation, then stable-sort by value (two sorts).
    """
    v32 = values.to(torch.float32) + 0.0  # + 0.0 turns -0.0 into +0.0, which compare equal
    if values.dtype == torch.float64 and not bool((v32.to(torch.float64) == values).all()):
        shuffle = _uniform(values.shape, values, generator).argsort(dim=1)  # [G, L] random permutation
        pos = torch.sort(values.gather(1, shuffle), dim=1, descending=descending, stable=True).indices
        return shuffle.gather(1, pos)
    bits = v32.view(torch.int32)  # [G, L]
    # IEEE floats order like sign-magnitude integers: flipping the magnitude bits of negative
    # numbers makes the signed int32 order equal the float order.
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # [G, L] int32
    # Pack (ordered, tie) as the (high, low) int32 halves of one int64 without int64 arithmetic.
    halves = torch.empty(*values.shape, 2, dtype=torch.int32, device=values.device)  # [G, L, 2]
    halves[..., _HIGH] = ordered
    if generator is None or generator.device == values.device:
        halves[..., 1 - _HIGH].random_(generator=generator)  # uniform in [0, 2^31)
    else:
        halves[..., 1 - _HIGH] = _random_int31(values.shape, values, generator)
    key = halves.view(torch.int64).squeeze(-1)  # [G, L]
    return torch.sort(key, dim=1, descending=descending).indices


def _mask_from_order(order: Tensor, keep_sorted: Tensor) -> Tensor:
    """Scatter a mask over sorted positions [G, L] back to the original positions [G, L]."""
    return torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)


def _max_variance_keep(values: Tensor, k: int, generator: torch.Generator | None, valid: Tensor | None = None) -> Tensor:
    """Per row of ``values`` [G, L], the k entries whose population variance is maximal.

    PODS Lemma: with the row sorted ascending, the best subset is the (k - j) lowest and the j
    highest for some j in 0..k. Only the k lowest and k highest values are needed to score all
    k + 1 candidates, from prefix sums. ``valid`` [G, L] bool (None: all) restricts each row to
    its valid entries: a row with c valid keeps min(k, c) of them (the invalid sort last).

    Returns: [G, L] bool with exactly min(k, valid count) True per row, all valid.
    """
    G, L = values.shape
    if valid is not None:
        values = torch.where(valid, values, torch.inf)  # invalid entries sort after every valid one
    order = _random_tie_order(values, generator)  # [G, L] ascending
    count = torch.full((G, 1), L, device=values.device) if valid is None else valid.sum(dim=1, keepdim=True)  # [G, 1]
    kk = count.clamp(max=k)  # [G, 1] entries kept per row
    position = torch.arange(k, device=values.device)  # [k]
    lows = order[:, :k]  # [G, k] the k lowest
    highs = order.gather(1, (count - 1 - position).clamp(min=0))  # [G, k] the k highest valid, largest first
    v = values.gather(1, torch.cat([lows, highs], dim=1)).to(torch.float64)  # [G, 2k]
    # Variance is shift-invariant: centring on the row's mid-range keeps the float64 sums of
    # squares from cancelling when the values have a large common offset.
    v = v - (v[:, :1] + v[:, k : k + 1]) / 2  # [G, 2k]; v[:, 0] is the row min, v[:, k] the max
    v = torch.where((position < count).repeat(1, 2), v, 0.0)  # [G, 2k]: past a short row's valid end
    zero = v.new_zeros(G, 1)
    low1, high1 = torch.cat([zero, v[:, :k].cumsum(1)], 1), torch.cat([zero, v[:, k:].cumsum(1)], 1)  # [G, k+1]
    low2, high2 = torch.cat([zero, v[:, :k].square().cumsum(1)], 1), torch.cat([zero, v[:, k:].square().cumsum(1)], 1)
    # Candidate j (column j) takes the kk - j lowest and the j highest.
    j = torch.arange(k + 1, device=values.device)  # [k+1]
    take_low = (kk - j).clamp(min=0)  # [G, k+1]
    total1 = low1.gather(1, take_low) + high1  # [G, k+1]
    total2 = low2.gather(1, take_low) + high2  # [G, k+1]
    score = kk * total2 - total1.square()  # [G, k+1], = kk^2 * Var of candidate j
    score = torch.where(j <= kk, score, -torch.inf)  # a short row has only kk + 1 candidates

    best = score.amax(dim=1, keepdim=True)  # [G, 1]
    tied = score >= best - _CANDIDATE_REL_TOL * best.abs()  # [G, k+1]
    noise = _uniform(score.shape, score, generator, dtype=torch.float32)  # [G, k+1]
    pick = torch.where(tied, noise, -1.0).argmax(dim=1, keepdim=True)  # [G, 1]

    rank = torch.arange(L, device=values.device)  # [L] position in ascending order
    keep_sorted = (rank < kk - pick) | ((rank >= count - pick) & (rank < count))  # [G, L]
    return _mask_from_order(order, keep_sorted)


# ----------------------------------------------------------------------------- rules


def keep_all(
    rewards: Tensor, m: int, *, generator: torch.Generator | None = None, scale_std: bool = True, valid: Tensor | None = None
) -> Tensor:
    """Plain GRPO: keep every rollout, valid or not. rewards [B, n]; m must equal n. Returns [B, n] bool."""
    m = _check_m(rewards, m)
    _check_valid(valid, rewards)
    if m != rewards.shape[1]:
        raise ValueError(f"rule 'all' keeps every rollout: m must equal n={rewards.shape[1]}, got m={m}")
    return torch.ones_like(rewards, dtype=torch.bool)


def random_subset(
    rewards: Tensor, m: int, *, generator: torch.Generator | None = None, scale_std: bool = True, valid: Tensor | None = None
) -> Tensor:
    """m valid rollouts per group uniformly without replacement. rewards [B, n]. Returns [B, n] bool."""
    m = _check_m(rewards, m)
    _check_valid(valid, rewards)
    noise = _uniform(rewards.shape, rewards, generator)  # [B, n] in [0, 1)
    if valid is not None:
        noise = torch.where(valid, noise, -1.0)  # the invalid come last
    chosen = noise.topk(m, dim=1).indices  # [B, m]
    keep = torch.zeros_like(rewards, dtype=torch.bool).scatter(1, chosen, True)
    return keep if valid is None else keep & valid


def max_reward(
    rewards: Tensor, m: int, *, generator: torch.Generator | None = None, scale_std: bool = True, valid: Tensor | None = None
) -> Tensor:
    """The m highest valid rewards per group, ties at the cut at random. rewards [B, n] -> [B, n] bool."""
    m = _check_m(rewards, m)
    _check_valid(valid, rewards)
    values = rewards if valid is None else torch.where(valid, rewards, -torch.inf)  # the invalid come last
    order = _random_tie_order(values, generator, descending=True)  # [B, n]
    keep_sorted = (torch.arange(rewards.shape[1], device=rewards.device) < m).expand_as(order)  # [B, n]
    keep = _mask_from_order(order, keep_sorted.contiguous())
    return keep if valid is None else keep & valid


def max_variance(
    rewards: Tensor, m: int, *, generator: torch.Generator | None = None, scale_std: bool = True, valid: Tensor | None = None
) -> Tensor:
    """PODS max-variance down-sampling: per group the m rollouts maximising Var(r_S).

    rewards [B, n] -> keep [B, n] bool, m True per row (fewer where fewer are valid).
    O(n log n + m) per group, vectorised.
    """
    m = _check_m(rewards, m)
    _check_valid(valid, rewards)
    return _max_variance_keep(rewards, m, generator, valid)


def d3s_intra(
    rewards: Tensor,
    m: int,
    *,
    generator: torch.Generator | None = None,
    scale_std: bool = True,
    valid: Tensor | None = None,
) -> Tensor:
    """D3S intra-group: per group the m rollouts maximising Var of their full-group advantages
    (over the group's valid rollouts).

    rewards [B, n] -> keep [B, n] bool, m True per row (fewer where fewer are valid).
    """
    m = _check_m(rewards, m)
    _check_valid(valid, rewards)
    advantages = group_advantages(rewards, valid, scale_std=scale_std)  # [B, n]
    return _max_variance_keep(advantages, m, generator, valid)


def d3s_cross(
    rewards: Tensor,
    m: int,
    *,
    generator: torch.Generator | None = None,
    scale_std: bool = True,
    valid: Tensor | None = None,
) -> Tensor:
    """D3S cross-group: B*m of the pooled B*n rollouts maximising Var of full-group advantages.

    rewards [B, n] -> keep [B, n] bool with B*m True in total (per group: any number in 0..n;
    min(B*m, valid) when some are not valid).
    """
    B, n = rewards.shape if rewards.dim() == 2 else (0, 0)
    try:
        m = _check_m(rewards, m)
    except ValueError as err:
        raise ValueError(f"d3s_cross keeps B*m of the pooled B*n rollouts: {err}") from None
    _check_valid(valid, rewards)
    advantages = group_advantages(rewards, valid, scale_std=scale_std)  # [B, n]
    pooled = advantages.reshape(1, B * n)  # [1, B*n]
    pooled_valid = None if valid is None else valid.reshape(1, B * n)
    return _max_variance_keep(pooled, B * m, generator, pooled_valid).reshape(B, n)


RULES: dict[str, Rule] = {
    "all": keep_all,
    "random": random_subset,
    "max_reward": max_reward,
    "max_variance": max_variance,
    "d3s_intra": d3s_intra,
    "d3s_cross": d3s_cross,
}


def get_rule(name: str) -> Rule:
    """The rule registered as ``name`` in :data:`RULES`; ValueError listing the valid names."""
    try:
        return RULES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown selection rule {name!r}; valid rules: {', '.join(RULES)}") from None


# ----------------------------------------------------------------------------- DAPO filter


def nonzero_variance_groups(rewards: Tensor, valid: Tensor | None = None) -> Tensor:
    """DAPO dynamic-sampling filter: rewards [B, n] -> [B] bool, True where not all rewards equal
    (of the valid ones, when ``valid`` [B, n] is given: a group with fewer than two valid is False)."""
    check_rewards(rewards)
    _check_valid(valid, rewards)
    if valid is None:
        return (rewards != rewards[:, :1]).any(dim=1)
    highest = torch.where(valid, rewards, -torch.inf).amax(dim=1)  # [B]
    lowest = torch.where(valid, rewards, torch.inf).amin(dim=1)  # [B]
    return highest > lowest


def drop_zero_variance_groups(keep: Tensor, rewards: Tensor, valid: Tensor | None = None) -> Tensor:
    """Un-keep every rollout of groups whose (valid) rewards are all equal. keep, rewards [B, n] -> [B, n].

    Composes with any rule; the number kept becomes (informative groups) * m for per-group rules,
    no longer B*m, so callers must not assume a fixed batch size afterwards.
    """
    check_rewards(rewards)
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool or keep.shape != rewards.shape:
        raise ValueError(
            f"keep must be a bool tensor of the rewards' shape {tuple(rewards.shape)}, got "
            f"{getattr(keep, 'dtype', type(keep).__name__)} {tuple(getattr(keep, 'shape', ()))}"
        )
    return keep & nonzero_variance_groups(rewards, valid)[:, None]
