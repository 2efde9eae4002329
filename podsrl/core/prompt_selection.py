"""Prompt selection before sampling: skip the prompts predicted to teach nothing (pure functions).

A group whose selection keeps no rollout with a nonzero advantage (a *silent* group:
:func:`podsrl.core.downsample.group_signal`) adds exactly nothing to the policy gradient, yet its n
rollouts cost as much to sample as any others. Whether a prompt's group is silent is consistent
over time: a prompt the policy always solves, or never does, stays so from one visit to the next.
GRESO (Zheng et al. 2025, "Act Only When It Pays", arXiv 2506.02177, Sec. 4) measured that
temporal consistency and skips predicted-silent prompts before sampling them; this module is its
decision rule, as podsrl applies it:

- **History**: per prompt, the number of its most recent consecutive visits that came back silent
  (``streak``, [P] uint8, saturating at 255: one byte a prompt, 100 KB for 100,000 prompts). A
  visit with a signal resets it to 0; a skipped prompt's streak is unchanged (nothing was seen).
- **Skipping**: a prompt with streak z is sampled with probability max(p^z, floor) and skipped
  otherwise (:func:`sample_probability`), p being the *exploration rate*: a prompt that has just
  been silent once is explored with probability p, one silent k times in a row with p^k, and never
  with less than ``floor``, so no prompt is written off for good.
- **Self-tuning**: after each step, p moves by a fixed step towards the target share of silent
  groups among those sampled (:func:`next_explore_rate`): more silent groups than the target lower p
  (skip more), fewer raise it (explore more), within [low, high].

Where podsrl differs from GRESO, and why:

- **Silent is the step's rule's verdict**, not a reward mean: GRESO calls a prompt easy when its
  mean reward is at least 0.98 and hard at most 0.11 (binary rewards). podsrl records what the
  step's selection decided (:func:`podsrl.core.downsample.group_signal`), so it is right for any
  reward values and any rule: under PODS max-reward a group whose m highest rewards are equal is
  silent though its rewards vary, and under GRPO a group of equal partial-credit rewards is silent.
- **One exploration rate** instead of GRESO's two (easy and hard prompts, with a third and two
  thirds of the target each): "easy" and "hard" are defined by reward values, which podsrl's
  verdict does not assume. One rate keeps one setting to tune and one number to log.
- **Its randomness is a seeded stream** (:data:`podsrl.core.seeds.Stream.PROMPT_SKIP`, one uniform
  per prompt and epoch), not a global generator, so every rank of a torchrun job makes the same
  decisions without communicating and a resumed run makes the ones an uninterrupted run would.
- **Adapting starts once a prompt comes back** (the second epoch), as GRESO's does (``epoch > 0``):
  before that no prompt has a history and the silent share says nothing about skipping.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["STREAK_MAX", "sample_probability", "skip_mask", "record_outcomes", "next_explore_rate"]

STREAK_MAX = 255  # the history is one byte a prompt


def sample_probability(streak: Tensor, explore: float, floor: float) -> Tensor:
    """streak [K] uint8 (consecutive silent visits) -> [K] float64, the probability of sampling each
    prompt: 1 for a prompt never silent (z = 0), else max(explore ** z, floor)."""
    z = streak.to(torch.float64)  # [K]
    return torch.where(z == 0, 1.0, torch.clamp(torch.pow(torch.tensor(explore, dtype=torch.float64), z), min=floor))


def skip_mask(streak: Tensor, uniform: Tensor, explore: float, floor: float) -> Tensor:
    """streak [K] uint8, uniform [K] in [0, 1) (the candidates' draws) -> [K] bool, the prompts
    skipped: those whose draw is at or above their sampling probability."""
    return uniform.to(torch.float64) >= sample_probability(streak, explore, floor)


def record_outcomes(streak: Tensor, prompts: Tensor, silent: Tensor) -> Tensor:
    """The history after a batch: streak [P] uint8, the batch's prompts [G] (indices) and whether each
    group came back silent [G] bool -> a new streak [P]: +1 (at most :data:`STREAK_MAX`) where silent,
    0 where it had a signal. A prompt sampled twice in one batch (a pool smaller than a batch)
    takes its last visit's outcome after its first's."""
    out = streak.clone()
    for p, quiet in zip(prompts.tolist(), silent.tolist()):  # in order: repeats apply one after another
        out[p] = min(int(out[p]) + 1, STREAK_MAX) if quiet else 0
    return out


def next_explore_rate(explore: float, silent_share: float, *, target: float, step: float, low: float, high: float) -> float:
    """The exploration rate after a step whose sampled groups were ``silent_share`` silent: one
    ``step`` down when at or above ``target`` (skip more), one up below it, within [low, high]."""
    moved = explore - step if silent_share >= target else explore + step
    return min(high, max(low, moved))
