"""Group-relative advantages (GRPO, PODS, D3S, Dr. GRPO).

For each prompt's group of rollouts with rewards r_1..r_n and a set S of the rollouts that are
trained on, the advantage of rollout i in S is

    a_i = (r_i - mean(r_S)) / std(r_S)

- GRPO and D3S: S is the full group (``keep=None``). D3S (arXiv 2509.22115) selects rollouts by
  these full-group advantages and does not re-normalise after selection.
- PODS (arXiv 2504.13818, Sec. 3, "advantages are recomputed over the subset"): S is the
  down-sampled subset chosen by a rule of :mod:`podsrl.core.selection` (``keep`` = its mask).
- Dr. GRPO (``scale_std=False``): a_i = r_i - mean(r_S), no division by the standard deviation.
- Batch std (``std_over="batch"``, TRL's ``scale_rewards="batch"``): each group is still centred on
  its own mean(r_S), but divided by one std for the whole step, that of the rewards of every
  group's set S pooled (TRL 1.16: ``nanstd(rewards)`` over the generation batch). Dividing every
  advantage of a step by the same number keeps the groups' relative weights; GRPO's per-group std
  makes a group with a small spread as loud as one with a large spread.

Choices made where the papers are silent:

- **Sample (Bessel-corrected) std by default** (``unbiased=True``): this is what TRL's GRPO
  trainer and the PODS authors' release (a TRL fork) use, ``rewards.view(-1, G).std(dim=1)``.
  ``unbiased=False`` gives the population std. The two differ by the constant factor
  sqrt(|S| / (|S| - 1)) within a group, so they only rescale the advantages.
- **No epsilon in the denominator.** The reference implementations divide by ``std + 1e-4``,
  which turns a near-constant group into huge advantages and makes the result depend on the
  reward scale. Here a group whose kept rewards are all exactly equal (std 0), or which keeps
  fewer than two rollouts, gets advantage 0 for every rollout; other groups are divided by their
  exact std. Constancy is tested exactly (max == min of the kept rewards), not with a threshold,
  because ``r - mean(r)`` of a constant group can be a tiny non-zero number in floating point.
- **The batch std** is the sample std of the pooled rewards (Bessel over the pooled count, as TRL);
  it is not the std of the centred values, so between-group spread counts, as in TRL. Groups whose
  kept rewards are all equal still get advantage 0, so a step whose pooled rewards are all equal
  does too.
- **The std is taken of the rewards divided by their range** (max - min of S, or of the pooled
  sets for the batch std), then the range is divided out again: the same number, but squaring
  ``r - mean`` directly underflows to 0 in float32 when rewards differ by less than about 1e-19,
  which would divide a non-constant group by a zero std (an infinite advantage).
- Rollouts outside S get advantage 0 (they are not trained on).
- The result has the dtype of ``rewards``; reduced-precision inputs are computed in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["STD_SCOPES", "check_rewards", "group_advantages"]

STD_SCOPES = ("group", "batch")  # what the std of the advantages is taken over (see the module docstring)


def check_rewards(rewards: Tensor, name: str = "rewards") -> None:
    """Raise ValueError unless ``rewards`` is a finite floating-point [B, n] tensor with n >= 1."""
    if not isinstance(rewards, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [B, n], got {type(rewards).__name__}")
    if rewards.dim() != 2:
        raise ValueError(
            f"{name} must be 2-D [B groups, n rollouts], got shape {tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype, got {rewards.dtype}")
    if rewards.shape[1] < 1:
        raise ValueError(f"{name} must have at least one rollout per group, got shape {tuple(rewards.shape)}")
    if bool(rewards.sum().isfinite()):  # fast path: one NaN/inf entry makes the sum non-finite
        return
    bad = ~torch.isfinite(rewards)  # [B, n]
    if bool(bad.any()):
        group, index = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name} must be finite: {int(bad.sum())} NaN/inf value(s), first at group {group}, "
            f"rollout {index} (value {rewards[group, index].item()})"
        )


def _check_keep(keep: Tensor, rewards: Tensor) -> None:
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool:
        got = keep.dtype if isinstance(keep, Tensor) else type(keep).__name__
        raise ValueError(f"keep must be a bool tensor, got {got}")
    if keep.shape != rewards.shape:
        raise ValueError(
            f"keep must have the shape of rewards {tuple(rewards.shape)}, got {tuple(keep.shape)}"
        )


def group_advantages(
    rewards: Tensor,
    keep: Tensor | None = None,
    *,
    scale_std: bool = True,
    unbiased: bool = True,
    std_over: str = "group",
) -> Tensor:
    """Group-normalised advantages over the kept rollouts of each group.

    Args:
        rewards: [B, n] float, finite. One row per prompt, one column per rollout.
        keep: [B, n] bool, the rollouts trained on (PODS subset); None means the full group.
        scale_std: divide by the std (GRPO); False is Dr. GRPO (centring only).
        unbiased: sample std (Bessel, the default, as TRL and the PODS release) or population std.
        std_over: with ``scale_std``, the std of each group's kept rewards (``"group"``) or one std
            of the kept rewards of every group pooled (``"batch"``, TRL's ``scale_rewards="batch"``).

    Returns:
        [B, n] advantages, dtype of ``rewards``; 0 outside ``keep`` and for groups whose kept
        rewards are all equal or that keep fewer than two rollouts.
    """
    check_rewards(rewards)
    if std_over not in STD_SCOPES:
        raise ValueError(f"std_over must be one of {', '.join(STD_SCOPES)}, got {std_over!r}")
    if keep is None:
        keep = torch.ones_like(rewards, dtype=torch.bool)
    else:
        _check_keep(keep, rewards)

    work_dtype = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.to(work_dtype)  # [B, n]
    count = keep.sum(dim=1, keepdim=True)  # [B, 1]
    mean = torch.where(keep, r, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)  # [B, 1]
    centred = torch.where(keep, r - mean, 0.0)  # [B, n]

    # Exact constancy test of the kept rewards: a constant group has no signal, whatever
    # rounding r - mean produced.
    kept_max = torch.where(keep, r, -torch.inf).amax(dim=1, keepdim=True)  # [B, 1]
    kept_min = torch.where(keep, r, torch.inf).amin(dim=1, keepdim=True)  # [B, 1]
    informative = (count >= 2) & (kept_max > kept_min)  # [B, 1]

    if scale_std and std_over == "batch":
        total = keep.sum()  # pooled count over every group's set
        pooled_mean = torch.where(keep, r, 0.0).sum() / total.clamp(min=1)
        span = torch.where(keep, r, -torch.inf).amax() - torch.where(keep, r, torch.inf).amin()
        span = torch.where(span > 0, span, 1.0)  # the pooled range; 0 only if every kept reward is equal (no group is informative)
        pooled_dev = torch.where(keep, r - pooled_mean, 0.0) / span  # [B, n], in [-1, 1]
        var = pooled_dev.square().sum() / ((total - 1) if unbiased else total).clamp(min=1)
        centred = centred / span / torch.where(var > 0, var.sqrt(), 1.0)
    elif scale_std:
        dof = (count - 1) if unbiased else count  # [B, 1]
        span = torch.where(informative, kept_max - kept_min, 1.0)  # [B, 1], > 0
        unit = centred / span  # [B, n]; an informative group has an entry of magnitude >= 1/2
        var = unit.square().sum(dim=1, keepdim=True) / dof.clamp(min=1)  # [B, 1], > 0 where informative
        centred = unit / torch.where(informative, var.sqrt(), 1.0)
    advantages = torch.where(informative & keep, centred, 0.0)  # [B, n]
    return advantages.to(rewards.dtype)
