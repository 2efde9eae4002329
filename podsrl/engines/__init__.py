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

from podsrl.engines.base import Engine, Rollouts, Sampling

__all__ = ["ENGINES", "ENGINE_CHOICES", "Engine", "Rollouts", "Sampling", "make_engine", "resolve_engine"]


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
            "weights (model.dtype); set rollout.engine = 'vllm' for a sampler of its own dtype, or leave "
            "rollout.sampler_dtype = 'auto' (or 'fast', which changes nothing with this engine)"
        )

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
