"""Grouped-query attention over the KV cache as it is (podsrl/engines/attention.py): the same logits
and the same sampled tokens as transformers' ``sdpa``, no copy of the cache per query head in the
engines' calls (a test that fails with the copy), and the switch only where it applies, restored
afterwards."""

from __future__ import annotations

import contextlib

import pytest
import torch

from podsrl.engines import Sampling
from podsrl.engines.attention import GROUPED, NAME, applies, register, shared_kv_heads
from podsrl.engines.dtype import resolve_sampler_dtype
from podsrl.engines.hf import TransformersEngine
from podsrl.engines.static import StaticCacheEngine
from test_static_engine import varied_model

PROMPT_LENGTHS = (2, 5, 9, 13)  # left padding in every call


@pytest.fixture(scope="module")
def tokenizer():
    from offline_tokenizer import build

    return build()


def gqa_model(tokenizer, *, kv_heads: int = 2, attn: str = "sdpa"):
    """test_static_engine's tiny Llama (4 query heads sharing ``kv_heads`` key/value heads, weights
    large enough that its greedy completions vary) with ``attn`` attention."""
    return varied_model(tokenizer, kv_heads=kv_heads, attn=attn)


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in PROMPT_LENGTHS]


def refuse_repeat_kv(hidden_states, n_rep):
    """transformers' ``repeat_kv`` made to fail where it would copy the key/value heads."""
    if n_rep > 1:
        raise AssertionError("repeat_kv called: the KV cache was copied per query head")
    return hidden_states


def greedy_kwargs(tokenizer, ps: list[list[int]]) -> dict:
    """``generate``'s arguments for 6 greedy steps on the prompts ``ps``, left-padded to one width,
    their logits returned."""
    width = max(map(len, ps))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in ps])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
    return dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, output_logits=True,
                return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)  # fmt: skip


def assert_same_greedy(got, want) -> None:
    """Two greedy ``generate`` outputs of :func:`greedy_kwargs`: the same tokens, every step's logits
    equal within float32 rounding (the same numbers through a kernel in another order)."""
    assert torch.equal(got.sequences, want.sequences)
    for step_got, step_want in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(step_got, step_want, rtol=1e-5, atol=1e-5)


@pytest.fixture
def no_repeat_kv(monkeypatch):
    """transformers' copy of the key/value heads (``repeat_kv``) made to fail when it is called."""
    import transformers.integrations.sdpa_attention as sdpa

    monkeypatch.setattr(sdpa, "repeat_kv", refuse_repeat_kv)


def test_logits_equal_sdpa_at_prefill_and_decode(tokenizer, one_thread):
    """Left-padded prompts, then 6 greedy steps on the dynamic cache: every step's logits under the
    shared heads equal ``sdpa``'s (the same kernel on the same numbers; float32 tolerance)."""
    model = gqa_model(tokenizer)
    kwargs = greedy_kwargs(tokenizer, prompts(len(tokenizer)))
    want = model.generate(**kwargs)
    with shared_kv_heads(model):
        assert model.config._attn_implementation == NAME
        got = model.generate(**kwargs)
    assert_same_greedy(got, want)


@pytest.mark.parametrize("padded", [True, False])
def test_grouped_queries_equal_sdpa_with_a_mask_and_causal_alone(tokenizer, one_thread, padded, monkeypatch):
    """grouped_queries_forward (the candidate for CUDA, bench/attention.py) under greedy generate: the
    same tokens and logits as ``sdpa`` with left-padded prompts (a mask every step) and with prompts of
    one length (no mask: the causal prefill it builds itself), and no ``repeat_kv``."""
    assert register()
    kwargs = greedy_kwargs(tokenizer, prompts(len(tokenizer)) if padded else [p[:2] for p in prompts(len(tokenizer))])
    model = gqa_model(tokenizer, kv_heads=2)
    want = model.generate(**kwargs)  # sdpa's own answer (it copies the heads where a mask is passed)
    import transformers.integrations.sdpa_attention as sdpa

    monkeypatch.setattr(sdpa, "repeat_kv", refuse_repeat_kv)
    model.config._attn_implementation = GROUPED
    got = model.generate(**kwargs)
    assert_same_greedy(got, want)


