"""bench/peak.py (issue 66, item 3) without its long runs: the FLOP it counts are the products the
model computes (torch's own counter around podsrl's forward, backward and a ``generate`` call of a
tiny random Qwen2), hand numbers for attention and the micro-batches, a fraction against the peaks
of the precision each part runs in, and both modes at tiny sizes on this CPU (the GPU mode's code with
tiny random Qwen2 models): the JSON's structure, and fractions of the peak in (0, 1.5]; the pages
carry every committed run's tables (this bench's and bench/samplers.py's)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def peak():
    with script_module(ROOT / "bench" / "peak.py") as module:
        yield module


def _tiny_qwen2(peak):
    from transformers import AutoModelForCausalLM, Qwen2Config

    _, arch = peak.ARCHS["tiny-qwen2-b"]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen2Config(**arch)), peak.Shapes.of(arch)


def _product_flop(counter) -> int:
    """Every matrix product torch's FlopCounterMode saw (linear layers: mm, addmm)."""
    return int(sum(counter.get_flop_counts()["Global"].values()))


@pytest.mark.parametrize("shared", [True, False])
def test_the_counted_products_are_the_ones_the_forward_and_backward_compute(peak, shared):
    """3 rows of one prompt and 1 of another (5 tokens each), completions of 7: the layers' and output
    layer's FLOP of forward_flop equal the products podsrl's forward_logprobs makes, shared prompts
    or not, and its backward's are twice them."""
    from torch.utils.flop_counter import FlopCounterMode

    from podsrl.train.sequences import forward_logprobs, pack

    model, shapes = _tiny_qwen2(peak)
    packed = pack([[5, 6, 7, 8, 9]] * 3 + [[11, 12, 13, 14, 15]], [[20 + i for i in range(7)] for _ in range(4)], 0)
    with FlopCounterMode(display=False) as forward:
        logprobs, _ = forward_logprobs(model, packed, share_prompts=shared)
    with FlopCounterMode(display=False) as backward:
        logprobs.sum().backward()
    flop = peak.forward_flop(shapes, prompt=5, completion=7, rows=4, prompts=2, shared=shared)
    assert _product_flop(forward) == flop.layers + flop.output
    assert _product_flop(backward) == 2 * (flop.layers + flop.output)


