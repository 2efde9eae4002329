"""The engine types: what ``generate`` is asked (`Sampling`) and returns (`Rollouts`), and the
`Engine` protocol. A leaf: the engines and the trainer import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = ["Engine", "Rollouts", "Sampling"]


@dataclass(frozen=True)
class Sampling:
    n: int  # completions per prompt
    temperature: float  # 0: greedy
    top_p: float
    max_new_tokens: int
    seed: int | None = None


@dataclass
class Rollouts:
    prompt_ids: list[list[int]]  # [B] prompt token ids (no padding)
    completion_ids: list[list[int]]  # [B*n] sampled ids, group-major; ends with EOS unless truncated
    texts: list[str]  # [B*n] decoded completions, special tokens removed
    truncated: list[bool]  # [B*n] True when max_new_tokens was reached before EOS
    logprobs: list[list[float]] | None = None  # [B*n] sampling log-prob of each completion token

    @property
    def n(self) -> int:
        return len(self.completion_ids) // max(1, len(self.prompt_ids))


class Engine(Protocol):
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollouts: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...

    def close(self) -> None: ...
