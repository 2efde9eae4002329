"""The training prompts a run samples, in shuffled epochs, with optional prompt selection.

**Epochs.** The run reads its P training prompts as TRL's sampler and verl's dataloader do: epoch e
is a permutation of all P, seeded by (train.seed, e) (:data:`podsrl.core.seeds.Stream.PROMPTS`;
``prompts.shuffle = false``: the task's order every epoch), and every generation batch takes the
next B prompts of the stream, across an epoch's end when it comes; dynamic sampling's further
batches take the next prompts of the same stream. The stream's position is a few numbers in the
checkpoint (:meth:`PromptStream.state_dict`), so a resumed run continues exactly; under torchrun
every rank reads the same stream and takes its block of each batch
(:meth:`podsrl.train.distributed.Dist.shard`).

**No prompt twice in one step** (issue 57): a step whose batches run over an epoch's end would
read the next epoch's permutation, which can hold the prompts the step has just sampled (a group
sampled twice in one step is two groups of one prompt). So an epoch begun during a step puts the
prompts that step has sampled at its end, in their permuted order (``back``, in the checkpoint):
the epoch is still one of all P, each prompt comes once in it, and a step of at most P prompts
never reaches them without skipping. Where prompt selection's skipping carries the step that far,
it passes over them: the step sampled them, and they have had their turn of the epoch, as a
skipped prompt has. Only a step that samples more than P prompts samples one twice, each once
before any twice; the trainer says so at start-up (:func:`repeats_warning`). The alternatives:
drawing the next epoch without the step's prompts would leave them out of that epoch, and holding
a duplicate back for the next step would carry candidates (and their skip draws) across steps.

Before (podsrl up to issue 44), each generation batch drew B prompts with a generator seeded by
(seed, step, batch), independently of the others: a prompt could come twice in one step and some
never came. A run's prompt order, and so its figures, differ from then (docs/run-directory.md).

**Prompt selection** (``prompts.skip_silent``; :mod:`podsrl.core.prompt_selection`): each prompt's
count of consecutive silent visits is kept (one byte a prompt, in the checkpoint), and a candidate
predicted silent is skipped with a probability that the exploration rate sets, before any rollout is
sampled for it: the batch takes the next candidates in its place. A skipped prompt has had its turn
of the epoch. A batch examines at most one epoch's worth of candidates (P) for skipping; if that
does not fill it, the next candidates are taken without skipping, so a step never stalls when nearly
every prompt is predicted silent. A prompt predicted silent that the rule's draw sampled is
*explored*; one taken so, without the rule, is *forced* (``prompts_forced``, and of those the ones
that came back silent, ``prompts_forced_silent``), so that ``prompts_explored`` and the
prediction's precision (``explored_silent_share``: :func:`prompt_metrics`) count the rule's choices
alone. The outcomes recorded are the ones the
step's selection decided (:func:`podsrl.core.downsample.group_signal`), for every group sampled:
with dynamic sampling, the silent groups and the surplus too.

**The parts**, each of which reads alone: :class:`EpochOrder` (the epochs' orders and the position
in them), :class:`PromptSelection` (the skip rule's state: the silent streaks and the exploration
rate), :class:`PromptStream` (a step's batches taken from the two, and the checkpoint of both) and
:func:`prompt_metrics` (what a step logs of them, from the batches it took).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from podsrl.core import prompt_selection as ps
from podsrl.core.seeds import Stream, generator

__all__ = ["EpochOrder", "PromptBatch", "PromptSelection", "PromptStream", "prompt_metrics", "repeats_warning"]


@dataclass
class PromptBatch:
    """One generation batch's prompts, decided before sampling (the same on every rank)."""

    prompts: list[int]  # [B] indices into task.train, in stream order
    skipped: int  # candidates passed over (predicted silent) to find them
    explored: list[bool]  # [B] True where the prompt was predicted silent (a silent streak) and the rule's draw sampled it anyway
    forced: list[bool]  # [B] True where the prompt was predicted silent and taken without the rule, an epoch's worth examined (module docstring)


