"""Exact early stopping: sample a group only until more rollouts could not change what it trains on.

PODS (arXiv 2504.13818) samples n rollouts per prompt and keeps m of them by a rule
(:mod:`podsrl.core.selection`). Sampling a group in rounds and stopping it as soon as the rest of
its n rollouts cannot change the *distribution* of its kept set and advantages trains on the same
kept set as fixed-n sampling, in distribution, for fewer generated rollouts. This module states
the stopping criteria, proves them, and checks the declared reward values they rely on. Tensors in,
tensors out; the trainer (:func:`podsrl.train.loop.train_step`) does the sampling.

What is exact is the law of the kept *multiset* of (rollout, advantage) pairs, not of the kept
rows as an ordered tuple. Their order (positions in the group, hence in the batch) has another
law: with ``max_variance``, m = 2, binary rewards and rounds of one rollout, the group stops on
the first rollout of the second kind, so the kept pair comes in the order in which the two kinds
first appeared (the low one first exactly when the first rollout was low), whereas with all n
sampled each order has probability 1/2 (i.i.d. rollouts are exchangeable and the rule breaks ties
uniformly). Everything the update computes is a function of
the multiset except what depends on row order: float summation order, the micro-batch layout
(:func:`podsrl.train.update.micro_batch_order` keeps index order among rows of equal length) and
the order in which ``torch.topk`` breaks exact ties in D3S token selection. So the update is
exact in law up to float rounding and those tie-breaks, not bit for bit per ordered sample.

    criterion = stop_criterion(spec_rule, m, values=(0.0, 1.0))      # None: no exact criterion
    done = criterion(rewards)                                        # rewards [B, n], NaN: not sampled yet -> [B] bool

Setting. A group's rollouts X_1, X_2, ... are i.i.d. draws of the policy, with rewards r_i = R(X_i).
The group is sampled in rounds; after c rollouts it stops when ``done`` says so (a function of
r_1..r_c only), or at c = n. The rule then keeps m of the c sampled rollouts (``valid`` in
:mod:`podsrl.core.selection`; :func:`podsrl.core.downsample.downsample` with ``allow_missing``) and
the advantages are computed over the kept set (PODS, ``advantage_over`` "kept").

Lemma 1 (rewards suffice). The stopping time and the rule's kept positions S depend on the rewards
and on noise independent of the rollouts. Given the rewards and S, the kept X_i are independent
with laws X | R = r_i. So the law of the kept multiset {(X_i, a_i): i in S}, whose advantages a_i
are a function of the kept rewards, is fixed by the law of the kept reward multiset M. Each
criterion below shows that M has the same law with early stopping as with all n rollouts.

Lemma 2 (stopping on a closed region). Let Q(. | r) be the law of M when the rule runs on the
rewards r (over its tie-break noise). If ``done`` is true on r_1..r_c only when Q(. | r_1..r_c) =
Q(. | r_1..r_n) for every continuation r_{c+1}..r_n, then draw all n rewards and look only at the
prefix: given r_1..r_n both procedures output M with the same law, hence unconditionally too. A
region closed under continuation (counts that only grow) is also safe to test at round boundaries
only.

The criteria (m: the step's m, so a scheduled m is fine; t(m) below):

- ``random`` (any rewards): stop after c >= m rollouts. The kept positions are uniform and
  independent of the values, so M is m i.i.d. rewards, from c or from n i.i.d. rollouts alike.
  (Not via Lemma 2: the stop time is fixed, no conditioning is involved.)
- ``max_reward`` (rewards in a declared finite set, maximum v*): stop when K = #{r_i = v*} >= m.
  Then M is m copies of v* for the prefix and for every continuation (K only grows): Lemma 2.
- ``max_variance`` (binary rewards lo < hi, K highs, L lows; h = number of highs kept): stop when
  K >= t(m) and L >= t(m), with t(m) = m/2 for even m, 1 for m = 1, (m+3)/2 for odd m >= 3.
  Var(M) is proportional to h(m - h). The rule (selection.py, ``_max_variance_keep``) sorts the
  c rewards with random ties, scores the m + 1 candidates j = 0..m (the m - j lowest and the j
  highest; a candidate keeps h(j) = min(j, K) + max(0, m - j - L) highs) and picks uniformly among
  the best-scoring candidates: so Q is the share of best candidates giving each h.
  Even m = 2a: h = a is the unique maximiser, reached (by j = a) iff K >= a and L >= a, so Q is a
  point mass on that region. Odd m = 2a + 1: h = a and h = a + 1 tie. If K, L >= a + 2, candidate
  a gives h = a, candidate a + 1 gives h = a + 1, every j <= a - 1 gives h <= max(j, m - L) <= a - 1
  and every j >= a + 2 gives h = min(j, K) >= a + 2: Q = (1/2, 1/2) on the whole region, Lemma 2.
  t is tight: at K = a + 1 (L >= a + 2) the candidates a + 1..m all give h = a + 1, so
  P(h = a + 1) = (a + 1)/(a + 2), which a later high changes to 1/2 (symmetrically for L). For
  m = 1 every candidate has variance 0: j = 0 keeps a low, j = 1 a high, 1/2 each once K, L >= 1.
  The criterion depends on this tie rule: changing selection.py's tie-breaks means re-deriving t
  (tests/test_early_stop.py pins it by brute force).

Several groups: each stops on its own rewards, so the groups stay independent and anything computed
from all the kept multisets together (the batch std, ``std_over = "batch"``; D3S token selection
over the kept tokens, up to its tie-breaks, see above) has its fixed-n law too.

The DAPO filter (``filter_zero_variance``) drops a group whose n rewards are all equal, which
depends on rollouts never sampled unless the prefix already settles it. With ``max_variance`` the
stop region has both outcomes, so no continuation is constant: still exact. ``max_reward`` stops
only once it also has one reward below v*. ``random`` has no exact criterion with the filter.

Dynamic sampling (``rollout.dynamic_sampling``, :func:`podsrl.core.downsample.group_signal`)
tests each group for a signal in the selection the step then trains on (one decision). Whether
the kept rollouts carry a nonzero advantage is a function of the kept reward multiset (the rule's
tie-breaks change which rollouts it keeps, not their values), whose law the criteria above
preserve: the groups that pass, and what the step keeps of them, have their fixed-n law, and no
criterion needs to change (``max_reward``'s kept set of m maxima has no signal, and no later
reward can give it one). ``random`` keeps m of the sampled rollouts uniformly, which by
exchangeability is a uniform m-subset of n i.i.d. rollouts, tested and trained on alike
(tests/test_dynamic_sampling.py checks the law). Before issue 44 the test drew one random subset
and the step another, whose joint law depended on how many were sampled, and the pair was refused.

No exact criterion (the group is sampled to n, or the run refuses; see :func:`why_not_exact`):
``all`` (it trains on all n); the D3S rules and ``advantage_over = "group"`` (advantages over the
full group depend on every rollout); ``max_variance`` with rewards that are not binary, and
``max_reward`` without a declared finite set of values (the continuation could always hold a
better reward); ``random`` with the DAPO filter.

The declared values are a promise, checked on every reward (:func:`check_values`): a reward outside
the declared set makes the criteria unsound, so it stops the run with a RewardError rather than
silently training on a biased selection. Values are compared with a relative tolerance of 1e-6
(rewards travel as float32).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from podsrl.errors import RewardError

__all__ = ["Criterion", "CRITERIA", "stop_criterion", "why_not_exact", "variance_threshold", "check_values"]

Criterion = Callable[[Tensor], Tensor]  # rewards [B, n] (NaN: not sampled yet) -> done [B] bool

_REL_TOL = 1e-6  # declared values vs rewards that went through float32


def variance_threshold(m: int) -> int:
    """t(m): highs and lows each a group needs before ``max_variance`` may stop (module docstring)."""
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if m % 2 == 0:
        return m // 2
    return 1 if m == 1 else (m + 3) // 2


def _is(rewards: Tensor, value: float) -> Tensor:
    """[B, n] bool: the sampled rewards equal to ``value`` (NaN, not sampled, never is)."""
    return (rewards - value).abs() <= _REL_TOL * max(1.0, abs(value))


def _random(rewards: Tensor, m: int, values: tuple[float, ...] | None, filter_zero_variance: bool) -> Tensor:
    return (~rewards.isnan()).sum(dim=1) >= m  # [B]


def _max_reward(rewards: Tensor, m: int, values: tuple[float, ...] | None, filter_zero_variance: bool) -> Tensor:
    best = _is(rewards, max(values))  # [B, n]
    done = best.sum(dim=1) >= m  # [B]
    if filter_zero_variance:  # one lower reward: no continuation is constant
        done &= (~rewards.isnan() & ~best).any(dim=1)
    return done


def _max_variance(rewards: Tensor, m: int, values: tuple[float, ...] | None, filter_zero_variance: bool) -> Tensor:
    low, high = values
    t = variance_threshold(m)
    return (_is(rewards, high).sum(dim=1) >= t) & (_is(rewards, low).sum(dim=1) >= t)  # [B]


# rule -> (criterion, what it needs of the declared reward values); a rule absent has none.
CRITERIA: dict[str, tuple[Callable[..., Tensor], str]] = {
    "random": (_random, "any"),
    "max_reward": (_max_reward, "finite"),
    "max_variance": (_max_variance, "binary"),
}


def why_not_exact(
    rule: str,
    *,
    values: Sequence[float] | None,
    advantages_over_group: bool = False,
    filter_zero_variance: bool = False,
) -> str | None:
    """None when ``rule`` has an exact stopping criterion with these settings, else the reason
    (one sentence, for an error message or a log line). ``values``: the declared reward values
    (None: unknown)."""
    if rule not in CRITERIA:
        return f"rule {rule!r} has no exact early stop (exact: {', '.join(CRITERIA)}): it depends on all n rollouts"
    if advantages_over_group:
        return "advantages over the full group (advantage_over = 'group') depend on all n rollouts"
    needs = CRITERIA[rule][1]
    if needs == "finite" and not values:
        return f"rule {rule!r} stops early only when the reward's possible values are declared (its maximum must be known)"
    if needs == "binary" and (values is None or len(set(values)) != 2):
        declared = "undeclared" if values is None else f"declared as {sorted(set(values))}"
        return f"rule {rule!r} stops early only with binary rewards (two declared values); the reward values are {declared}"
    if rule == "random" and filter_zero_variance:
        return "the DAPO filter (filter_zero_variance) with rule 'random' depends on all n rollouts"
    return None


def stop_criterion(
    rule: str,
    m: int,
    *,
    values: Sequence[float] | None = None,
    filter_zero_variance: bool = False,
    advantages_over_group: bool = False,
) -> Criterion | None:
    """The exact stopping criterion of ``rule`` keeping ``m`` per group (the step's m), or None
    when there is none (:func:`why_not_exact` says why).

    The criterion maps rewards [B, n] float, NaN where a rollout has not been sampled yet, to
    done [B] bool: True where the group may stop (once True, it stays True as rewards are added).
    """
    if why_not_exact(rule, values=values, advantages_over_group=advantages_over_group, filter_zero_variance=filter_zero_variance):
        return None
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    fn = CRITERIA[rule][0]
    declared = None if values is None else tuple(sorted(set(float(v) for v in values)))
    return lambda rewards: fn(rewards, m, declared, filter_zero_variance)


def check_values(rewards: Tensor, values: Sequence[float], *, explain: Callable[[Tensor], str] | None = None) -> None:
    """RewardError unless every sampled reward of ``rewards`` [B, n] (NaN: not sampled) is one of
    the declared ``values``: the stopping criteria are exact only for the rewards they assume.
    ``explain(stray)``, stray [B, n] bool (the rollouts with an undeclared reward), gives the sentence
    that names who declared the values and the fix (the trainer's:
    :func:`podsrl.grading.rewards.explain_undeclared`)."""
    sampled = ~rewards.isnan()  # [B, n]
    known = torch.zeros_like(sampled)
    for value in values:
        known |= _is(rewards, float(value))
    stray = sampled & ~known  # [B, n]
    if bool(stray.any()):
        bad = sorted({float(v) for v in rewards[stray].tolist()})[:5]
        fix = explain(stray) if explain is not None else (
            "declare every value the reward can take (reward.values, or a reward function's `reward_values`), "
            "or set rollout.early_stop = 'off'"
        )
        raise RewardError(
            f"reward values {bad} are outside the declared values {sorted(set(float(v) for v in values))}, on which "
            f"exact early stopping (rollout.early_stop = 'exact') relies: {fix}"
        )

