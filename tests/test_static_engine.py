"""The transformers-static engine (podsrl/engines/static.py): a sampler of its own with a static KV
cache; and the transformers engine's prefill shared by a prompt's rows (podsrl/engines/hf.py). On the CPU, beside today's TransformersEngine: the same tokens under greedy decoding, the same
law under sampling (a test against the model's exact probabilities that can fail), log-probs equal to
the trainer's, the weights following the policy after each optimizer step, and a whole training run
through the importance correction; and how ``rollout.engine = "auto"`` chooses."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from float_bounds import logprob_atol, within
from podsrl.engines import Sampling, choose_engine, resolve_engine
from podsrl.engines.dtype import resolve_sampler_dtype
from podsrl.engines.hf import TransformersEngine
from podsrl.engines.static import LOGIT_BYTES, StaticCacheEngine, bytes_per_row, rows_that_fit
from podsrl.train.sequences import forward_logprobs, pack

FLOAT32 = resolve_sampler_dtype("auto", torch.float32)
PROMPT_LENGTHS = (1, 3, 6, 9, 14)
FALSE_ALARM = 1e-6  # the law test's chance of failing a correct sampler (McDiarmid's bound below)


@pytest.fixture(scope="module")
def tokenizer():
    from offline_tokenizer import build

    return build()  # 686 tokens


def varied_model(tokenizer, initializer_range: float = 0.4, *, kv_heads: int = 2, attn: str | None = None):
    """The conftest tiny Llama, by default with weights 20x larger (initializer_range 0.4): the
    conftest's logits are nearly uniform and its greedy completions repeat one token, this one's
    greedy completions vary and its next-token distributions are peaked enough for a law test of few
    categories. With 0.02 it is the conftest's model (its float32 rounding is the one
    float_bounds.py's bounds were derived for: small weights, little amplification through layers).
    ``kv_heads``: key/value heads shared by its 4 query heads; ``attn``: its attention implementation
    (transformers' default when None)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=512, tie_word_embeddings=True, initializer_range=initializer_range,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **({"attn_implementation": attn} if attn else {}),
    )  # fmt: skip
    torch.manual_seed(1234)
    return LlamaForCausalLM(config).eval()


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in PROMPT_LENGTHS]


def test_greedy_gives_the_tokens_of_the_transformers_engine(tokenizer, one_thread):
    """Float32, prompts of 1 to 14 tokens, two copies each, calls of 3 sequences (4 calls, the last of
    1): the same completions and truncated flags as TransformersEngine, with an EOS that some rows
    reach (a second EOS id in the model's generation_config, chosen from a greedy completion) and
    others not (cut at max_new_tokens)."""
    model = varied_model(tokenizer)
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=2, temperature=0, top_p=1.0, max_new_tokens=12)
    plain = TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy)
    stop = plain.completion_ids[0][5]  # the first prompt's completion ends at its sixth token (or before)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop]

    want = TransformersEngine(model, tokenizer, batch_size=4).generate(ps, greedy)
    engine = StaticCacheEngine(model, tokenizer, sampler_dtype=FLOAT32, batch_size=3)
    got = engine.generate(ps, greedy)

    assert engine.calls == [3, 3, 3, 1]
    assert any(want.truncated) and not all(want.truncated), "both ends should be exercised"
    assert got.completion_ids == want.completion_ids
    assert got.truncated == want.truncated
    assert got.texts == want.texts
    assert got.logprobs is None  # greedy decoding draws from no distribution
    # Equality is what float32 promises here: every greedy choice wins by far more than the two
    # caches' rounding can move a logit (~1e-6 at these magnitudes).
    assert _smallest_greedy_margin(model, [p for p in ps for _ in range(2)], want.completion_ids) > 1e-3


def _smallest_greedy_margin(model, prompt_rows, completions) -> float:
    smallest = math.inf
    with torch.no_grad():
        for prompt, completion in zip(prompt_rows, completions):
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : len(prompt) + len(completion) - 1]
            top2 = logits.topk(2, dim=-1).values
            smallest = min(smallest, float((top2[:, 0] - top2[:, 1]).min()))
    return smallest


# ------------------------------------------------------------------ the transformers engine's shared prefill