class EpochOrder:
    """P prompts in epochs: epoch e is a permutation of all P seeded by (seed, e) (``shuffle``
    false: the task's order), with the prompts in ``back`` moved to its end (module docstring: the
    step that began the epoch had sampled them), read from ``position`` on."""

    def __init__(self, pool: int, seed: int, shuffle: bool):
        self.pool, self.seed, self.shuffle = pool, seed, shuffle
        self.epoch = 0  # the epoch being read
        self.position = 0  # candidates of that epoch already taken (sampled, skipped or passed over); P: the epoch is done
        self.back: list[int] = []  # prompts moved to the end of this epoch's order
        self._cache: tuple[int, Tensor] | None = None  # (epoch, its order [P])

    @property
    def passes(self) -> float:
        """Passes over the prompts so far (1.5: one and a half), as HF Trainer counts epochs."""
        return self.epoch + self.position / self.pool

    @property
    def done(self) -> bool:
        """Every candidate of the current epoch has been taken."""
        return self.position == self.pool

    def current(self) -> Tensor:
        """The current epoch's order [P]: its permutation, with :attr:`back` moved to its end."""
        if self._cache is None or self._cache[0] != self.epoch:
            if self.shuffle:
                order = torch.randperm(self.pool, generator=generator(self.seed, self.epoch, Stream.PROMPTS))
            else:
                order = torch.arange(self.pool)
            if self.back:
                moved = torch.zeros(self.pool, dtype=torch.bool)
                moved[self.back] = True
                order = torch.cat([order[~moved[order]], order[moved[order]]])
            self._cache = (self.epoch, order)
        return self._cache[1]

    def remaining(self) -> Tensor:
        """[C] the current epoch's candidates not taken yet, in order."""
        return self.current()[self.position :]

    def advance(self, count: int) -> None:
        """``count`` more candidates of the current epoch taken."""
        self.position += count

    def next_epoch(self, back: list[int]) -> None:
        """Begin the next epoch, with ``back`` at the end of its order."""
        self.epoch, self.position, self.back = self.epoch + 1, 0, sorted(back)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "pool": self.pool, "back": list(self.back)}

    def load_state_dict(self, state: dict) -> None:
        """``state`` of a stream of the same P (:meth:`state_dict`); no ``back``: written before issue
        57, when every epoch was a plain permutation."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.back, self._cache = [int(p) for p in state.get("back", [])], None


class PromptSelection:
    """Prompt selection's state (``prompts.skip_silent``; the rule: :mod:`podsrl.core.prompt_selection`):
    each prompt's count of consecutive silent visits and the exploration rate, with ``cfg`` the run's
    :class:`podsrl.config.PromptsConfig`. Its draws are one uniform per candidate, seeded by (seed,
    epoch) and indexed by the candidate's position in the epoch."""

    def __init__(self, pool: int, seed: int, cfg):
        self.seed, self.cfg = seed, cfg
        self.explore_rate = cfg.explore  # p: a prompt silent k visits in a row is sampled with probability p**k
        self.streak = torch.zeros(pool, dtype=torch.uint8)  # [P] consecutive silent visits
        self._draws: tuple[int, Tensor] | None = None  # (epoch, its uniforms [P])

    def predicts_silent(self, prompt: int) -> bool:
        """Whether ``prompt``'s last visit was silent (a silent streak)."""
        return int(self.streak[prompt]) > 0

    def skips(self, candidates: Tensor, epoch: int, position: int) -> list[bool]:
        """Which of ``candidates`` [C], at ``position``, ``position`` + 1, ... of epoch ``epoch``, the rule
        skips (:func:`podsrl.core.prompt_selection.skip_mask`)."""
        uniform = self.draws(epoch)[position : position + len(candidates)]
        return ps.skip_mask(self.streak[candidates], uniform, self.explore_rate, self.cfg.min_sample_probability).tolist()

    def draws(self, epoch: int) -> Tensor:
        """Epoch ``epoch``'s uniforms [P], one per position (:data:`podsrl.core.seeds.Stream.PROMPT_SKIP`)."""
        if self._draws is None or self._draws[0] != epoch:
            self._draws = (epoch, torch.rand(len(self.streak), generator=generator(self.seed, epoch, Stream.PROMPT_SKIP), dtype=torch.float64))
        return self._draws[1]

    def record(self, prompts: Tensor, silent: Tensor) -> None:
        """The outcomes of a sampled batch's groups: prompts [G] indices, silent [G] bool."""
        if len(prompts):
            self.streak = ps.record_outcomes(self.streak, prompts, silent)

    def adapt(self, sampled: int, silent: int, passes: float) -> None:
        """After a step whose sampled groups were ``silent`` of ``sampled`` silent, ``passes`` over
        the prompts done: the exploration rate moves toward ``prompts.target_silent``, once prompts
        have come back (module docstring of :mod:`podsrl.core.prompt_selection`)."""
        if sampled == 0 or passes < 1:
            return
        c = self.cfg
        self.explore_rate = ps.next_explore_rate(self.explore_rate, silent / sampled, target=c.target_silent, step=c.explore_step,
                                                 low=c.explore_min, high=c.explore_max)  # fmt: skip

    def state_dict(self) -> dict:
        return {"explore": self.explore_rate, "streak": self.streak.clone()}  # "explore": the key since issue 44

    def load_state_dict(self, state: dict) -> None:
        self.explore_rate, self.streak = float(state["explore"]), state["streak"].to(torch.uint8).clone()


