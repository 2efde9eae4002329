"""A step's rollouts: prompts -> rollouts -> rewards, as one record of groups (:class:`Groups`).

``sample_step`` samples and scores the groups one training step trains on:

1. A generation batch j of the step takes the next B prompts of the run's prompt stream (shuffled
   epochs; with ``prompts.skip_silent`` passing over the prompts it predicts silent:
   :mod:`podsrl.train.prompts`); under torchrun every rank takes the same B and its contiguous
   block of B / world (:meth:`podsrl.train.distributed.Dist.shard`).
2. Each rank samples n rollouts per prompt of its block, or with ``rollout.early_stop = "exact"``
   in rounds of ``rollout.round_size`` (default: the step's m), each group until its exact stopping
   criterion holds (:mod:`podsrl.core.early_stop`) or it has n; a rollout never sampled has NaN in
   every numeric field. Stopping is decided per rank on its own groups: no collective per round.
3. It scores them (:func:`podsrl.grading.rewards.compute_rewards`) and the batch is gathered in
   one collective (:meth:`Groups.gather`): every rank then holds every group's numbers, and the
   tokens of the groups it sampled.
4. The batch's selection is decided once (:func:`podsrl.core.downsample.downsample` over the
   batch, the step's seed offset by the batch), and each group's *signal* read from it: its kept
   rollouts carry a nonzero advantage (:func:`podsrl.core.downsample.group_signal`; for GRPO that is
   DAPO's "not all rewards equal"). The prompt stream records each group's outcome (silent or not).
5. Without ``rollout.dynamic_sampling`` that one batch and its selection are the step's. With it
   (DAPO's dynamic sampling, arXiv 2503.14476 Sec. 3.2, for every rule), further batches j = 1, 2,
   ... are sampled until B groups have a signal, and the step trains on B of them with the rows
   their test read: the groups of each batch in prompt order, the last batch's spread over the
   ranks (below). Its ``downsample`` then computes the advantages over those B groups as a step
   without dynamic sampling does over its B (``std_over = "batch"`` is their std); ``d3s_cross``,
   whose pool is the batch, selects again over the B (its test is the group's own: its rewards are
   not all equal). Every rank decides on the gathered batches, so all run the same number of
   batches and collectives.

Choices (where DAPO, verl's ``algorithm.filter_groups`` and NeMo-RL's ``dynamic_sampling`` differ
or are silent):

- **The cap** (``rollout.max_gen_batches``, batches a step samples, the first included): verl and
  NeMo-RL stop the run with an error there. Here the step trains on the groups with a signal it
  has (fewer than B; with none it takes no optimizer step, like the DAPO filter), logs it
  (``gen_batches``, ``groups_with_signal`` in metrics.jsonl) and the trainer warns once.
- **Surplus groups** (with a signal, beyond B, from the last batch): dropped, as verl and NeMo-RL
  drop them. Kept for the next step they would train a step later on the previous weights
  (off-policy by one step) and make the checkpoint carry rollouts; dropped, every step samples
  from its own weights, and what a resumed run needs is the prompt stream's position and history
  (in the checkpoint) and the weights (``metrics.jsonl`` logs ``groups_surplus``). Which of the
  last batch's groups are kept balances the ranks: each next one comes from the rank that holds
  the fewest of the step's groups so far (ties: the lower rank), in prompt order within a rank, so
  no rank trains on more rows than it must while another pads (FSDP) or waits.
- **Seeds** (:mod:`podsrl.core.seeds`): batch 0 uses the streams a run without dynamic sampling
  uses, so it samples and selects the same; batch j >= 1 offsets every stream by j x
  ``BATCH_OFFSET``.
- **What the step's metrics report** (``sample_metrics``): early stopping samples a group until
  its kept set is settled, so the groups that run long (rewards all equal) outweigh the others in
  a mean pooled over every sampled rollout, and dynamic sampling adds batches exactly when signal
  is scarce. Neither the pooled mean nor the mean of per-group means (which equals the pooled
  mean when every group has n) estimates what a fixed-n run logs: in a simulation with podsrl's
  criterion (``python bench/metric_basis.py``: p ~ Beta(3, 1), n = 16, m = 4, rounds of 4) fixed n
  logs 0.751, the pooled mean is 0.798 and the mean of per-group means 0.727. The rollouts sampled
  whatever happens later do (0.751 there): the first batch's B groups, each group's first round
  (all n without early stopping). ``reward_mean``, ``reward_std``, ``reward/<name>``,
  ``completion_len``, ``truncated`` are over those, ``zero_variance_groups`` over the first batch's
  groups: the same quantities, with the same expectation, as a fixed-n run's (identical values
  without early stopping and dynamic sampling).
- **Reward timeouts** (``reward.max_timeout_fraction``) are checked once per step, over every
  completion of every round, batch and rank (:func:`podsrl.grading.pool.check_timeouts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from podsrl.core.downsample import Selection, downsample, group_signal
from podsrl.core.early_stop import check_values, stop_criterion
from podsrl.core.seeds import BATCH_OFFSET, RANK_OFFSET, ROUND_OFFSET, Stream, generator, step_seed
from podsrl.core.selection import nonzero_variance_groups
from podsrl.engines import Rollouts, Sampling
from podsrl.grading.rewards import RewardResult, compute_rewards, explain_undeclared
from podsrl.train.prompts import PromptBatch, prompt_metrics


@dataclass
class Completion:
    """One sampled completion's tokens, kept on the rank that sampled it."""

    ids: list[int]
    logprobs: list[float] | None  # the engine's sampling log-prob of each token (vLLM); None: not given


