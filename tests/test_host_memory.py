"""bench/host_memory.py: the CPU update with glibc's allocator as it is, with freed memory kept and
with PyTorch's huge pages, each way in fresh processes (issue 66)."""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path

import pytest

from conftest import script_module
from podsrl.intervals import t975

ROOT = Path(__file__).resolve().parents[1]
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's tunables: the bench refuses other C libraries")
def test_the_bench_runs_each_way_in_its_own_process_with_its_tunables(tmp_path, monkeypatch):
    """--quick: one process a way; the kept way's worker saw the tunables, the thp way's PyTorch's
    huge-page switch and glibc's neither, even where the caller's environment sets both; the fresh and
    copied ways undid their change of the update; the JSON as written, and its table's ratios to glibc's."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    with script_module(ROOT / "bench" / "host_memory.py") as bench:
        assert not {"GLIBC_TUNABLES", bench.THP} & set(bench.environment("glibc"))
        assert bench.environment("kept")["GLIBC_TUNABLES"] == bench.KEPT and bench.THP not in bench.environment("kept")
        assert bench.environment("thp")[bench.THP] == "1" and "GLIBC_TUNABLES" not in bench.environment("thp")
        data = bench.main(["--quick", "--ways", "glibc,kept,thp,fresh,copied", "--out", str(tmp_path / "hm.json")])
        assert json.loads((tmp_path / "hm.json").read_text()) == json.loads(json.dumps(data))
        assert list(data["runs"]) == ["glibc", "kept", "thp", "fresh", "copied"]
        assert data["runs"]["kept"][0]["tunables"] == bench.KEPT and data["runs"]["glibc"][0]["tunables"] is None
        assert data["runs"]["thp"][0]["thp"] == "1" and data["runs"]["glibc"][0]["thp"] is None and data["runs"]["kept"][0]["thp"] is None
        # the update asked whether to write the logits' gradient in place: yes but in the fresh way; its
        # attention copied the key/value heads (the tiny model shares 2 among 4 query heads) in the copied way only
        assert {w: data["runs"][w][0]["gradient_in_place"] for w in data["runs"]} == {"glibc": True, "kept": True, "thp": True, "fresh": False, "copied": True}
        assert {w: data["runs"][w][0]["heads_copied"] for w in data["runs"]} == {"glibc": False, "kept": False, "thp": False, "fresh": False, "copied": True}
        assert all(run["timed"] == "update" and run["tokens"] == 2 * 16 for w in data["runs"] for run in data["runs"][w])
        assert all(len(data["runs"][w]) == 1 and data["median"][w] > 0 and data["peak_rss_gib"][w] > 0 for w in data["runs"])
        text = bench.table(data)
        assert "| glibc | " in text and " | 1.00x | " in text
        assert all(f"| {w} | {data['median'][w]:.2f} | {data['median']['glibc'] / data['median'][w]:.2f}x |" in text for w in ("kept", "thp"))


@pytest.mark.parametrize("ways", ["kept,glibc", "glibc", "glibc,kept,kept", "glibc,jemalloc", "glibc,fresh --sampler 4", "glibc,fresh --train",
                                  "glibc,copied --sampler 4"])
def test_the_bench_refuses_ways_without_glibc_first_or_unknown_or_repeated(ways, capsys):
    ways, *rest = ways.split()
    with script_module(ROOT / "bench" / "host_memory.py") as bench, pytest.raises(SystemExit):
        bench.main(["--quick", "--ways", ways, *rest])
    assert "--ways" in capsys.readouterr().err


@pytest.mark.skipif(not GLIBC, reason="glibc's tunables: the bench refuses other C libraries")
@pytest.mark.parametrize("other", ["fresh", "copied"])
def test_paired_alternates_glibc_and_another_way_in_one_process(tmp_path, other):
    """--quick --paired: one worker, a warm-up each way, then two pairs whose first way alternates;
    the other way's updates alone undid their change (the gradient in place, the heads read in
    place); the JSON as written, its table's ratio."""
    with script_module(ROOT / "bench" / "host_memory.py") as bench:
        data = bench.main(["--quick", "--paired", "--ways", f"glibc,{other}", "--out", str(tmp_path / "hm.json")])
        assert json.loads((tmp_path / "hm.json").read_text()) == json.loads(json.dumps(data))
        run = data["run"]
        assert run["order"] == ["glibc", other, other, "glibc"]
        assert run["gradient_in_place"] == {"glibc": True, other: other != "fresh"} and run["heads_copied"] == {"glibc": False, other: other == "copied"}
        assert run["tunables"] is None and run["thp"] is None and all(len(run["seconds"][w]) == 2 for w in ("glibc", other))
        assert data["paired"] == bench.paired_ratio(run["seconds"]["glibc"], run["seconds"][other]) and data["paired"]["interval"] is not None
        text = bench.table(data)
        assert "2 pairs of timed updates in one process" in text and f"| {other} | {data['median'][other]:.2f} | {data['paired']['geometric_mean']:.2f}x [" in text