class PromptStream:
    """A run's P training prompts (module docstring): the batches each training step takes from
    its :class:`EpochOrder`, skipping as its :class:`PromptSelection` says (``cfg.skip_silent``;
    ``cfg``: the run's :class:`podsrl.config.PromptsConfig`; None without), and their checkpoint."""

    def __init__(self, pool: int, seed: int, cfg):
        if pool < 1:
            raise ValueError("the task has no training prompts")
        self.pool = pool
        self.order = EpochOrder(pool, seed, cfg.shuffle)
        self.selection = PromptSelection(pool, seed, cfg) if cfg.skip_silent else None
        self._step: int | None = None  # the training step taking prompts
        self._held: set[int] = set()  # the prompts that step has sampled (since it last held every prompt)
        self.step_epoch = 0.0  # passes over the prompts when that step began taking them: the epoch it logs

    def take(self, B: int, step: int) -> PromptBatch:
        """The next B prompts to sample for training step ``step`` (a step may take several batches:
        dynamic sampling); with prompt selection, skipping the ones it predicts silent. None is one
        the step already sampled, until it has sampled every prompt (module docstring)."""
        if step != self._step:
            self._step, self._held, self.step_epoch = step, set(), self.order.passes
        prompts: list[int] = []
        explored: list[bool] = []
        forced: list[bool] = []
        skipped = examined = 0
        while len(prompts) < B:
            if self.order.done:  # a new epoch, begun when its first candidate is needed
                self.order.next_epoch(back=list(self._held))
            candidates = self.order.remaining()  # [C]
            selecting = self.selection is not None and examined < self.pool  # else: none, or one epoch's worth examined
            if selecting:
                candidates = candidates[: self.pool - examined]  # examine no more than P candidates in all
                skip = self.selection.skips(candidates, self.order.epoch, self.order.position)
            used = 0  # candidates consumed (sampled, skipped, or passed over as already sampled this step)
            for i, p in enumerate(candidates.tolist()):
                used += 1
                if p in self._held:
                    continue
                if selecting and skip[i]:
                    skipped += 1
                    continue
                silent = self.selection is not None and self.selection.predicts_silent(p)
                prompts.append(p)
                explored.append(silent and selecting)
                forced.append(silent and not selecting)
                self._hold(p)
                if len(prompts) == B:
                    break
            examined += used
            self.order.advance(used)
        return PromptBatch(prompts=prompts, skipped=skipped, explored=explored, forced=forced)

    def _hold(self, prompt: int) -> None:
        """``prompt`` is sampled this step; once the step holds every prompt, it starts again."""
        self._held.add(prompt)
        if len(self._held) == self.pool:
            self._held = set()

    def record(self, prompts: Tensor, silent: Tensor) -> None:
        """The outcomes of a sampled batch's groups: prompts [G] indices, silent [G] bool (every
        rank passes the gathered batch, so every rank's history stays the same)."""
        if self.selection is not None:
            self.selection.record(prompts, silent)

    def end_step(self, sampled: int, silent: int) -> None:
        """After a step whose sampled groups were ``silent`` of ``sampled`` silent (:meth:`PromptSelection.adapt`)."""
        if self.selection is not None:
            self.selection.adapt(sampled, silent, self.order.passes)

    @property
    def explore_rate(self) -> float | None:
        """The exploration rate the next batch uses; None without prompt selection."""
        return None if self.selection is None else self.selection.explore_rate

    # ------------------------------------------------------------------ the checkpoint

    def state_dict(self) -> dict:
        """Plain values and a tensor, for the checkpoint's ``state.pt`` (read with weights_only)."""
        return self.order.state_dict() | ({} if self.selection is None else self.selection.state_dict())

    def load_state_dict(self, state: dict) -> str | None:
        """Continue from ``state`` (:meth:`state_dict`); returns a line for the log when the
        checkpoint cannot continue this stream exactly (written before epochs, another training
        set, prompt selection turned on), None when it does."""
        if not state:
            return ("the checkpoint was written before prompts were read in epochs (podsrl before issue 44): the run "
                    "continues from the start of a new shuffled epoch")  # fmt: skip
        if state.get("pool") != self.pool:
            return (f"the checkpoint's training set had {state.get('pool')} prompts, this one has {self.pool}: the run "
                    "continues from the start of a new shuffled epoch, with no prompt history")  # fmt: skip
        self.order.load_state_dict(state)
        if self.selection is None:
            return None
        if "streak" not in state:
            return "prompt selection is new to this run: its history starts empty"
        self.selection.load_state_dict(state)
        return None


