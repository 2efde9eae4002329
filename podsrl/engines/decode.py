"""The transformers engine's KV cache on a CPU, grown in chunks instead of concatenated at every step
(issue 66).

transformers' ``DynamicLayer`` appends a step's keys and values with ``torch.cat``, copying the whole
cache of every layer at every step: a cost that grows with the completion (8% of a 128 x 64 call of
the embedded model on this project's 2-core EPYC, results/peak/). :class:`ChunkedLayer` keeps each
layer's keys and values in a buffer that grows by :data:`CHUNK` positions at a time, writes a step in
place and hands attention a view of the positions written: the same numbers, bit for bit, a copy
every CHUNK steps instead of every step, and at most CHUNK - 1 positions a layer allocated unused.
bench/hf_engine.py measures it against transformers' cache side by side: 1.12x the tokens a second
at 128 rollouts x 64 tokens and 1.11x at 64 x 256 (results/hf-engine/cpu-amd-epyc-2026-11-30-cache*.json,
docs/engines.md).

It applies where :data:`DEVICES` says: a CPU, where it was measured. On CUDA the default sampler
without vLLM is ``transformers-static``, whose cache is static anyway.
"""

from __future__ import annotations

import torch

try:  # caches made of layers (transformers >= 4.54); with older ones generate keeps its own (chunked_cache: None)
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - this project's pins install a newer transformers
    DynamicLayer = None

__all__ = ["CHUNK", "DEVICES", "ChunkedLayer", "chunked_cache"]

CHUNK = 64  # positions a ChunkedLayer grows by
DEVICES = frozenset({"cpu"})


class ChunkedLayer(DynamicLayer or object):
    """transformers' ``DynamicLayer`` whose keys and values are views of buffers that grow by
    :data:`CHUNK` positions, each step written in place (no ``torch.cat`` of the whole cache).

    ``keys``/``values`` [B, H, S, D] are the buffers' first S positions (strided along S, contiguous
    in D, which PyTorch's attention kernels take as they are). Whatever replaces them (``crop``,
    ``reorder_cache``, ``batch_repeat_interleave``, ``reset``: DynamicLayer's own methods, unchanged) is
    copied into a new buffer at the next ``update``; ``batch_select_indices`` selects the buffers' rows."""

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

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (podsrl/engines/loop.py drops finished rows): one copy of the
        buffers' rows, which keep their spare positions, where DynamicLayer's own would copy the rows
        and the next ``update`` copy them again into a new buffer."""
        if self._view is None or self.keys is not self._view[0] or self.values is not self._view[1]:
            return super().batch_select_indices(indices)
        length = self.keys.shape[-2]
        self._buffers = (self._buffers[0][indices], self._buffers[1][indices])
        self.keys, self.values = self._buffers[0][:, :, :length], self._buffers[1][:, :, :length]
        self._view = (self.keys, self.values)


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
    contents kept. None where the model is not on a device type in :data:`DEVICES`, where a layer is
    of another kind (sliding windows, linear attention) or where transformers' caches have no layers
    (before 4.54): the caller then lets ``generate`` build its own cache."""
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
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):  # also where DynamicLayer is None
        return None
    chunked = []
    for old in layers:
        layer = ChunkedLayer()
        layer.__dict__.update(old.__dict__)  # keys, values, dtype, device, is_initialized: adopted at the next update
        chunked.append(layer)
    cache.layers = chunked
    return cache