def test_the_counted_products_are_the_ones_a_sampling_call_computes(peak):
    """generate on 3 prompts of 6 tokens, exactly 9 new tokens each: the prefill, 8 decode steps and 9
    logits a row, as sampling_flop counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    model, shapes = _tiny_qwen2(peak)
    ids = torch.randint(3, shapes.vocab - 1, (3, 6), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model.eval().generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=9, min_new_tokens=9, pad_token_id=0,
                                    eos_token_id=shapes.vocab - 1)  # fmt: skip
    assert out.shape == (3, 15)
    flop = peak.sampling_flop(shapes, prompt=6, generated=9, rows=3, prompts=3)
    assert _product_flop(counter) == flop.layers + flop.output


def test_the_samplers_prompts_differ_in_length_and_its_completions_hold_theirs(peak):
    """The sampler's prompts are P - 4 to P + 4 tokens, every offset before any repeats (a call of 2 or
    more is left-padded, as a training step's); bench/_fixed_length.py gives every row its
    max_new_tokens where the model would stop at an EOS, by that EOS's scores alone: in generate, and
    in the transformers engine (whose decode loop on a CPU is its own) through its processors."""
    lengths = peak.prompt_lengths(40, 16)
    assert set(lengths[:9]) == set(range(36, 45)) and lengths[0] != lengths[1]
    from _fixed_length import SuppressEos, hold_length

    model, shapes = _tiny_qwen2(peak)
    model.eval()
    ids = torch.randint(3, shapes.vocab - 1, (3, 6), generator=torch.Generator().manual_seed(0))
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False, pad_token_id=0)
    stop = int(model.generate(ids, eos_token_id=shapes.vocab - 1, **kwargs)[0, 6])  # row 0's first greedy token
    assert model.generate(ids, eos_token_id=[stop], **kwargs)[0, 7:].eq(0).all(), "without it row 0 ends at once"
    plain = hold_length(model)
    try:
        held = model.generate(ids, eos_token_id=[stop], **kwargs)
    finally:
        model.generate = plain
    assert held.shape == (3, 13) and held[:, 6:].ne(stop).all()
    # the transformers engine (its own decode loop on a CPU, not generate): held by its processors
    import types

    from podsrl.engines import Sampling
    from podsrl.engines.hf import TransformersEngine

    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=stop, batch_decode=lambda rows, **kw: ["" for _ in rows])
    engine, greedy = TransformersEngine(model, tok, batch_size=3), Sampling(n=1, temperature=0, top_p=1.0, max_new_tokens=7)
    assert len(engine.generate(ids.tolist(), greedy).completion_ids[0]) == 1, "without it row 0 ends at once"
    peak._FixedLength.hold_engine(engine)
    assert [len(c) for c in engine.generate(ids.tolist(), greedy).completion_ids] == [7, 7, 7]
    scores = torch.zeros(2, 5)
    assert SuppressEos([1, 3])(None, scores) is scores and scores.isinf().sum() == 4


def test_attention_and_the_layers_by_hand(peak):
    """hidden 4, intermediate 8, vocabulary 10, 2 layers, 2 heads of 2, 1 KV head: D = 2 x (4 x (4 + 2 x 2)
    + 4 x 4 + 3 x 4 x 8) = 2 x 144 = 288. One prompt of 3 tokens shared by 2 rows of 2 completion
    tokens: 3 + 4 tokens through the layers, context 6 (prompt: 1 + 2 + 3) + 2 x (2 x 3 + 3) = 24,
    logits 1 + 2 x 1 = 3."""
    s = peak.Shapes(hidden=4, intermediate=8, vocab=10, layers=2, heads=2, kv_heads=1, head_dim=2)
    assert s.dense == 288
    assert [p[0] for p in s.products()] == ["q", "k", "gate", "down", "output"]  # v is k's shape, o q's (d_q = hidden), up gate's
    f = peak.forward_flop(s, prompt=3, completion=2, rows=2)
    assert (f.layers, f.attention, f.output) == (2 * 288 * 7, 4 * 2 * 4 * 24, 2 * 4 * 10 * 3)
    unshared = peak.forward_flop(s, prompt=3, completion=2, rows=2, shared=False)  # each row: 5 tokens, context 15
    assert (unshared.layers, unshared.attention, unshared.output) == (2 * 288 * 10, 4 * 2 * 4 * 30, 2 * 4 * 10 * 4)
    g = peak.sampling_flop(s, prompt=3, generated=2, rows=2, prompts=1)  # one prefill, one decode step a row (context 4), 2 logits a row
    assert (g.layers, g.attention, g.output) == (2 * 288 * 5, 4 * 2 * 4 * (6 + 2 * 4), 2 * 4 * 10 * 4)


def test_micro_batches_follow_the_updates_order(peak):
    """GRPO(16) with B = 4 in micro-batches of 16 rows: one prompt each; PODS(16, 4): the 4 groups in one."""
    prompts = [[p, p + 1] for p in range(4)]
    grpo = [p for p in prompts for _ in range(16)]
    pods = [p for p in prompts for _ in range(4)]
    assert peak.micro_batches(grpo, [[1, 2]] * 64, 16) == [(1, 16)] * 4
    assert peak.micro_batches(pods, [[1, 2]] * 16, 16) == [(4, 16)]


def test_a_fraction_takes_each_part_at_its_precisions_peak(peak):
    """1e9 FLOP of layers and attention at a 100 GFLOP/s peak (0.01 s) and 1e9 of output layer at 50
    (0.02 s), measured in 0.06 s: a fraction 0.5."""
    f = peak.Flop(layers=0.6e9, attention=0.4e9, output=1e9)
    assert peak.fraction(f, 0.06, 100.0, 50.0) == pytest.approx(0.5)
    assert peak.fraction(f, 0.06, None, 50.0) is None
    figures = peak.update_figures({"seconds": {"forward": 0.06, "backward": 0.12, "optimizer": 0.01, "rest": 0.01, "update": 0.2}}, f, 100,
                                  {"float32": {"gflops": 50.0}, "bfloat16": {"gflops": 100.0}}, mixed=True)  # fmt: skip
    assert figures["fraction"]["forward"] == pytest.approx(0.5) and figures["fraction"]["backward"] == pytest.approx(0.5)
    assert figures["fraction"]["update"] == pytest.approx(0.09 / 0.2)
    assert figures["tokens_per_second"]["optimizer"] == pytest.approx(10000)


def _check_report(data: dict, *, mode: str, models: set[str], updates: int, engines: set[str]) -> None:
    assert data["mode"] == mode and set(data["models"]) == models
    assert data["machine"]["native_bf16"] in (True, False) and data["machine"]["bf16_reason"]
    for name, entry in data["models"].items():
        assert set(entry["peak"]) == {"float32", "bfloat16"}
        for p, v in entry["peak"].items():  # the higher of the measurements before and after the phases
            assert v["gflops"] == max(entry["peak_before"][p]["gflops"], entry["peak_after"][p]["gflops"])
        assert entry["peak"]["bfloat16"]["emulated"] is (not data["machine"]["native_bf16"])
        assert all(p["gflops"] > 0 for precision in entry["peak"].values() for p in precision["products"])
        assert len(entry["update"]) == updates, name
        for row in entry["update"]:
            assert set(row["seconds"]) == {"forward", "backward", "optimizer", "rest", "update"}
            assert row["flop"]["backward"] == 2 * row["flop"]["forward"]
            for phase, value in row["fraction"].items():
                assert 0 < value <= 1.5, (name, row["label"], phase, value)
            # the peak beside: a probe before the first timed update and after each, each round against the higher of its two
            assert len(row["beside"]) == len(row["rounds"]) and set(row["fraction_beside"]) == {"forward", "backward", "update"}
            assert all(0 < value <= 1.5 for value in row["fraction_beside"].values()), row["fraction_beside"]
        assert not entry["skipped"] or entry["skipped"] == [{"part": "sampler vllm", "why": "vLLM is not installed here, or the model is not on disk"}]
    sampled = [entry for entry in data["models"].values() if entry["sampler"]]
    assert len(sampled) == 1
    assert {r["engine"] for r in sampled[0]["sampler"]} == engines
    for r in sampled[0]["sampler"]:
        assert r["tokens"] == r["rollouts"] * r["completion"]  # every completion its full length
        assert 0 < r["fraction"] <= 1.5
        assert r["decode_gflops"] > 0 and r["of_decode_rate"] == pytest.approx(r["gflops"] / r["decode_gflops"])
        assert len(r["beside_gflops"]) == data["sizes"]["sampler_repeats"] and 0 < r["fraction_beside"] <= 1.5


@pytest.mark.usefixtures("one_thread")
def test_the_gpu_modes_code_runs_on_the_cpu_at_a_tiny_size(peak, tmp_path):
    """--gpu --tiny: two tiny random Qwen2 models, GRPO(16) and PODS(16, 4) under mixed precision, the
    samplers at two sizes; the JSON as the GPU writes it (peak memory: None off a GPU)."""
    out = tmp_path / "peak.json"
    data = peak.main(["--gpu", "--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(data))
    _check_report(data, mode="gpu-tiny", models={"tiny-qwen2-a", "tiny-qwen2-b"}, updates=2,
                  engines={"transformers", "transformers-static", "transformers-static-gqa"})
    for entry in data["models"].values():
        assert [(r["label"], r["rows"], r["n"], r["m"], r["mixed_precision"]) for r in entry["update"]] == [
            ("GRPO(16)", 16, 16, 16, True), ("PODS(16, 4)", 4, 16, 4, True)]  # fmt: skip
        assert all(r["peak_mib"] is None for r in entry["update"])
    assert {r["rollouts"] for r in data["models"]["tiny-qwen2-a"]["sampler"]} == {4, 8}
    tables = peak.results_tables(json.loads(out.read_text()))  # --table FILE: docs/results.md's tables of a saved run
    assert ("| update phase | precision | GRPO(16), 8+16: tokens/s | of peak | of the peak beside | PODS(16, 4), 8+16: tokens/s | of peak "
            "| of the peak beside |") in tables  # fmt: skip
    assert tables.count("| whole update | bfloat16 autocast |") == 2 and "| sampler | precision | 4 x 8: tokens/s | of peak | of the peak beside |" in tables
    assert "The peak beside each timed round" in tables and "| peak memory (MiB) |" not in tables


@pytest.mark.usefixtures("one_thread")
def test_the_cpu_mode_runs_at_a_quick_size(peak, tmp_path):
    """--quick: the update at two lengths with mixed precision off and on, the engines side by side."""
    data = peak.main(["--quick", "--out", str(tmp_path / "peak.json")])
    _check_report(data, mode="cpu-quick", models={"tiny-llama"}, updates=4, engines={"transformers", "transformers-static"})
    rows = data["models"]["tiny-llama"]["update"]
    assert [(r["completion"], r["mixed_precision"]) for r in rows] == [(8, False), (8, True), (16, False), (16, True)]
    assert rows[0]["precision"] == {"compute": "float32", "output": "float32"} and rows[1]["precision"]["compute"] == "bfloat16"


@pytest.mark.usefixtures("one_thread")
def test_the_update_can_be_timed_in_float32_alone(peak, tmp_path):
    """--update-precision float32: no emulated bfloat16 update (minutes at training rows on a CPU
    without native bfloat16); --rows sets the update's rows."""
    data = peak.main(["--quick", "--update-precision", "float32", "--rows", "3", "--engines", "transformers", "--out", str(tmp_path / "p.json")])
    _check_report(data, mode="cpu-quick", models={"tiny-llama"}, updates=2, engines={"transformers"})
    rows = data["models"]["tiny-llama"]["update"]
    assert [(r["completion"], r["mixed_precision"], r["rows"]) for r in rows] == [(8, False, 3), (16, False, 3)]
    assert "bfloat16 autocast" not in peak.results_tables(data)