@dataclass
class Groups:
    """G groups of n rollouts, one record: every field has one row per group, so selecting groups,
    concatenating batches and gathering over ranks each touch one place (``_GROUP_FIELDS``,
    ``_ROLLOUT_FIELDS``, ``_PER_REWARD``). Once gathered, every rank holds every group's numbers
    and the tokens of the groups it sampled; ``completions`` is None where another rank holds them
    or a rollout was never sampled."""

    prompt: Tensor  # [G] int64: the prompt's index in task.train
    rank: Tensor  # [G] int64: the process that sampled the group (and holds its tokens)
    batch: Tensor  # [G] int64: the step's generation batch it came from (0: the first B prompts)
    reward: Tensor  # [G, n] float32: the weighted sum of the reward functions; NaN: never sampled
    round: Tensor  # [G, n] float32: the sampling round that drew it (0: the first; early stopping); NaN: never sampled
    length: Tensor  # [G, n] float32: completion tokens
    truncated: Tensor  # [G, n] float32: 1.0 where the completion hit rollout.max_new_tokens
    per_reward: dict[str, Tensor]  # name -> [G, n] float32: each reward function's unweighted value
    timed_out: dict[str, Tensor]  # name -> [G, n] float32: 1.0 where that function's call was stopped at reward.timeout_seconds
    completions: list[list[Completion | None]]  # [G][n]

    _GROUP_FIELDS = ("prompt", "rank", "batch")
    _ROLLOUT_FIELDS = ("reward", "round", "length", "truncated")
    _PER_REWARD = ("per_reward", "timed_out")

    @classmethod
    def unsampled(cls, prompts: list[int], n: int, *, rank: int, batch: int, rewards: list[str], timed: list[str]) -> Groups:
        """``len(prompts)`` groups of n rollouts not sampled yet (NaN everywhere)."""
        G = len(prompts)
        nan = lambda: torch.full((G, n), math.nan)  # noqa: E731
        return cls(
            prompt=torch.tensor(prompts, dtype=torch.long).reshape(G),
            rank=torch.full((G,), rank, dtype=torch.long),
            batch=torch.full((G,), batch, dtype=torch.long),
            **{name: nan() for name in cls._ROLLOUT_FIELDS},
            per_reward={name: nan() for name in rewards},
            timed_out={name: nan() for name in timed},
            completions=[[None] * n for _ in range(G)],
        )

    def __len__(self) -> int:
        return self.prompt.shape[0]

    @property
    def sampled(self) -> Tensor:
        """[G, n] bool: the rollouts that were sampled."""
        return ~self.reward.isnan()

    def record(self, groups: list[int], first: int, out: Rollouts, scores: RewardResult, round: int) -> None:
        """Write one engine call's k rollouts per group (``out``, group-major, for ``groups``) and
        their scores into rollout positions first .. first + k - 1, drawn in sampling round ``round``."""
        k = len(out.completion_ids) // max(1, len(groups))
        cols = slice(first, first + k)
        as_rows = lambda values: torch.tensor(values, dtype=torch.float32).reshape(len(groups), k)  # noqa: E731
        self.reward[groups, cols] = as_rows(scores.total)
        self.round[groups, cols] = float(round)
        self.length[groups, cols] = as_rows([len(ids) for ids in out.completion_ids])
        self.truncated[groups, cols] = as_rows([float(t) for t in out.truncated])
        for name, values in scores.per_reward.items():
            self.per_reward[name][groups, cols] = as_rows(values)
        for name in self.timed_out:
            self.timed_out[name][groups, cols] = as_rows([float(t) for t in scores.timed_out[name]])
        for j, g in enumerate(groups):
            for i in range(k):
                logprobs = None if out.logprobs is None else out.logprobs[j * k + i]
                self.completions[g][first + i] = Completion(out.completion_ids[j * k + i], logprobs)

    def subset(self, rows: Tensor | list[int]) -> Groups:
        """The groups at ``rows`` (indices or a [G] bool mask), in that order."""
        rows = torch.as_tensor(rows)
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        rows = rows.long().reshape(-1)
        return Groups(
            **{name: getattr(self, name)[rows] for name in (*self._GROUP_FIELDS, *self._ROLLOUT_FIELDS)},
            **{name: {k: v[rows] for k, v in getattr(self, name).items()} for name in self._PER_REWARD},
            completions=[self.completions[i] for i in rows.tolist()],
        )

    @classmethod
    def cat(cls, parts: list[Groups]) -> Groups:
        """The groups of ``parts`` one after another (every part has the same n and reward names)."""
        first = parts[0]
        return cls(
            **{name: torch.cat([getattr(p, name) for p in parts]) for name in (*cls._GROUP_FIELDS, *cls._ROLLOUT_FIELDS)},
            **{name: {k: torch.cat([getattr(p, name)[k] for p in parts]) for k in getattr(first, name)} for name in cls._PER_REWARD},
            completions=[row for p in parts for row in p.completions],
        )

    def gather(self, dist) -> Groups:
        """Every rank's groups (the same number on each; ``dist``: :class:`podsrl.train.distributed.Dist`),
        in rank order, on every rank: every number in one collective ([G, n, C] float64, which holds
        float32 values and indices exactly); the tokens stay on the rank that sampled them."""
        if not dist.active:
            return self
        G, n = self.reward.shape
        columns = [getattr(self, name)[:, None].expand(G, n) for name in self._GROUP_FIELDS]
        columns += [getattr(self, name) for name in self._ROLLOUT_FIELDS]
        columns += [t for name in self._PER_REWARD for t in getattr(self, name).values()]
        table = dist.gather_rows(torch.stack([c.to(torch.float64) for c in columns], dim=-1))  # [world * G, n, C]
        it = iter(table.unbind(-1))
        fields = {name: next(it)[:, 0].to(getattr(self, name).dtype) for name in self._GROUP_FIELDS}
        fields |= {name: next(it).to(getattr(self, name).dtype) for name in self._ROLLOUT_FIELDS}
        fields |= {name: {k: next(it).to(v.dtype) for k, v in getattr(self, name).items()} for name in self._PER_REWARD}
        others = [[None] * n for _ in range(G)]
        completions = [row for r in range(dist.world) for row in (self.completions if r == dist.rank else others)]
        return Groups(**fields, completions=completions)


