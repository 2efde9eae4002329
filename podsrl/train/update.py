"""The policy update on the kept rollouts: micro-batches, gradient accumulation, one optimizer step.

Only the m kept rollouts of each group enter this phase: that is where PODS saves time and memory
(update cost scales with the number kept, not with n).

- Rollouts are ordered by prompt group, then length, and cut into micro-batches of
  ``micro_batch_size``, so that a micro-batch runs each prompt once (``share_prompts``, see
  :mod:`podsrl.train.sequences`) and padding stays small. The loss of every micro-batch is normalised by
  the whole batch's sequence / token counts (``policy_loss(batch=BatchCounts(...))``),
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
import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from podsrl.train.distributed import Dist
from podsrl.core.loss import BatchCounts, LossSettings, policy_loss
from podsrl.train.sequences import Packed, forward_logprobs, pack
from podsrl.core.token_selection import entropy_top_fraction_mask, token_scores, top_fraction_mask


@dataclass
class UpdateBatch:
    prompt_ids: list[list[int]]  # [K] the kept rollouts' prompts
    completion_ids: list[list[int]]  # [K]
    advantages: Tensor  # [K]


@dataclass(frozen=True)
class UpdateSettings:
    """How the update runs, fixed for a run except the D3S token fraction (scheduled per step)."""

    loss: LossSettings = LossSettings()
    pad_id: int = 0
    micro_batch_size: int = 16
    temperature: float = 1.0  # the sampling temperature: log-probs are of logits / temperature
    grad_clip: float = 1.0  # max gradient norm; 0: no clipping
    policy_iterations: int = 1
    token_fraction: float = 1.0  # D3S: fraction of the batch's tokens in the loss
    token_score: str = "adv_entropy"  # "adv_entropy" (|A| x H) | "entropy"
    share_prompts: bool = True  # forward each prompt once per micro-batch

    @classmethod
    def from_config(cls, cfg, *, pad_id: int, token_fraction: float = 1.0) -> UpdateSettings:
        """From a :class:`podsrl.config.Config`, with the step's scheduled token fraction."""
        return cls(
            loss=LossSettings(
                eps_low=cfg.loss.eps_low,
                eps_high=cfg.loss.eps_high,
                aggregation=cfg.loss.aggregation,
                beta=cfg.loss.beta,
                max_completion_len=cfg.rollout.max_new_tokens,
            ),
            pad_id=pad_id,
            micro_batch_size=cfg.optim.micro_batch_size,
            temperature=cfg.rollout.temperature,
            grad_clip=cfg.optim.grad_clip,
            policy_iterations=cfg.loss.policy_iterations,
            token_fraction=token_fraction,
            token_score=cfg.select.token_score,
            share_prompts=cfg.optim.share_prompts,
        )


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

    def metrics(self) -> dict[str, float]:
        """The step's update metrics as logged (``kl`` only with a KL term)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "sequences"}
        if self.kl is None:
            del out["kl"]
        return out


@dataclass
class _MicroBatches:
    """The kept rollouts cut into micro-batches; FSDP pads with ``None`` (an empty forward)."""

    packs: list[Packed | None]
    rows: list[list[int]]  # each micro-batch's rows of the batch
    advantages: list[Tensor]  # [k] per micro-batch
    old: list[Tensor | None] = field(init=False)  # [k, T] log pi_old from the scoring pass (None: the detached current)
    entropy: list[Tensor | None] = field(init=False)  # [k, T]
    ref: list[Tensor | None] = field(init=False)  # [k, T] log pi_ref (KL term)
    token_masks: list[Tensor | None] = field(init=False)  # [k, T] D3S / 80-20 (None: every token)

    def __post_init__(self) -> None:
        self.old, self.entropy, self.ref, self.token_masks = ([None] * len(self.packs) for _ in range(4))

    def real(self) -> list[int]:
        return [j for j, p in enumerate(self.packs) if p is not None]


def run_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    batch: UpdateBatch,
    settings: UpdateSettings,
    *,
    reference: torch.nn.Module | None = None,
    dist: Dist | None = None,
) -> UpdateStats:
    """``settings.policy_iterations`` optimizer steps on this rank's kept rollouts; global stats."""
    dist = dist or Dist()
    mb = _micro_batches(model, batch, settings, dist)
    if settings.policy_iterations > 1 or settings.token_fraction < 1.0 or settings.loss.beta > 0:
        _scoring_pass(model, mb, settings, reference, share=_share_prompts(settings, dist))
    if settings.token_fraction < 1.0:
        real = mb.real()
        picked = _select_tokens([mb.packs[j] for j in real], [mb.advantages[j] for j in real], [mb.entropy[j] for j in real],
                                [mb.rows[j] for j in real], settings.token_fraction, settings.token_score, dist)  # fmt: skip
        for j, mask in zip(real, picked):
            mb.token_masks[j] = mask
    real = mb.real()
    counted = [mb.packs[j].completion_mask if mb.token_masks[j] is None else mb.token_masks[j] & mb.packs[j].completion_mask for j in real]
    counts = torch.tensor([len(batch.completion_ids), sum(int(c.sum()) for c in counted), sum(int(mb.packs[j].completion_mask.sum()) for j in real)])
    total_sequences, total_tokens, tokens_total = dist.sum(counts).tolist()  # the whole batch's
    totals = BatchCounts(sequences=total_sequences, tokens=total_tokens)
    sums = dict(loss=0.0, clip_low=0.0, clip_high=0.0, ratio=0.0, entropy=0.0, kl=0.0, grad_norm=0.0)
    for _ in range(settings.policy_iterations):
        _policy_iteration(model, optimizer, scheduler, mb, settings, totals, sums, dist)
    optimizer.zero_grad(set_to_none=True)
    sums["entropy"] = sum(float(e.sum()) for e in mb.entropy if e is not None)
    keys = ("loss", "clip_low", "clip_high", "ratio", "kl", "entropy")
    sums.update(zip(keys, dist.sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64)).tolist()))
    iterations = settings.policy_iterations
    return UpdateStats(
        loss=sums["loss"] / iterations,
        grad_norm=sums["grad_norm"],
        clip_frac_low=sums["clip_low"] / iterations,
        clip_frac_high=sums["clip_high"] / iterations,
        ratio_mean=sums["ratio"] / iterations,
        entropy=sums["entropy"] / max(tokens_total, 1),
        kl=sums["kl"] / iterations if settings.loss.beta > 0 else None,
        tokens_total=tokens_total,
        tokens_kept=total_tokens,
        sequences=total_sequences,
    )


