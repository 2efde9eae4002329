"""The one call a trainer makes between scoring its rollouts and its first forward pass.

    selection = downsample(rewards, spec, progress=p, step=s, seed=run_seed)   # rewards [B, n]
    rows = selection.keep.flatten().nonzero()        # the only rollouts that reach a forward pass
    advantages = selection.advantages.flatten()[rows]

What it does, in order (PODS, arXiv 2504.13818; D3S, arXiv 2509.22115; ALGORITHMS.md 2-4):

1. the schedules: m(p) rollouts kept per group and the D3S token fraction K(p) at training
   progress p in [0, 1] (:mod:`podsrl.core.schedules`);
2. the rule (:data:`podsrl.core.selection.RULES`) picks the kept rollouts, with a generator seeded
   by (seed, step) (:func:`selection_generator`), then the DAPO filter when asked;
3. the advantages over the kept subset (PODS) or over the full group (GRPO, D3S), 0 outside the
   kept rollouts (:func:`podsrl.core.advantages.group_advantages`);
4. the selection metrics, over all n rollouts and over the kept ones.

It must run before the old-policy and reference log-prob passes: those passes are per rollout and
cost as much as the update's own forward, so running them on all n and dropping rows afterwards
would spend on the n - m rejected rollouts what PODS exists to save (docs/integrating.md).

:class:`DownsampleSpec` is the whole configuration, in one place: ``podsrl train`` reads it as its
``[select]`` section (:class:`podsrl.config.SelectConfig` is this class) and TRL users set it as
``PODSConfig``'s ``pods_<field>`` arguments (:mod:`podsrl.integrations.trl`). Same names, same
defaults, same validation, and the same seed rule, so both trainers keep the same rollouts for the
same rewards, step and seed.

Choices made where the papers are silent:

- **m's default** (``m = None``): n for the rule ``all`` (GRPO), else max(2, n // 4), at most n (the
  PODS paper's n = 64, m = 16). Not max(1, ...): below n = 8 that kept one rollout per group, whose
  advantage over the kept subset is always 0, so nothing was learned. :meth:`DownsampleSpec.check_signal`
  refuses the settings that can never train on a nonzero advantage (``podsrl train`` calls it).
- **A schedule without an end** is constant; an end (``m_final``, ``token_fraction_final``) with a
  constant schedule is an error rather than silently ignored.
- **Seeds**: one torch generator per step, seeded by (seed, step) only (the stream
  :data:`podsrl.core.seeds.Stream.SELECTION`), so a resumed run selects exactly as an uninterrupted
  one and every process of a multi-process run computes the same selection without communicating.
- **One decision**: a selection already made for these groups (``keep``, e.g. by dynamic
  sampling's signal test over a generation batch) is used as it is, never drawn again: the rows a
  step trains on are the rows its test found a signal in (:func:`group_signal`).
- **Metrics** are population statistics except the reward standard deviations, which are sample
  (Bessel) std as TRL logs them; a rollout set with fewer than two members has std 0, and the kept
  reward mean of an empty selection (every group filtered out) is NaN.
- **Batch std** (``std_over="batch"``, TRL's ``scale_rewards="batch"``): each group's advantage
  set is centred on its own mean and divided by the std of every group's set pooled
  (:mod:`podsrl.core.advantages`). The D3S rules then select on the centred advantages (as with
  ``scale_std=False``): one std for the whole step scales every advantage by the same factor,
  which changes no variance comparison, so that is the selection the trained advantages make.
- **Missing rewards** (``allow_missing=True``; TRL turns a completion every reward function scored
  None into NaN): NaN marks a rollout without a reward. It is never kept, except by ``all`` (plain
  GRPO keeps every rollout; it is trained on with advantage 0, exactly as TRL's GRPOTrainer does);
  every statistic is over the scored rollouts only: the rule's choice (a group with fewer than m
  scored keeps all of them), the advantages' means and stds, the DAPO filter (a group with fewer
  than two different scored rewards is constant) and the metrics. Without ``allow_missing`` a NaN
  reward is an error: ``podsrl train`` never produces one (a reward function returning a
  non-number raises :class:`podsrl.errors.RewardError`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from podsrl.core.advantages import STD_SCOPES, check_rewards, group_advantages
from podsrl.core.schedules import SCHEDULES, schedule_value, scheduled_m
from podsrl.core import seeds
from podsrl.core.seeds import Stream
from podsrl.core.selection import RULES, drop_zero_variance_groups, get_rule, nonzero_variance_groups
from podsrl.errors import ConfigError

__all__ = [
    "DownsampleSpec", "Selection", "downsample", "selection_generator", "has_signal", "group_signal", "groups_with_signal",
]  # fmt: skip

ADVANTAGE_SETS = ("auto", "kept", "group")
TOKEN_SCORES = ("adv_entropy", "entropy")


@dataclass(frozen=True)
class DownsampleSpec:
    """How to keep m of the n rollouts per prompt, and the advantages and token fraction to train with."""

    rule: str = "max_variance"  # all (GRPO) | random | max_reward | max_variance (PODS) | d3s_intra | d3s_cross (D3S)
    m: int | None = None  # rollouts kept per prompt at the start of training; None: n for rule all, else max(2, n // 4), at most n
    m_final: int | None = None  # m at the end of training (progress 1), reached along m_schedule; None: m throughout
    m_schedule: str = "constant"  # how m moves to m_final with training progress: constant | linear | cosine | step. Progress (podsrl train): steps / train.max_steps or training time / train.max_seconds, the further; with both set (train.max_seconds has a default), time can end the schedule before the last step: set train.max_seconds = "none" for steps alone
    schedule_steps: int = 4  # pieces of the 'step' schedule (of m and of the token fraction)
    filter_zero_variance: bool = False  # DAPO dynamic-sampling filter: drop groups whose n rewards are all equal
    advantage_over: str = "auto"  # "kept" (PODS) | "group" (GRPO, D3S) | "auto" (group for the d3s rules, else kept)
    scale_std: bool = True  # divide advantages by the std of their set (GRPO); false: Dr. GRPO (centring only)
    std_over: str = "group"  # with scale_std: the std of each group's set ("group") | of all groups' sets pooled ("batch", as TRL)
    token_fraction: float = 1.0  # D3S token selection: fraction of the kept rollouts' tokens in the loss (of those with advantage != 0); 1: all
    token_fraction_final: float | None = None  # the token fraction at the end of training (progress 1); None: token_fraction
    token_schedule: str = "constant"  # how token_fraction moves to token_fraction_final with training progress (as m_schedule: podsrl train's is the further of steps / train.max_steps and training time / train.max_seconds)
    token_score: str = "adv_entropy"  # "adv_entropy" (D3S, |A| x entropy) | "entropy" (the 80/20 rule)
    seed: int | None = None  # selection seed; None: the run's seed

    FIELD_PREFIX: ClassVar[str] = ""  # how error messages name the fields ("select.", "pods_")

    def __post_init__(self) -> None:
        name = lambda field: f"{self.FIELD_PREFIX}{field}"  # noqa: E731
        _one_of(self.rule, RULES, name("rule"))
        for field in ("m", "m_final"):
            value = getattr(self, field)
            _check(value is None or _is_int(value) and value >= 1, name(field), f"must be a whole number >= 1, got {value!r}")
        _one_of(self.m_schedule, SCHEDULES, name("m_schedule"))
        _one_of(self.token_schedule, SCHEDULES, name("token_schedule"))
        _check(_is_int(self.schedule_steps) and self.schedule_steps >= 2, name("schedule_steps"),
               f"must be a whole number >= 2 (the pieces of the 'step' schedule), got {self.schedule_steps!r}")  # fmt: skip
        _one_of(self.advantage_over, ADVANTAGE_SETS, name("advantage_over"))
        _one_of(self.std_over, STD_SCOPES, name("std_over"))
        _one_of(self.token_score, TOKEN_SCORES, name("token_score"))
        for field in ("token_fraction", "token_fraction_final"):
            value = getattr(self, field)
            _check(value is None or _is_number(value) and 0 < value <= 1, name(field),
                   f"must be in (0, 1], the fraction of completion tokens kept; got {value!r}")  # fmt: skip
        _check(self.seed is None or _is_int(self.seed), name("seed"), f"must be a whole number (or none), got {self.seed!r}")
        for end, start, schedule in (("m_final", "m", "m_schedule"), ("token_fraction_final", "token_fraction", "token_schedule")):
            moves = getattr(self, end) is not None and getattr(self, end) != getattr(self, start)
            _check(not moves or getattr(self, schedule) != "constant", name(schedule),
                   f"is 'constant', so {name(end)} = {getattr(self, end)!r} would never be reached; "
                   f"set {name(schedule)} to linear, cosine or step, or drop {name(end)}")  # fmt: skip

    # ------------------------------------------------------------------ what follows from n

    def check_n(self, n: int, n_name: str = "n") -> None:
        """ConfigError unless m (and m_final) fit n rollouts per prompt; ``n_name`` is how the
        caller's config names n (``rollout.n``, ``num_generations``)."""
        name = lambda field: f"{self.FIELD_PREFIX}{field}"  # noqa: E731
        for field in ("m", "m_final"):
            value = getattr(self, field)
            if value is not None and value > n:
                raise ConfigError(f"{name(field)} = {value} exceeds {n_name} = {n}: PODS keeps m of the n rollouts sampled "
                                  f"per prompt; lower {name(field)} or raise {n_name}")
        if self.rule == "all":
            _check(self.m in (None, n) and self.m_final in (None, n), name("m"),
                   f"rule 'all' (plain GRPO) keeps every rollout: leave {name('m')} unset or set it to {n_name} = {n}")  # fmt: skip

    def check_signal(self, n: int, n_name: str = "n") -> None:
        """ConfigError when no step could ever train on a nonzero advantage with n rollouts per
        prompt: every step would log rows_run 0, grad_norm 0 and loss 0 (issue 38). Such are a group
        of one rollout (nothing to compare it with), and one kept rollout per group (m or m_final of
        1) whose advantage is taken over the kept subset (PODS's re-normalisation over the m kept: a
        set of one has mean equal to its reward). Not ``d3s_cross``, which keeps B*m over the pooled
        batch, so a group may keep several. Separate from :meth:`check_n`: :func:`downsample` computes
        such a selection if asked; a trainer's config refuses to train on it."""
        name = lambda field: f"{self.FIELD_PREFIX}{field}"  # noqa: E731
        if n < 2:
            raise ConfigError(
                f"{n_name} = {n}: a group of one rollout has advantage 0 (there is no other rollout to compare it with), "
                f"so nothing would be learned; set {n_name} to at least 2 (PODS samples more than it keeps, e.g. 16)"
            )
        if self.advantages_over_group or self.rule == "d3s_cross":
            return
        for field, value in (("m", self.m_start(n)), ("m_final", self.m_final)):
            if value == 1:
                raise ConfigError(
                    f"{name(field)} = 1 keeps one rollout per prompt, and its advantage over the kept subset is always 0 "
                    f"(the subset's mean is its own reward), so nothing would be learned; set {name(field)} to at least 2, "
                    f"or {name('advantage_over')} = \"group\" (advantages over all {n_name} rollouts, as D3S)"
                )

    def m_start(self, n: int) -> int:
        if self.m is not None:
            return self.m
        return n if self.rule == "all" else min(n, max(2, n // 4))

    def m_at(self, n: int, progress: float) -> int:
        """Rollouts kept per group at training progress p in [0, 1]."""
        start = self.m_start(n)
        end = start if self.m_final is None else self.m_final
        return scheduled_m(n, start, end, self.m_schedule, progress, num_steps=self.schedule_steps)

    @property
    def uses_token_selection(self) -> bool:
        return self.token_fraction < 1 or (self.token_fraction_final or 1.0) < 1

    def token_fraction_at(self, progress: float) -> float:
        """The fraction of tokens kept in the loss at progress p (1.0 without token selection)."""
        if not self.uses_token_selection:
            return 1.0
        end = self.token_fraction if self.token_fraction_final is None else self.token_fraction_final
        return schedule_value(self.token_schedule, self.token_fraction, end, progress, num_steps=self.schedule_steps)

    @property
    def advantages_over_group(self) -> bool:
        if self.advantage_over == "auto":
            return self.rule.startswith("d3s")
        return self.advantage_over == "group"

    def fields(self) -> dict[str, Any]:
        """The spec's settings by field name (for copying into another spec class)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(DownsampleSpec)}


@dataclass(frozen=True)
class Selection:
    """What :func:`downsample` decided for one step's rewards [B, n]."""

    keep: Tensor  # [B, n] bool: the rollouts trained on
    advantages: Tensor  # [B, n], the rewards' dtype; 0 outside keep
    m: int  # rollouts kept per group by the rule in force (before the DAPO filter)
    token_fraction: float  # of the kept rollouts' tokens, in the loss (1.0: all)
    metrics: dict[str, float]  # see selection_metrics


def selection_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator the rule draws its tie-breaks from at ``step``."""
    return seeds.generator(seed, step, Stream.SELECTION)


def downsample(
    rewards: Tensor,
    spec: DownsampleSpec,
    *,
    progress: float = 0.0,
    step: int = 0,
    seed: int = 0,
    generator: torch.Generator | None = None,
    allow_missing: bool = False,
    keep: Tensor | None = None,
) -> Selection:
    """Keep m of the n rollouts of each group and compute the advantages to train them with.

    Args:
        rewards: [B, n] float, finite (NaN allowed with ``allow_missing``); row b holds the n
            rollouts of prompt b (every process of a multi-process run passes the same, gathered,
            tensor).
        spec: the rule, schedules, advantage set and token fraction.
        progress: training progress in [0, 1], for the schedules.
        step: the optimizer step about to be taken (0 for the first), for the seed.
        seed: the run's seed, used when ``spec.seed`` is None.
        generator: overrides the (seed, step) generator.
        allow_missing: NaN marks a rollout without a reward instead of being an error (see
            "Missing rewards" in the module docstring).
        keep: [B, n] bool, a selection already decided for these groups (the DAPO filter
            included): used as it is, and only the advantages and metrics are computed ("One
            decision" in the module docstring). None: the rule decides.

    Returns:
        a :class:`Selection`: keep [B, n] bool, advantages [B, n] (0 outside keep), m, the token
        fraction, and the metrics.
    """
    scored = None  # [B, n] bool, the rollouts with a reward; None: all of them
    if allow_missing and isinstance(rewards, Tensor) and bool(rewards.isnan().any()):
        scored = ~rewards.isnan()
        rewards = torch.where(scored, rewards, 0.0)  # the value is never read where not scored
    check_rewards(rewards)
    n = rewards.shape[1]
    spec.check_n(n)
    m = spec.m_at(n, progress)
    if keep is not None:
        if not isinstance(keep, Tensor) or keep.dtype != torch.bool or keep.shape != rewards.shape:
            raise ValueError(f"keep must be a bool tensor of the rewards' shape {tuple(rewards.shape)}, got {getattr(keep, 'shape', keep)!r}")
    else:
        if generator is None:
            generator = selection_generator(spec.seed if spec.seed is not None else seed, step)
        select_std = spec.scale_std and spec.std_over == "group"  # a batch-wide std changes no selection
        keep = get_rule(spec.rule)(rewards, m, generator=generator, scale_std=select_std, valid=scored)  # [B, n]
        if spec.filter_zero_variance:
            keep = drop_zero_variance_groups(keep, rewards, scored)
    trained = keep if scored is None else keep & scored  # the kept rollouts that have a reward
    advantage_set = scored if spec.advantages_over_group else trained  # None: every rollout of the group
    advantages = group_advantages(rewards, advantage_set, scale_std=spec.scale_std, std_over=spec.std_over)
    advantages = advantages * keep  # [B, n]: over the full group (D3S), still only the kept are trained on
    token_fraction = spec.token_fraction_at(progress)
    metrics = selection_metrics(rewards, keep, advantages, m, token_fraction, scored)
    return Selection(keep, advantages, m, token_fraction, metrics)


def has_signal(selection: Selection) -> Tensor:
    """[B] bool: the groups of a selection whose kept rollouts carry a nonzero advantage, the only
    groups a step learns from (the others add exactly nothing to the policy gradient)."""
    return (selection.keep & (selection.advantages != 0)).any(dim=1)


def group_signal(rewards: Tensor, selection: Selection, spec: DownsampleSpec) -> Tensor:
    """Dynamic sampling's test (DAPO, arXiv 2503.14476 Sec. 3.2, for every rule) and prompt
    selection's outcome: rewards [G, n] (NaN: not sampled) and their selection -> [G] bool, whether
    each group has a signal.

    For every rule but ``d3s_cross`` a group's selection is its own (the rule runs per group), so
    the answer is :func:`has_signal`: its kept rollouts carry a nonzero advantage, in the very rows
    the step then trains on (pass ``selection.keep`` on to :func:`downsample`). A batch-wide std
    (``std_over="batch"``) scales every advantage by one factor and changes no sign. ``d3s_cross``
    pools the batch, so whether the pool keeps a group's rows depends on the other groups; its
    answer is the group's own: its scored full-group rewards are not all equal (a nonzero advantage
    the pool could choose). DAPO's test ("not all rewards equal") is this one for GRPO (rule
    ``all``); PODS' ``max_reward`` over the kept subset needs the m highest rewards not all equal,
    and m = 1 over the kept subset never has a signal.
    """
    if spec.rule == "d3s_cross":
        scored = ~rewards.isnan()
        return nonzero_variance_groups(rewards.nan_to_num(0.0), scored)
    return has_signal(selection)


def groups_with_signal(
    rewards: Tensor,
    spec: DownsampleSpec,
    *,
    progress: float = 0.0,
    generator: torch.Generator | None = None,
    allow_missing: bool = False,
) -> Tensor:
    """rewards [G, n] -> [G] bool: :func:`group_signal` of one :func:`downsample` call over the
    groups (one batched call; the selection itself is discarded, so use :func:`group_signal` where
    the step trains on what was tested)."""
    selection = downsample(rewards, spec, progress=progress, generator=generator, allow_missing=allow_missing)
    return group_signal(rewards, selection, spec)


def selection_metrics(
    rewards: Tensor, keep: Tensor, advantages: Tensor, m: int, token_fraction: float, scored: Tensor | None = None
) -> dict[str, float]:
    """rewards, keep, advantages [B, n] -> the step's selection metrics (names as logged):

    m, token_fraction; kept (rollouts kept); signal_rows (kept rollouts with a nonzero advantage: the
    only ones that move the weights without a KL term); reward_mean, reward_std (all n); reward_kept_mean,
    reward_kept_std (the kept); zero_variance_groups (fraction of groups whose n rewards are all
    equal); kept_adv_var (population variance of the kept advantages, the quantity D3S maximises).
    With ``scored`` [B, n] bool the reward statistics are over the scored rollouts only.
    """
    all_rewards = rewards if scored is None else rewards[scored]  # [N] (all n, or the scored)
    kept_rewards = rewards[keep if scored is None else keep & scored]  # [K]
    kept_advantages = advantages[keep]  # [K]
    return {
        "m": m,
        "token_fraction": token_fraction,
        "kept": int(keep.sum()),
        "signal_rows": int((advantages[keep] != 0).sum()),
        "reward_mean": float(all_rewards.mean()) if all_rewards.numel() else math.nan,
        "reward_std": float(all_rewards.std()) if all_rewards.numel() > 1 else 0.0,
        "reward_kept_mean": float(kept_rewards.mean()) if kept_rewards.numel() else math.nan,
        "reward_kept_std": float(kept_rewards.std()) if kept_rewards.numel() > 1 else 0.0,
        "zero_variance_groups": float((~nonzero_variance_groups(rewards, scored)).float().mean()),
        "kept_adv_var": float(kept_advantages.var(unbiased=False)) if kept_advantages.numel() else 0.0,
    }


def _check(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


def _one_of(value: object, valid, name: str) -> None:
    _check(isinstance(value, str) and value in valid, name, f"unknown value {value!r}; valid values: {', '.join(valid)}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
