"""The policy update on the kept rollouts: micro-batches, gradient accumulation, one optimizer step.

Only the m kept rollouts of each group enter this phase: that is where PODS saves time and memory
(update cost scales with the number kept, not with n). Of those, only the rows that can change the
gradient take a forward and backward pass:

- **Zero-signal rows are skipped, exactly** (``skip_zero_advantage``, on by default). Without a KL
  term (``loss.beta = 0``) a row whose advantage is exactly 0 has a surrogate min(rho * 0, clip(rho)
  * 0) = 0 at every token, so its gradient is exactly zero whatever its log-probs: it takes no
  forward, no backward and no scoring pass. The normalisers stay the whole batch's (``BatchCounts``:
  every kept row and every completion token, known from the token counts alone), so the gradient
  is the one the full batch would give (up to float summation order: other rows share a
  micro-batch). When no row of the step has a signal, every trainable parameter gets a zero
  gradient and the optimizer still steps, as it would have: AdamW's decoupled weight decay and
  momentum move the weights on a zero gradient. With beta > 0 the KL term needs every row, and
  nothing is skipped. With dropout (``model.lora_dropout``) the rows that run draw other dropout
  masks than they would beside the skipped rows: the same in distribution, not bit for bit.
- **D3S scores only what can be selected.** The D3S token score |A_i| x H_{i,t} of a row with A_i = 0
  is 0 whatever its entropy, so the scoring pass runs only the rows with a signal and the skipped
  rows enter the batch-wide top-K with score 0 at each of their tokens: the same scores, hence the
  same mask, as scoring every row. The entropy-only score ("80/20") needs every row's entropies, so
  there the scoring pass runs every kept row (and the update still skips the zero-signal ones).

How the rows that run are processed:

- They are ordered by prompt group, then length, and cut into micro-batches of ``micro_batch_size``,
  so that a micro-batch runs each prompt once (``share_prompts``, see :mod:`podsrl.train.sequences`)
  and padding stays small. The loss of every micro-batch is normalised by the whole batch's
  sequence / completion-token counts (``policy_loss(batch=BatchCounts(...))``), so the accumulated
  gradient equals the full-batch gradient whatever the micro-batch size.
- With one policy iteration per batch, pi_old == pi_theta numerically, so the old log-probs are the
  detached current ones (ALGORITHMS.md section 1), also when a scoring pass ran for another reason:
  its forward is another forward (dropout, nondeterministic kernels), and using it as pi_old would
  put a ratio != 1 into an on-policy step. A scoring pass without gradients runs first only when it
  is needed: several policy iterations (pi_old must stay fixed), D3S token selection (the top-K
  threshold is over all tokens of the batch, so every score must be known before the first loss;
  the entropies are the current policy's, as the spec asks), or a KL term (reference log-probs).
- The reference policy for the KL is the initial one: the base model with the LoRA adapter disabled,
  or a frozen copy for full fine-tuning.
- Several processes (``dist``, see :mod:`podsrl.train.distributed`): each rank passes its own kept rows.
  The sequence and token normalisers and D3S's top-fraction threshold are global (the threshold is
  taken on every rank over the gathered [K, T] scores in batch order, so the kept tokens, ties
  included, are one process's), so the ranks' gradients sum to the single-process gradient; they
  are summed by one all-reduce after accumulation ("ddp") or by FSDP's reduce-scatter ("fsdp", where
  every rank runs the same number of forward passes, padding with an empty micro-batch, and at
  least one). A rank with no rows to run joins with zero contribution. Returned stats are global.

Metrics (:class:`UpdateStats`): ``rows_run`` / ``tokens_run`` are the rows (and their completion
tokens) that took the update's forward and backward; ``entropy`` covers the rows that had any
forward pass, and ``clip_frac_low``, ``clip_frac_high``, ``ratio_mean`` and ``kl`` cover the rows
that ran the update (a skipped row would add a ratio of exactly 1 and no clipping), as do
``sampler_logp_diff`` and ``sampler_kl``: the gap between the engine's sampling log-probs (vLLM
returns them; ``UpdateBatch.sampler_logprobs``) and the trainer's on the weights that sampled, the
first iteration's forward.
``sequences``, ``tokens_total`` and ``tokens_kept`` count every kept row, run or not.
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
    sampler_logprobs: list[list[float]] | None = None  # [K] the engine's log-prob of each token (vLLM); None: not given


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
    skip_zero_advantage: bool = True  # rows with advantage exactly 0 take no forward/backward when the loss has no KL term (exact)

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether rows whose advantage is exactly 0 are left out of every forward pass: only
        without a KL term, whose gradient every row has."""
        return self.skip_zero_advantage and self.loss.beta == 0

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
            skip_zero_advantage=cfg.optim.skip_zero_advantage,
        )


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float
    clip_frac_low: float
    clip_frac_high: float
    ratio_mean: float
    entropy: float  # mean over the completion tokens of the rows that had a forward pass
    kl: float | None
    tokens_total: int  # completion tokens of the kept rollouts
    tokens_kept: int  # tokens in the policy-gradient term (after D3S token selection)
    sequences: int  # kept rollouts
    rows_run: int  # kept rollouts that took the update's forward and backward
    tokens_run: int  # their completion tokens
    sampler_logp_diff: float | None = None  # mean |log pi_trainer - log pi_sampler| per token of the rows that ran
    sampler_kl: float | None = None  # mean k3 estimate of KL(sampler || trainer) per token of the rows that ran

    def metrics(self) -> dict[str, float]:
        """The step's update metrics as logged (``kl`` only with a KL term)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "sequences"}
        for key in ("kl", "sampler_logp_diff", "sampler_kl"):  # only with a KL term, only with the sampler's log-probs
            if out[key] is None:
                del out[key]
        return out


@dataclass
class _MicroBatches:
    """Some rows of the batch cut into micro-batches; FSDP pads with ``None`` (an empty forward)."""

    packs: list[Packed | None]
    rows: list[list[int]]  # each micro-batch's rows of the batch


@dataclass
class _RowValues:
    """What the scoring pass and the token selection know of each row of the batch, row by row
    ([len_i] tensors; None: not computed for that row)."""

    old: list[Tensor | None]  # log pi_old (several policy iterations)
    entropy: list[Tensor | None]
    ref: list[Tensor | None]  # log pi_ref (KL term)
    token_mask: list[Tensor | None]  # bool, D3S / 80-20 (None: every token)
    sampler: list[Tensor | None]  # the engine's sampling log-probs (vLLM; None: not given)

    @classmethod
    def empty(cls, K: int) -> _RowValues:
        return cls(*([None] * K for _ in range(5)))


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
    K = len(batch.completion_ids)  # this rank's rows
    lengths = [len(c) for c in batch.completion_ids]
    every = list(range(K))
    signal = (batch.advantages != 0).nonzero().flatten().tolist() if settings.skips_zero_advantage else every  # rows that run
    values = _RowValues.empty(K)
    if batch.sampler_logprobs is not None:
        values.sampler = [torch.tensor(row, dtype=torch.float32) for row in batch.sampler_logprobs]
    selects_tokens = settings.token_fraction < 1.0
    if settings.policy_iterations > 1 or selects_tokens or settings.loss.beta > 0:
        scored = every if selects_tokens and settings.token_score == "entropy" else signal
        _scoring_pass(model, batch, scored, values, settings, reference, dist)
    if selects_tokens:
        values.token_mask = _select_tokens(values.entropy, lengths, batch.advantages, settings.token_fraction, settings.token_score, dist)
    pg_tokens = sum(int(m.sum()) for m in values.token_mask) if selects_tokens else sum(lengths)
    counts = torch.tensor([K, sum(lengths), pg_tokens, len(signal), sum(lengths[i] for i in signal)])
    total_sequences, tokens_total, tokens_kept, rows_run, tokens_run = dist.sum(counts).tolist()  # the whole batch's
    totals = BatchCounts(sequences=total_sequences, tokens=tokens_total)
    mb = _micro_batches(model, batch, signal, settings, dist, at_least_one=True)
    sums = dict.fromkeys(("loss", "clip_low", "clip_high", "ratio", "pg_tokens", "kl", "kl_tokens", "grad_norm", "gap", "gap_k3", "gap_tokens"), 0.0)
    for iteration in range(settings.policy_iterations):
        _policy_iteration(model, optimizer, scheduler, mb, batch, values, settings, totals, sums, dist, first=iteration == 0)
    optimizer.zero_grad(set_to_none=True)
    known = [(e, lengths[i]) for i, e in enumerate(values.entropy) if e is not None]
    sums["entropy"], sums["entropy_tokens"] = sum(float(e.sum()) for e, _ in known), sum(n for _, n in known)
    keys = ("loss", "clip_low", "clip_high", "ratio", "pg_tokens", "kl", "kl_tokens", "entropy", "entropy_tokens", "gap", "gap_k3", "gap_tokens")
    sums.update(zip(keys, dist.sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64)).tolist()))
    iterations = settings.policy_iterations
    return UpdateStats(
        loss=sums["loss"] / iterations,
        grad_norm=sums["grad_norm"],
        clip_frac_low=sums["clip_low"] / max(sums["pg_tokens"], 1),
        clip_frac_high=sums["clip_high"] / max(sums["pg_tokens"], 1),
        ratio_mean=sums["ratio"] / sums["pg_tokens"] if sums["pg_tokens"] else 1.0,
        entropy=sums["entropy"] / max(sums["entropy_tokens"], 1),
        kl=sums["kl"] / max(sums["kl_tokens"], 1) if settings.loss.beta > 0 else None,
        tokens_total=tokens_total,
        tokens_kept=tokens_kept,
        sequences=total_sequences,
        rows_run=rows_run,
        tokens_run=tokens_run,
        sampler_logp_diff=sums["gap"] / sums["gap_tokens"] if sums["gap_tokens"] else None,
        sampler_kl=sums["gap_k3"] / sums["gap_tokens"] if sums["gap_tokens"] else None,
    )


def _micro_batches(model: torch.nn.Module, batch: UpdateBatch, rows: list[int], settings: UpdateSettings, dist: Dist, *, at_least_one: bool = False) -> _MicroBatches:
    """``rows`` of the batch in micro-batches. FSDP: every rank runs the same number (padding with
    None), and with ``at_least_one`` at least one, so that every parameter gets its (zero) gradient."""
    device = next(model.parameters()).device
    order = micro_batch_order([batch.prompt_ids[i] for i in rows], [batch.completion_ids[i] for i in rows])
    ordered = [rows[i] for i in order]
    cut = [ordered[i : i + settings.micro_batch_size] for i in range(0, len(ordered), settings.micro_batch_size)]
    packs: list[Packed | None] = [
        pack([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], settings.pad_id, device=device)
        for idx in cut
    ]
    if dist.sharded:  # FSDP: the same number of forward passes on every rank
        packs += [None] * (max(dist.max_int(len(packs)), int(at_least_one)) - len(packs))
    return _MicroBatches(packs, cut)


def _share_prompts(settings: UpdateSettings, dist: Dist) -> bool:
    # FSDP: sharing's two forward calls per micro-batch would depend on the data (a collective each).
    return settings.share_prompts and not dist.sharded


@torch.no_grad()
def _scoring_pass(model: torch.nn.Module, batch: UpdateBatch, rows: list[int], values: _RowValues, settings: UpdateSettings,
                  reference: torch.nn.Module | None, dist: Dist) -> None:  # fmt: skip
    """Log-probs and entropies of the current policy and the reference's log-probs of ``rows``,
    before the first loss, into ``values``: needed for several policy iterations (pi_old must stay
    fixed), D3S token selection (its threshold is over every token of the batch) and a KL term."""
    t = settings.temperature
    device = next(model.parameters()).device
    share = _share_prompts(settings, dist)
    mb = _micro_batches(model, batch, rows, settings, dist)
    for p, idx in zip(mb.packs, mb.rows + [[]] * (len(mb.packs) - len(mb.rows))):
        if p is None:
            _empty_forward(model, settings.pad_id, device)
            continue
        logprobs, entropy = forward_logprobs(model, p, temperature=t, with_entropy=True, share_prompts=share)
        _store(values.entropy, idx, entropy, p)
        if settings.policy_iterations > 1:  # one iteration: pi_old is the update's own forward, detached
            _store(values.old, idx, logprobs, p)
        if settings.loss.beta > 0:
            with _reference(model, reference) as ref_model:
                ref, _ = forward_logprobs(ref_model, p, temperature=t, share_prompts=share)
            _store(values.ref, idx, ref, p)


def _store(per_row: list[Tensor | None], rows: list[int], values: Tensor, p: Packed) -> None:
    """Micro-batch values [k, T] -> ``per_row[rows[q]]`` = the q-th row's completion part [len]."""
    lengths = p.completion_mask.sum(dim=1).tolist()
    for q, i in enumerate(rows):
        per_row[i] = values[q, : lengths[q]]


