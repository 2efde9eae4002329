"""podsrl/engines/draw.py: one token a row by inverse transform. Its law against the exact
probabilities (tests that can fail: mass at every block boundary, a vocabulary that is not a multiple
of a block, excluded tokens), never an excluded token, and a clear stop on probabilities that are not
finite. The law through ``generate`` is tests/test_static_engine.py's, for both transformers engines."""

from __future__ import annotations

import math

import pytest
import torch

from podsrl.engines.draw import BLOCK, CPU_SLICE_BYTES, DrawTokens, draw

FALSE_ALARM = 1e-6  # each law test's chance of failing a correct draw (McDiarmid's bound below)


def _threshold(p: torch.Tensor, n: int) -> float:
    """A total-variation distance that the empirical law of n draws from ``p`` exceeds with probability
    at most FALSE_ALARM (as tests/test_static_engine.py's ``_threshold``: Jensen for the mean, then
    McDiarmid, one draw moving TV by at most 1/n)."""
    mean = 0.5 * float((p * (1 - p) / n).sqrt().sum())
    return mean + math.sqrt(math.log(1 / FALSE_ALARM) / (2 * n))


def _empirical(scores: torch.Tensor, draws: int, rows: int = 10_000) -> torch.Tensor:
    """The share of each token over ``draws`` draws of the one-row ``scores`` [V], in calls of ``rows``."""
    counts = torch.zeros(scores.shape[-1], dtype=torch.float64)
    for _ in range(draws // rows):
        tokens = draw(scores.expand(rows, -1).contiguous())
        counts += torch.bincount(tokens, minlength=scores.shape[-1]).double()
    return counts / counts.sum()


def _boundary_scores(vocab: int, mass: dict[int, float]) -> torch.Tensor:
    scores = torch.full((vocab,), float("-inf"))
    for token, p in mass.items():
        scores[token] = math.log(p)
    return scores


def test_mass_at_every_block_boundary_is_drawn_at_its_rate(one_thread):
    """All the mass on the first and last entries of blocks (and the vocabulary's last, in a padded
    block): an off-by-one within a block or across blocks moves 0.05-0.3 between neighbours, far
    beyond the threshold (about 0.015 at 100,000 draws)."""
    torch.manual_seed(0)
    vocab = 2 * BLOCK + 88  # the third block is padded
    mass = {0: 0.1, BLOCK - 1: 0.3, BLOCK: 0.05, 2 * BLOCK - 1: 0.25, 2 * BLOCK: 0.2, vocab - 1: 0.1}
    scores = _boundary_scores(vocab, mass)
    exact = torch.softmax(scores.double(), -1)
    seen = _empirical(scores, 100_000)
    assert set(seen.nonzero().squeeze(1).tolist()) <= set(mass), "an excluded token (probability 0) was drawn"
    tv = 0.5 * float((seen - exact).abs().sum())
    assert tv <= _threshold(exact, 100_000), f"total variation {tv:.4f}"


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_a_smooth_law_over_a_vocabulary_of_several_blocks(one_thread, temperature):
    """Random logits over 1,000 tokens (4 blocks, the last padded) at two temperatures: the empirical
    law of 200,000 draws within the threshold of softmax(logits / T). The test's power: the law at the
    other temperature is farther than both thresholds together."""
    g = torch.Generator().manual_seed(1)
    logits = 2 * torch.randn(1000, generator=g)
    exact = torch.softmax(logits.double() / temperature, -1)
    other = torch.softmax(logits.double() / (1.3 - temperature), -1)  # 0.3 <-> 1.0
    n = 200_000
    assert 0.5 * float((exact - other).abs().sum()) > _threshold(exact, n) + _threshold(other, n)
    torch.manual_seed(2)
    seen = _empirical(logits / temperature, n)
    tv = 0.5 * float((seen - exact).abs().sum())
    assert tv <= _threshold(exact, n), f"total variation {tv:.4f} above {_threshold(exact, n):.4f}"


@pytest.mark.parametrize("vocab", [3 * BLOCK, 49_152])
def test_one_token_left_is_always_drawn_and_rows_are_independent(one_thread, vocab):
    """Rows with a single token left (a top-p nucleus of one) draw it, whichever block it is in, and
    each row draws from its own scores; at the embedded model's vocabulary a CPU draws 170 rows in
    slices of 42 (CPU_SLICE_BYTES), which keep the rows' order."""
    rows = min(vocab, 170)
    want = torch.randperm(vocab, generator=torch.Generator().manual_seed(4))[:rows]
    assert rows > CPU_SLICE_BYTES // (4 * vocab) or vocab < 1000
    scores = torch.full((rows, vocab), float("-inf"))
    scores[torch.arange(rows), want] = 0.0
    assert draw(scores).tolist() == want.tolist()


def test_tiny_probabilities_beside_a_dominant_token(one_thread):
    """A dominant token and the rest at about 1e-9 each in its block: the excluded half of the block is
    never drawn, and the dominant token is drawn at its rate."""
    vocab = 2 * BLOCK
    scores = torch.full((vocab,), -20.0)
    scores[BLOCK // 2 : BLOCK] = float("-inf")
    scores[7] = 0.0
    torch.manual_seed(3)
    tokens = draw(scores.expand(50_000, -1).contiguous())
    excluded = (tokens >= BLOCK // 2) & (tokens < BLOCK)
    assert not bool(excluded.any())
    exact = float(torch.softmax(scores.double(), -1)[7])
    assert abs(float((tokens == 7).double().mean()) - exact) < 5 * math.sqrt(exact * (1 - exact) / 50_000) + 1e-6


def test_the_processor_makes_greedy_decoding_pick_the_drawn_token(one_thread):
    """DrawTokens's scores are 0 at the drawn token and -inf elsewhere: argmax (greedy decoding) takes
    it, and the same seed draws the same tokens."""
    scores = torch.randn(4, 700)
    torch.manual_seed(5)
    want = draw(scores)
    torch.manual_seed(5)
    out = DrawTokens()(torch.zeros(4, 3, dtype=torch.long), scores)
    assert out.argmax(-1).tolist() == want.tolist()
    assert bool(torch.isinf(out).sum(-1).eq(699).all())


@pytest.mark.parametrize("bad", ["nan", "all excluded"])
def test_probabilities_that_are_not_finite_stop_the_call(bad):
    """As torch.multinomial refuses them: a NaN logit, or every token excluded."""
    scores = torch.zeros(2, 300)
    if bad == "nan":
        scores[1, 5] = float("nan")
    else:
        scores[1] = float("-inf")
    with pytest.raises(RuntimeError, match="not finite or sum to 0"):
        draw(scores)


def test_the_benchmark_runs(tmp_path):
    """bench/hf_engine.py --quick: both parts measured, every way of the call timed, and the engine's
    draw, prefill, attention switch, cache and linear layers restored after."""
    import importlib.util
    import json
    from pathlib import Path

    import podsrl.engines.hf as hf

    script = Path(__file__).resolve().parents[1] / "bench" / "hf_engine.py"
    spec = importlib.util.spec_from_file_location("bench_draw", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from podsrl.engines import loop

    names = ("generate_kwargs", "shared_kv_heads", "chunked_cache", "onednn_linears")
    before = [getattr(hf, name) for name in names], hf.TransformersEngine._shared_prefill
    applies = loop.applies
    threads = torch.get_num_threads()
    assert bench.main(["--quick", "--out", str(tmp_path / "draw.json")]) == 0
    torch.set_num_threads(threads)
    data = json.loads((tmp_path / "draw.json").read_text())
    assert [row["rows"] for row in data["draws"]] == [8, 16]
    assert set(data["call"]["tokens_per_s"]) == set(data["call"]["labels"]) == {"today", "generate", "copied heads", "multinomial", "concatenated cache", "mkl linear", "before"}
    assert all(data["call"][key] > 0 for key in ("ratio", "loop_ratio", "draw_ratio", "heads_ratio", "cache_ratio", "linear_ratio"))
    assert {n for made in data["call"]["tokens"].values() for n in made} == {32 * 4}  # every row its --length, both decode paths
    assert "oneDNN" in bench.doc_table(data)  # the run's own labels
    assert len(set(data["call"]["prompt_lengths"])) > 1, "the prompts should differ in length (left padding, as real calls)"
    assert data["command"].startswith("python bench/hf_engine.py --quick")
    assert ([getattr(hf, name) for name in names], hf.TransformersEngine._shared_prefill) == before
    assert loop.applies is applies


def test_the_benchmarks_varied_ends_are_the_same_in_both_decode_paths(tmp_path):
    """bench/hf_engine.py --quick --ends: the rows end at varied lengths (bench/_fixed_length.py's
    EndAt), the same tokens in the engine's loop and in generate, and the table says so."""
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "hf_engine.py"
    spec = importlib.util.spec_from_file_location("bench_ends", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    assert bench.main(["--quick", "--ends", "--length", "16", "--ways", "today,generate", "--out", str(tmp_path / "ends.json")]) == 0
    torch.set_num_threads(threads)
    call = json.loads((tmp_path / "ends.json").read_text())["call"]
    made = call["tokens"]
    assert call["ends"] == "varied" and made["today"] == made["generate"]  # each round (seed) the same tokens both ways
    assert all(32 * 8 <= n < 32 * 16 for n in made["today"])
    assert "up to 16 tokens (16 prompts" in bench.doc_table(json.loads((tmp_path / "ends.json").read_text()))


def test_every_committed_run_is_in_the_engines_page_as_its_table():
    """bench/hf_engine.py's committed runs (results/hf-engine/*.json) appear in docs/engines.md exactly
    as ``--table`` prints them."""
    from conftest import committed_tables_in_page

    assert committed_tables_in_page("hf_engine", "doc_table", "hf-engine", "engines.md"), "no committed run of bench/hf_engine.py"