def test_paired_ratio_is_the_geometric_mean_with_an_interval_over_the_log_ratios():
    with script_module(ROOT / "bench" / "host_memory.py") as bench:
        r = bench.paired_ratio([2.0, 4.0], [1.0, 1.0])  # ratios 2 and 4: geometric mean sqrt(8); log ratios' sd log(2) / sqrt(2)
        assert r["ratios"] == pytest.approx([2.0, 4.0]) and r["geometric_mean"] == pytest.approx(8**0.5)
        half = t975(1) * (math.log(2) / 2**0.5) / 2**0.5
        assert r["interval"] == pytest.approx([8**0.5 * math.exp(-half), 8**0.5 * math.exp(half)], rel=1e-9) and not r["resolved"]
        faster = bench.paired_ratio([1.10, 1.12, 1.09, 1.11], [1.0, 1.0, 1.0, 1.0])  # every pair 9-12% apart: resolved
        assert faster["resolved"] and faster["interval"][0] > 1
        slower = bench.paired_ratio([0.90, 0.92, 0.91], [1.0, 1.0, 1.0])
        assert slower["resolved"] and slower["interval"][1] < 1
        assert bench.paired_ratio([1.0], [1.1]) == {"ratios": [pytest.approx(1 / 1.1)], "geometric_mean": pytest.approx(1 / 1.1), "interval": None, "resolved": False}
        with pytest.raises(ValueError):
            bench.paired_ratio([1.0, 2.0], [1.0])


@pytest.mark.parametrize("argv", ["--ways glibc,kept", "--ways glibc,fresh,copied", "--ways glibc", "--sampler 4", "--train"])
def test_paired_refuses_other_ways_the_sampler_and_train(argv, capsys):
    with script_module(ROOT / "bench" / "host_memory.py") as bench, pytest.raises(SystemExit):
        bench.main(["--quick", "--paired", *argv.split()])
    assert "--paired: glibc against one of fresh, copied" in capsys.readouterr().err


def test_every_committed_host_memory_run_is_in_the_results_page_as_its_table():
    page = (ROOT / "docs" / "results.md").read_text()
    with script_module(ROOT / "bench" / "host_memory.py") as bench:
        for path in sorted((ROOT / "results" / "host-memory").glob("*.json")):
            assert bench.table(json.loads(path.read_text())) in page, f"paste `python bench/host_memory.py --table {path.relative_to(ROOT)}`"


def test_the_bench_refuses_a_machine_without_glibc_saying_why(monkeypatch):
    with script_module(ROOT / "bench" / "host_memory.py") as bench:
        monkeypatch.setattr(bench, "tunables_unsupported", lambda: "glibc's tunables need Linux with glibc (Darwin, another C library)")
        with pytest.raises(SystemExit, match=r"bench/host_memory.py: glibc's tunables need Linux with glibc \(Darwin"):
            bench.main(["--quick"])


@pytest.mark.slow  # two processes loading the embedded model, about 40 s; the update's quick test above runs the same workers by default
@pytest.mark.skipif(not GLIBC, reason="glibc's tunables: the bench refuses other C libraries")
def test_the_bench_times_a_sampling_call_instead_with_the_embedded_model(tmp_path):
    """--quick --sampler 4: the transformers engine's call of 4 rollouts (the embedded model: the tiny
    random one has no tokenizer) in each way's process; the table says it timed calls."""
    with script_module(ROOT / "bench" / "host_memory.py") as bench:
        data = bench.main(["--quick", "--sampler", "4", "--ways", "glibc,kept", "--out", str(tmp_path / "hm.json")])
        assert data["sizes"]["sampler"] == 4 and data["sizes"]["model"] == "smollm2-135m-instruct"
        assert all(data["median"][w] > 0 for w in data["runs"]) and data["runs"]["kept"][0]["tunables"] == bench.KEPT
        assert all(run["timed"] == "sampler" and run["tokens"] == 4 * 16 for w in data["runs"] for run in data["runs"][w])  # held at 16 tokens
        assert "the transformers engine's call of 4 x 16 tokens" in bench.table(data) and "| sampling call: s (median) |" in bench.table(data)


@pytest.mark.slow  # two `podsrl train` processes, about a minute; tests/test_hostmem.py checks the CLI's restart in the default suite
@pytest.mark.skipif(not GLIBC, reason="glibc's tunables: the bench refuses other C libraries")
def test_the_bench_times_whole_train_runs_started_as_users_start_them(tmp_path):
    """--train: `podsrl train` once a way (a step of the embedded model at a tiny size); kept's run asked
    the CLI, whose start-up line says it restarted with the tunables, glibc's says it did not."""
    tiny = ["train.max_steps=1", "eval.at_start=false", "eval.at_end=false", "rollout.engine=transformers", "rollout.n=4", "select.m=2",
            "train.prompts_per_step=2", "rollout.max_new_tokens=4"]  # fmt: skip
    with script_module(ROOT / "bench" / "host_memory.py") as bench:
        assert "GLIBC_TUNABLES" not in bench.environment("kept", train=True) and bench.environment("kept", train=True)["PODSRL_KEEP_FREED_MEMORY"] == "1"
        assert not {"GLIBC_TUNABLES", "PODSRL_KEEP_FREED_MEMORY"} & set(bench.environment("glibc", train=True))
        data = bench.main(["--quick", "--train", "--ways", "glibc,kept", *(f"--setting={x}" for x in tiny), "--out", str(tmp_path / "hm.json")])
        kept, glibc = data["runs"]["kept"][0], data["runs"]["glibc"][0]
        assert kept["said"].startswith("glibc keeps freed memory (GLIBC_TUNABLES=" + bench.KEPT) and glibc["said"].startswith("the C library's allocator as it is (PODSRL_KEEP_FREED_MEMORY=1 ")
        assert kept["steps"] == glibc["steps"] == 1 and kept["median"]["update"] > 0 and kept["peak_rss_gib"] > 0.1
        text = bench.table(data)
        assert "`podsrl train` with --train.max_steps=1 " in text and "| kept | 1 | 1 | " in text and "| glibc | 1 | 1 | " in text