def prompt_metrics(batches: list[PromptBatch], silent: list[Tensor], *, epoch: float, epoch_end: float, explore_rate: float | None) -> dict:
    """A step's prompt metrics (docs/run-directory.md) from the batches it took, ``silent`` [G] bool
    per batch in prompt order (each group's outcome), ``epoch`` the passes over the prompts when it
    began taking them (:attr:`PromptStream.step_epoch`: its whole part is the epoch its first
    candidate came from, so a step that runs into epoch 1 is logged from epoch 0), ``epoch_end``
    the passes once it had taken them (what ``epoch`` was before issue 57: the passes by this step)
    and ``explore_rate`` the exploration rate its batches used (None: no prompt selection, no more)."""
    out: dict = {"epoch": round(epoch, 4), "epoch_end": round(epoch_end, 4)}
    if explore_rate is None:
        return out

    def silent_among(mask: str) -> int:  # of the prompts ``mask`` marks, the ones that came back silent
        return sum(int(s[torch.tensor(getattr(b, mask), dtype=torch.bool)].sum()) for b, s in zip(batches, silent) if len(b.prompts))

    explored, hits = sum(sum(b.explored) for b in batches), silent_among("explored")
    return out | {
        "prompts_skipped": sum(b.skipped for b in batches),
        "explore_rate": explore_rate,
        "prompts_explored": explored,  # predicted silent, sampled by the rule's draw
        "prompts_forced": sum(sum(b.forced) for b in batches),  # predicted silent, taken without the rule (the fallback)
        "prompts_explored_silent": hits,  # of those explored, the ones that came back silent
        "prompts_forced_silent": silent_among("forced"),  # of those forced, the ones that came back silent
        "explored_silent_share": hits / explored if explored else math.nan,  # the prediction's precision
    }


def repeats_warning(pool: int, cfg) -> str | None:
    """The start-up warning of a run (``cfg``: its :class:`podsrl.config.Config`) whose step can sample
    more prompts than its ``pool`` training prompts, so samples some twice; None when no step can."""
    B, dynamic, cap = cfg.train.prompts_per_step, cfg.rollout.dynamic_sampling, cfg.rollout.max_gen_batches
    most = B * cap if dynamic else B
    if pool >= most:
        return None
    settings = f"train.prompts_per_step = {B}" + (f" x rollout.max_gen_batches = {cap}" if dynamic else "")
    return (f"the training set has {pool} prompts, fewer than the {most} a step {'may sample' if dynamic else 'samples'} ({settings}): "
            f"a step that samples more than {pool} samples some prompts twice (each once before any twice)")
