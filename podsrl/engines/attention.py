"""Grouped-query attention that reads the KV cache as it is, for sampling on a CPU (issue 66), and
for the update's forward there (podsrl.train.sequences: no copies saved for the backward).

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

**Float32 attention under the update's mixed precision on a CPU.** Under bfloat16 autocast
(``model.mixed_precision``, podsrl.train.precision) PyTorch runs ``scaled_dot_product_attention``
in bfloat16, and on a CPU the flash kernel's backward in bfloat16 is several times slower than in
float32 at the update's lengths (with or without ``enable_gqa`` and a mask; its forward is faster):
in a profile of one mixed-precision update of the embedded model (24 rows of 14-token completions
behind 40-token prompts: results/mixed-precision/profile-update-cpu-intel-xeon-2026-12-01.txt), the
bfloat16 attention backward alone took about a fifth of the update.
So :func:`sdpa_gqa_forward` computes the attention in float32 there (:func:`float32_under_autocast`:
autocast off around the call, the inputs cast up, a float32 output for the next product to cast down),
in every pass of the update alike (scoring, measuring and gradient forwards read the same numbers);
the update's forward switches to it on a CPU also for models with as many key/value heads as query
heads (:func:`applies` ``autocast``). The update with and without it, side by side:
``python bench/mixed_precision.py --attention-bf16`` (docs/results.md, "Mixed precision: what it costs
and changes"). Not covered: gradient checkpointing (not switched, below) and a bfloat16 base model
trained without autocast (LoRA over ``model.dtype = "bfloat16"``), whose attention stays in bfloat16.
On a GPU nothing changes (bfloat16 flash attention is the fast path there).

On CUDA the engines still copy the heads wherever a mask is passed (the static engine's calls always
pass one). Timed alone on a lent H200 (torch 2.11, bfloat16, Qwen2.5-0.5B's heads, a decode step at 128
and 512 rollouts over 552 positions; bench/peak.py's GPU mode, results/peak/nvidia-h200-2026-11-30.json),
``enable_gqa`` with the mask took 1/8.7 and 1/24 of the copy's time and gave the same output to the
bit, the grouped queries (:func:`grouped_queries_forward`, registered as :data:`GROUPED`) 1/4.7 and
1/12: transformers' reason to copy on CUDA (the math kernel) did not show there. The engines switch
where :data:`DEVICES` says; CUDA joins it once a whole sampler has run both ways on a GPU
(bench/peak.py's GPU mode samples with ``transformers-static`` and ``transformers-static-gqa``, the
latter with CUDA added here: compiled decoding with CUDA graphs is another path than the timed kernel).
"""

from __future__ import annotations

import contextlib
import functools

import torch

__all__ = ["DEVICES", "FLOAT32_UNDER_CPU_AUTOCAST", "GROUPED", "NAME", "applies", "float32_under_autocast", "grouped_queries_forward", "register",
           "sdpa_gqa_forward", "shared_kv_heads"]  # fmt: skip

NAME = "podsrl_sdpa_gqa"
GROUPED = "podsrl_sdpa_grouped_queries"  # grouped_queries_forward, registered beside NAME (not switched on by the engines)
DEVICES = frozenset({"cpu"})  # device types where shared_kv_heads switches a model (CUDA: measured, not yet switched; the module docstring)
FLOAT32_UNDER_CPU_AUTOCAST = True  # the attention in float32 under bfloat16 autocast on a CPU (float32_under_autocast); a benchmark's switch