@dataclass
class StepSample:
    """What ``sample_step`` sampled for one step."""

    groups: Groups  # the groups the step trains on: B (fewer at the dynamic-sampling cap), every rank's numbers
    first: Groups  # the step's first batch of B prompts: the basis of the sampling metrics (module docstring)
    gen_batches: int  # generation batches of B prompts sampled (1 without dynamic sampling)
    rollouts: int  # rollouts generated, every batch, round and rank
    rounds: int  # sampling rounds, summed over the batches (in each, the most any group took)
    timeouts: int  # reward calls stopped at reward.timeout_seconds, every function
    surplus: int  # groups with a signal sampled beyond B and dropped
    keep: Tensor | None = None  # [len(groups), n] bool: their selection, decided with the signal test; None: select anew (d3s_cross)
    passed: int = 0  # of the groups trained on, those whose signal test passed (B unless at the cap)
    silent: int = 0  # groups sampled this step (every batch) without a signal
    prompts: dict = field(default_factory=dict)  # the prompt stream's metrics: epoch, epoch_end; with prompt selection, skipped, explored and forced prompts


def sample_step(run, step: int, progress: float, timer) -> StepSample:
    """Sample and score the groups of training step ``step`` (module docstring). ``run`` is the run's
    :class:`podsrl.train.loop.Setup` (``run.prompts``: its prompt stream); ``progress`` its training
    progress (for m's schedule)."""
    cfg = run.cfg
    B, dynamic = cfg.train.prompts_per_step, cfg.rollout.dynamic_sampling
    spec, m = cfg.select, cfg.select.m_at(cfg.rollout.n, progress)
    seed = spec.seed if spec.seed is not None else cfg.train.seed
    batches: list[Groups] = []
    picks: list[PromptBatch] = []
    selections: list[Selection] = []
    signals: list[Tensor] = []
    for j in range(cfg.rollout.max_gen_batches if dynamic else 1):
        picks.append(run.prompts.take(B, step))
        batch = _sample_batch(run, step, j, m, picks[-1].prompts, timer)
        with timer("select"):  # the batch's one selection: its signal test, and the rows a step trains on
            selection = downsample(batch.reward, spec, progress=progress, generator=generator(seed, step, Stream.SELECTION + BATCH_OFFSET * j),
                                   allow_missing=True)  # fmt: skip
            signal = group_signal(batch.reward, selection, spec)  # [B]
        run.prompts.record(batch.prompt, ~signal)
        batches.append(batch), selections.append(selection), signals.append(signal)
        if not dynamic or sum(int(x.sum()) for x in signals) >= B:
            break
    everything = Groups.cat(batches)
    timed_out = {name: int(t.nansum()) for name, t in everything.timed_out.items()}
    if run.reward_pool is not None:  # over the whole step, every rank's (the same decision on each)
        run.reward_pool.check_timeouts(timed_out, int(everything.sampled.sum()))
    if dynamic:
        groups, keep, found = _with_signal(batches, selections, signals, B, world=run.dist.world)
        keep = None if spec.rule == "d3s_cross" else keep
    else:
        groups, keep, found = batches[0], selections[0].keep, int(signals[0].sum())
    silent = sum(int((~x).sum()) for x in signals)
    prompts = prompt_metrics(picks, [~x for x in signals], epoch=run.prompts.step_epoch, epoch_end=run.prompts.order.passes,
                             explore_rate=run.prompts.explore_rate)  # fmt: skip
    run.prompts.end_step(sampled=len(everything), silent=silent)
    return StepSample(
        groups=groups,
        keep=keep,
        first=batches[0],
        gen_batches=len(batches),
        rollouts=int(everything.sampled.sum()),
        rounds=sum(int(b.round.nan_to_num(-1).max()) + 1 for b in batches),
        timeouts=sum(timed_out.values()),
        surplus=max(0, found - B) if dynamic else 0,
        passed=min(found, B),
        silent=silent,
        prompts=prompts,
    )