@pytest.mark.parametrize("lora", [False, True])
def test_engine_copies_no_kv_heads_and_samples_the_same_tokens(tokenizer, one_thread, monkeypatch, lora):
    """The transformers engine (shared prefill and decode, with or without LoRA) calls no ``repeat_kv``
    and draws the same tokens under a seed as with transformers' ``sdpa``; without the switch the same
    call copies the heads (so the check can fail)."""
    import podsrl.engines.hf as hf

    model = gqa_model(tokenizer)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ps = prompts(len(tokenizer))
    sampling = Sampling(n=3, temperature=1.0, top_p=1.0, max_new_tokens=10, seed=7)
    want = TransformersEngine(model, tokenizer, batch_size=6).generate(ps, sampling)

    import transformers.integrations.sdpa_attention as sdpa

    real = sdpa.repeat_kv
    calls = []
    monkeypatch.setattr(sdpa, "repeat_kv", lambda h, n: calls.append(n) or real(h, n))
    got = TransformersEngine(model, tokenizer, batch_size=6).generate(ps, sampling)
    assert calls == [], f"repeat_kv called {len(calls)} times"
    assert got.completion_ids == want.completion_ids

    monkeypatch.setattr(hf, "shared_kv_heads", lambda model: contextlib.nullcontext())
    TransformersEngine(model, tokenizer, batch_size=6).generate(ps, sampling)
    assert calls, "without the switch transformers should copy the heads: the check above would not fail"
    base = model.get_base_model() if lora else model
    assert base.config._attn_implementation == "sdpa"


def test_static_engine_copies_no_kv_heads(tokenizer, one_thread, no_repeat_kv):
    """The static engine's sampler on a CPU: its static cache read without copies, greedy tokens as
    the transformers engine's."""
    model = gqa_model(tokenizer)
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=2, temperature=0, top_p=1.0, max_new_tokens=8)
    engine = StaticCacheEngine(model, tokenizer, sampler_dtype=resolve_sampler_dtype("auto", torch.float32), batch_size=4)
    got = engine.generate(ps, greedy)
    assert got.completion_ids == TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy).completion_ids


def test_switch_restored_on_error(tokenizer):
    model = gqa_model(tokenizer)
    with pytest.raises(RuntimeError, match="inside"), shared_kv_heads(model):
        assert model.config._attn_implementation == NAME
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"


def test_applies_only_where_it_helps(tokenizer):
    """On a CPU with sdpa and shared heads; not with eager attention, not with a key/value head per
    query head, not off the CPU (a meta-device model stands in for an accelerator), where the
    model is left exactly as it was."""
    assert applies(gqa_model(tokenizer))
    for model in (gqa_model(tokenizer, attn="eager"), gqa_model(tokenizer, kv_heads=4), gqa_model(tokenizer).to("meta")):
        before = model.config._attn_implementation
        assert not applies(model)
        with shared_kv_heads(model):
            assert model.config._attn_implementation == before


def test_the_update_switches_a_model_with_a_head_per_query_head_under_autocast_alone(tokenizer):
    """``autocast`` (the update's forward under mixed precision) also switches a model with as many
    key/value heads as query heads, for the float32 attention; the default does not."""
    model = gqa_model(tokenizer, kv_heads=4)
    assert not applies(model) and applies(model, autocast=True)
    with shared_kv_heads(model, autocast=True):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    assert not applies(gqa_model(tokenizer, attn="eager"), autocast=True) and not applies(gqa_model(tokenizer).to("meta"), autocast=True)