def _stack(per_row: list[Tensor | None], rows: list[int], p: Packed) -> Tensor | None:
    """``per_row`` values of ``rows`` -> [k, T] like ``p`` (0 / False on padding); None if unknown."""
    if per_row[rows[0]] is None:
        return None
    first = per_row[rows[0]]
    out = torch.zeros(p.completion_mask.shape, dtype=first.dtype, device=p.completion_mask.device)
    for q, i in enumerate(rows):
        out[q, : per_row[i].shape[0]] = per_row[i]
    return out


def _policy_iteration(model, optimizer, scheduler, mb: _MicroBatches, batch: UpdateBatch, values: _RowValues, settings: UpdateSettings,
                      totals: BatchCounts, sums: dict, dist: Dist, *, first: bool = True) -> None:  # fmt: skip
    """Accumulate every micro-batch's gradient, reduce over ranks, clip, take one optimizer step; on
    the ``first`` iteration (the weights that sampled), also the sampler / trainer log-prob gap."""
    device = next(model.parameters()).device
    share = _share_prompts(settings, dist)
    optimizer.zero_grad(set_to_none=True)
    for p, idx in zip(mb.packs, mb.rows + [[]] * (len(mb.packs) - len(mb.rows))):
        if p is None:  # FSDP padding: join the collectives, add nothing
            (_empty_forward(model, settings.pad_id, device) * 0.0).backward()
            continue
        need_entropy = values.entropy[idx[0]] is None
        logprobs, entropy = forward_logprobs(model, p, temperature=settings.temperature, with_entropy=need_entropy, share_prompts=share)
        if need_entropy:
            _store(values.entropy, idx, entropy, p)
        old = _stack(values.old, idx, p)
        advantages = batch.advantages[idx].to(device)
        loss, metrics = policy_loss(logprobs, logprobs.detach() if old is None else old, advantages, p.completion_mask, settings.loss,
                                    token_mask=_stack(values.token_mask, idx, p), ref_logprobs=_stack(values.ref, idx, p), batch=totals)  # fmt: skip
        loss.backward()
        if first and values.sampler[idx[0]] is not None:
            _sampler_gap(logprobs.detach(), _stack(values.sampler, idx, p), p, sums)
        # Means over tokens, weighted by each call's tokens (and summed over ranks by the caller).
        sums["loss"] += loss.item()
        sums["clip_low"] += metrics.clip_frac_low * metrics.tokens
        sums["clip_high"] += metrics.clip_frac_high * metrics.tokens
        sums["ratio"] += metrics.ratio_mean * metrics.tokens
        sums["pg_tokens"] += metrics.tokens
        sums["kl"] += (metrics.kl or 0.0) * metrics.completion_tokens
        sums["kl_tokens"] += metrics.completion_tokens
    params = [q for q in model.parameters() if q.requires_grad]
    if not dist.sharded:
        for q in params:  # no row ran here: a zero gradient, which AdamW still steps on (no row skipped would give the same)
            if q.grad is None:
                q.grad = torch.zeros_like(q)
        dist.all_reduce_grads(params)  # "ddp": sum the ranks' partial gradients
    norm = torch.nn.utils.clip_grad_norm_(params, settings.grad_clip if settings.grad_clip > 0 else float("inf"))
    sums["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    scheduler.step()


def _sampler_gap(logprobs: Tensor, sampler: Tensor, p: Packed, sums: dict) -> None:
    """Add this micro-batch's gap between the trainer's log-probs [k, T] (the weights that sampled)
    and the engine's [k, T] to ``sums``: sum of |difference| and of the k3 estimate of KL(sampler || trainer),
    exp(d) - 1 - d with d = log pi_trainer - log pi_sampler, over the completion tokens. Nonzero by
    float and kernel differences alone; by construction with top_p < 1 (the engine's log-probs are
    renormalised over the nucleus)."""
    d = (logprobs.float() - sampler.to(logprobs.device).float())[p.completion_mask]  # [tokens]
    sums["gap"] += float(d.abs().sum())
    sums["gap_k3"] += float((d.exp() - 1.0 - d).sum())
    sums["gap_tokens"] += d.numel()


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
    entropy: list[Tensor | None],
    lengths: list[int],
    advantages: Tensor,
    fraction: float,
    score: str,
    dist: Dist,
) -> list[Tensor]:
    """One top-fraction threshold over all tokens of the batch (every rank's), split back per row:
    [len_i] bool each. The scores are laid out in batch order and, over ranks, in rank order: the
    global batch's order, whatever the micro-batching or the world size, so top-k breaks ties the
    same way in every configuration. A row without entropies (skipped: A_i = 0, so with the score
    |A_i| x H its tokens score 0 whatever H is) enters with entropy 0: the same scores, the same mask."""
    K = len(lengths)
    T = dist.max_int(max(lengths, default=1) or 1)
    # Every rank takes the global top-k on the same device (top-k breaks ties per device), also a
    # rank whose rows were all skipped and so has no entropies on the GPU.
    device = dist.device if dist.active else next((e.device for e in entropy if e is not None), advantages.device)
    ent = torch.zeros((K, T), device=device)  # [K, T] in batch order
    valid = torch.zeros((K, T), dtype=torch.bool, device=device)
    adv = advantages.to(device).float()  # [K]
    for i, (e, n) in enumerate(zip(entropy, lengths)):
        valid[i, :n] = True
        if e is not None:
            ent[i, :n] = e.float()
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
    return [mask[i, :n] for i, n in enumerate(lengths)]


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