def _with_signal(batches: list[Groups], selections: list[Selection], signals: list[Tensor], B: int, *, world: int):
    """Dynamic sampling's step: the groups with a signal, B at most (the last batch's chosen to
    balance the ranks: module docstring), with the selection their test read; and how many passed."""
    rows: list[Tensor] = []  # per batch, the indices of its groups the step keeps
    held = torch.zeros(world, dtype=torch.long)  # the step's groups per rank so far
    for batch, signal in zip(batches, signals):
        passed = signal.nonzero().flatten()  # [S] in prompt order
        need = B - sum(len(r) for r in rows)
        if len(passed) > need:
            passed = _balance(batch.rank[passed], held, need, passed)
        held += torch.bincount(batch.rank[passed], minlength=world)
        rows.append(passed)
    groups = Groups.cat([b.subset(r) for b, r in zip(batches, rows)])
    keep = torch.cat([sel.keep[r] for sel, r in zip(selections, rows)])  # [G, n]
    return groups, keep, sum(int(x.sum()) for x in signals)


def _balance(ranks: Tensor, held: Tensor, need: int, candidates: Tensor) -> Tensor:
    """``need`` of ``candidates`` (their ranks [S]), each next one from the rank that holds the fewest
    groups (``held`` [world]; ties: the lower rank), in order within a rank; returned in their order."""
    held = held.clone()
    queues = {r: [i for i in range(len(ranks)) if int(ranks[i]) == r] for r in range(len(held))}
    chosen: list[int] = []
    for _ in range(need):
        r = min((r for r in queues if queues[r]), key=lambda r: (int(held[r]), r))
        chosen.append(queues[r].pop(0))
        held[r] += 1
    return candidates[sorted(chosen)]