def _forward_shapes(model) -> list[tuple[int, int]]:
    """Record [rows, tokens] of every forward of ``model`` from now on."""
    import functools

    shapes, plain = [], model.forward

    @functools.wraps(plain)  # generate reads the forward's signature (position_ids)
    def recording(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        shapes.append(tuple(ids.shape))
        return plain(*args, **kwargs)

    model.forward = recording
    return shapes


@pytest.mark.parametrize("lora", [False, True])
def test_a_prompts_rows_share_one_prefill(tokenizer, one_thread, lora, monkeypatch):
    """Prompts of 1 to 14 tokens, 3 rows each, calls of 8 rows (a prompt's rows split across calls):
    each call's prefill runs once per distinct prompt over all but the last prompt token, generate then
    runs one token a row; the greedy completions are those of a prefill per row (the engine without
    sharing), by margins far above float32 rounding; under LoRA too."""
    model = varied_model(tokenizer)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=3, temperature=0, top_p=1.0, max_new_tokens=6)
    engine = TransformersEngine(model, tokenizer, batch_size=8)
    base = model.get_base_model() if lora else model
    shapes = _forward_shapes(base)
    shared = engine.generate(ps, greedy)
    rows = [p for p in ps for _ in range(3)]
    calls = [rows[i : i + 8] for i in range(0, len(rows), 8)]
    width = [max(map(len, call)) for call in calls]
    distinct = [len({tuple(r) for r in call}) for call in calls]
    prefills = [s for s in shapes if s[1] > 1]
    assert prefills == [(d, w - 1) for d, w in zip(distinct, width)]  # one a call, distinct prompts only
    assert not any(s[0] == len(call) and s[1] > 1 for s, call in zip(shapes, calls))  # no prefill of every row

    shapes.clear()
    monkeypatch.setattr(TransformersEngine, "_shared_prefill", lambda self, *a: None)
    alone = engine.generate(ps, greedy)
    assert [s for s in shapes if s[1] > 1] == [(len(call), w) for call, w in zip(calls, width)]  # the engine before
    assert shared.completion_ids == alone.completion_ids
    assert _smallest_greedy_margin(model, rows, alone.completion_ids) > 1e-3


def test_no_shared_prefill_where_nothing_repeats_or_under_fsdp(tokenizer, one_thread):
    """Distinct prompts (n = 1) and FSDP's lockstep (synced_gpus) keep generate's own prefill."""
    model = varied_model(tokenizer)
    ps = prompts(len(tokenizer))
    engine = TransformersEngine(model, tokenizer, batch_size=16)
    ids = torch.ones(2, 3, dtype=torch.long)
    assert engine._shared_prefill([[5, 6, 7], [8, 9, 10]], ids, ids) is None
    engine.synced_gpus = True
    assert engine._shared_prefill([[5, 6, 7], [5, 6, 7]], ids, ids) is None
    engine.synced_gpus = False
    assert engine._shared_prefill([[5, 6, 7], [5, 6, 7]], ids, ids).get_seq_length() == 2
    assert engine._shared_prefill([[5], [5]], ids[:, :1], ids[:, :1]) is None  # one token: nothing to cache
    assert len(engine.generate(ps, Sampling(n=1, temperature=0, top_p=1.0, max_new_tokens=3)).completion_ids) == len(ps)


# ------------------------------------------------------------------ the law under sampling


