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
- **Token selection is over the rows with a signal, and scores only those.** D3S's top fraction K
  (and the 80/20 rule's) is taken over the tokens of the rows with A_i != 0
  (:func:`podsrl.core.token_selection.select_tokens`; why, and how it departs from a literal
  reading of the paper: that module's docstring): a row with A_i = 0 adds nothing to the policy
  gradient whatever its mask, so counting its tokens in the budget would let K select every token
  of the rows that do. Its tokens are never selected, so the scoring pass runs only the rows that
  run the update (``skip_zero_advantage`` on) and a skipped row enters the batch-wide selection
  with entropy 0, unread: the same mask as scoring every row.

How the rows that run are processed:

- They are ordered by prompt group, then length, so that a micro-batch runs each prompt once
  (``share_prompts``, see :mod:`podsrl.train.sequences`) and padding stays small, and cut into
  micro-batches of ``micro_batch_size`` rows or, with ``micro_batch_tokens`` > 0, of as many rows as
  fit that many padded tokens (:func:`micro_batch_cuts`: rows x the longest row's prompt +
  completion; at least one row a micro-batch). A micro-batch costs about a fixed number of operator
  calls whatever its rows (on this project's CPU about 40,000 for a 30-layer model with shared
  prompts, 22,000 without), which on a GPU at short answers is the update's time: on a lent H200 the
  135M model's update took about 0.24 s a micro-batch of up to 16 rows of 40 + 15 tokens
  (results/compare-gpu, issue 66). Fewer, larger micro-batches cut it. The loss of every micro-batch is normalised by the whole batch's
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
- **Importance correction of the sampler's gap** (``UpdateSettings.importance``, on by default;
  :mod:`podsrl.core.importance`): when the engine returned its log-probs, each token's surrogate is
  multiplied by the truncated or masked ratio pi_old / pi_sampler, where pi_old is the trainer at the
  weights that sampled: the update's own forward (detached) with one policy iteration, the scoring
  pass's pi_old with several. It is computed once per row, in the first iteration, and every later
  iteration reuses it; a row's weight depends on that row alone, so micro-batching, skipped rows and
  world size do not change it. No normaliser changes; the KL term is not weighted. Without the
  engine's log-probs (the transformers engine samples with the trainer itself) nothing is weighted.
- **Mixed precision** (``UpdateSettings.mixed_precision``, what ``model.mixed_precision`` resolved
  to; :mod:`podsrl.train.precision`): every forward of the model here (scoring, measure, each policy
  iteration, FSDP's padding) runs under bfloat16 autocast, the output layer in float32; the
  log-probs, entropies, loss, clipped ratio, importance weights and advantages are float32 tensors
  computed outside it, and the weights, gradients and optimizer state stay float32. Which rows run,
  which tokens are selected and the normalisers do not depend on it.
- Several processes (``dist``, see :mod:`podsrl.train.distributed`): each rank passes its own kept rows.
  The sequence and token normalisers and D3S's top-fraction threshold are global (the threshold is
  taken on every rank over the gathered [K, T] scores in rank order, so the kept tokens, ties
  included, are one process's when the step's rows are one generation batch; with dynamic sampling
  ties at the threshold may break differently: :func:`_select_tokens`), so the ranks' gradients sum
  to the single-process gradient; they
  are summed by one all-reduce after accumulation ("ddp") or by FSDP's reduce-scatter ("fsdp", where
  every rank runs the same number of forward passes, padding with an empty micro-batch, and at
  least one). A rank with no rows to run joins with zero contribution. Returned stats are global.