def _sampling(cfg, step: int, rank: int, *, batch: int, round: int, n: int) -> Sampling:
    """The sampling of ``rank``'s prompts in round ``round`` of batch ``batch`` of ``step`` (n
    rollouts each; round 0 of batch 0 is the sampling of a run without early stopping)."""
    r = cfg.rollout
    seed = step_seed(cfg.train.seed, step, Stream.SAMPLING + RANK_OFFSET * rank + ROUND_OFFSET * round + BATCH_OFFSET * batch)
    return Sampling(n=n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens, seed=seed)


def _sample_batch(run, step: int, j: int, m: int, batch_prompts: list[int], timer) -> Groups:
    """Generation batch ``j`` of the prompts ``batch_prompts`` (every rank's): this rank's groups
    sampled (in rounds with early stopping) and scored, then every rank's gathered."""
    cfg, dist = run.cfg, run.dist
    n, sel = cfg.rollout.n, cfg.select
    idx = dist.shard(batch_prompts)  # this rank's block
    prompts, examples = [run.train_prompts[i] for i in idx], [run.task.train[i] for i in idx]
    timed = [spec.name for spec in run.rewards if run.reward_pool is not None and run.reward_pool.serves(spec.name)]
    local = Groups.unsampled(idx, n, rank=dist.rank, batch=j, rewards=[spec.name for spec in run.rewards], timed=timed)
    criterion = None
    if cfg.rollout.early_stop != "off":
        criterion = stop_criterion(sel.rule, m, values=run.reward_values, filter_zero_variance=sel.filter_zero_variance)
    size = n if criterion is None else cfg.rollout.round_size or m
    running, count, round = list(range(len(idx))), 0, 0  # every running group has `count` rollouts
    while running:
        k = min(size, n - count)
        with timer("generate"):
            out = run.engine.generate([prompts[g] for g in running], _sampling(cfg, step, dist.rank, batch=j, round=round, n=k))
        with timer("reward"):
            scores = compute_rewards(out.texts, [examples[g] for g in running for _ in range(k)], run.rewards, pool=run.reward_pool)
            local.record(running, count, out, scores, round)
            if criterion is not None and run.reward_values is not None:  # the criteria are exact only for declared values
                check_values(local.reward, run.reward_values, explain=lambda stray: _explain(run, local, stray))
        count, round = count + k, round + 1
        if criterion is None:
            break
        done = criterion(local.reward)  # [b]
        running = [g for g in running if count < n and not bool(done[g])]
    with timer("reward"):
        return local.gather(dist)


def _explain(run, groups: Groups, stray: Tensor) -> str:
    """Who gave the rewards outside the declared values (``stray`` [G, n] bool), and the fix."""
    values = torch.stack([groups.per_reward[spec.name] for spec in run.rewards], dim=-1)[stray]  # [S, F] each function's value
    return explain_undeclared(run.rewards, values.tolist(), run.cfg.reward, run.declared)


def sample_metrics(sample: StepSample, reward_names: list[str]) -> dict:
    """The step's metrics of what was sampled, on the basis a fixed-n run's have (module docstring):
    the first batch's groups, each group's first round."""
    first = sample.first
    basis = first.sampled & (first.round == 0)  # [B, n]
    rewards = first.reward[basis]  # [N]
    sampled = first.sampled
    silent = ~nonzero_variance_groups(first.reward.nan_to_num(0.0), sampled)  # [B]
    return {
        "reward_mean": float(rewards.mean()) if rewards.numel() else math.nan,
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "zero_variance_groups": float(silent.float().mean()),
        "completion_len": float(first.length[basis].mean()),
        "truncated": float(first.truncated[basis].mean()),
        **{f"reward/{name}": float(first.per_reward[name][basis].mean()) for name in reward_names},
        "reward/timeouts": sample.timeouts,  # calls stopped at reward.timeout_seconds, the whole step
        "rollouts_generated": sample.rollouts,  # B*n, fewer with early stopping, more with dynamic sampling
        "sample_rounds": sample.rounds,
        "prompts_sampled": sample.gen_batches * len(first),
        "gen_batches": sample.gen_batches,
        "groups_surplus": sample.surplus,
        "groups_passed": sample.passed,  # of the groups trained on, those whose signal test passed
        "groups_silent": sample.silent,  # groups sampled this step, every batch, without a signal
        **sample.prompts,
    }
