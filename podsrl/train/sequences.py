"""Prompt + completion token lists -> padded tensors, and the policy's per-token log-probs on them.

The one place where the model meets the loss: ``forward_logprobs`` runs the causal LM on
[prompt; completion] and returns, for each completion position, log pi(token) (with the sampling
temperature applied to the logits, as the rollouts were drawn with it) and optionally the entropy of
the next-token distribution (D3S token scores, and the logged entropy).

Two things make it cheaper than "logits = model(ids).logits; log_softmax; gather", without changing
what it computes (the tests check log-probs and gradients against that plain computation):

- **Shared prompts.** The rollouts of one group share their prompt. With ``share_prompts`` the
  prompt is run once per distinct prompt (with gradients), its key/value cache is repeated to the
  rows that use it, and only the completions are run on top of it; the gradients of all rows flow
  back into the one prompt pass. With n rollouts per prompt this removes (n - 1) / n of the prompt
  positions' forward and backward work: on the embedded default (prompts of ~36 tokens, at most 16
  completion tokens) most of the update. Used when the model's cache is transformers' plain
  ``DynamicCache`` of full-attention layers and gradient checkpointing is off (transformers drops the
  cache under checkpointing); otherwise, and for batches without a repeated prompt, the plain
  full-sequence forward runs.
- **Fused log-softmax.** Only the logits at completion positions are computed
  (``logits_to_keep``), and :func:`token_logprobs` takes log-softmax, the target's log-prob and the
  entropy in one chunked pass that keeps no [positions, V] intermediate for the backward (which
  recomputes softmax from the saved log-normaliser).
- **Shared key/value heads read in place, on a CPU.** Where several query heads share a key/value
  head and a mask is passed (always here), transformers' ``sdpa`` copies each key/value head out to
  its query heads (``repeat_kv``), and the copies are what attention saves for the backward. Under
  :func:`_attention` PyTorch's kernel reads the shared heads itself (``enable_gqa``,
  :mod:`podsrl.engines.attention`, as the engines sample): the same log-probs, gradients within
  rounding, and less peak memory for the update of 16 rows of 40 + 256 tokens of the embedded model
  (the copies: 0.65 GB; 8.72-9.10 against 9.22-9.80 GiB in bench/host_memory.py's ``copied`` way,
  its time not resolved: docs/results.md). Not under gradient checkpointing, whose recomputation in
  the backward runs after the switch is undone and must save the tensors the forward saved.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from podsrl.core.logits import log_normaliser
from podsrl.engines.attention import shared_kv_heads
from podsrl.train.precision import autocast


@dataclass
class Packed:
    input_ids: Tensor  # [N, P + T] left-padded prompt, then right-padded completion
    attention_mask: Tensor  # [N, P + T]
    completion_mask: Tensor  # [N, T] bool, True on real completion tokens
    completion_ids: Tensor  # [N, T]
    prompt_width: int  # P
    prompt_index: Tensor  # [N] long: row -> its distinct prompt u (first-seen order)
    prompt_rows: Tensor  # [U] long: the first row holding each distinct prompt


def pack(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, *, device: torch.device | str | None = None
) -> Packed:
    """Left-pad prompts to a common width P and right-pad completions to T (each row: one rollout),
    on ``device`` (the model's; None: the CPU)."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"pack: {len(prompt_ids)} prompts for {len(completion_ids)} completions")
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("pack: every rollout needs a non-empty prompt (its first token is predicted from it)")
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    N = len(prompt_ids)
    input_ids = torch.full((N, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((N, P + T), dtype=torch.long)
    distinct: dict[tuple[int, ...], int] = {}  # prompt -> u
    prompt_index = torch.empty(N, dtype=torch.long)
    prompt_rows: list[int] = []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        input_ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attention[i, P - len(p) : P] = 1
        if c:
            input_ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attention[i, P : P + len(c)] = 1
        u = distinct.setdefault(tuple(p), len(distinct))
        if u == len(prompt_rows):  # first row with this prompt
            prompt_rows.append(i)
        prompt_index[i] = u
    input_ids, attention = input_ids.to(device), attention.to(device)
    completion_mask = attention[:, P:].bool()  # [N, T]
    prompt_rows_t = torch.tensor(prompt_rows, device=device)
    return Packed(input_ids, attention, completion_mask, input_ids[:, P:], P, prompt_index.to(device), prompt_rows_t)


def forward_logprobs(
    model: torch.nn.Module,
    packed: Packed,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
    chunk_size: int = 256,
    mixed_precision: bool = False,
    overwrite_logits: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs [N, T] of the completion tokens (differentiable) and entropy [N, T] (detached),
    both float32.

    Padding positions hold 0. Position ids follow the attention mask, so left padding does not shift
    the prompt's positions (matching what `generate` and vLLM saw). ``mixed_precision``: the model's
    calls run under bfloat16 autocast (:func:`podsrl.train.precision.autocast`); the log-softmax
    after them does not. ``overwrite_logits``: see :func:`token_logprobs` (the update's backward runs
    once; a caller that backpropagates twice through one forward, ``retain_graph``, must not set it).
    """
    N, T = packed.completion_ids.shape
    position_ids = (packed.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, P+T]
    targets = packed.completion_ids
    fused = dict(temperature=temperature, with_entropy=with_entropy, chunk_size=chunk_size, overwrite_logits=overwrite_logits)
    if share_prompts and len(packed.prompt_rows) < N and can_share_prompts(model):
        with autocast(model, mixed_precision), _attention(model, mixed_precision):
            first, rest = _shared_prompt_logits(model, packed, position_ids)  # [U, V], [N, T-1, V]
        lp0, ent0 = token_logprobs(first, targets[:, 0], rows=packed.prompt_index, **fused)  # [N]
        pieces = [(lp0[:, None], None if ent0 is None else ent0[:, None])]
        if T > 1:
            lp, ent = token_logprobs(rest.reshape(N * (T - 1), -1), targets[:, 1:].reshape(-1), **fused)
            pieces.append((lp.view(N, T - 1), None if ent is None else ent.view(N, T - 1)))
        logprobs = torch.cat([lp for lp, _ in pieces], dim=1)
        entropy = torch.cat([e for _, e in pieces], dim=1) if with_entropy else None
    else:
        P = packed.prompt_width
        # The logits that predict completion token t sit at position P + t - 1.
        with autocast(model, mixed_precision), _attention(model, mixed_precision):
            logits = model(
                input_ids=packed.input_ids,
                attention_mask=packed.attention_mask,
                position_ids=position_ids,
                logits_to_keep=torch.arange(P - 1, P + T - 1, device=position_ids.device),
            ).logits  # [N, T, V]
        lp, ent = token_logprobs(logits.reshape(N * T, -1), targets.reshape(-1), **fused)
        logprobs, entropy = lp.view(N, T), None if ent is None else ent.view(N, T)
    logprobs = logprobs * packed.completion_mask
    if entropy is not None:
        entropy = entropy * packed.completion_mask
    return logprobs, entropy


def _attention(model: torch.nn.Module, mixed_precision: bool = False) -> contextlib.AbstractContextManager:
    """The model's attention for one forward: shared key/value heads read in place where
    :func:`podsrl.engines.attention.shared_kv_heads` applies (a CPU, ``sdpa``), and under
    ``mixed_precision`` the attention in float32 (:func:`podsrl.engines.attention.float32_under_autocast`),
    except under gradient checkpointing (the module docstring)."""
    if getattr(model, "is_gradient_checkpointing", False):
        return contextlib.nullcontext()
    return shared_kv_heads(model, autocast=mixed_precision)


def can_share_prompts(model: torch.nn.Module) -> bool:
    """Whether the shared-prompt forward is exact for this model: a transformers causal LM whose
    cache is plain full-attention ``DynamicCache`` layers (no sliding window, no recurrent state), and
    no gradient checkpointing (under which transformers turns the cache off)."""
    config = getattr(model, "config", None)
    if config is None or getattr(model, "is_gradient_checkpointing", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return not getattr(config, "is_encoder_decoder", False)


def _shared_prompt_logits(model: torch.nn.Module, packed: Packed, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Logits predicting completion token 0, per distinct prompt [U, V], and tokens 1..T-1 [N, T-1, V]."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    P, rows = packed.prompt_width, packed.prompt_rows
    cache = DynamicCache(config=model.config)
    first = model(
        input_ids=packed.input_ids[rows, :P],
        attention_mask=packed.attention_mask[rows, :P],
        position_ids=position_ids[rows, :P],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]  # [U, V]
    N, T = packed.completion_ids.shape
    if T == 1:
        return first, first.new_empty(N, 0, first.shape[-1])
    if not all(type(layer) is DynamicLayer for layer in cache.layers):  # checked up front; guard anyway
        raise RuntimeError(f"shared prompts: unexpected cache layers {sorted({type(x).__name__ for x in cache.layers})}")
    cache.batch_select_indices(packed.prompt_index)  # [U, ...] -> [N, ...], differentiable
    rest = model(
        input_ids=packed.input_ids[:, P:],
        attention_mask=packed.attention_mask,
        position_ids=position_ids[:, P:],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=torch.arange(T - 1, device=position_ids.device),
    ).logits  # [N, T-1, V]
    return first, rest


def token_logprobs(
    logits: Tensor,
    targets: Tensor,
    *,
    rows: Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 256,
    overwrite_logits: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(logits / temperature)[target] [M] (differentiable, float32) and the entropy [M]
    (detached, float32) of each row's distribution.

    logits [R, V] (any float dtype); targets [M] long; rows [M] long picks the logits row of each
    target (default: row i for target i, M = R), so a row shared by several targets is normalised
    once. Works ``chunk_size`` rows at a time in float32 and saves only the logits and the [R]
    log-normalisers for the backward. ``overwrite_logits``: the backward writes the logits' gradient
    over the logits themselves where :func:`_gradient_in_place` allows (no second [R, V] tensor), so
    the graph cannot be backpropagated through a second time (``retain_graph``: autograd's version
    counter then raises).
    """
    if rows is None:
        if logits.shape[0] != targets.shape[0]:
            raise ValueError(f"token_logprobs: {logits.shape[0]} logit rows for {targets.shape[0]} targets")
        rows = torch.arange(targets.shape[0], device=logits.device)
    lse, entropy = log_normaliser(logits.detach(), temperature=temperature, with_entropy=with_entropy, chunk_size=chunk_size)
    logprobs = _TokenLogProbs.apply(logits, lse, rows, targets, temperature, chunk_size, overwrite_logits and _gradient_in_place(logits))
    return logprobs, None if entropy is None else entropy[rows]


# Autograd nodes that make a view of their input, and nodes whose backward needs their inputs only,
# never their output (a product, a sum, a dtype cast): logits reached from such a producer through
# such views are read by nothing after this function's backward, which may then overwrite them.
_VIEW_NODES = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "AliasBackward0", "SelectBackward0", "SliceBackward0"})
_PRODUCER_NODES = frozenset({"MmBackward0", "AddmmBackward0", "BmmBackward0", "AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "ToCopyBackward0"})


def _gradient_in_place(logits: Tensor) -> bool:
    """Whether the backward may write the logits' gradient into the logits themselves: contiguous,
    and made by a node of :data:`_PRODUCER_NODES` through views only (the output layer's product,
    LoRA's sum, autocast's cast). Not for a leaf (a caller's own tensor) nor anything else."""
    node = logits.grad_fn
    while node is not None and type(node).__name__ in _VIEW_NODES:
        node = node.next_functions[0][0]
    return logits.is_contiguous() and node is not None and type(node).__name__ in _PRODUCER_NODES


class _TokenLogProbs(torch.autograd.Function):
    """logits[rows, targets] / temperature - lse[rows] [M], given lse = logsumexp(logits / temperature).

    Backward: d/dlogits[r] = (onehot(targets) summed over r's targets - softmax(logits[r] / t) * sum of
    r's grads) / t, with the softmax recomputed chunk by chunk from the saved logits and lse, written
    into the logits' own memory when ``in_place`` (no second [R, V] tensor: 805 MB less at the
    backward's start at 16 rows of 256 tokens of a 49k vocabulary, and no fresh pages to fault in).
    Autograd's version counter still catches any later reader of the overwritten logits: it raises
    rather than reads them."""

    @staticmethod
    def forward(ctx, logits: Tensor, lse: Tensor, rows: Tensor, targets: Tensor, temperature: float, chunk_size: int, in_place: bool):
        ctx.save_for_backward(logits, lse, rows, targets)
        ctx.temperature, ctx.chunk_size, ctx.in_place = temperature, chunk_size, in_place
        return logits[rows, targets].float() / temperature - lse[rows]

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, lse, rows, targets = ctx.saved_tensors
        t, c = ctx.temperature, ctx.chunk_size
        grad = grad.float()
        row_grad = torch.zeros_like(lse).index_add_(0, rows, grad)  # [R]
        out = logits if ctx.in_place else torch.empty_like(logits)
        # The softmax is built in place: in out's own rows when they are float32, else in one
        # [c, V] float32 buffer reused from chunk to chunk (no fresh allocation per chunk).
        buf = None if logits.dtype == torch.float32 else torch.empty((min(c, logits.shape[0]), logits.shape[1]), dtype=torch.float32, device=logits.device)
        for s in range(0, logits.shape[0], c):
            x = logits[s : s + c]
            p = out[s : s + c] if buf is None else buf[: x.shape[0]]
            if p.data_ptr() != x.data_ptr():  # not already the logits' own rows (float32 in place)
                p.copy_(x)
            if t != 1.0:
                p.div_(t)
            p.sub_(lse[s : s + c, None]).exp_().mul_(row_grad[s : s + c, None] / -t)
            if buf is not None:
                out[s : s + c] = p
        out.index_put_((rows, targets), (grad / t).to(out.dtype), accumulate=True)
        return out, None, None, None, None, None, None
