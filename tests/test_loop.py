"""The transformers engine's own decode loop on a CPU (podsrl/engines/loop.py): finished rows leave the
batch, and nothing else changes: the greedy tokens of transformers' generate (with LoRA too), the law
of temperature and top-p under sampling with rows leaving at every EOS, generate kept where the model's
generation config asks it for more, or under FSDP; the engine's own processors in both paths."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from podsrl.engines import Sampling, loop
from podsrl.engines.hf import TransformersEngine
from test_static_engine import _exact_law, _forward_shapes, _smallest_greedy_margin, _threshold, _tv, prompts, tokenizer, varied_model  # noqa: F401


def _with_eos_reached(model, tokenizer, ps, greedy) -> None:
    """Two more EOS ids in the (base) model's generation_config, the first prompt's sixth greedy token
    and the last one's third: rows end at different steps, others run to max_new_tokens."""
    plain = TransformersEngine(model, tokenizer, batch_size=16).generate(ps, greedy)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.generation_config.eos_token_id = [tokenizer.eos_token_id, plain.completion_ids[0][5], plain.completion_ids[-1][2]]


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("compact_at", [0.0, 0.25])
def test_greedy_gives_generates_tokens_while_rows_leave(tokenizer, one_thread, monkeypatch, lora, compact_at):
    """Prompts of 1 to 14 tokens, 3 rows each, one call of 15 rows, 12 new tokens, an EOS some rows
    reach: the loop's completions and truncated flags are generate's (the engine with the loop
    switched off), by greedy margins far above float32 rounding; its decode steps run on fewer rows
    once rows have ended (every finished row leaving at once with COMPACT_AT 0)."""
    model = varied_model(tokenizer)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=3, temperature=0, top_p=1.0, max_new_tokens=12)
    base = model.get_base_model() if lora else model
    _with_eos_reached(model, tokenizer, ps, greedy)
    monkeypatch.setattr(loop, "COMPACT_AT", compact_at)
    shapes = _forward_shapes(base)
    got = TransformersEngine(model, tokenizer, batch_size=16).generate(ps, greedy)
    steps = [rows for rows, width in shapes if width == 1]
    monkeypatch.setattr(loop, "applies", lambda model, cache: False)
    want = TransformersEngine(model, tokenizer, batch_size=16).generate(ps, greedy)

    assert any(want.truncated) and not all(want.truncated), "both ends should be exercised"
    assert got.completion_ids == want.completion_ids and got.truncated == want.truncated and got.texts == want.texts
    lengths = [len(c) for c, cut in zip(want.completion_ids, want.truncated)]
    assert steps == _batches(lengths, compact_at, greedy.max_new_tokens) and steps[-1] < 15
    if compact_at == 0:  # every row leaves at its EOS
        assert steps == [sum(length > t for length in lengths) for t in range(len(steps))]
    assert _smallest_greedy_margin(model, [p for p in ps for _ in range(3)], want.completion_ids) > 1e-3


def _batches(lengths: list[int], compact_at: float, max_new_tokens: int) -> list[int]:
    """The rows of each decode step under loop.py's rule, for completions of these lengths: the rows
    that have ended leave once they are at least compact_at of the batch (and at least one)."""
    batch, out = list(lengths), []
    for t in range(max_new_tokens):
        out.append(len(batch))
        ended = [length <= t + 1 for length in batch]
        if all(ended) or t == max_new_tokens - 1:
            return out
        if sum(ended) >= max(1.0, compact_at * len(batch)):
            batch = [length for length, e in zip(batch, ended) if not e]
    return out


