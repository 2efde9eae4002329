"""Every random stream of a run, in one registry: which prompts, which are skipped, how rollouts are
sampled, which are kept, dropout.

A draw is seeded by (run seed, index, stream) (:func:`step_seed`): the index is the training step for
the streams of a step, the epoch for the prompt stream's (:mod:`podsrl.train.prompts`). A resumed
run therefore draws what an uninterrupted one would, given what its checkpoint holds, and every
process of a multi-process run draws the same numbers without communicating. A new stream gets the
next number here, so no two can collide.

Within a step, generation batch j (dynamic sampling) and sampling round r (exact early stopping)
offset a stream by j x :data:`BATCH_OFFSET` and r x :data:`ROUND_OFFSET`, and the sampling stream by
100 x rank: far enough apart that no two (stream, batch, round, rank) give the same number.
"""

from __future__ import annotations

from enum import IntEnum

import torch

__all__ = ["Stream", "step_seed", "generator", "BATCH_OFFSET", "ROUND_OFFSET", "RANK_OFFSET"]


class Stream(IntEnum):
    """The random streams (their numbers are part of every run's reproducibility: never renumber)."""

    PROMPTS = 0  # the permutation of the training prompts of an epoch (index: the epoch)
    SELECTION = 1  # the selection rule's tie-breaks and random subsets (podsrl.core.downsample)
    TORCH = 2  # torch's global generator during a step: dropout, transformers' sampling
    SAMPLING = 3  # the engine's sampling seed, per rank, round and generation batch
    SIGNAL = 4  # retired: dynamic sampling's own draw for its signal test (it now reads the selection)
    PROMPT_SKIP = 5  # prompt selection: whether a prompt predicted silent is skipped (index: the epoch)


BATCH_OFFSET = 1_000_000_000  # between a step's generation batches (above every round's)
ROUND_OFFSET = 1_000_000  # between sampling rounds (above every rank's)
RANK_OFFSET = 100  # between ranks, in the sampling stream


def step_seed(seed: int, step: int, stream: int) -> int:
    """A 31-bit seed for one (run seed, index, stream): every random number of a run comes from one
    of these (the index is the step, or the epoch for the prompt streams)."""
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**31 - 1)


def generator(seed: int, step: int, stream: int) -> torch.Generator:
    """A CPU generator seeded by :func:`step_seed`."""
    return torch.Generator().manual_seed(step_seed(seed, step, stream))