def sdpa_gqa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention-function signature. query [B, H, T, D]; key, value [B, G, S, D] with G
    dividing H; attention_mask [B, 1, T, S] (boolean or additive) or None. Returns ([B, T, H, D], None),
    as ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` does, whose ``is_causal``
    rule this follows (causal only for more than one query and no mask)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    attend = functools.partial(torch.nn.functional.scaled_dot_product_attention, dropout_p=dropout, scale=scaling, is_causal=is_causal,
                               enable_gqa=query.shape[1] != key.shape[1])  # fmt: skip
    if float32_under_autocast(query):
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        with torch.autocast("cpu", enabled=False):
            out = attend(query.float(), key.float(), value.float(), attn_mask=attention_mask)
    else:
        out = attend(query, key, value, attn_mask=attention_mask)
    return out.transpose(1, 2).contiguous(), None


def float32_under_autocast(query: torch.Tensor) -> bool:
    """Whether :func:`sdpa_gqa_forward` computes the attention in float32: on a CPU under bfloat16
    autocast (the update's mixed precision, podsrl.train.precision), where PyTorch's flash attention
    kernel is slower in bfloat16 than in float32 once its backward counts (the module docstring);
    :data:`FLOAT32_UNDER_CPU_AUTOCAST` off: never (bench/mixed_precision.py times both)."""
    return FLOAT32_UNDER_CPU_AUTOCAST and query.device.type == "cpu" and torch.is_autocast_enabled("cpu")


def grouped_queries_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """The same attention as :func:`sdpa_gqa_forward` with no ``enable_gqa`` and no copy of the KV cache:
    the r = H / G query heads that share a key/value head are passed as that head's query positions.

    query [B, H, T, D] -> [B, G, r*T, D] (query head g*r + i is row i*T + t of head g, as ``repeat_kv``
    pairs them); the mask [B, 1, T, S] is repeated r times along its query rows -> [B, 1, r*T, S] (a
    copy of the mask, not of the cache: B*r*T*S elements against the cache's B*H*S*D); with no mask and
    more than one query (a causal prefill) the causal mask is built here, since the stacked rows are no
    longer one causal square. A kernel for a plain mask with no grouping runs (on CUDA the
    memory-efficient one; transformers says ``enable_gqa`` with a mask falls back to the math kernel
    there, which a lent H200 did not show: the module docstring). Returns
    ([B, T, H, D], None). Not used by the engines: bench/attention.py measures it against the
    alternatives, and on a CPU and a GPU alike ``enable_gqa`` was faster (the module docstring)."""
    batch, heads, queries, dim = query.shape
    groups = key.shape[1]
    rep = heads // groups
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and is_causal and queries > 1:
        positions = key.shape[2]
        attention_mask = torch.ones(queries, positions, dtype=torch.bool, device=query.device).tril(positions - queries)[None, None]
    if attention_mask is not None:
        attention_mask = attention_mask.expand(batch, 1, queries, attention_mask.shape[-1]).repeat(1, 1, rep, 1)
    stacked = query.reshape(batch, groups, rep * queries, dim)
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, queries, dim).transpose(1, 2).contiguous(), None


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
    AttentionInterface.register(GROUPED, grouped_queries_forward)
    AttentionMaskInterface.register(GROUPED, sdpa_mask)
    return True


def applies(model: torch.nn.Module, *, autocast: bool = False) -> bool:
    """Whether :func:`shared_kv_heads` switches ``model``: on a device type in :data:`DEVICES` (a CPU),
    ``sdpa`` attention, no sub-configs, and fewer key/value heads than query heads (with as many,
    ``sdpa`` copies nothing), or, with ``autocast`` (a forward under the update's bfloat16 autocast),
    as many: the switch then buys the attention in float32 (:func:`float32_under_autocast`)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "sub_configs", None):
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads or (kv_heads >= heads and not autocast):
        return False
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return False
    return device.type in DEVICES and register()


@contextlib.contextmanager
def shared_kv_heads(model: torch.nn.Module, *, autocast: bool = False):
    """Within the block, ``model`` (a transformers model, or a peft model around one) attends with
    :func:`sdpa_gqa_forward` where :func:`applies` (``autocast``: its argument); its configured
    attention is restored on leaving, also on an error."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not applies(base, autocast=autocast):
        yield
        return
    base.config._attn_implementation = NAME
    try:
        yield
    finally:
        base.config._attn_implementation = "sdpa"
