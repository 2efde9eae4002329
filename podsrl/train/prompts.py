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
predicted silent is skipped with a probability that the exploration rate sets, before any rollout
is sampled for it: the batch takes the next candidates in its place. A skipped prompt has had its
turn of the epoch. A batch examines at most one epoch's worth of candidates (P) for skipping; if
that does not fill it, the next candidates are taken without skipping, so a step never stalls
when nearly every prompt is predicted silent. A prompt predicted silent that the rule's draw
sampled is *explored*; one taken so, without the rule, is *forced* (``prompts_forced``), so that
``prompts_explored`` and the prediction's precision (:func:`explored_silent`) count the rule's
choices alone. The outcomes recorded are the ones the step's
selection decided (:func:`podsrl.core.downsample.group_signal`), for every group sampled: with
dynamic sampling, the silent groups and the surplus too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from podsrl.core import prompt_selection as ps
from podsrl.core.seeds import Stream, generator

__all__ = ["PromptBatch", "PromptStream", "repeats_warning"]


@dataclass
class PromptBatch:
    """One generation batch's prompts, decided before sampling (the same on every rank)."""

    prompts: list[int]  # [B] indices into task.train, in stream order
    skipped: int  # candidates passed over (predicted silent) to find them
    explored: list[bool]  # [B] True where the prompt was predicted silent (a silent streak) and the rule's draw sampled it anyway
    forced: int  # prompts predicted silent taken without the rule, the batch having examined an epoch's worth (module docstring)


