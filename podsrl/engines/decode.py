"""Two costs of a decode step on a CPU that the transformers engine need not pay (issue 66).

Measured on this project's 2-core AMD EPYC (AVX2, torch 2.13, the embedded SmolLM2-135M-Instruct in
float32, 2026-11-30; docs/engines.md has the runs and their commands):

1. **The output layer's product.** A decode step multiplies R hidden states [R, 576] by the output
   layer's [49,152 x 576] weight. PyTorch's ``F.linear`` (MKL's sgemm on a CPU) runs that wide, short
   product at 11-65 GFLOP/s (8-256 rows), against 110-125 for the model's other layers at 64-256 rows;
   oneDNN's ``linear`` runs it at 27-110 (1.6-2.4x; with the weight in oneDNN's own layout a little
   more, but that is a second copy of the weights, repacked at every optimizer step). At 128 rows it was
   a fifth of a call's time. :func:`onednn_output_layer` computes the output layer with oneDNN for the
   length of a ``with`` block: the same weights, read in place, a float32 product in another summation
   order (the logits differ from ``F.linear``'s by rounding only: tests/test_decode.py bounds it).
   The body's layers gain nothing from it (0.6-1.3x, shape by shape), so they keep ``F.linear``.
2. **The dynamic cache's concatenations.** transformers' ``DynamicLayer`` appends a step's keys and
   values with ``torch.cat``, copying the whole cache of every layer at every step: a cost that grows
   with the completion (8% of a 128 x 64 call, results/peak). :class:`ChunkedLayer` keeps each
   layer's keys and values in a buffer that grows by :data:`CHUNK` positions at a time, writes a step in
   place and hands attention a view of the positions written: the same numbers (bit for bit), a copy
   every CHUNK steps instead of every step, at most CHUNK - 1 positions a layer allocated unused.

Both apply where :data:`DEVICES` says (a CPU: only there were they measured; on CUDA the engines
sample with ``transformers-static``'s static cache, and cuBLAS's product is another matter), to
float32 output layers (the transformers engine samples with the policy, float32 on a CPU).
"""

from __future__ import annotations

import contextlib

import torch
from transformers.cache_utils import DynamicLayer

__all__ = ["CHUNK", "DEVICES", "ChunkedLayer", "chunked_cache", "onednn_linear", "onednn_output_layer", "output_layer_applies"]

CHUNK = 64  # positions a ChunkedLayer grows by
DEVICES = frozenset({"cpu"})


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with oneDNN's kernel (PyTorch's ``mkldnn::_linear_pointwise``, what
    its own compiler emits for linear layers on a CPU), the weight read as it is. x [..., K], weight
    [N, K], bias [N] or None -> [..., N]. No autograd: for sampling under ``torch.no_grad``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def output_layer_applies(model: torch.nn.Module) -> torch.nn.Linear | None:
    """``model``'s output layer where :func:`onednn_output_layer` switches it: a plain ``nn.Linear``
    with float32 weights on a device type in :data:`DEVICES`, with oneDNN built into PyTorch; else None.
    A LoRA on the output layer (peft's wrapper) or a quantized layer is left as it is."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get = getattr(base, "get_output_embeddings", None)
    layer = get() if callable(get) else None
    if type(layer) is not torch.nn.Linear:
        return None
    if layer.weight.dtype != torch.float32 or layer.weight.device.type not in DEVICES or not _onednn_available():
        return None
    return layer


@contextlib.contextmanager
def onednn_output_layer(model: torch.nn.Module):
    """Within the block, ``model``'s output layer computes with :func:`onednn_linear` where
    :func:`output_layer_applies`; its own ``forward`` is restored on leaving, also on an error. For
    sampling only (no autograd through the kernel): the engine's ``generate`` runs under ``no_grad``."""
    layer = output_layer_applies(model)
    if layer is None:
        yield
        return
    layer.forward = lambda x: onednn_linear(x, layer.weight, layer.bias)  # an instance attribute, over nn.Linear.forward
    try:
        yield
    finally:
        del layer.forward


class ChunkedLayer(DynamicLayer):
    """transformers' ``DynamicLayer`` whose keys and values are views of buffers that grow by
    :data:`CHUNK` positions, each step written in place (no ``torch.cat`` of the whole cache).

    ``keys``/``values`` [B, H, S, D] are the buffers' first S positions (strided along S, contiguous
    in D, which PyTorch's attention kernels take as they are). Whatever replaces them (``crop``,
    ``reorder_cache``, ``batch_select_indices``, ``batch_repeat_interleave``, ``reset``: DynamicLayer's
    own methods, unchanged) is copied into a new buffer at the next ``update``."""

    _view: tuple[torch.Tensor, torch.Tensor] | None = None
    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        new = key_states.shape[-2]
        ours = self._view is not None and self.keys is self._view[0] and self.values is self._view[1]
        if not ours or length + new > self._buffers[0].shape[-2]:
            self._buffers = (_grown(self.keys, key_states, length, new), _grown(self.values, value_states, length, new))
        keys, values = self._buffers
        keys[:, :, length : length + new] = key_states
        values[:, :, length : length + new] = value_states
        self.keys, self.values = keys[:, :, : length + new], values[:, :, : length + new]
        self._view = (self.keys, self.values)
        return self.keys, self.values


def _grown(old: torch.Tensor, states: torch.Tensor, length: int, new: int) -> torch.Tensor:
    """A buffer [B, H, capacity, D] for ``length + new`` positions rounded up to a multiple of CHUNK,
    its first ``length`` positions copied from ``old``."""
    batch, heads, _, dim = states.shape
    capacity = -(-(length + new) // CHUNK) * CHUNK
    buffer = states.new_empty(batch, heads, capacity, dim)
    if length:
        buffer[:, :, :length] = old
    return buffer


def chunked_cache(model: torch.nn.Module, cache=None):
    """A ``DynamicCache`` for ``model`` whose plain dynamic layers are :class:`ChunkedLayer` s, or
    ``cache`` (a DynamicCache, empty or filled) with its plain dynamic layers made ChunkedLayers, their
    contents kept. None where the model is not on a device type in :data:`DEVICES`, or where a layer is
    of another kind (sliding windows, linear attention): the caller then lets ``generate`` build its
    own cache."""
    from transformers import DynamicCache

    try:
        device = next(model.parameters()).device
    except StopIteration:
        return None
    if device.type not in DEVICES:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cache = cache if cache is not None else DynamicCache(config=base.config)
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    chunked = []
    for old in layers:
        layer = ChunkedLayer()
        layer.__dict__.update(old.__dict__)  # keys, values, dtype, device, is_initialized: adopted at the next update
        chunked.append(layer)
    cache.layers = chunked
    return cache