def test_sampling_follows_the_law_while_rows_leave(tokenizer, one_thread, monkeypatch):
    """test_static_engine's law test (4000 completions of two tokens at T = 0.5, top_p = 0.8) with every
    row that ends at its first token leaving the batch before the second: the empirical law is within
    the FALSE_ALARM threshold of the exact one, and rows did leave."""
    n, temperature, top_p = 4000, 0.5, 0.8
    model = varied_model(tokenizer)
    prompt = prompts(len(tokenizer))[2]
    law = _exact_law(model, prompt, tokenizer.eos_token_id, temperature, top_p)
    # an EOS likely enough at the first token that many rows leave: the most likely first token
    first = Counter({ids[0]: 0.0 for ids in law})
    for ids, p in law.items():
        first[ids[0]] += p
    eos = first.most_common(1)[0][0]
    law = _exact_law(model, prompt, eos, temperature, top_p)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, eos]
    monkeypatch.setattr(loop, "COMPACT_AT", 0.0)
    shapes = _forward_shapes(model)
    out = TransformersEngine(model, tokenizer, batch_size=n).generate([prompt], Sampling(n=n, temperature=temperature, top_p=top_p, max_new_tokens=2, seed=0))
    steps = [rows for rows, width in shapes if width == 1]
    ended = sum(len(c) == 1 for c in out.completion_ids)
    assert ended > n / 10 and steps == [n, n - ended]  # the rows that ended did not run the second step
    seen = {ids: count / n for ids, count in Counter(tuple(c) for c in out.completion_ids).items()}
    assert _tv(seen, law) <= _threshold(law, n)


def test_generate_where_the_config_asks_for_more_or_under_fsdp(tokenizer, one_thread, monkeypatch):
    """A repetition penalty in the model's generation config, or FSDP's lockstep: generate samples
    (and the penalty applies: another completion than the loop's)."""
    model = varied_model(tokenizer, 0.02)  # small weights: its greedy completions repeat a token
    ps = prompts(len(tokenizer))[:2]
    greedy = Sampling(n=2, temperature=0, top_p=1.0, max_new_tokens=8)
    calls = []
    generate = model.generate
    # (recorded, then run without FSDP's lockstep, which needs a process group)
    monkeypatch.setattr(model, "generate", lambda **kw: calls.append(kw["synced_gpus"]) or generate(**{**kw, "synced_gpus": False}))
    plain = TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy)
    assert not calls  # the loop
    model.generation_config.repetition_penalty = 50.0
    penalised = TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy)
    assert len(calls) == 1 and penalised.completion_ids != plain.completion_ids
    for ids in penalised.completion_ids:
        assert len(set(ids)) == len(ids)  # a penalty of 50 repeats nothing here
    model.generation_config.repetition_penalty = 1.0
    engine = TransformersEngine(model, tokenizer, batch_size=4)
    engine.synced_gpus = True
    assert engine.generate(ps, greedy).completion_ids == plain.completion_ids and calls == [False, True]


@pytest.mark.parametrize("through_generate", [False, True])
def test_the_engines_processors_apply_in_both_paths(tokenizer, one_thread, monkeypatch, through_generate):
    """TransformersEngine.logits_processors run before the sampling warpers, in the loop and in
    generate: one that forbids EOS makes every completion max_new_tokens long (the benchmarks' fixed
    length), where without it some end."""
    model = varied_model(tokenizer)
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=1, temperature=0, top_p=1.0, max_new_tokens=12)
    _with_eos_reached(model, tokenizer, ps, greedy)
    if through_generate:
        monkeypatch.setattr(loop, "applies", lambda model, cache: False)
    engine = TransformersEngine(model, tokenizer, batch_size=8)
    assert not all(engine.generate(ps, greedy).truncated)
    eos = list(model.generation_config.eos_token_id)

    def no_eos(ids, scores):
        scores[:, eos] = -math.inf
        return scores

    engine.logits_processors = [no_eos]
    for sampling in (greedy, Sampling(n=2, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=3)):
        out = engine.generate(ps, sampling)
        assert all(out.truncated) and {len(c) for c in out.completion_ids} == {12}


def test_applies_only_to_the_chunked_cache_and_a_plain_config(tokenizer):
    from podsrl.engines.decode import chunked_cache

    model = varied_model(tokenizer)
    cache = chunked_cache(model)
    assert loop.applies(model, cache) and not loop.applies(model, None)
    from transformers import DynamicCache

    assert not loop.applies(model, DynamicCache(config=model.config))
    model.generation_config.no_repeat_ngram_size = 3
    assert not loop.applies(model, cache)
