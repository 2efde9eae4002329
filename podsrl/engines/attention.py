"""Grouped-query attention that reads the KV cache as it is, for sampling on a CPU (issue 66).

Why: most small instruct models share each key/value head among several query heads (SmolLM2-135M: 9
query heads, 3 key/value heads; Qwen2.5: 14 and 2). transformers' ``sdpa`` attention asks PyTorch to
do the sharing (``enable_gqa``) only where no attention mask is passed
(``transformers.integrations.sdpa_attention.use_gqa_in_sdpa``: on CUDA a mask with ``enable_gqa`` falls
back to the slow math kernel). Otherwise it first copies every key/value head to each of its query
heads (``repeat_kv``). A sampling call has a mask whenever its prompts differ in length (they are
left-padded), so each decode step copied every layer's whole KV cache, three times over for
SmolLM2 (``aten::clone`` of [R, 9, L, 64] per layer), a cost that grows with the completion: reading
the heads in place makes the transformers engine 1.37x faster at 128 rollouts x 64 tokens and 2.33x
at 64 x 256 on a 2-core EPYC (bench/hf_engine.py, docs/engines.md). On a CPU, PyTorch's flash
attention kernel (``_scaled_dot_product_flash_attention_for_cpu``) takes the mask and the shared
heads together, so nothing needs copying.

What: :func:`sdpa_gqa_forward` is transformers' ``sdpa`` attention with ``enable_gqa`` whatever the mask,
registered under :data:`NAME` through transformers' public extension points (``AttentionInterface``,
``AttentionMaskInterface``, the latter with transformers' own ``sdpa_mask``). :func:`shared_kv_heads`
switches a model to it for the length of a ``with`` block and back, where it applies
(:func:`applies`): a model on a CPU whose configuration uses ``sdpa`` and has no sub-configurations
(a plain causal LM, not a composite one), on torch >= 2.5 (``enable_gqa``). Elsewhere it changes
nothing. The arithmetic is the same kernel's on the same numbers; tests/test_attention.py checks
logits and sampled tokens against ``sdpa``.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["NAME", "applies", "register", "sdpa_gqa_forward", "shared_kv_heads"]

NAME = "podsrl_sdpa_gqa"


def sdpa_gqa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention-function signature. query [B, H, T, D]; key, value [B, G, S, D] with G
    dividing H; attention_mask [B, 1, T, S] (boolean or additive) or None. Returns ([B, T, H, D], None),
    as ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` does, whose ``is_causal``
    rule this follows (causal only for more than one query and no mask)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def register() -> bool:
    """Register :data:`NAME` with transformers (idempotent). False where this transformers or torch lacks
    what it needs (``AttentionMaskInterface``: transformers >= 4.53; ``enable_gqa``: torch >= 2.5)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 5):
        return False
    AttentionInterface.register(NAME, sdpa_gqa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return True


def applies(model: torch.nn.Module) -> bool:
    """Whether :func:`shared_kv_heads` switches ``model``: on a CPU, ``sdpa`` attention, no sub-configs,
    and fewer key/value heads than query heads (with as many, ``sdpa`` copies nothing)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "sub_configs", None):
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads or kv_heads >= heads:
        return False
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return False
    return device.type == "cpu" and register()


@contextlib.contextmanager
def shared_kv_heads(model: torch.nn.Module):
    """Within the block, ``model`` (a transformers model, or a peft model around one) attends with
    :func:`sdpa_gqa_forward` where :func:`applies`; its configured attention is restored on leaving,
    also on an error."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not applies(base):
        yield
        return
    base.config._attn_implementation = NAME
    try:
        yield
    finally:
        base.config._attn_implementation = "sdpa"