def _micro_batches(model: torch.nn.Module, batch: UpdateBatch, settings: UpdateSettings, dist: Dist) -> _MicroBatches:
    K = len(batch.completion_ids)  # this rank's rows
    device = next(model.parameters()).device
    order = micro_batch_order(batch.prompt_ids, batch.completion_ids)
    rows = [order[i : i + settings.micro_batch_size] for i in range(0, K, settings.micro_batch_size)]
    packs: list[Packed | None] = [
        pack([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], settings.pad_id, device=device)
        for idx in rows
    ]
    if dist.sharded:  # FSDP: the same number of forward passes on every rank
        packs += [None] * (dist.max_int(len(packs)) - len(packs))
    return _MicroBatches(packs, rows, [batch.advantages[idx].to(device) for idx in rows])


def _share_prompts(settings: UpdateSettings, dist: Dist) -> bool:
    # FSDP: sharing's two forward calls per micro-batch would depend on the data (a collective each).
    return settings.share_prompts and not dist.sharded


@torch.no_grad()
def _scoring_pass(model: torch.nn.Module, mb: _MicroBatches, settings: UpdateSettings, reference: torch.nn.Module | None, *, share: bool) -> None:
    """Log-probs and entropies of the current policy (pi_old) and the reference's log-probs, before
    the first loss: needed for several policy iterations (pi_old must stay fixed), D3S token
    selection (its threshold is over every token of the batch) and a KL term."""
    t = settings.temperature
    device = next(model.parameters()).device
    for j, p in enumerate(mb.packs):
        if p is None:
            _empty_forward(model, settings.pad_id, device)
            continue
        mb.old[j], mb.entropy[j] = forward_logprobs(model, p, temperature=t, with_entropy=True, share_prompts=share)
        if settings.loss.beta > 0:
            with _reference(model, reference) as ref_model:
                mb.ref[j], _ = forward_logprobs(ref_model, p, temperature=t, share_prompts=share)


def _policy_iteration(model, optimizer, scheduler, mb: _MicroBatches, settings: UpdateSettings, totals: BatchCounts, sums: dict, dist: Dist) -> None:
    """Accumulate every micro-batch's gradient, reduce over ranks, clip, take one optimizer step."""
    device = next(model.parameters()).device
    share = _share_prompts(settings, dist)
    optimizer.zero_grad(set_to_none=True)
    for j, p in enumerate(mb.packs):
        if p is None:  # FSDP padding: join the collectives, add nothing
            (_empty_forward(model, settings.pad_id, device) * 0.0).backward()
            continue
        logprobs, entropy = forward_logprobs(model, p, temperature=settings.temperature, with_entropy=mb.entropy[j] is None, share_prompts=share)
        if mb.entropy[j] is None:
            mb.entropy[j] = entropy
        old = mb.old[j] if mb.old[j] is not None else logprobs.detach()
        loss, metrics = policy_loss(logprobs, old, mb.advantages[j], p.completion_mask, settings.loss,
                                    token_mask=mb.token_masks[j], ref_logprobs=mb.ref[j], batch=totals)  # fmt: skip
        loss.backward()
        # Metrics are token-weighted over the micro-batches (and the ranks, summed by the caller).
        share_of_tokens = metrics.tokens / max(totals.tokens, 1)
        sums["loss"] += loss.item()
        sums["clip_low"] += metrics.clip_frac_low * share_of_tokens
        sums["clip_high"] += metrics.clip_frac_high * share_of_tokens
        sums["ratio"] += metrics.ratio_mean * share_of_tokens
        sums["kl"] += (metrics.kl or 0.0) * share_of_tokens
    params = [q for q in model.parameters() if q.requires_grad]
    if not dist.sharded:
        dist.all_reduce_grads(params)  # "ddp": sum the ranks' partial gradients
    norm = torch.nn.utils.clip_grad_norm_(params, settings.grad_clip if settings.grad_clip > 0 else float("inf"))
    sums["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    scheduler.step()


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