def test_the_peaks_and_the_update_alone_record_the_allocators_tunables(peak, tmp_path, monkeypatch):
    """--engines none: no sampler; the JSON records GLIBC_TUNABLES (the CLI sets podsrl.hostmem.KEPT)
    and the tables' first line shows it, where set; unset, neither."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")  # read from the environment, acts only at a start
    data = peak.main(["--quick", "--update-precision", "float32", "--engines", "none", "--out", str(tmp_path / "p.json")])
    assert data["models"]["tiny-llama"]["sampler"] == [] and len(data["models"]["tiny-llama"]["update"]) == 2
    assert data["machine"]["glibc_tunables"] == "glibc.malloc.trim_threshold=1"
    assert ", GLIBC_TUNABLES=glibc.malloc.trim_threshold=1; " in peak.results_tables(data).splitlines()[0]
    data["machine"]["glibc_tunables"] = None
    assert "GLIBC_TUNABLES" not in peak.results_tables(data)


@pytest.mark.usefixtures("one_thread")
def test_the_samplers_alone_against_the_peak_and_their_decode_products(peak, tmp_path):
    """--update-precision none: the peaks and the samplers, no update; each sampler row beside the rate
    of a decode step's products at its rollouts, in a table of its own (older runs' tables unchanged)."""
    data = peak.main(["--quick", "--update-precision", "none", "--engines", "transformers", "--sampler-rollouts", "2,4",
                      "--out", str(tmp_path / "p.json")])  # fmt: skip
    _check_report(data, mode="cpu-quick", models={"tiny-llama"}, updates=0, engines={"transformers"})
    rows = data["models"]["tiny-llama"]["sampler"]
    assert sorted({r["rollouts"] for r in rows}) == [2, 4]
    tables = peak.results_tables(data)
    assert "| update phase |" not in tables
    assert "| sampler | call | GFLOP/s | a decode step's products at its rollouts: GFLOP/s | of that rate |" in tables
    assert tables.count("| transformers | ") == len(rows) + 1  # one row per call, and the engine's row of the first table


@pytest.mark.usefixtures("one_thread")
def test_a_profiled_call_says_where_its_time_goes(peak, tmp_path):
    """--profile 2x8: one call per engine under torch's profiler, its operators by self CPU time
    (shares of the profiled total, largest first: a matrix product among them), in the tables."""
    data = peak.main(["--quick", "--update-precision", "none", "--engines", "transformers", "--sampler-rollouts", "2", "--lengths", "8",
                      "--profile", "2x8", "--out", str(tmp_path / "p.json")])  # fmt: skip
    (prof,) = data["models"]["tiny-llama"]["profile"]
    assert (prof["engine"], prof["rollouts"], prof["completion"]) == ("transformers", 2, 8)
    shares = [o["share"] for o in prof["ops"]]
    assert 0 < len(shares) <= peak.PROFILE_OPS and shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-9
    products = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm", "mkldnn::_linear_pointwise")  # the last: podsrl/engines/linear.py
    assert any(o["op"] in products for o in prof["ops"]), prof["ops"]
    assert "Where a call of 2 x 8 tokens goes, **transformers**" in peak.results_tables(data)
    with pytest.raises(SystemExit):
        peak.main(["--gpu", "--tiny", "--profile", "2x8"])
    with pytest.raises(SystemExit):
        peak.main(["--quick", "--profile", "2by8"])


def test_the_fractions_are_against_the_higher_of_two_peak_measurements(peak):
    """A float32 peak of 50 GFLOP/s before the phases and 100 after: the fractions measured against 50
    halve; a bfloat16 peak lower after keeps its first figure. A float32 update row recomputed from its
    seconds and FLOP; a sampler row from its GFLOP/s; the tables say both measurements."""
    f = peak.Flop(layers=0.6e9, attention=0.4e9, output=1e9)
    measured = {"seconds": {"forward": 0.06, "backward": 0.12, "optimizer": 0.01, "rest": 0.01, "update": 0.2}}
    first = {"float32": {"gflops": 50.0, "emulated": False}, "bfloat16": {"gflops": 40.0, "emulated": True}}
    row = {"label": "2 rows", "prompt": 4, "completion": 8, "tokens": 100, "mixed_precision": False, "peak_mib": None, **measured,
           **peak.update_figures(measured, f, 100, first, mixed=False)}  # fmt: skip
    sampled = {"engine": "vllm", "dtype": "float32", "rollouts": 8, "completion": 8, "gflops": 20.0, "fraction": 0.4, "tokens_per_second": 1.0}
    entry = {"peak": first, "update": [row], "sampler": [sampled], "skipped": [], "weights": "random"}
    before = row["fraction"]["forward"]
    peak.settle_peaks(entry, {"float32": {"gflops": 100.0, "emulated": False}, "bfloat16": {"gflops": 30.0, "emulated": True}})
    assert entry["peak"]["float32"]["gflops"] == 100.0 and entry["peak"]["bfloat16"]["gflops"] == 40.0
    assert row["fraction"]["forward"] == pytest.approx(before / 2) and sampled["fraction"] == pytest.approx(0.2)
    data = {"machine": {"cpu": "cpu", "threads": 1, "torch": "t", "native_bf16": False}, "date": "2026-11-29", "command": "c",
            "models": {"m": entry}}  # fmt: skip
    assert "float32 50.0 and 100.0; bfloat16 40.0 and 30.0" in peak.results_tables(data)


def test_each_round_is_against_the_peak_beside_it(peak):
    """Beside.rounds: a round's peak beside it is the higher of the probes on either side, per precision.
    fractions_beside: each round against its own peaks, the median over the rounds: a round as slow as
    the machine was (the same fraction at half the peak) counts as the others do, where the run's peak
    would halve it."""
    probes = [{"float32": 100.0}, {"float32": 50.0}, {"float32": 40.0}, {"float32": 100.0}]
    assert peak.Beside.rounds(probes) == [{"float32": 100.0}, {"float32": 50.0}, {"float32": 100.0}]
    f = peak.Flop(layers=1e9, attention=0.0, output=1e9)  # 0.02 s at 100 GFLOP/s; its backward 0.04
    rounds = [{"forward": 0.04, "backward": 0.08, "update": 0.12}, {"forward": 0.08, "backward": 0.16, "update": 0.24},
              {"forward": 0.04, "backward": 0.08, "update": 0.15}]  # fmt: skip
    beside = peak.fractions_beside({"rounds": rounds, "beside": peak.Beside.rounds(probes)}, f, mixed=False)
    assert beside["forward"] == pytest.approx(0.5) and beside["backward"] == pytest.approx(0.5)
    assert beside["update"] == pytest.approx(0.5)  # rounds 0.5, 0.5 and 0.4
    mixed = peak.fractions_beside({"rounds": rounds[:1], "beside": [{"bfloat16": 200.0, "float32": 100.0}]}, f, mixed=True)
    assert mixed["forward"] == pytest.approx((0.005 + 0.01) / 0.04)  # the layers at bfloat16's peak, the output layer at float32's
    measured = {"seconds": {"forward": 0.04, "backward": 0.08, "optimizer": 0.0, "rest": 0.0, "update": 0.12}, "rounds": rounds[:1],
                "beside": [{"float32": 100.0}]}  # fmt: skip
    figures = peak.update_figures(measured, f, 10, {"float32": {"gflops": 200.0}}, mixed=False)
    assert figures["fraction"]["forward"] == pytest.approx(0.25) and figures["fraction_beside"]["forward"] == pytest.approx(0.5)
    assert "fraction_beside" not in peak.update_figures({"seconds": measured["seconds"]}, f, 10, {"float32": {"gflops": 200.0}}, mixed=False)


@pytest.mark.usefixtures("one_thread")
def test_the_rounds_are_probed_before_and_after_each(peak, tmp_path, monkeypatch):
    """One probe before a phase's first timed round and one after each (none around a warm-up): with
    probes that read 50, 10, 40, 20, 30, 60, then 50, 10, 40, 20, 30, each update of two rounds is
    against [50, 40] and [30, 60]; the sampler's two rounds of two lengths (alternating within a round)
    against [50, 40] (8 tokens) and [40, 30] (16)."""
    readings = iter([50, 10, 40, 20, 30, 60, 50, 10, 40, 20, 30])
    monkeypatch.setattr(peak.Beside, "probe", lambda self, precisions: dict.fromkeys(precisions, float(next(readings))))
    data = peak.main(["--quick", "--update-precision", "float32", "--engines", "transformers", "--sampler-rollouts", "2", "--repeats", "2",
                      "--out", str(tmp_path / "p.json")])  # fmt: skip
    entry = data["models"]["tiny-llama"]
    assert [[b["float32"] for b in r["beside"]] for r in entry["update"]] == [[50.0, 40.0], [30.0, 60.0]]
    rows = {r["completion"]: r for r in entry["sampler"]}
    assert rows[8]["beside_gflops"] == [50.0, 40.0] and rows[16]["beside_gflops"] == [40.0, 30.0]
    assert rows[8]["fraction_beside"] == pytest.approx(statistics.median(rows[8]["flop"] / s / 1e9 / b for s, b in zip(rows[8]["call_seconds"], [50.0, 40.0])))


def test_the_decode_rate_weighs_each_product_by_its_flop(peak, monkeypatch):
    """hidden 4, intermediate 8, vocabulary 10, 2 layers, 2 heads of 2, 1 KV head, each product timed at
    K x N GFLOP/s: each takes 2M x count / 1e9 s (7 a layer, 2 layers, and the output layer: 15 of them),
    their FLOP are 2M (2 x 144 + 40): the rate is 328 / 15 GFLOP/s, each distinct shape timed once at M."""
    timed = []

    def fake(m, k, n, dtype, device, kernel="F.linear", **_):
        timed.append((m, k, n))
        return float(k * n) if kernel == "F.linear" else 0.5 * k * n  # the best kernel's rate counts

    monkeypatch.setattr(peak, "product_gflops", fake)
    monkeypatch.setattr(peak, "kernels_for", lambda device: ["oneDNN", "F.linear"])
    s = peak.Shapes(hidden=4, intermediate=8, vocab=10, layers=2, heads=2, kv_heads=1, head_dim=2)
    rate = peak.decode_rate(s, 3, "float32", torch.device("cpu"))
    assert rate["gflops"] == pytest.approx(328 / 15) and rate["rows"] == 3
    assert sorted(timed) == [shape for shape in [(3, 4, 2), (3, 4, 4), (3, 4, 8), (3, 4, 10), (3, 8, 4)] for _ in range(2)]  # each kernel once


def test_a_product_is_timed_with_each_kernel_and_the_best_counts(peak, monkeypatch):
    """best_product: the faster kernel's rate and name, every kernel's rate; a kernel that refuses the
    dtype (oneDNN's bfloat16 on a CPU without avx512bw) is left out, F.linear's errors are not; on a CPU
    whose torch has oneDNN's linear ops both kernels time the real product, which is F.linear's."""
    def fake(m, k, n, dtype, device, kernel="F.linear", **_):
        if kernel == "oneDNN" and dtype == torch.bfloat16:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")
        return {"F.linear": 10.0, "oneDNN": 12.0}[kernel]

    with monkeypatch.context() as m:
        m.setattr(peak, "product_gflops", fake)
        m.setattr(peak, "kernels_for", lambda device: list(peak.KERNELS))
        assert peak.best_product(4, 8, 8, torch.float32, torch.device("cpu")) == {"gflops": 12.0, "kernel": "oneDNN", "kernels": {"F.linear": 10.0, "oneDNN": 12.0}}
        assert peak.best_product(4, 8, 8, torch.bfloat16, torch.device("cpu")) == {"gflops": 10.0, "kernel": "F.linear", "kernels": {"F.linear": 10.0}}
        m.setattr(peak, "product_gflops", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("F.linear broke")))
        with pytest.raises(RuntimeError, match="F.linear broke"):
            peak.best_product(4, 8, 8, torch.float32, torch.device("cpu"))
    from podsrl.engines.linear import available

    assert peak.kernels_for(torch.device("cpu")) == (["F.linear", "oneDNN"] if available() else ["F.linear"])
    assert peak.kernels_for(torch.device("meta")) == ["F.linear"]  # not a CPU: cuBLAS's F.linear alone
    with pytest.raises(ValueError, match="kernel must be one of"):
        peak.product_gflops(2, 4, 4, torch.float32, torch.device("cpu"), kernel="mkl")
    if available():
        rate = peak.best_product(8, 16, 32, torch.float32, torch.device("cpu"))
        assert set(rate["kernels"]) == {"F.linear", "oneDNN"} and rate["gflops"] == max(rate["kernels"].values()) > 0


def test_the_peaks_line_says_each_kernels_best_product(peak):
    """A run that timed each kernel prints each one's best product per precision below the peak; a run
    before it (no ``kernels``) prints nothing more, so the committed tables stay as they were."""
    products = [{"product": "q", "M": 8, "K": 4, "N": 4, "gflops": 12.0, "kernel": "oneDNN", "kernels": {"F.linear": 10.0, "oneDNN": 12.0}},
                {"product": "o", "M": 8, "K": 4, "N": 4, "gflops": 11.0, "kernel": "F.linear", "kernels": {"F.linear": 11.0, "oneDNN": 9.0}}]  # fmt: skip
    peaks = {"float32": {"gflops": 12.0, "emulated": False, "products": products},
             "bfloat16": {"gflops": 2.0, "emulated": True, "products": [{"gflops": 2.0, "kernels": {"F.linear": 2.0}}]}}  # fmt: skip
    assert peak.kernel_bests(peaks) == {"float32": {"F.linear": 11.0, "oneDNN": 12.0}, "bfloat16": {"F.linear": 2.0}}
    entry = {"peak": peaks, "update": [], "sampler": [], "skipped": []}
    data = {"machine": {"cpu": "cpu", "threads": 1, "torch": "t", "native_bf16": False}, "date": "2026-11-30", "command": "c", "models": {"m": entry}}
    assert "The best product with each kernel: float32 F.linear 11.0, oneDNN 12.0 GFLOP/s; bfloat16 F.linear 2.0 GFLOP/s." in peak.results_tables(data)
    for p in peaks.values():
        for r in p["products"]:
            r.pop("kernels")
    assert peak.kernel_bests(peaks) == {} and "each kernel" not in peak.results_tables(data)


def test_vllms_kv_cache_holds_the_whole_call(peak):
    """SmolLM2-135M in float32: keys and values of 30 layers x 3 KV heads x 64 = 46080 bytes a token; 256
    rollouts of 40 + 256 tokens, a quarter more: 4.07 GiB; a small call keeps bench/samplers.py's 2."""
    s = peak.Shapes.of(peak.SMOLLM2_135M)
    assert peak.kv_cache_gib(s, rollouts=256, max_len=296) == pytest.approx(256 * 296 * 46080 * 1.25 / 2**30)
    assert peak.kv_cache_gib(s, rollouts=8, max_len=296) == 2.0


def test_a_budget_too_short_skips_the_parts_and_says_so(peak, tmp_path):
    data = peak.main(["--gpu", "--tiny", "--budget", "0.001", "--out", str(tmp_path / "peak.json")])
    for entry in data["models"].values():
        assert entry["skipped"] == [{"part": entry["skipped"][0]["part"], "why": "budget: under 20 s of --budget left"}]
        assert entry["skipped"][0]["part"].endswith("every part") and not entry["update"]
    assert "nothing measured" in peak.headline(data)


def test_every_committed_peak_run_is_in_the_results_page_as_its_tables(peak):
    """A committed run (results/peak/*.json) appears in docs/results.md exactly as ``--table`` prints
    it, so the page's figures cannot drift from the file (issue 68)."""
    page = (ROOT / "docs" / "results.md").read_text()
    for path in sorted((ROOT / "results" / "peak").glob("*.json")):
        tables = peak.results_tables(json.loads(path.read_text()))
        assert tables in page, f"docs/results.md lacks {path.name}'s tables: paste `python bench/peak.py --table {path.relative_to(ROOT)}`"


def test_every_committed_samplers_run_is_in_the_engines_page_as_its_table():
    """bench/samplers.py's committed runs (results/samplers/*.json) appear in docs/engines.md exactly as
    ``--table`` prints them."""
    from conftest import committed_tables_in_page

    committed_tables_in_page("samplers", "doc_table", "samplers", "engines.md")


def test_a_failing_attention_way_is_recorded_and_the_sampler_still_runs(peak, monkeypatch, tmp_path):
    """bench/peak.py's attention part (bench/attention.py's ways) failing, e.g. a kernel refusing a
    mask on a GPU, is recorded as skipped with its reason; the rest of the run goes on (the one
    GPU call must not lose the samplers to it)."""
    import attention

    def refuse(*args, **kwargs):
        raise AssertionError("grouped differs from copied by 1.0e+00")

    monkeypatch.setattr(attention, "measure", refuse)
    data = peak.main(["--gpu", "--tiny", "--update-precision", "none", "--engines", "transformers", "--sampler-rollouts", "4", "--out-dir", str(tmp_path)])
    entry = data["models"]["tiny-qwen2-a"]
    assert "attention" not in entry and entry["sampler"]
    assert any(s["part"] == "tiny-qwen2-a: attention" and "grouped differs" in s["why"] for s in entry["skipped"])


def test_every_committed_micro_batches_run_is_in_the_results_page_as_its_table():
    """bench/micro_batches.py's committed runs (results/micro-batches/*.json) appear in docs/results.md
    exactly as ``--table`` prints them."""
    from conftest import committed_tables_in_page

    assert committed_tables_in_page("micro_batches", "table", "micro-batches", "results.md"), "no committed run of bench/micro_batches.py"


@pytest.mark.usefixtures("one_thread")
def test_the_micro_batches_bench_times_three_ways_and_prints_its_table(tmp_path):
    """bench/micro_batches.py --quick: each way's rounds, the JSON as written, the table's ratios to rows-16."""
    from conftest import script_module

    with script_module(ROOT / "bench" / "micro_batches.py") as bench:
        data = bench.main(["--quick", "--out", str(tmp_path / "mb.json")])
        assert json.loads((tmp_path / "mb.json").read_text()) == json.loads(json.dumps(data))
        assert set(data["seconds"]) == set(bench.WAYS) and all(len(t) == 1 and t[0] > 0 for t in data["seconds"].values())
        assert data["rows"] == 32 and "| rows-16 |" in bench.table(data) and "| 1.00x |" in bench.table(data)


@pytest.mark.usefixtures("one_thread")
def test_the_mixed_precision_bench_writes_its_json_after_each_length(tmp_path, monkeypatch):
    """bench/mixed_precision.py --quick --out: the JSON holds each completion length's medians and
    ratio, written as each is measured (a run stopped at its limit keeps what it measured)."""
    from conftest import script_module

    written = []
    with script_module(ROOT / "bench" / "mixed_precision.py") as bench:
        update = bench.time_updates

        def recording(*args, measured, **kwargs):
            return update(*args, measured=lambda rows: (measured(rows), written.append(json.loads((tmp_path / "mp.json").read_text()))), **kwargs)

        monkeypatch.setattr(bench, "time_updates", recording)
        bench.main(["--quick", "--out", str(tmp_path / "mp.json")])
    assert [[r["completion"] for r in w["sizes"]] for w in written] == [[64], [64, 256]]
    assert all(r["ratio"] == r["bf16_s"] / r["float32_s"] for r in written[-1]["sizes"]) and written[-1]["machine"]["device"] == "cpu"


def test_the_mixed_precision_bench_measures_the_samplers_gap_as_the_weights_move(small_vocab_model_dir):
    """bench/mixed_precision.py --gap-after-updates at a tiny size (the tiny test model, 2 prompts, one
    completion each to update on and one to score, 6 tokens, one update): a row before the update and
    one after, each with the three pairs of forwards' mean |d| and k3 over the scored tokens; the
    forwards differ (every figure above 0) and the update moved the weights (the float32 forward's
    log-probs changed)."""
    import math

    from conftest import script_module

    with script_module(ROOT / "bench" / "mixed_precision.py") as bench:
        model, _, _, tokenizer = bench._model(str(small_vocab_model_dir), "cpu", 0)
        rows = bench.gap_after_updates(model, tokenizer, 1, questions=2, samples=1, max_new_tokens=6)
    assert [r["updates"] for r in rows] == [0, 1] and all(r["tokens"] > 0 for r in rows)
    for row in rows:
        for label, _, _ in bench.GAP_PAIRS:
            assert 0 < row[label]["mean_abs"] < 1 and 0 <= row[label]["k3"] and math.isfinite(row[label]["k3"]), (row["updates"], label)
    assert rows[0]["update bf16 - sampler float32"] != rows[1]["update bf16 - sampler float32"]


def test_the_committed_gap_run_is_in_the_results_page_as_its_table():
    """results/mixed-precision/gap-*.json appears in docs/results.md as ``--gap-table`` prints it."""
    from conftest import script_module

    page = (ROOT / "docs" / "results.md").read_text()
    paths = sorted((ROOT / "results" / "mixed-precision").glob("gap-*.json"))
    assert paths
    with script_module(ROOT / "bench" / "mixed_precision.py") as bench:
        for path in paths:
            assert bench.gap_table(json.loads(path.read_text())) in page, f"paste `python bench/mixed_precision.py --gap-table {path.relative_to(ROOT)}`"


def test_the_committed_update_timings_are_in_the_results_page_as_their_table():
    """results/mixed-precision/update-*.json (bench/mixed_precision.py's timing runs) appear in
    docs/results.md row for row as ``--time-table`` prints them, and each row's ratio and speed-up
    follow from its medians (those of ``--attention-bf16``'s third side too)."""
    from conftest import script_module

    page = (ROOT / "docs" / "results.md").read_text()
    paths = sorted((ROOT / "results" / "mixed-precision").glob("update-*.json"))
    assert paths
    with script_module(ROOT / "bench" / "mixed_precision.py") as bench:
        for path in paths:
            data = json.loads(path.read_text())
            for size in data["sizes"]:
                assert (size["float32_s"], size["bf16_s"]) == (statistics.median(size["float32_all"]), statistics.median(size["bf16_all"]))
                assert size["ratio"] == size["bf16_s"] / size["float32_s"]
                if "bf16_attn_bf16_s" in size:  # --attention-bf16: the third side, in the same rounds
                    assert len(size["bf16_attn_bf16_all"]) == len(size["bf16_all"]) == len(size["float32_all"])
                    assert size["bf16_attn_bf16_s"] == statistics.median(size["bf16_attn_bf16_all"])
                    assert size["ratio_attn_bf16"] == size["bf16_attn_bf16_s"] / size["float32_s"]
            for line in bench.time_table([data]).splitlines()[2:]:
                assert line in page, f"paste `python bench/mixed_precision.py --time-table {path.relative_to(ROOT)}`: {line}"