def _processed(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The exact distribution, in float64, that temperature then top-p sampling draws from."""
    p = (logits.double() / temperature).softmax(-1)
    if top_p < 1:
        ordered, index = p.sort()
        drop = ordered.cumsum(-1) <= 1 - top_p  # transformers' TopPLogitsWarper's rule
        p = torch.where(drop.scatter(-1, index, drop), 0.0, p)
        p = p / p.sum(-1, keepdim=True)
    return p


def _exact_law(model, prompt: list[int], eos: int, temperature: float, top_p: float) -> dict[tuple[int, ...], float]:
    """The probability of every completion of up to two tokens (one when the first is EOS)."""
    with torch.no_grad():
        first = _processed(model(torch.tensor([prompt])).logits[0, -1], temperature, top_p)
        support = first.nonzero().squeeze(1).tolist()
        second = model(torch.tensor([prompt + [a] for a in support])).logits[:, -1]
    law = {}
    for a, logits in zip(support, second):
        if a == eos:
            law[(a,)] = float(first[a])
            continue
        p = _processed(logits, temperature, top_p)
        law.update({(a, b): float(first[a] * p[b]) for b in p.nonzero().squeeze(1).tolist()})
    return law


def _tv(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def _threshold(law: dict, n: int) -> float:
    """A total-variation distance that the empirical law of n draws from ``law`` exceeds with
    probability at most FALSE_ALARM: E[TV] <= 1/2 sum_c sqrt(p_c (1 - p_c) / n) (Jensen, per
    category), and one draw moves TV by at most 1/n, so P(TV > E[TV] + t) <= exp(-2 n t^2)
    (McDiarmid) = FALSE_ALARM at t = sqrt(ln(1 / FALSE_ALARM) / (2 n))."""
    mean = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in law.values())
    return mean + math.sqrt(math.log(1 / FALSE_ALARM) / (2 * n))


@pytest.mark.parametrize("engine_name", ["transformers-static", "transformers"])
def test_sampling_follows_the_law_of_temperature_and_top_p(tokenizer, one_thread, engine_name):
    """4000 completions of two tokens at T = 0.5, top_p = 0.8 (26 completions possible): their
    empirical law lies within the FALSE_ALARM threshold of the exact one, for this engine and for
    today's. The test can fail: the law with the temperature ignored (T = 1) is farther from the
    exact one than both thresholds together, so such a sampler fails it with probability at least
    1 - FALSE_ALARM (the fixed seed makes each run the same)."""
    n, temperature, top_p = 4000, 0.5, 0.8
    model = varied_model(tokenizer)
    prompt, eos = prompts(len(tokenizer))[2], tokenizer.eos_token_id
    law = _exact_law(model, prompt, eos, temperature, top_p)
    careless = _exact_law(model, prompt, eos, 1.0, top_p)
    assert _tv(law, careless) > _threshold(law, n) + _threshold(careless, n)  # the test's power

    if engine_name == "transformers":
        engine = TransformersEngine(model, tokenizer, batch_size=n)
    else:
        engine = StaticCacheEngine(model, tokenizer, sampler_dtype=FLOAT32, batch_size=n)
    out = engine.generate([prompt], Sampling(n=n, temperature=temperature, top_p=top_p, max_new_tokens=2, seed=0))
    seen = {ids: count / n for ids, count in Counter(tuple(c) for c in out.completion_ids).items()}
    distance, bound = _tv(seen, law), _threshold(law, n)  # a completion outside the law's support counts in full
    outside = sum(share for ids, share in seen.items() if ids not in law)
    assert distance <= bound, f"total variation {distance:.4f} from the exact law, above {bound:.4f} ({outside:.3f} of the draws outside its support)"


# ------------------------------------------------------------------ log-probs


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_logprobs_are_the_trainers(tokenizer, one_thread, top_p):
    """The conftest's tiny model: each sampled token's log-prob (T = 0.7) equals forward_logprobs's
    at the same temperature within two float32 computations' bound (float_bounds.logprob_atol, at
    the larger magnitude of the log-probs and the scaled logits z / T); with top_p < 1 it is
    renormalised over the nucleus: the trainer's log-prob minus log(nucleus mass), never below it."""
    temperature = 0.7
    model = varied_model(tokenizer, initializer_range=0.02)
    ps = prompts(len(tokenizer))
    engine = StaticCacheEngine(model, tokenizer, sampler_dtype=FLOAT32, batch_size=8)
    out = engine.generate(ps, Sampling(n=3, temperature=temperature, top_p=top_p, max_new_tokens=8, seed=3))
    rows = [p for p in ps for _ in range(3)]
    assert [len(lp) for lp in out.logprobs] == [len(c) for c in out.completion_ids]
    packed = pack(rows, out.completion_ids, tokenizer.pad_token_id)
    with torch.no_grad():
        own, _ = forward_logprobs(model, packed, temperature=temperature)
        scaled = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits.abs().max() / temperature
    for i, completion in enumerate(out.completion_ids):
        got, want = torch.tensor(out.logprobs[i]), own[i, : len(completion)]
        atol = logprob_atol(len(tokenizer), max(float(scaled), float(torch.maximum(got.abs(), want.abs()).max())))
        if top_p == 1.0:
            err = float((got - want).abs().max())
            assert within(err, atol, f"static engine log-probs row {i}"), f"row {i}: {err:.2e} > {atol:.2e}"
        else:
            assert bool((got >= want - atol).all()), f"row {i}: a nucleus log-prob below the full distribution's"
    if top_p < 1.0:  # the nucleus renormalisation moved some log-probs up
        assert any(float((torch.tensor(out.logprobs[i]) - own[i, : len(c)]).max()) > 1e-3 for i, c in enumerate(out.completion_ids))


# ------------------------------------------------------------------ weight sync