@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("masked", [True, False])
def test_under_cpu_autocast_the_attention_computes_in_float32(kv_heads, masked, one_thread, monkeypatch):
    """podsrl's attention under bfloat16 autocast on a CPU: the float32 kernel on the inputs in float32
    (a float32 output, the same bits as that call outside autocast), its gradients too; outside
    autocast, or with the switch off (FLOAT32_UNDER_CPU_AUTOCAST, the benchmark's), the call as it was:
    under autocast the kernel then computes in bfloat16."""
    from podsrl.engines import attention

    g = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 7, 8, generator=g, requires_grad=True)
    key, value = (torch.randn(2, kv_heads, 7, 8, generator=g).bfloat16().requires_grad_() for _ in range(2))
    mask = torch.ones(7, 7, dtype=torch.bool).tril()[None, None].expand(2, 1, 7, 7).clone() if masked else None
    if masked:
        mask[0, :, :, :2] = False  # a left-padded row
        mask[0, :, :2, 0] = True  # its padding positions attend to something
    module = torch.nn.Module()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attention.sdpa_gqa_forward(module, query, key, value, mask)
    assert out.dtype == torch.float32
    want = torch.nn.functional.scaled_dot_product_attention(query, key.float(), value.float(), attn_mask=mask, is_causal=not masked,
                                                            enable_gqa=kv_heads != 4).transpose(1, 2)  # fmt: skip
    assert torch.equal(out, want)
    grads = torch.autograd.grad(out.sum(), (query, key, value))
    assert [t.dtype for t in grads] == [torch.float32, torch.bfloat16, torch.bfloat16]
    torch.testing.assert_close(grads[0], torch.autograd.grad(want.sum(), query)[0], rtol=0, atol=0)
    plain, _ = attention.sdpa_gqa_forward(module, query.bfloat16(), key, value, mask)  # no autocast: bfloat16 in, bfloat16 out
    assert plain.dtype == torch.bfloat16
    monkeypatch.setattr(attention, "FLOAT32_UNDER_CPU_AUTOCAST", False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before, _ = attention.sdpa_gqa_forward(module, query, key, value, mask)
    assert before.dtype == torch.bfloat16 and not torch.equal(before.float(), out)


def test_the_update_forward_attends_in_float32_under_mixed_precision(tokenizer, one_thread, monkeypatch):
    """forward_logprobs with mixed_precision on a CPU: every layer's attention goes through podsrl's
    function under autocast (so in float32), for a model with shared heads and one with a head per
    query head; in float32 arithmetic the shared-heads model alone is switched, as before."""
    from podsrl.engines import attention
    from podsrl.train.sequences import forward_logprobs, pack

    seen: list[tuple[bool, bool]] = []
    real = attention.sdpa_gqa_forward

    def spy(module, query, *args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), attention.float32_under_autocast(query)))
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_gqa_forward", spy)
    packed = pack([[5, 6, 7], [5, 6, 7, 8, 9]], [[10, 11, 12], [13, 14]], tokenizer.pad_token_id)
    for kv_heads in (2, 4):
        model = gqa_model(tokenizer, kv_heads=kv_heads)
        layers = model.config.num_hidden_layers
        for mixed in (True, False):
            seen.clear()
            forward_logprobs(model, packed, mixed_precision=mixed, share_prompts=False)
            switched = mixed or kv_heads < 4
            assert seen == ([(mixed, mixed)] * layers if switched else []), (kv_heads, mixed)


def test_the_benchs_gqa_variant_switches_the_heads_for_its_own_calls_alone(tokenizer, one_thread, monkeypatch):
    """bench/samplers.py's ``transformers-static-gqa`` on a device where the engines copy the heads (a
    CPU taken out of ``DEVICES`` stands in for CUDA): its calls read them in place and sample the
    plain static engine's greedy tokens; ``DEVICES`` is as it was after them, and the plain engine
    still copies."""
    from pathlib import Path

    import transformers.integrations.sdpa_attention as sdpa
    from conftest import script_module

    from podsrl.engines import attention

    monkeypatch.setattr(attention, "DEVICES", frozenset())
    copies, copy = [], sdpa.repeat_kv

    def counted_copy(hidden_states, n_rep):
        copies.extend([n_rep] if n_rep > 1 else [])
        return copy(hidden_states, n_rep)

    monkeypatch.setattr(sdpa, "repeat_kv", counted_copy)
    model = gqa_model(tokenizer)
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=2, temperature=0, top_p=1.0, max_new_tokens=8)
    dtype = resolve_sampler_dtype("auto", torch.float32)
    with script_module(Path(__file__).resolve().parents[1] / "bench" / "samplers.py") as bench:
        variant = bench.shared_heads_everywhere()(model, tokenizer, sampler_dtype=dtype, batch_size=4)
        got = variant.generate(ps, greedy)
    assert not copies and attention.DEVICES == frozenset()
    want = StaticCacheEngine(model, tokenizer, sampler_dtype=dtype, batch_size=4).generate(ps, greedy)
    assert copies and got.completion_ids == want.completion_ids


def test_the_attention_benchmark_runs_and_checks_the_ways_agree(tmp_path, monkeypatch):
    """bench/attention.py --tiny: every way at every shape, their outputs checked against ``copied``
    (a way that computes something else fails the run), the ratios and the table from the JSON."""
    import json
    from pathlib import Path

    from conftest import script_module

    root = Path(__file__).resolve().parents[1]
    threads = torch.get_num_threads()
    with script_module(root / "bench" / "attention.py") as bench:
        data = bench.main(["--tiny", "--threads", "1", "--out", str(tmp_path / "attention.json")])
        torch.set_num_threads(threads)
        assert data == json.loads((tmp_path / "attention.json").read_text())
        assert [(r["rows"], r["positions"]) for r in data["rows"]] == [(4, 12), (4, 20), (8, 12), (8, 20)]
        for row in data["rows"]:
            assert set(row["ways"]) == set(bench.WAYS) and row["ways"]["copied"]["vs_copied"] == 1.0
            assert all(len(f["rounds"]) == 3 and f["seconds"] == sorted(f["rounds"])[1] for f in row["ways"].values())  # the median of 3
            assert all(f["max_diff"] < 1e-4 and f["seconds"] > 0 for f in row["ways"].values())
        assert "| tiny (4 / 2) | float32 | 8 x 20 |" in bench.table(data)
        if not torch.cuda.is_available():
            with pytest.raises(SystemExit, match="--gpu: torch sees no GPU"):
                bench.main(["--gpu"])

        from podsrl.engines import attention

        monkeypatch.setattr(attention, "grouped_queries_forward", lambda module, q, k, v, mask, **kw: (q.transpose(1, 2) * 0, None))
        with pytest.raises(AssertionError, match="grouped differs from copied"):
            bench.measure(bench.TINY, [4], [12], "float32", torch.device("cpu"))


