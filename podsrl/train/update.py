"""The policy update on the kept rollouts: micro-batches, gradient accumulation, one optimizer step.

Only the m kept rollouts of each group enter this phase: that is where PODS saves time and memory
(update cost scales with the number kept, not with n).

- Rollouts are ordered by prompt group, then length, and cut into micro-batches of
  ``micro_batch_size``, so that a micro-batch runs each prompt once (``share_prompts``, see
  :mod:`podsrl.train.sequences`) and padding stays small. The loss of every micro-batch is normalised by
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
- Several processes (``dist``, see :mod:`podsrl.train.distributed`): each rank passes its own kept rows.
  The sequence and token normalisers and D3S's top-fraction threshold are global (the threshold is
  taken on every rank over the gathered [K, T] scores in batch order, so the kept tokens, ties
  included, are one process's), so the ranks' gradients sum to the single-process gradient; they
  are summed by one all-reduce after accumulation ("ddp") or by FSDP's reduce-scatter ("fsdp", where
  every rank runs the same number of forward passes, padding with an empty micro-batch). A rank with
  no rows joins with zero contribution. Returned stats are global.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from podsrl.train.distributed import Dist
from podsrl.core.loss import policy_loss
from podsrl.train.sequences import Packed, forward_logprobs, pack
from podsrl.core.token_selection import entropy_top_fraction_mask, token_scores, top_fraction_mask


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
    dist: Dist | None = None,
) -> UpdateStats:
    dist = dist or Dist()
    K = len(batch.completion_ids)  # this rank's rows
    device = next(model.parameters()).device
    order = micro_batch_order(batch.prompt_ids, batch.completion_ids)
    chunks = [order[i : i + micro_batch_size] for i in range(0, K, micro_batch_size)]
    packs: list[Packed | None] = [
        pack([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], pad_id, device=device)
        for idx in chunks
    ]
    advantages = [batch.advantages[idx].to(device) for idx in chunks]  # [k] per micro-batch
    if dist.sharded:  # FSDP: the same number of forward passes on every rank
        share_prompts = False  # its two forward calls per micro-batch would depend on the data
        packs += [None] * (dist.max_int(len(packs)) - len(packs))

    select_tokens = token_fraction < 1.0
    needs_scoring = policy_iterations > 1 or select_tokens or beta > 0
    old, entropy, ref = [None] * len(packs), [None] * len(packs), [None] * len(packs)
    if needs_scoring:
        with torch.no_grad():
            for j, p in enumerate(packs):
                if p is None:
                    _empty_forward(model, pad_id, device)
                    continue
                old[j], entropy[j] = forward_logprobs(
                    model, p, temperature=temperature, with_entropy=True, share_prompts=share_prompts
                )
                if beta > 0:
                    with _reference(model, reference) as ref_model:
                        ref[j], _ = forward_logprobs(ref_model, p, temperature=temperature, share_prompts=share_prompts)

    real = [j for j, p in enumerate(packs) if p is not None]
    token_masks = [None] * len(packs)
    if select_tokens:
        picked = _select_tokens(
            [packs[j] for j in real], [advantages[j] for j in real], [entropy[j] for j in real],
            [chunks[j] for j in real], token_fraction, token_score, dist,
        )  # fmt: skip
        for j, mask in zip(real, picked):
            token_masks[j] = mask
    counted = [packs[j].completion_mask if token_masks[j] is None else token_masks[j] & packs[j].completion_mask for j in real]
    counts = torch.tensor([K, sum(int(c.sum()) for c in counted), sum(int(packs[j].completion_mask.sum()) for j in real)])
    total_sequences, total_tokens, tokens_total = dist.sum(counts).tolist()  # the whole batch's

    sums = dict(loss=0.0, clip_low=0.0, clip_high=0.0, ratio=0.0, entropy=0.0, kl=0.0, grad_norm=0.0)
    for _ in range(policy_iterations):
        optimizer.zero_grad(set_to_none=True)
        for j, p in enumerate(packs):
            if p is None:  # FSDP padding: join the collectives, add nothing
                (_empty_forward(model, pad_id, device) * 0.0).backward()
                continue
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
                total_sequences=total_sequences,
                total_tokens=total_tokens,
            )
            loss.backward()
            # Metrics are token-weighted over the micro-batches (and the ranks, summed below).
            share = metrics.tokens / max(total_tokens, 1)
            sums["loss"] += loss.item()
            sums["clip_low"] += metrics.clip_frac_low * share
            sums["clip_high"] += metrics.clip_frac_high * share
            sums["ratio"] += metrics.ratio_mean * share
            sums["kl"] += (metrics.kl or 0.0) * share
        params = [q for q in model.parameters() if q.requires_grad]
        if not dist.sharded:
            dist.all_reduce_grads(params)  # "ddp": sum the ranks' partial gradients
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
        sums["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    sums["entropy"] = sum(float(e.sum()) for e in entropy if e is not None)
    keys = ("loss", "clip_low", "clip_high", "ratio", "kl", "entropy")
    reduced = dist.sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64)).tolist()
    sums.update(zip(keys, reduced))
    return UpdateStats(
        loss=sums["loss"] / policy_iterations,
        grad_norm=sums["grad_norm"],
        clip_frac_low=sums["clip_low"] / policy_iterations,
        clip_frac_high=sums["clip_high"] / policy_iterations,
        ratio_mean=sums["ratio"] / policy_iterations,
        entropy=sums["entropy"] / max(tokens_total, 1),
        kl=sums["kl"] / policy_iterations if beta > 0 else None,
        tokens_total=tokens_total,
        tokens_kept=total_tokens,
        sequences=total_sequences,
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
    packs: list[Packed],
    advantages: list[Tensor],
    entropy: list[Tensor],
    rows: list[list[int]],
    fraction: float,
    score: str,
    dist: Dist,
) -> list[Tensor]:
    """One top-fraction threshold over all tokens of the batch (every rank's), split back per
    micro-batch. The scores are laid out in batch order (``rows``: each micro-batch's rows of the
    batch) and, over ranks, in rank order: the global batch's order, whatever the micro-batching or
    the world size, so top-k breaks ties the same way in every configuration."""
    K = sum(len(r) for r in rows)
    T = dist.max_int(max((p.completion_mask.shape[1] for p in packs), default=1))
    device = packs[0].completion_mask.device if packs else "cpu"
    ent = torch.zeros((K, T), device=device)  # [K, T] in batch order
    valid = torch.zeros((K, T), dtype=torch.bool, device=device)
    adv = torch.zeros(K, device=device)
    for p, e, a, r in zip(packs, entropy, advantages, rows):
        t = p.completion_mask.shape[1]
        ent[r, :t], valid[r, :t], adv[r] = e.float(), p.completion_mask, a.float()
    if dist.active:  # the whole batch's [K_global, T], in rank order
        ent, adv = dist.gather_ragged(ent), dist.gather_ragged(adv)
        valid = dist.gather_ragged(valid.to(torch.uint8)).bool()
    if score == "entropy":
        mask = entropy_top_fraction_mask(ent, valid, fraction)
    else:
        mask = top_fraction_mask(token_scores(adv, ent), valid, fraction)
    if dist.active:
        sizes = dist.gather_objects(K)
        start = sum(sizes[: dist.rank])
        mask = mask[start : start + K]
    return [mask[r, : p.completion_mask.shape[1]] for p, r in zip(packs, rows)]


def _empty_forward(model: torch.nn.Module, pad_id: int, device) -> Tensor:
    """A one-token forward whose output is a scalar 0 attached to the graph (FSDP padding)."""
    ids = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
    return model(input_ids=ids, logits_to_keep=1).logits.sum() * 0.0


@contextlib.contextmanager
def _reference(model: torch.nn.Module, reference: torch.nn.Module | None):
    if reference is not None:
        yield reference
    else:  # LoRA: the base model is the reference
        with model.disable_adapter():
            yield model