@pytest.mark.parametrize("lora", [False, True])
def test_samples_from_the_new_weights_after_sync(tokenizer, one_thread, lora):
    """After an optimizer step the engine samples from its old copy until sync_weights, and from the
    new weights (LoRA merged) after it: its greedy completions are then the policy's own."""
    model = varied_model(tokenizer)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], init_lora_weights=False))
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=1, temperature=0, top_p=1.0, max_new_tokens=8)
    engine = StaticCacheEngine(model, tokenizer, sampler_dtype=FLOAT32, batch_size=8)
    before = engine.generate(ps, greedy).completion_ids
    assert before == TransformersEngine(model, tokenizer).generate(ps, greedy).completion_ids

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.2)
    logprobs, _ = forward_logprobs(model, pack(ps, before, tokenizer.pad_token_id))
    logprobs.sum().backward()  # a step that lowers the greedy completions' log-probs: they change
    optimizer.step()
    model.eval()

    after = TransformersEngine(model, tokenizer).generate(ps, greedy).completion_ids
    assert after != before
    assert engine.generate(ps, greedy).completion_ids == before  # not synced yet: the old copy
    engine.sync_weights(model)
    assert engine.generate(ps, greedy).completion_ids == after


def test_the_sampler_copy_is_in_the_sampler_dtype(tokenizer):
    model = varied_model(tokenizer)
    engine = StaticCacheEngine(model, tokenizer, sampler_dtype=resolve_sampler_dtype("bfloat16", torch.float32), batch_size=8)
    assert {p.dtype for p in engine.sampler.parameters()} == {torch.bfloat16}
    assert next(model.parameters()).dtype == torch.float32  # the policy is left as it was
    weight = model.get_input_embeddings().weight
    assert torch.equal(engine.sampler.get_input_embeddings().weight, weight.to(torch.bfloat16))


# ------------------------------------------------------------------ call sizes, the choice of engine


def test_call_sizes_from_memory():
    """A GPU call takes as many sequences as bytes_per_row says fit: the KV cache of every layer (keys
    and values) plus the larger of the prefill's activations and a decode step's logits."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    kv = 2 * 3 * 2 * 16 * 2 * 100  # keys and values x layers x kv heads x head dim x bfloat16 bytes x tokens
    assert bytes_per_row(config, torch.bfloat16, cache_len=100, prompt_len=10) == kv + 1000 * LOGIT_BYTES
    assert bytes_per_row(config, torch.bfloat16, cache_len=100, prompt_len=200) == kv + 200 * (5 * 64 + 4 * 128) * 2
    assert rows_that_fit(budget=10_000, per_row=1_000, rows=512) == 10
    assert rows_that_fit(budget=10**9, per_row=1_000, rows=512) == 512
    assert rows_that_fit(budget=10, per_row=1_000, rows=512) == 1


def test_engine_auto_without_vllm_is_static_on_a_gpu(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert choose_engine("auto", on_gpu=True) == ("transformers-static", "no vLLM; on a GPU, a sampler of its own with compiled decoding")
    assert resolve_engine("auto", on_gpu=False) == "transformers"
    assert choose_engine("transformers-static", on_gpu=False) == ("transformers-static", "as set")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert resolve_engine("auto", on_gpu=True) == "vllm"


# ------------------------------------------------------------------ a training run


def test_a_training_run_with_the_engine_corrects_for_its_sampler(small_vocab_model_dir, reward_file, tmp_path):
    """``podsrl train`` with rollout.engine = "transformers-static": the start-up line names the
    engine and its sampler dtype, and every step logs the gap between the engine's log-probs and the
    trainer's (float32 beside float32: near 0) and the importance correction's metrics."""
    from conftest import tiny_config_dict
    from podsrl.config import from_dict, to_toml
    from podsrl.run.metrics import read_jsonl
    from test_cli import run_cli

    cfg = from_dict(tiny_config_dict(small_vocab_model_dir, reward_file, **{
        "rollout.engine": "transformers-static", "rollout.sampler_dtype": "float32", "rollout.temperature": 0.8,
        "train.max_steps": 2, "eval.at_start": False, "train.checkpoint_every": 0}))  # fmt: skip
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg))
    code, out, err = run_cli(["train", str(path), "--out", str(tmp_path / "run"), "--no-plot"])
    assert code == 0, err
    assert "rollout engine transformers-static, sampler float32 (rollout.sampler_dtype = 'float32': as set)" in out, out
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["sampler_kl"] is not None and 0 <= row["sampler_kl"] < 1e-6, row
        assert row["is_ess"] == pytest.approx(1.0, abs=1e-4), row
