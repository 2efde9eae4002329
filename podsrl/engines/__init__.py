"""Rollout engines: prompts in, sampled completions (token ids, texts, log-probs) out.

An engine has one job, ``generate``, and one duty after every optimizer step, ``sync_weights``: the
next rollouts must come from the current policy. Engines are chosen by name from ``ENGINES``; each
entry is a factory ``(RolloutConfig, Policy) -> Engine`` that imports its backend lazily, so a
missing optional backend fails only when it is asked for. ``"auto"`` (the default) picks vLLM when
it is installed and transformers otherwise.

Order convention: for B prompts and n samples each, completion ``b * n + j`` is sample j of prompt b
(group-major), which is what ``rewards.view(B, n)`` assumes everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch


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


def _transformers(cfg, policy) -> Engine:
    from podsrl.engines.hf import TransformersEngine

    return TransformersEngine(policy.model, policy.tokenizer, batch_size=cfg.generation_batch_size)


def _vllm(cfg, policy) -> Engine:
    from podsrl.engines.vllm import VLLMEngine

    return VLLMEngine.from_config(cfg, policy)


ENGINES: dict[str, Callable[..., Engine]] = {"transformers": _transformers, "vllm": _vllm}
ENGINE_CHOICES = ("auto", *ENGINES)


def resolve_engine(name: str) -> str:
    """The engine ``rollout.engine`` names; ``"auto"`` is vLLM when it is installed (faster to
    sample from, see bench/engines.py), else transformers."""
    if name != "auto":
        return name
    import importlib.util

    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


def make_engine(cfg, policy) -> Engine:
    """``cfg``: :class:`podsrl.config.RolloutConfig`; ``policy``: :class:`podsrl.models.Policy`."""
    return ENGINES[resolve_engine(cfg.engine)](cfg, policy)