Metrics (:class:`UpdateStats`): ``rows_run`` / ``tokens_run`` are the rows (and their completion
tokens) that took the update's forward and backward; ``entropy`` covers the rows that had any
forward pass, and ``clip_frac_low``, ``clip_frac_high``, ``ratio_mean`` and ``kl`` cover the rows
that ran the update (a skipped row would add a ratio of exactly 1 and no clipping), as do
``sampler_logp_diff`` and ``sampler_kl``: the gap between the engine's sampling log-probs (vLLM
returns them; ``UpdateBatch.sampler_logprobs``) and the trainer's on the weights that sampled, the
first iteration's forward. ``is_ratio_mean``, ``is_ratio_min``, ``is_ratio_max`` and ``is_clip_frac``
(the importance correction's ratio pi_old / pi_sampler and the share of tokens it truncated or
masked), ``is_weight_mean`` (the mean sequence weight after truncation or masking), ``is_ess_tokens``
and ``is_ess_sequences`` (the effective sample size of the tokens' own weights and of the sequences'
weights) and ``is_ess`` (the one of the two that matches the mode's level:
:class:`podsrl.core.importance.ImportanceMetrics`) cover the
policy-gradient tokens of the rows that ran, over every rank (the minimum and maximum take one more
collective, only when the correction ran). In a step where no row runs (every kept row's advantage
is 0) the sampler gap and these metrics are still logged, from a sample: :data:`MEASURE_ROWS` of the
rank's kept rows, evenly spaced (:func:`measured_rows`), all their completion tokens, one forward
without gradients before the optimizer step (:func:`_measure_pass`; ``entropy`` covers those rows
too). A step that kept no rollout at all (the DAPO filter, dynamic sampling's cap) runs no update;
the loop measures its sampled rollouts the same way (:func:`measure_sampler_gap`). A sample, not
every kept row: the skipped update is the saving of such a step, and a forward of every kept row
cost several times the update it skips (measured in results/compare-vs-trl/README.md, "A first
start, withdrawn"; the sample's own cost: docs/results.md).
``sequences`` and ``tokens_total`` count every kept row, run or not; ``tokens_kept`` counts the
tokens in the policy-gradient term: every completion token without token selection, the selected
ones (of rows with A_i != 0 only) with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from podsrl.train.distributed import Dist
from podsrl.core.importance import ImportanceMetrics, ImportanceSettings, importance_weights
from podsrl.core.loss import BatchCounts, LossMetrics, LossSettings, policy_loss
from podsrl.train.precision import autocast
from podsrl.train.sequences import Packed, forward_logprobs, pack
from podsrl.core.token_selection import select_tokens


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
    micro_batch_tokens: int = 0  # > 0: micro-batches of up to this many padded tokens (any rows) instead of micro_batch_size rows
    temperature: float = 1.0  # the sampling temperature: log-probs are of logits / temperature
    grad_clip: float = 1.0  # max gradient norm; 0: no clipping
    policy_iterations: int = 1
    token_fraction: float = 1.0  # D3S: fraction of the batch's tokens in the loss
    token_score: str = "adv_entropy"  # "adv_entropy" (|A| x H) | "entropy"
    share_prompts: bool = True  # forward each prompt once per micro-batch
    skip_zero_advantage: bool = True  # rows with advantage exactly 0 take no forward/backward when the loss has no KL term (exact)
    importance: ImportanceSettings | None = None  # the sampler correction, applied where the batch has the engine's log-probs; None: off
    mixed_precision: bool = False  # the model's forward (and backward) in every pass under bfloat16 autocast; log-probs, loss and ratios stay float32 (podsrl.train.precision)

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether rows whose advantage is exactly 0 are left out of every forward pass: only
        without a KL term, whose gradient every row has."""
        return self.skip_zero_advantage and self.loss.beta == 0

    @classmethod
    def from_config(cls, cfg, *, pad_id: int, token_fraction: float = 1.0, mixed_precision: bool = False) -> UpdateSettings:
        """From a :class:`podsrl.config.Config`, with the step's scheduled token fraction and what
        ``model.mixed_precision`` resolved to on the model's device (``Setup.precision``)."""
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
            micro_batch_tokens=cfg.optim.micro_batch_tokens,
            temperature=cfg.rollout.temperature,
            grad_clip=cfg.optim.grad_clip,
            policy_iterations=cfg.loss.policy_iterations,
            token_fraction=token_fraction,
            token_score=cfg.select.token_score,
            share_prompts=cfg.optim.share_prompts,
            skip_zero_advantage=cfg.optim.skip_zero_advantage,
            importance=ImportanceSettings(
                mode=cfg.rollout.importance_sampling_mode,
                clip_max=cfg.rollout.importance_sampling_clip_max,
                clip_min=cfg.rollout.importance_sampling_clip_min,
            )
            if cfg.rollout.importance_sampling_correction
            else None,
            mixed_precision=mixed_precision,
        )


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float
    clip_frac_low: float
    clip_frac_high: float
    ratio_mean: float
    entropy: float | None  # mean over the completion tokens of the rows that had a forward pass; None where none had one
    kl: float | None
    tokens_total: int  # completion tokens of the kept rollouts
    tokens_kept: int  # tokens in the policy-gradient term (after D3S token selection: of rows with A != 0 only)
    sequences: int  # kept rollouts
    rows_run: int  # kept rollouts that took the update's forward and backward
    tokens_run: int  # their completion tokens
    sampler_logp_diff: float | None = None  # mean |log pi_trainer - log pi_sampler| per token of the rows that ran
    sampler_kl: float | None = None  # mean k3 estimate of KL(sampler || trainer) per token of the rows that ran
    is_ratio_mean: float | None = None  # importance correction: mean pi_old / pi_sampler (before truncation) over the policy-gradient tokens of the rows that ran
    is_ratio_min: float | None = None
    is_ratio_max: float | None = None
    is_clip_frac: float | None = None  # share of those tokens whose ratio was truncated or masked
    is_weight_mean: float | None = None  # the mean sequence weight after truncation or masking (a sequence's: the mean of its tokens')
    is_ess: float | None = None  # the effective sample size that matches the mode's level: is_ess_tokens for the token modes, else is_ess_sequences
    is_ess_tokens: float | None = None  # (sum w)^2 / (n sum w^2) of those tokens' own weights, a share of the n tokens
    is_ess_sequences: float | None = None  # the same of the sequence weights, a share of the n sequences

    def metrics(self) -> dict[str, float]:
        """The step's update metrics as logged (``kl`` only with a KL term)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "sequences"}
        # only with a KL term; only with the sampler's log-probs; only with the correction too
        for key in ("kl", "sampler_logp_diff", "sampler_kl", "is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_clip_frac", "is_weight_mean", "is_ess",
                    "is_ess_tokens", "is_ess_sequences"):  # fmt: skip
            if out[key] is None:
                del out[key]
        return out


@dataclass
class _Row:
    """What the update knows of one row of the batch besides its tokens: each a [len] tensor over
    the row's completion tokens, None where it was not computed for that row."""

    old: Tensor | None = None  # log pi_old (several policy iterations)
    entropy: Tensor | None = None
    ref: Tensor | None = None  # log pi_ref (KL term)
    token_mask: Tensor | None = None  # bool, D3S / 80-20 (None: every token)
    sampler: Tensor | None = None  # the engine's sampling log-probs (vLLM; None: not given)
    is_weight: Tensor | None = None  # the importance weight of each token (the sampler correction; None: not computed)


@dataclass
class _MicroBatch:
    """Rows of the batch packed for one forward pass. FSDP's padding micro-batch has no rows and
    no pack: an empty forward, so that every rank runs the same number."""

    rows: list[int]  # rows of the batch, in the pack's order
    pack: Packed | None

    def split(self, values: Tensor) -> list[Tensor]:
        """The pack's values [k, T] -> each row's completion part [len_q], in ``rows`` order."""
        lengths = self.pack.completion_mask.sum(dim=1).tolist()
        return [values[q, :n] for q, n in enumerate(lengths)]

    def stack(self, per_row: list[Tensor | None]) -> Tensor | None:
        """Each row's values [len_q] (in ``rows`` order) -> [k, T] like the pack (0 / False on
        padding); None when they are unknown (None for the first row)."""
        first = per_row[0]
        if first is None:
            return None
        out = torch.zeros(self.pack.completion_mask.shape, dtype=first.dtype, device=self.pack.completion_mask.device)
        for q, values in enumerate(per_row):
            out[q, : values.shape[0]] = values
        return out


@dataclass
class _Sums:
    """This rank's sums over the micro-batches it ran, reduced over ranks in one collective
    (:meth:`reduced`); the means of :class:`UpdateStats` are their ratios. Means over tokens are
    summed weighted by each call's tokens."""

    loss: float = 0.0
    clip_low: float = 0.0  # clip_frac_low x policy-gradient tokens
    clip_high: float = 0.0
    ratio: float = 0.0
    pg_tokens: float = 0.0  # tokens in the policy-gradient term
    kl: float = 0.0  # mean k3 x completion tokens
    kl_tokens: float = 0.0
    entropy: float = 0.0  # over the rows that had any forward pass
    entropy_tokens: float = 0.0
    gap: float = 0.0  # sampler / trainer gap, see add_sampler_gap
    gap_k3: float = 0.0
    gap_tokens: float = 0.0
    is_ratio: float = 0.0  # importance ratio, see add_importance
    is_tokens: float = 0.0
    is_clipped: float = 0.0
    is_sequences: float = 0.0  # sequences with a counted token, and the sums of their weights and squared weights
    is_weight: float = 0.0
    is_weight_sq: float = 0.0
    is_token_weight: float = 0.0  # the sums of the counted tokens' own weights and squared weights (over is_tokens)
    is_token_weight_sq: float = 0.0
    is_ratio_min: float = math.inf  # reduced by a maximum, not a sum (reduced)
    is_ratio_max: float = -math.inf

    def add_loss(self, loss: float, metrics: LossMetrics) -> None:
        self.loss += loss
        self.clip_low += metrics.clip_frac_low * metrics.tokens
        self.clip_high += metrics.clip_frac_high * metrics.tokens
        self.ratio += metrics.ratio_mean * metrics.tokens
        self.pg_tokens += metrics.tokens
        self.kl += (metrics.kl or 0.0) * metrics.completion_tokens
        self.kl_tokens += metrics.completion_tokens

    def add_sampler_gap(self, logprobs: Tensor, sampler: Tensor, p: Packed) -> None:
        """The gap between the trainer's log-probs [k, T] (the weights that sampled) and the
        engine's [k, T]: sum of |difference| and of the k3 estimate of KL(sampler || trainer),
        exp(d) - 1 - d with d = log pi_trainer - log pi_sampler, over the completion tokens. Nonzero
        by float and kernel differences alone; by construction with top_p < 1 (the engine's
        log-probs are renormalised over the nucleus)."""
        d = (logprobs.float() - sampler.to(logprobs.device).float())[p.completion_mask]  # [tokens]
        self.gap += float(d.abs().sum())
        self.gap_k3 += float((d.exp() - 1.0 - d).sum())
        self.gap_tokens += d.numel()

    def add_importance(self, metrics: ImportanceMetrics) -> None:
        self.is_ratio += metrics.ratio_sum
        self.is_tokens += metrics.tokens
        self.is_clipped += metrics.clipped
        self.is_sequences += metrics.sequences
        self.is_weight += metrics.weight_sum
        self.is_weight_sq += metrics.weight_sq_sum
        self.is_token_weight += metrics.token_weight_sum
        self.is_token_weight_sq += metrics.token_weight_sq_sum
        self.is_ratio_min = min(self.is_ratio_min, metrics.ratio_min)
        self.is_ratio_max = max(self.is_ratio_max, metrics.ratio_max)

    def reduced(self, dist: Dist) -> _Sums:
        """Every rank's sums added up (one collective of all the fields), and the importance ratio's
        extremes by a second one, only when some rank counted a ratio (every rank sees the same sum,
        so all make it or none)."""
        out = _Sums(*dist.sum(torch.tensor(dataclasses.astuple(self), dtype=torch.float64)).tolist())
        out.is_ratio_min, out.is_ratio_max = self.is_ratio_min, self.is_ratio_max
        if out.is_tokens and dist.active:
            high, low = dist.max(torch.tensor([self.is_ratio_max, -self.is_ratio_min], dtype=torch.float64)).tolist()
            out.is_ratio_min, out.is_ratio_max = -low, high
        return out


@dataclass
class _Update:
    """One call of :func:`run_update`: the model and how it is trained, this rank's batch and what
    is known of each of its rows (``rows[i]`` is row i of ``batch``)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    batch: UpdateBatch
    settings: UpdateSettings
    dist: Dist
    reference: torch.nn.Module | None  # the KL's reference model; None: the LoRA base (or no KL)
    rows: list[_Row]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def share_prompts(self) -> bool:
        # FSDP: sharing's two forward calls per micro-batch would depend on the data (a collective each).
        return self.settings.share_prompts and not self.dist.sharded


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
    u = _Update(model, optimizer, scheduler, batch, settings, dist, reference, rows=[_Row() for _ in range(K)])
    lengths = [len(c) for c in batch.completion_ids]
    signal = (batch.advantages != 0).nonzero().flatten().tolist() if settings.skips_zero_advantage else list(range(K))  # rows that run
    if batch.sampler_logprobs is not None:
        for row, logprobs in zip(u.rows, batch.sampler_logprobs):
            row.sampler = torch.tensor(logprobs, dtype=torch.float32)
    selects_tokens = settings.token_fraction < 1.0
    if settings.policy_iterations > 1 or selects_tokens or settings.loss.beta > 0:
        _scoring_pass(u, signal)  # token selection needs only these: a row with A = 0 is never selected
    if selects_tokens:
        for row, mask in zip(u.rows, _select_tokens(u, lengths)):
            row.token_mask = mask
    pg_tokens = sum(int(row.token_mask.sum()) for row in u.rows) if selects_tokens else sum(lengths)
    counts = torch.tensor([K, sum(lengths), pg_tokens, len(signal), sum(lengths[i] for i in signal)])
    total_sequences, tokens_total, tokens_kept, rows_run, tokens_run = dist.sum(counts).tolist()  # the whole batch's
    totals = BatchCounts(sequences=total_sequences, tokens=tokens_total)
    micro_batches = _micro_batches(u, signal, at_least_one=True)
    sums = _Sums()
    if rows_run == 0 and batch.sampler_logprobs is not None:  # on every rank alike: rows_run is global
        _measure_pass(u, measured_rows(K), sums)  # before the optimizer step: at the weights that sampled
    for iteration in range(settings.policy_iterations):
        grad_norm = _policy_iteration(u, micro_batches, totals, sums, first=iteration == 0)
    optimizer.zero_grad(set_to_none=True)
    known = [(row.entropy, n) for row, n in zip(u.rows, lengths) if row.entropy is not None]
    sums.entropy, sums.entropy_tokens = sum(float(e.sum()) for e, _ in known), sum(n for _, n in known)
    sums = sums.reduced(dist)
    iterations = settings.policy_iterations
    return UpdateStats(
        loss=sums.loss / iterations,
        grad_norm=grad_norm,
        clip_frac_low=sums.clip_low / max(sums.pg_tokens, 1),
        clip_frac_high=sums.clip_high / max(sums.pg_tokens, 1),
        ratio_mean=sums.ratio / sums.pg_tokens if sums.pg_tokens else 1.0,
        entropy=sums.entropy / sums.entropy_tokens if sums.entropy_tokens else None,  # no forward pass: not measured, not 0
        kl=sums.kl / max(sums.kl_tokens, 1) if settings.loss.beta > 0 else None,
        tokens_total=tokens_total,
        tokens_kept=tokens_kept,
        sequences=total_sequences,
        rows_run=rows_run,
        tokens_run=tokens_run,
        **_sampler_metrics(sums, settings.importance),
    )


def measure_sampler_gap(model: torch.nn.Module, batch: UpdateBatch, settings: UpdateSettings, *, dist: Dist | None = None) -> dict[str, float]:
    """The sampler gap and the importance correction's metrics of a step that kept no rollout at all
    (the DAPO filter, or dynamic sampling's cap with no signal: no update runs), as :func:`run_update`
    logs them in a step where no row runs: one forward without gradients of :data:`MEASURE_ROWS` of
    ``batch``'s rows (this rank's sampled rollouts; their advantages are not read), at the weights that
    sampled; no optimizer step. Every rank calls it (FSDP joins the same number of forwards). The
    metrics' names are UpdateStats'; {} without the sampler's log-probs."""
    dist = dist or Dist()
    if batch.sampler_logprobs is None:
        return {}
    K = len(batch.completion_ids)
    u = _Update(model, None, None, batch, settings, dist, None, rows=[_Row() for _ in range(K)])
    for row, logprobs in zip(u.rows, batch.sampler_logprobs):
        row.sampler = torch.tensor(logprobs, dtype=torch.float32)
    sums = _Sums()
    _measure_pass(u, measured_rows(K), sums)
    return {k: v for k, v in _sampler_metrics(sums.reduced(dist), settings.importance).items() if v is not None}


def _sampler_metrics(sums: _Sums, importance: ImportanceSettings | None) -> dict[str, float | None]:
    """The sampler gap and the correction's metrics from the reduced sums; None where nothing was measured."""
    return {
        "sampler_logp_diff": sums.gap / sums.gap_tokens if sums.gap_tokens else None,
        "sampler_kl": sums.gap_k3 / sums.gap_tokens if sums.gap_tokens else None,
        "is_ratio_mean": sums.is_ratio / sums.is_tokens if sums.is_tokens else None,
        "is_ratio_min": sums.is_ratio_min if sums.is_tokens else None,
        "is_ratio_max": sums.is_ratio_max if sums.is_tokens else None,
        "is_clip_frac": sums.is_clipped / sums.is_tokens if sums.is_tokens else None,
        **_ess(sums, importance),
    }


def _ess(sums: _Sums, importance: ImportanceSettings | None) -> dict[str, float | None]:
    """``is_weight_mean``, ``is_ess_tokens``, ``is_ess_sequences`` and ``is_ess`` (the one matching
    the mode's level) from the reduced sums (ImportanceMetrics' formulas); None without the correction."""
    whole = ImportanceMetrics(tokens=int(sums.is_tokens), ratio_sum=0.0, ratio_min=math.inf, ratio_max=-math.inf, clipped=0,
                              sequences=int(sums.is_sequences), weight_sum=sums.is_weight, weight_sq_sum=sums.is_weight_sq,
                              token_weight_sum=sums.is_token_weight, token_weight_sq_sum=sums.is_token_weight_sq)  # fmt: skip
    if importance is None:
        return {"is_weight_mean": None, "is_ess": None, "is_ess_tokens": None, "is_ess_sequences": None}
    return {"is_weight_mean": whole.weight_mean, "is_ess": whole.ess(importance.level), "is_ess_tokens": whole.ess_tokens,
            "is_ess_sequences": whole.ess_sequences}  # fmt: skip


def _micro_batches(u: _Update, rows: list[int], *, at_least_one: bool = False) -> list[_MicroBatch]:
    """``rows`` of the batch in micro-batches. FSDP: every rank runs the same number (padding with
    empty ones), and with ``at_least_one`` at least one, so that every parameter gets its (zero) gradient."""
    batch, s = u.batch, u.settings
    order = micro_batch_order([batch.prompt_ids[i] for i in rows], [batch.completion_ids[i] for i in rows])
    ordered = [rows[i] for i in order]
    cuts = micro_batch_cuts([(len(batch.prompt_ids[i]), len(batch.completion_ids[i])) for i in ordered], s.micro_batch_size, s.micro_batch_tokens)
    out = [
        _MicroBatch(idx, pack([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx], s.pad_id, device=u.device))
        for idx in (ordered[a:b] for a, b in cuts)
    ]
    if u.dist.sharded:  # FSDP: the same number of forward passes on every rank
        out += [_MicroBatch([], None) for _ in range(max(u.dist.max_int(len(out)), int(at_least_one)) - len(out))]
    return out


@torch.no_grad()
def _scoring_pass(u: _Update, rows: list[int]) -> None:
    """Log-probs and entropies of the current policy and the reference's log-probs of ``rows``,
    before the first loss, into ``u.rows``: needed for several policy iterations (pi_old must stay
    fixed), D3S token selection (its threshold is over every token of the batch) and a KL term."""
    s = u.settings
    for mb in _micro_batches(u, rows):
        if mb.pack is None:
            _empty_forward(u.model, s.pad_id, u.device, s.mixed_precision)
            continue
        logprobs, entropy = forward_logprobs(u.model, mb.pack, temperature=s.temperature, with_entropy=True, share_prompts=u.share_prompts,
                                             mixed_precision=s.mixed_precision)  # fmt: skip
        ref = None
        if s.loss.beta > 0:
            with _reference(u.model, u.reference) as ref_model:
                ref, _ = forward_logprobs(ref_model, mb.pack, temperature=s.temperature, share_prompts=u.share_prompts,
                                          mixed_precision=s.mixed_precision)  # fmt: skip
        rows = [u.rows[i] for i in mb.rows]
        for row, e in zip(rows, mb.split(entropy)):
            row.entropy = e
        if s.policy_iterations > 1:  # one iteration: pi_old is the update's own forward, detached
            for row, old in zip(rows, mb.split(logprobs)):
                row.old = old
        if ref is not None:
            for row, r in zip(rows, mb.split(ref)):
                row.ref = r


MEASURE_ROWS = 4  # the kept rows (of a rank) whose gap a step without a signal measures (module docstring)


def measured_rows(kept: int) -> list[int]:
    """The indices of the at most :data:`MEASURE_ROWS` of ``kept`` rows (group-major) whose sampler gap
    a step where no row runs measures: evenly spaced, so that they come from several groups."""
    m = min(MEASURE_ROWS, kept)
    return [i * kept // m for i in range(m)]


@torch.no_grad()
def _measure_pass(u: _Update, rows: list[int], sums: _Sums) -> None:
    """The sampler gap and the importance correction's metrics of ``rows`` in a step where no row runs
    the update (every advantage 0): one forward without gradients at the weights that sampled, so that
    every step that sampled logs them; the rows' entropies come with it. Nothing is weighted."""
    s = u.settings
    for mb in _micro_batches(u, rows):
        if mb.pack is None:  # FSDP padding
            _empty_forward(u.model, s.pad_id, u.device, s.mixed_precision)
            continue
        logprobs, entropy = forward_logprobs(u.model, mb.pack, temperature=s.temperature, with_entropy=True, share_prompts=u.share_prompts,
                                             mixed_precision=s.mixed_precision)  # fmt: skip
        for row, e in zip((u.rows[i] for i in mb.rows), mb.split(entropy)):
            row.entropy = e
        sampler = mb.stack([u.rows[i].sampler for i in mb.rows])
        sums.add_sampler_gap(logprobs, sampler, mb.pack)
        if s.importance is not None:
            sums.add_importance(importance_weights(logprobs, sampler, mb.pack.completion_mask, s.importance)[1])


def _policy_iteration(u: _Update, micro_batches: list[_MicroBatch], totals: BatchCounts, sums: _Sums, *, first: bool = True) -> float:
    """Accumulate every micro-batch's gradient, reduce over ranks, clip, take one optimizer step; on
    the ``first`` iteration (the weights that sampled), also the sampler / trainer log-prob gap.
    Returns the gradient norm before clipping."""
    s = u.settings
    u.optimizer.zero_grad(set_to_none=True)
    for mb in micro_batches:
        if mb.pack is None:  # FSDP padding: join the collectives, add nothing
            (_empty_forward(u.model, s.pad_id, u.device, s.mixed_precision) * 0.0).backward()
            continue
        rows = [u.rows[i] for i in mb.rows]
        need_entropy = rows[0].entropy is None
        logprobs, entropy = forward_logprobs(u.model, mb.pack, temperature=s.temperature, with_entropy=need_entropy, share_prompts=u.share_prompts,
                                             mixed_precision=s.mixed_precision, overwrite_logits=True)  # fmt: skip  (one backward below)
        if need_entropy:
            for row, e in zip(rows, mb.split(entropy)):
                row.entropy = e
        old = mb.stack([row.old for row in rows])
        old = logprobs.detach() if old is None else old  # pi_old: the weights that sampled
        token_mask = mb.stack([row.token_mask for row in rows])
        if first and s.importance is not None and rows[0].sampler is not None:  # once, at the weights that sampled
            weights, is_metrics = importance_weights(old, mb.stack([row.sampler for row in rows]), mb.pack.completion_mask, s.importance,
                                                     token_mask=token_mask)  # fmt: skip
            for row, w in zip(rows, mb.split(weights)):
                row.is_weight = w
            sums.add_importance(is_metrics)
        advantages = u.batch.advantages[mb.rows].to(u.device)
        loss, metrics = policy_loss(logprobs, old, advantages, mb.pack.completion_mask, s.loss, token_mask=token_mask,
                                    ref_logprobs=mb.stack([row.ref for row in rows]), batch=totals,
                                    is_weights=mb.stack([row.is_weight for row in rows]))  # fmt: skip
        loss.backward()
        if first and rows[0].sampler is not None:
            sums.add_sampler_gap(logprobs.detach(), mb.stack([row.sampler for row in rows]), mb.pack)
        sums.add_loss(loss.item(), metrics)
    params = [q for q in u.model.parameters() if q.requires_grad]
    if not u.dist.sharded:
        for q in params:  # no row ran here: a zero gradient, which AdamW still steps on (no row skipped would give the same)
            if q.grad is None:
                q.grad = torch.zeros_like(q)
        u.dist.all_reduce_grads(params)  # "ddp": sum the ranks' partial gradients
    norm = torch.nn.utils.clip_grad_norm_(params, s.grad_clip if s.grad_clip > 0 else float("inf"))
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    u.dist.commit()  # a stop signal abandons the step up to here, the weights still the last step's (podsrl.run.preemption)
    u.optimizer.step()
    u.scheduler.step()
    return grad_norm


def micro_batch_cuts(lengths: list[tuple[int, int]], rows: int, tokens: int = 0) -> list[tuple[int, int]]:
    """The micro-batches of rows in order, as [start, end) pairs. ``lengths``: each row's (prompt,
    completion) tokens, in the order of :func:`micro_batch_order`. ``tokens`` = 0: runs of ``rows``
    rows. ``tokens`` > 0: each micro-batch takes the next rows while its padded size, its rows x
    (the longest prompt + the longest completion among them: what :func:`podsrl.train.sequences.pack`
    lays out), stays within ``tokens``; a row alone over it is a micro-batch of its own."""
    if tokens <= 0:
        return [(a, min(a + rows, len(lengths))) for a in range(0, len(lengths), rows)]
    cuts, start, prompt, completion = [], 0, 0, 0
    for i, (p, c) in enumerate(lengths):
        wider = (max(prompt, p) + max(completion, c)) * (i - start + 1)
        if i > start and wider > tokens:
            cuts.append((start, i))
            start, prompt, completion = i, p, c
        else:
            prompt, completion = max(prompt, p), max(completion, c)
    if lengths:
        cuts.append((start, len(lengths)))
    return cuts


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


def _select_tokens(u: _Update, lengths: list[int]) -> list[Tensor]:
    """The token mask of every row of this rank, [len_i] bool each: one top-fraction threshold over
    the selectable tokens of the whole batch (every rank's; :func:`podsrl.core.token_selection.select_tokens`:
    the budget is over the rows with A_i != 0), split back per row. The scores are laid out in
    batch order and, over ranks, in rank order, whatever the micro-batching. That is the global
    batch's order when each rank holds a contiguous block of it (one generation batch: the step
    without dynamic sampling), so top-k then breaks ties the same way on 1 and on W ranks. With
    dynamic sampling the step's groups come from several generation batches, each rank holding its
    block of each, so rank order interleaves the batches differently on 1 and on W ranks: the
    threshold and the kept count are the same, but tokens tied at the threshold may be chosen
    differently. A row without entropies (skipped: A_i = 0) enters with entropy 0; it is not
    selectable, so its entropies are never read."""
    K, dist = len(lengths), u.dist
    T = dist.max_int(max(lengths, default=1) or 1)
    # Every rank takes the global top-k on the same device (top-k breaks ties per device), also a
    # rank whose rows were all skipped and so has no entropies on the GPU.
    device = dist.device if dist.active else next((row.entropy.device for row in u.rows if row.entropy is not None), u.batch.advantages.device)
    ent = torch.zeros((K, T), device=device)  # [K, T] in batch order
    valid = torch.zeros((K, T), dtype=torch.bool, device=device)
    adv = u.batch.advantages.to(device).float()  # [K]
    for i, (row, n) in enumerate(zip(u.rows, lengths)):
        valid[i, :n] = True
        if row.entropy is not None:
            ent[i, :n] = row.entropy.float()
    if dist.active:  # the whole batch's [K_global, T], in rank order; every rank's K gathered once for the three
        sizes = dist.row_counts(K)
        ent, adv = dist.gather_ragged(ent, sizes), dist.gather_ragged(adv, sizes)
        valid = dist.gather_ragged(valid.to(torch.uint8), sizes).bool()
    mask = select_tokens(adv, ent, valid, u.settings.token_fraction, u.settings.token_score)
    if dist.active:  # this rank's rows
        start = sum(sizes[: dist.rank])
        mask = mask[start : start + K]
    return [mask[i, :n] for i, n in enumerate(lengths)]


def _empty_forward(model: torch.nn.Module, pad_id: int, device, mixed_precision: bool = False) -> Tensor:
    """A one-token forward whose output is a scalar 0 attached to the graph (FSDP padding), in the
    arithmetic of the real ones."""
    ids = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
    with autocast(model, mixed_precision):
        logits = model(input_ids=ids, logits_to_keep=1).logits
    return logits.float().sum() * 0.0


@contextlib.contextmanager
def _reference(model: torch.nn.Module, reference: torch.nn.Module | None):
    if reference is not None:
        yield reference
    else:  # LoRA: the base model is the reference
        with model.disable_adapter():
            yield model