def test_every_committed_attention_run_is_in_the_engines_page_as_its_table():
    """bench/attention.py's committed runs (results/attention/*.json) appear in docs/engines.md exactly
    as ``--table`` prints them."""
    from conftest import committed_tables_in_page

    assert committed_tables_in_page("attention", "table", "attention", "engines.md"), "no committed run of bench/attention.py"


def test_every_committed_gpu_peak_runs_attention_is_in_the_engines_page_as_its_table():
    """The attention rows of bench/peak.py's committed GPU runs (results/peak/nvidia-*.json, bench/
    attention.py's ways inside the lent GPU's one command) appear in docs/engines.md as bench/
    attention.py's table prints them."""
    import json
    from pathlib import Path

    from conftest import script_module

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "engines.md").read_text()
    runs = [json.loads(p.read_text()) for p in sorted((root / "results" / "peak").glob("nvidia-*.json"))]
    rows = [[r for r in entry.get("attention", [])] for run in runs for entry in run["models"].values()]
    with script_module(root / "bench" / "attention.py") as bench:
        tables = [bench.table({"rows": r}) for r in rows if r]
    assert tables, "no committed GPU run of bench/peak.py with attention rows"
    for table in tables:
        assert table in page, "docs/engines.md lacks a GPU run's attention table: paste bench/attention.py's table of its rows"


def _bfloat16_errors(tokenizer, device: str) -> tuple[float, float]:
    """The tiny GQA model in bfloat16 on ``device``, left-padded prompts: a masked prefill, then one
    masked decode step on its cache, under ``sdpa`` and under the grouped queries. Each way's largest
    logit error against the same model in float32 (sdpa), over both steps: (sdpa's, grouped's)."""
    assert register()
    ps = prompts(len(tokenizer))
    width = max(map(len, ps))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in ps], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps], device=device)
    step = torch.full((len(ps), 1), 5, device=device)
    longer = torch.cat([mask, torch.ones_like(step)], 1)

    def two_steps(model):
        with torch.no_grad():
            first = model(input_ids=ids, attention_mask=mask, use_cache=True)
            second = model(input_ids=step, attention_mask=longer, past_key_values=first.past_key_values, use_cache=True)
        valid = mask.bool()  # left padding's logits are not compared
        return torch.cat([first.logits[valid].float(), second.logits[:, -1].float()])

    reference = two_steps(gqa_model(tokenizer).to(device))
    errors = []
    for attn in ("sdpa", GROUPED):
        model = gqa_model(tokenizer).to(device=device, dtype=torch.bfloat16)
        model.config._attn_implementation = attn
        errors.append(float((two_steps(model) - reference).abs().max()))
    return errors[0], errors[1]


def test_grouped_queries_in_bfloat16_err_no_more_than_sdpa_on_the_cpu(tokenizer, one_thread):
    """In bfloat16 the ways round differently, so they are compared with float32: the grouped queries'
    logit error is within twice ``sdpa``'s own (same weights, same inputs; one bfloat16 rounding of the
    attention's output is the difference). The same check on CUDA below, where it would be used."""
    sdpa_error, grouped_error = _bfloat16_errors(tokenizer, "cpu")
    assert 0 < grouped_error <= 2 * sdpa_error, (sdpa_error, grouped_error)


@pytest.mark.gpu
def test_grouped_queries_in_bfloat16_err_no_more_than_sdpa_on_cuda(tokenizer):
    """As the CPU test above, on CUDA (where transformers copies the heads with a mask and the
    grouped queries run the memory-efficient kernel): run by ``make gpu-check`` on a lent GPU."""
    sdpa_error, grouped_error = _bfloat16_errors(tokenizer, "cuda")
    assert 0 < grouped_error <= 2 * sdpa_error, (sdpa_error, grouped_error)