class PromptStream:
    """P training prompts in epochs (module docstring). ``skip_silent``: prompt selection, with
    ``cfg`` the run's :class:`podsrl.config.PromptsConfig`."""

    def __init__(self, pool: int, seed: int, cfg):
        if pool < 1:
            raise ValueError("the task has no training prompts")
        self.pool, self.seed, self.cfg = pool, seed, cfg
        self.epoch = 0  # the epoch being read
        self.position = 0  # candidates of that epoch already taken (sampled, skipped or passed over); P: the epoch is done
        self.explore = cfg.explore
        self.streak = torch.zeros(pool, dtype=torch.uint8) if cfg.skip_silent else None  # [P] consecutive silent visits
        self._back: list[int] = []  # prompts moved to the end of the current epoch's order: the step that began it had sampled them
        self._step: int | None = None  # the training step taking prompts
        self._held: set[int] = set()  # the prompts that step has sampled (since it last held every prompt)
        self._step_start = 0.0  # passes over the prompts when that step began taking them (:meth:`metrics`)
        self._cache: tuple[int, Tensor, Tensor | None] | None = None  # (epoch, order [P], uniforms [P])

    # ------------------------------------------------------------------ reading the stream

    @property
    def epochs(self) -> float:
        """Passes over the training prompts so far (1.5: one and a half), as HF Trainer counts them."""
        return self.epoch + self.position / self.pool

    def take(self, B: int, step: int) -> PromptBatch:
        """The next B prompts to sample for training step ``step`` (a step may take several batches:
        dynamic sampling); with prompt selection, skipping the ones it predicts silent. None is one
        the step already sampled, until it has sampled every prompt (module docstring)."""
        if step != self._step:
            self._step, self._held, self._step_start = step, set(), self.epochs
        prompts: list[int] = []
        explored: list[bool] = []
        skipped = examined = forced = 0
        while len(prompts) < B:
            if self.position == self.pool:  # a new epoch, begun when its first candidate is needed
                self.epoch, self.position, self._back = self.epoch + 1, 0, sorted(self._held)
            order, uniform = self._epoch()
            candidates = order[self.position :]  # [C] this epoch's remaining candidates
            selecting = self.streak is not None and examined < self.pool  # else: none, or one epoch's worth examined
            if selecting:
                candidates = candidates[: self.pool - examined]  # examine no more than P candidates in all
                skip = ps.skip_mask(self.streak[candidates], uniform[self.position : self.position + len(candidates)], self.explore,
                                    self.cfg.min_sample_probability).tolist()  # fmt: skip
            used = 0  # candidates consumed (sampled, skipped, or passed over as already sampled this step)
            for i, p in enumerate(candidates.tolist()):
                used += 1
                if p in self._held:
                    continue
                if selecting and skip[i]:
                    skipped += 1
                    continue
                silent = self.streak is not None and int(self.streak[p]) > 0  # predicted silent
                prompts.append(p)
                explored.append(silent and selecting)
                forced += silent and not selecting
                self._hold(p)
                if len(prompts) == B:
                    break
            examined += used
            self.position += used
        return PromptBatch(prompts=prompts, skipped=skipped, explored=explored, forced=forced)

    def _hold(self, prompt: int) -> None:
        """``prompt`` is sampled this step; once the step holds every prompt, it starts again."""
        self._held.add(prompt)
        if len(self._held) == self.pool:
            self._held = set()

    def _epoch(self) -> tuple[Tensor, Tensor | None]:
        """The current epoch's order [P] (its permutation, with :attr:`_back` moved to its end) and,
        with selection, its candidates' uniforms [P]."""
        if self._cache is None or self._cache[0] != self.epoch:
            if self.cfg.shuffle:
                order = torch.randperm(self.pool, generator=generator(self.seed, self.epoch, Stream.PROMPTS))
            else:
                order = torch.arange(self.pool)
            if self._back:
                moved = torch.zeros(self.pool, dtype=torch.bool)
                moved[self._back] = True
                order = torch.cat([order[~moved[order]], order[moved[order]]])
            uniform = None
            if self.streak is not None:
                uniform = torch.rand(self.pool, generator=generator(self.seed, self.epoch, Stream.PROMPT_SKIP), dtype=torch.float64)
            self._cache = (self.epoch, order, uniform)
        return self._cache[1], self._cache[2]

    # ------------------------------------------------------------------ what was seen

    def record(self, prompts: Tensor, silent: Tensor) -> None:
        """The outcomes of a sampled batch's groups: prompts [G] indices, silent [G] bool (every
        rank passes the gathered batch, so every rank's history stays the same)."""
        if self.streak is not None and len(prompts):
            self.streak = ps.record_outcomes(self.streak, prompts, silent)

    def end_step(self, sampled: int, silent: int) -> None:
        """After a step whose sampled groups were ``silent`` of ``sampled`` silent: the exploration
        rate moves toward ``prompts.target_silent``, once prompts have come back (module docstring
        of :mod:`podsrl.core.prompt_selection`)."""
        if self.streak is None or sampled == 0 or self.epochs < 1:
            return
        c = self.cfg
        self.explore = ps.next_explore_rate(self.explore, silent / sampled, target=c.target_silent, step=c.explore_step,
                                            low=c.explore_min, high=c.explore_max)  # fmt: skip

    # ------------------------------------------------------------------ the checkpoint

    def state_dict(self) -> dict:
        """Plain values and a tensor, for the checkpoint's ``state.pt`` (read with weights_only)."""
        state = {"epoch": self.epoch, "position": self.position, "pool": self.pool, "back": list(self._back)}
        if self.streak is not None:
            state |= {"explore": self.explore, "streak": self.streak.clone()}
        return state

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
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._back, self._cache = [int(p) for p in state.get("back", [])], None  # no "back": written before issue 57, a plain permutation
        if self.streak is None:
            return None
        if "streak" not in state:
            return "prompt selection is new to this run: its history starts empty"
        self.explore, self.streak = float(state["explore"]), state["streak"].to(torch.uint8).clone()
        return None

    def metrics(self, batches: list[PromptBatch]) -> dict:
        """The step's prompt-stream metrics (after its batches were taken): ``epoch`` is the passes
        over the prompts when the step began taking them, so its whole part is the epoch its first
        candidate came from (a step that runs into epoch 1 is logged from epoch 0)."""
        out: dict = {"epoch": round(self._step_start, 4)}
        if self.streak is not None:
            explored = sum(sum(b.explored) for b in batches)
            out |= {"prompts_skipped": sum(b.skipped for b in batches), "explore_rate": self.explore, "prompts_explored": explored,
                    "prompts_forced": sum(b.forced for b in batches)}  # fmt: skip
        return out


def explored_silent(batches: list[PromptBatch], silent: list[Tensor]) -> tuple[int, float]:
    """Of the prompts sampled although predicted silent, how many came back silent, and the share
    (NaN when none was): the prediction's precision. ``silent`` [G] bool per batch, in prompt order."""
    hits = sum(int(s[torch.tensor(b.explored, dtype=torch.bool)].sum()) for b, s in zip(batches, silent) if len(b.explored))
    explored = sum(sum(b.explored) for b in batches)
    return hits, (hits / explored if explored else math.nan)


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
