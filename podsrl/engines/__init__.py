"""Rollout engines: prompts in, sampled completions (token ids, texts, log-probs) out.

An engine has one job, ``generate``, and one duty after every optimizer step, ``sync_weights``: the
next rollouts must come from the current policy. Engines are chosen by name from ``ENGINES``; each
entry is a factory ``(RolloutConfig, Policy) -> Engine`` that imports its backend lazily, so a
missing optional backend fails only when it is asked for. ``"auto"`` (the default) picks vLLM when
it is installed; without it, on a GPU the transformers engine with a sampler of its own
(``"transformers-static"``: static KV cache, compiled decoding, log-probs), and on a CPU the
transformers engine that samples with the policy itself (``"transformers"``): there the other is no
faster (docs/engines.md) and costs a second copy of the weights.

Order convention: for B prompts and n samples each, completion ``b * n + j`` is sample j of prompt b
(group-major), which is what ``rewards.view(B, n)`` assumes everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from podsrl.engines.base import Engine, Rollouts, Sampling

__all__ = ["ENGINES", "ENGINE_CHOICES", "Engine", "EngineChoice", "Rollouts", "Sampling", "choose_engine", "make_engine", "resolve_engine"]


def _transformers(cfg, policy) -> Engine:
    from podsrl.engines.dtype import NOT_NAMED
    from podsrl.engines.hf import TransformersEngine
    from podsrl.errors import ConfigError

    # "fast" asks for the faster of the sampler's dtypes where there is a choice; this engine has none
    # (it samples with the policy itself), so it changes nothing here, as "auto". A dtype named
    # outright is refused: the run would not sample in it.
    if getattr(cfg, "sampler_dtype", "auto") not in NOT_NAMED:
        raise ConfigError(
            f"rollout.sampler_dtype = {cfg.sampler_dtype!r}: the transformers engine samples with the policy's own "
            "weights (model.dtype); set rollout.engine = 'transformers-static' (or 'vllm') for a sampler of its own dtype, or leave "
            "rollout.sampler_dtype = 'auto' (or 'fast', which changes nothing with this engine)"
        )

    return TransformersEngine(policy.model, policy.tokenizer, batch_size=cfg.generation_batch_size)


def _transformers_static(cfg, policy) -> Engine:
    from podsrl.engines.static import StaticCacheEngine

    return StaticCacheEngine.from_config(cfg, policy)


def _vllm(cfg, policy) -> Engine:
    from podsrl.engines.vllm import VLLMEngine

    return VLLMEngine.from_config(cfg, policy)


ENGINES: dict[str, Callable[..., Engine]] = {
    "transformers": _transformers,
    "transformers-static": _transformers_static,
    "vllm": _vllm,
}
ENGINE_CHOICES = ("auto", *ENGINES)


class EngineChoice(NamedTuple):
    """The engine ``rollout.engine`` resolved to (a name in ENGINES), and why (for the start-up line)."""

    name: str
    reason: str


def choose_engine(name: str, on_gpu: bool | None = None) -> EngineChoice:
    """The engine ``rollout.engine = name`` runs, and why. ``"auto"``: vLLM when it is installed
    (the fastest sampler, bench/engines.py); else, where the policy is on a GPU (``on_gpu``; None:
    ``torch.cuda.is_available()``), ``"transformers-static"`` (a step's rollouts in few compiled
    calls; a decode step there is overhead, nearly flat in the batch); else ``"transformers"``."""
    if name != "auto":
        return EngineChoice(name, "as set")
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return EngineChoice("vllm", "vLLM is installed")
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    if on_gpu:
        return EngineChoice("transformers-static", "no vLLM; on a GPU, a sampler of its own with compiled decoding")
    return EngineChoice("transformers", "no vLLM, no GPU; on a CPU the policy samples as fast itself")


def resolve_engine(name: str, on_gpu: bool | None = None) -> str:
    """The name of :func:`choose_engine`'s engine."""
    return choose_engine(name, on_gpu).name


def make_engine(cfg, policy) -> Engine:
    """``cfg``: :class:`podsrl.config.RolloutConfig`; ``policy``: :class:`podsrl.models.Policy`."""
    return ENGINES[resolve_engine(cfg.engine, _on_gpu(policy.model))](cfg, policy)


def _on_gpu(model) -> bool:
    return next(model.parameters()).device.type == "cuda"
