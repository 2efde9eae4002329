"""The transformers engine's KV cache on a CPU (podsrl/engines/decode.py): grown in chunks, it holds
the numbers transformers' DynamicLayer holds, through every operation generate applies to a cache,
and the engine samples the same tokens with it."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.cache_utils import DynamicLayer

import podsrl.engines.hf as hf
from podsrl.engines import Sampling, loop
from podsrl.engines.decode import CHUNK, ChunkedLayer, chunked_cache
from podsrl.engines.hf import TransformersEngine
from test_static_engine import prompts, tokenizer, varied_model  # noqa: F401 (tokenizer: a fixture)


def _states(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 4, generator=g), torch.randn(batch, 2, length, 4, generator=g)


def test_chunked_layer_holds_what_dynamic_layer_holds():
    """A prefill of 5 positions, then one position a step past two chunk boundaries, and between steps
    each of DynamicLayer's own operations (reorder, select, repeat, crop, reset): after every update the
    same keys and values, bit for bit, and a new buffer only every CHUNK positions (not every step)."""
    plain, chunked = DynamicLayer(), ChunkedLayer()
    buffers = set()

    def step(states):
        want, got = plain.update(*states), chunked.update(*states)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
        assert plain.get_seq_length() == chunked.get_seq_length()
        buffers.add(chunked._buffers[0].data_ptr())

    step(_states(3, 5, 0))
    for i in range(2 * CHUNK + 3):
        step(_states(3, 1, i + 1))
    assert len(buffers) == 3  # 5 + 131 positions: capacities of 64, 128, 192
    assert chunked._buffers[0].shape[-2] == 3 * CHUNK
    for name, args in (("reorder_cache", (torch.tensor([2, 0, 1]),)), ("batch_select_indices", (torch.tensor([0, 2]),)),
                       ("batch_repeat_interleave", (2,)), ("crop", (-7,)), ("reset", ())):  # fmt: skip
        getattr(plain, name)(*args)
        getattr(chunked, name)(*args)
        batch = plain.keys.shape[0] if plain.keys is not None and plain.keys.dim() == 4 else 3
        for i in range(3):
            step(_states(batch, 1, 100 + i))


def test_chunked_cache_only_where_it_applies(tokenizer):
    """chunked_cache makes a CPU model's plain dynamic layers chunked (an empty cache, or a filled one
    keeping its contents); a cache with other layers, or a model off the CPU, is left to generate."""
    from transformers import DynamicCache

    model = varied_model(tokenizer)
    empty = chunked_cache(model)
    assert empty is not None and all(type(layer) is ChunkedLayer for layer in empty.layers)
    filled = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7]]), past_key_values=filled, use_cache=True)
    keys = filled.layers[0].keys
    assert chunked_cache(model, filled) is filled and filled.layers[0].keys is keys and filled.get_seq_length() == 3
    sliding = DynamicCache(config=model.config)
    sliding.layers[0] = type("Other", (DynamicLayer,), {})()
    assert chunked_cache(model, sliding) is None
    meta = varied_model(tokenizer).to("meta")
    assert chunked_cache(meta) is None


def test_without_cache_layers_generate_keeps_its_own_cache(tokenizer, one_thread, monkeypatch):
    """A transformers whose caches have no layers (before 4.54: decode.DynamicLayer is None): no chunked
    cache and no shared prefill, and the engine still samples, the tokens of transformers' own cache."""
    import podsrl.engines.decode as decode

    model = varied_model(tokenizer)
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=2, temperature=0, top_p=1.0, max_new_tokens=5)
    want = TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy)
    monkeypatch.setattr(decode, "DynamicLayer", None)
    engine = TransformersEngine(model, tokenizer, batch_size=4)
    ids = torch.ones(2, 3, dtype=torch.long)
    assert chunked_cache(model) is None and engine._shared_prefill([[5, 6, 7], [5, 6, 7]], ids, ids) is None
    assert engine.generate(ps, greedy).completion_ids == want.completion_ids


@pytest.mark.parametrize("n", [1, 3])
def test_the_engine_samples_the_same_tokens_with_the_chunked_cache(tokenizer, one_thread, monkeypatch, n):
    """Seeded sampling at temperature 1, prompts of 1 to 14 tokens, completions of 70 tokens (past a
    chunk boundary), with and without a shared prefill (n = 3 and 1): the engine's own loop over the
    chunked cache, no finished row leaving the batch (loop.COMPACT_AT infinite), samples the same
    completions as transformers' generate with its own DynamicCache: the same loop, step for step."""
    model = varied_model(tokenizer)
    ps = prompts(len(tokenizer))
    sampling = Sampling(n=n, temperature=1.0, top_p=1.0, max_new_tokens=CHUNK + 6, seed=7)
    monkeypatch.setattr(loop, "COMPACT_AT", math.inf)
    passed, sample = [], loop.sample
    monkeypatch.setattr(loop, "sample", lambda model, ids, mask, cache, **kw: passed.append(cache) or sample(model, ids, mask, cache, **kw))
    got = TransformersEngine(model, tokenizer, batch_size=8).generate(ps, sampling)
    assert passed and all(type(layer) is ChunkedLayer for cache in passed for layer in cache.layers)  # what the loop started from
    monkeypatch.setattr(hf, "chunked_cache", lambda model, cache=None: None)
    generated = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: generated.append(1) or generate(**kw))
    want = TransformersEngine(model, tokenizer, batch_size=8).generate(ps, sampling)
    assert generated  # without the chunked cache: generate
    assert got.completion_ids == want.completion_ids
    assert max(map(len, got.completion_ids)) > CHUNK  # some rows ran past a chunk boundary
