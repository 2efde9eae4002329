"""The transformers engine's decode step on a CPU (podsrl/engines/decode.py): the KV cache grown in
chunks holds the numbers transformers' DynamicLayer holds, through every operation generate applies to
a cache, and the engine samples the same tokens with it; the output layer on oneDNN gives the logits
of ``F.linear`` within float32 rounding, the same greedy tokens, and is switched only where it applies
and back on leaving."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

import podsrl.engines.hf as hf
from float_bounds import U32
from podsrl.engines import Sampling
from podsrl.engines.decode import CHUNK, ChunkedLayer, chunked_cache, onednn_output_layer, output_layer_applies
from podsrl.engines.hf import TransformersEngine
from test_static_engine import _smallest_greedy_margin, prompts, tokenizer, varied_model  # noqa: F401 (tokenizer: a fixture)


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


@pytest.mark.parametrize("n", [1, 3])
def test_the_engine_samples_the_same_tokens_with_the_chunked_cache(tokenizer, one_thread, monkeypatch, n):
    """Seeded sampling at temperature 1, prompts of 1 to 14 tokens, completions of 70 tokens (past a
    chunk boundary), with and without a shared prefill (n = 3 and 1): the same completions as with
    transformers' own DynamicCache; the output layer is F.linear in both, so the cache is all that differs."""
    model = varied_model(tokenizer)
    ps = prompts(len(tokenizer))
    sampling = Sampling(n=n, temperature=1.0, top_p=1.0, max_new_tokens=CHUNK + 6, seed=7)
    monkeypatch.setattr(hf, "onednn_output_layer", lambda model: _nothing())
    used = []
    real = hf.chunked_cache
    monkeypatch.setattr(hf, "chunked_cache", lambda model, cache=None: used.append(1) or real(model, cache))
    got = TransformersEngine(model, tokenizer, batch_size=8).generate(ps, sampling)
    assert used
    monkeypatch.setattr(hf, "chunked_cache", lambda model, cache=None: cache)
    want = TransformersEngine(model, tokenizer, batch_size=8).generate(ps, sampling)
    assert got.completion_ids == want.completion_ids
    assert max(map(len, got.completion_ids)) > CHUNK  # some rows ran past a chunk boundary


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_onednn_output_layer_gives_f_linear_logits_within_rounding(tokenizer):
    """The model's logits with the output layer on oneDNN and with F.linear, both float32, from the same
    hidden states: each logit within the rounding bound of a float32 dot product of K = 32 terms, K u
    sum_k |h_k w_k| (tests/float_bounds.py's sum_bound, in any summation order), of the product in
    float64; the layer's forward restored after."""
    model = varied_model(tokenizer)
    ids = torch.tensor([prompts(len(tokenizer))[4]])
    layer = output_layer_applies(model)
    assert layer is model.lm_head
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state
        want = model(ids).logits
        with onednn_output_layer(model):
            assert "forward" in vars(layer)
            got = model(ids).logits
    assert "forward" not in vars(layer)
    weight = layer.weight.double()
    exact = hidden.double() @ weight.T
    bound = weight.shape[1] * U32 * (hidden.double().abs() @ weight.abs().T)
    assert ((got.double() - exact).abs() <= bound).all()
    assert ((want.double() - exact).abs() <= bound).all()


def test_onednn_output_layer_keeps_greedy_tokens(tokenizer, one_thread, monkeypatch):
    """Greedy completions of 12 tokens (n = 2, a shared prefill): the same with the output layer on
    oneDNN as with F.linear, by margins far above float32 rounding."""
    model = varied_model(tokenizer)
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=2, temperature=0, top_p=1.0, max_new_tokens=12)
    got = TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy)
    monkeypatch.setattr(hf, "onednn_output_layer", lambda model: _nothing())
    want = TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy)
    assert got.completion_ids == want.completion_ids
    rows = [p for p in ps for _ in range(2)]
    assert _smallest_greedy_margin(model, rows, want.completion_ids) > 1e-4


def test_onednn_output_layer_only_where_it_applies_and_restored_on_error(tokenizer):
    """Not for a bfloat16 output layer, a LoRA-wrapped one, or one off the CPU; a LoRA elsewhere keeps
    the base model's output layer switched; an error inside the block restores the forward."""
    from peft import LoraConfig, get_peft_model

    assert output_layer_applies(varied_model(tokenizer).to(torch.bfloat16)) is None
    assert output_layer_applies(varied_model(tokenizer).to("meta")) is None
    head_lora = get_peft_model(varied_model(tokenizer), LoraConfig(r=2, target_modules=["lm_head"]))
    assert output_layer_applies(head_lora) is None
    lora = get_peft_model(varied_model(tokenizer), LoraConfig(r=2, target_modules=["q_proj"]))
    layer = output_layer_applies(lora)
    assert layer is lora.get_base_model().lm_head
    with pytest.raises(RuntimeError, match="inside"), onednn_output_layer(lora):
        assert "forward" in vars(layer)
        raise RuntimeError("inside")
    assert "forward" not in vars(layer)
