"""The policy update on the kept rollouts: micro-batches, gradient accumulation, one optimizer step.

Only the m kept rollouts of each group enter this phase: that is where PODS saves time and memory
(update cost scales with the number kept, not with n).

- Rollouts are ordered by prompt group, then length, and cut into micro-batches of
  ``micro_batch_size``, so that a micro-batch runs each prompt once (``share_prompts``, see
  :mod:`podsrl.sequences`) and padding stays small. The loss of every micro-batch is normalised by
  the whole batch's sequence / token counts (``policy_loss(total_sequences=..., total_tokens=...)``),
  so the accumulated gradient equals the full-batch gradient whatever the micro-batch size.
- With one policy iteration per batch, pi_old == pi_theta numerically, so the old log-probs are the
  detached current ones and no extra forward is run (ALGORITHMS.md section 1). A scoring pass without
  gradients runs first only when it is needed: several policy iterations (pi_old must stay fixed),
  D3S token selection (the top-K threshold is over all tokens of the batch, so every entropy must be
  known before the first loss; the entropies are the current policy's, as the spec asks), or a KL
  term (reference log-probs).
- The reference policy for the KL is the initial one: the base model with the LoRA adapter disabled,
  or a frozen copy for full fine-tuning.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from podsrl.loss import policy_loss
from podsrl.sequences import Packed, forward_logprobs, pack
from podsrl.tokens import entropy_top_fraction_mask, token_scores, top_fraction_mask


@dataclass
class UpdateBatch:
    prompt_ids: list[list[int]]  # [K] the kept rollouts' prompts
    completion_ids: list[list[int]]  # [K]
    advantages: Tensor  # [K]


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float
    clip_frac_low: float
    clip_frac_high: float
    ratio_mean: float
    entropy: float  # mean over the kept rollouts' completion tokens
    kl: float | None
    tokens_total: int  # completion tokens of the kept rollouts
    tokens_kept: int  # tokens that entered the loss (after D3S token selection)
    sequences: int


def run_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    batch: UpdateBatch,
    *,
    pad_id: int,
    micro_batch_size: int,
    temperature: float,
    eps_low: float,
    eps_high: float | None,
    aggregation: str,
    max_completion_len: int,
    grad_clip: float,
    policy_iterations: int = 1,
    token_fraction: float = 1.0,
    token_score: str = "adv_entropy",
    beta: float = 0.0,
    reference: torch.nn.Module | None = None,
    share_prompts: bool = True,
) -> UpdateStats:
    K = len(batch.completion_ids)
    device = next(model.parameters()).device
    order = micro_batch_order(batch.prompt_ids, batch.completion_ids)
    chunks = [order[i : i + micro_batch_size] for i in range(0, K, micro_batch_size)]
    packs = [
        pack([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], pad_id, device=device)
        for idx in chunks
    ]
    advantages = [batch.advantages[idx].to(device) for idx in chunks]  # [k] per micro-batch

    select_tokens = token_fraction < 1.0
    needs_scoring = policy_iterations > 1 or select_tokens or beta > 0
    old, entropy, ref = [None] * len(packs), [None] * len(packs), [None] * len(packs)
    if needs_scoring:
        with torch.no_grad():
            for j, p in enumerate(packs):
                old[j], entropy[j] = forward_logprobs(
                    model, p, temperature=temperature, with_entropy=True, share_prompts=share_prompts
                )
                if beta > 0:
                    with _reference(model, reference) as ref_model:
                        ref[j], _ = forward_logprobs(ref_model, p, temperature=temperature, share_prompts=share_prompts)

    token_masks = [None] * len(packs)
    if select_tokens:
        token_masks = _select_tokens(packs, advantages, entropy, token_fraction, token_score)
    total_tokens = sum(
        int((p.completion_mask if m is None else m & p.completion_mask).sum()) for p, m in zip(packs, token_masks)
    )
    tokens_total = sum(int(p.completion_mask.sum()) for p in packs)

    sums = dict(loss=0.0, clip_low=0.0, clip_high=0.0, ratio=0.0, entropy=0.0, kl=0.0, grad_norm=0.0)
    for _ in range(policy_iterations):
        optimizer.zero_grad(set_to_none=True)
        for j, p in enumerate(packs):
            logprobs, ent = forward_logprobs(
                model, p, temperature=temperature, with_entropy=entropy[j] is None, share_prompts=share_prompts
            )
            if entropy[j] is None:
                entropy[j] = ent
            old_lp = old[j] if old[j] is not None else logprobs.detach()
            loss, metrics = policy_loss(
                logprobs,
                old_lp,
                advantages[j],
                p.completion_mask,
                eps_low=eps_low,
                eps_high=eps_high,
                aggregation=aggregation,
                token_mask=token_masks[j],
                ref_logprobs=ref[j],
                beta=beta,
                max_completion_len=max_completion_len,
                total_sequences=K,
                total_tokens=total_tokens,
            )
            loss.backward()
            # Metrics are token-weighted over the micro-batches.
            share = metrics.tokens / max(total_tokens, 1)
            sums["loss"] += loss.item()
            sums["clip_low"] += metrics.clip_frac_low * share
            sums["clip_high"] += metrics.clip_frac_high * share
            sums["ratio"] += metrics.ratio_mean * share
            sums["kl"] += (metrics.kl or 0.0) * share
        params = [q for q in model.parameters() if q.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
        sums["grad_norm"] = float(norm)
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    ent_sum = sum(float(e.sum()) for e in entropy)
    return UpdateStats(
        loss=sums["loss"] / policy_iterations,
        grad_norm=sums["grad_norm"],
        clip_frac_low=sums["clip_low"] / policy_iterations,
        clip_frac_high=sums["clip_high"] / policy_iterations,
        ratio_mean=sums["ratio"] / policy_iterations,
        entropy=ent_sum / max(tokens_total, 1),
        kl=sums["kl"] / policy_iterations if beta > 0 else None,
        tokens_total=tokens_total,
        tokens_kept=total_tokens,
        sequences=K,
    )


def micro_batch_order(prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[int]:
    """Rollout order for micro-batching: the rollouts of one prompt together (so a micro-batch runs
    each prompt once, see ``forward_logprobs``), groups by their longest sequence, and within a group
    by length (little padding when consecutive micro-batches are cut)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompt_ids):
        groups.setdefault(tuple(p), []).append(i)
    length = lambda i: len(prompt_ids[i]) + len(completion_ids[i])  # noqa: E731
    ordered = sorted(groups.values(), key=lambda rows: max(length(i) for i in rows))
    return [i for rows in ordered for i in sorted(rows, key=length)]


def _select_tokens(
    packs: list[Packed], advantages: list[Tensor], entropy: list[Tensor], fraction: float, score: str
) -> list[Tensor]:
    """One top-fraction threshold over all tokens of the batch, split back per micro-batch."""
    T = max(p.completion_mask.shape[1] for p in packs)
    pad = lambda x, v: torch.nn.functional.pad(x, (0, T - x.shape[1]), value=v)  # noqa: E731
    ent = torch.cat([pad(e, 0.0) for e in entropy])  # [K, T]
    valid = torch.cat([pad(p.completion_mask, False) for p in packs])  # [K, T]
    if score == "entropy":
        mask = entropy_top_fraction_mask(ent, valid, fraction)
    else:
        mask = top_fraction_mask(token_scores(torch.cat(advantages), ent), valid, fraction)
    out, row = [], 0
    for p in packs:
        k, t = p.completion_mask.shape
        out.append(mask[row : row + k, :t])
        row += k
    return out


@contextlib.contextmanager
def _reference(model: torch.nn.Module, reference: torch.nn.Module | None):
    if reference is not None:
        yield reference
    else:  # LoRA: the base model is the reference
        with model.disable_adapter():
            yield model
