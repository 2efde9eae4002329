"""The training prompts a run samples, in shuffled epochs, with optional prompt selection.

**Epochs.** The run reads its P training prompts as TRL's sampler and verl's dataloader do: epoch e
is a permutation of all P, seeded by (train.seed, e) (:data:`podsrl.core.seeds.Stream.PROMPTS`;
``prompts.shuffle = false``: the task's order every epoch), and every generation batch takes the
next B prompts of the stream, across an epoch's end when it comes (a pool smaller than B repeats
prompts within a batch). Each prompt comes once an epoch; dynamic sampling's further batches take
the next prompts of the same stream. The stream's position is a few numbers in the checkpoint
(:meth:`PromptStream.state_dict`), so a resumed run continues exactly; under torchrun every rank
reads the same stream and takes its block of each batch (:meth:`podsrl.train.distributed.Dist.shard`).

Before (podsrl up to issue 44), each generation batch drew B prompts with a generator seeded by
(seed, step, batch), independently of the others: a prompt could come twice in one step and some
never came. A run's prompt order, and so its figures, differ from then (docs/run-directory.md).

**Prompt selection** (``prompts.skip_silent``; :mod:`podsrl.core.prompt_selection`): each prompt's
count of consecutive silent visits is kept (one byte a prompt, in the checkpoint), and a candidate
predicted silent is skipped with a probability that the exploration rate sets, before any rollout
is sampled for it: the batch takes the next candidates in its place. A skipped prompt has had its
turn of the epoch. A batch examines at most one epoch's worth of candidates (P) for skipping; if
that does not fill it, the next candidates are taken without skipping, so a step never stalls
when nearly every prompt is predicted silent. The outcomes recorded are the ones the step's
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

__all__ = ["PromptBatch", "PromptStream"]


@dataclass
class PromptBatch:
    """One generation batch's prompts, decided before sampling (the same on every rank)."""

    prompts: list[int]  # [B] indices into task.train, in stream order
    skipped: int  # candidates passed over (predicted silent) to find them
    explored: list[bool]  # [B] True where the prompt was predicted silent (a silent streak) and sampled anyway


class PromptStream:
    """P training prompts in epochs (module docstring). ``skip_silent``: prompt selection, with
    ``cfg`` the run's :class:`podsrl.config.PromptsConfig`."""

    def __init__(self, pool: int, seed: int, cfg):
        if pool < 1:
            raise ValueError("the task has no training prompts")
        self.pool, self.seed, self.cfg = pool, seed, cfg
        self.epoch = 0  # the epoch of the next candidate
        self.position = 0  # candidates of that epoch already taken (sampled or skipped)
        self.explore = cfg.explore
        self.streak = torch.zeros(pool, dtype=torch.uint8) if cfg.skip_silent else None  # [P] consecutive silent visits
        self._cache: tuple[int, Tensor, Tensor | None] | None = None  # (epoch, order [P], uniforms [P])

    # ------------------------------------------------------------------ reading the stream

    @property
    def epochs(self) -> float:
        """Passes over the training prompts so far (1.5: one and a half), as HF Trainer counts them."""
        return self.epoch + self.position / self.pool

    def take(self, B: int) -> PromptBatch:
        """The next B prompts to sample; with prompt selection, skipping the ones it predicts silent."""
        prompts: list[int] = []
        explored: list[bool] = []
        skipped = examined = 0
        while len(prompts) < B:
            order, uniform = self._epoch()
            chunk = order[self.position :]  # [C] this epoch's remaining candidates
            if self.streak is None or examined >= self.pool:  # no selection, or one epoch's worth examined
                take = chunk[: B - len(prompts)]
                prompts += take.tolist()
                explored += [False] * len(take) if self.streak is None else (self.streak[take] > 0).tolist()
                self._advance(len(take))
                continue
            chunk = chunk[: self.pool - examined]  # examine no more than P candidates in all
            streak = self.streak[chunk]  # [C]
            skip = ps.skip_mask(streak, uniform[self.position : self.position + len(chunk)], self.explore, self.cfg.min_sample_probability)
            kept = (~skip).nonzero().flatten()[: B - len(prompts)]  # positions in chunk of the next to sample
            used = int(kept[-1]) + 1 if len(kept) == B - len(prompts) else len(chunk)  # candidates consumed
            prompts += chunk[kept].tolist()
            explored += (streak[kept] > 0).tolist()
            skipped += used - len(kept)
            examined += used
            self._advance(used)
        return PromptBatch(prompts=prompts, skipped=skipped, explored=explored)

    def _epoch(self) -> tuple[Tensor, Tensor | None]:
        """The current epoch's permutation [P] and, with selection, its candidates' uniforms [P]."""
        if self._cache is None or self._cache[0] != self.epoch:
            if self.cfg.shuffle:
                order = torch.randperm(self.pool, generator=generator(self.seed, self.epoch, Stream.PROMPTS))
            else:
                order = torch.arange(self.pool)
            uniform = None
            if self.streak is not None:
                uniform = torch.rand(self.pool, generator=generator(self.seed, self.epoch, Stream.PROMPT_SKIP), dtype=torch.float64)
            self._cache = (self.epoch, order, uniform)
        return self._cache[1], self._cache[2]

    def _advance(self, count: int) -> None:
        self.position += count
        if self.position >= self.pool:
            self.epoch, self.position = self.epoch + 1, 0

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
        if self.streak is None or sampled == 0 or self.epoch == 0:
            return
        c = self.cfg
        self.explore = ps.next_explore_rate(self.explore, silent / sampled, target=c.target_silent, step=c.explore_step,
                                            low=c.explore_min, high=c.explore_max)  # fmt: skip

    # ------------------------------------------------------------------ the checkpoint

    def state_dict(self) -> dict:
        """Plain values and a tensor, for the checkpoint's ``state.pt`` (read with weights_only)."""
        state = {"epoch": self.epoch, "position": self.position, "pool": self.pool}
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
        if self.streak is None:
            return None
        if "streak" not in state:
            return "prompt selection is new to this run: its history starts empty"
        self.explore, self.streak = float(state["explore"]), state["streak"].to(torch.uint8).clone()
        return None

    def metrics(self, batches: list[PromptBatch]) -> dict:
        """The step's prompt-stream metrics (after its batches were taken)."""
        out: dict = {"epoch": round(self.epochs, 4)}
        if self.streak is not None:
            explored = sum(sum(b.explored) for b in batches)
            out |= {"prompts_skipped": sum(b.skipped for b in batches), "explore_rate": self.explore, "prompts_explored": explored}
        return out


def explored_silent(batches: list[PromptBatch], silent: list[Tensor]) -> tuple[int, float]:
    """Of the prompts sampled although predicted silent, how many came back silent, and the share
    (NaN when none was): the prediction's precision. ``silent`` [G] bool per batch, in prompt order."""
    hits = sum(int(s[torch.tensor(b.explored, dtype=torch.bool)].sum()) for b, s in zip(batches, silent) if len(b.explored))
    explored = sum(sum(b.explored) for b in batches)
    return hits, (hits / explored if explored else math.nan)
