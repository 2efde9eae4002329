"""bench/cost_model.py: its ratios read as podsrl.figures.RATIO says (a method's time as a fraction of
the baseline's, below 1 sooner; before issue 66 it printed speedups, the other way), on the committed
two-digit comparison it has always read; and bench/peak.py's JSON as its inputs (``--peak``): the
update's fixed and per-token cost and a sampling call's, from hand-written figures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "cost_model.py"


@pytest.fixture(scope="module")
def cost_model():
    with script_module(SCRIPT) as module:
        yield module


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_every_ratio_is_the_methods_time_over_the_baselines():
    """results/compare-2digit: the measured column is each method's minutes to the target over GRPO's
    (PODS 11.3 against 12.9: 0.88x, sooner), and the last line says which way it reads."""
    out = _run()
    table = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\w+)\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+\S+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)x\s+([\d.]+)x", line)
        if m:
            table[m.group(1)] = (float(m.group(2)), float(m.group(4)))
    assert set(table) == {"grpo", "d3s_cross", "d3s_intra", "pods_max_variance"}
    base = table["grpo"][0]
    for method, (minutes, ratio) in table.items():
        assert ratio == pytest.approx(minutes / base, abs=0.011), method  # both printed to two digits
    assert table["pods_max_variance"][1] < 1.0
    assert out.strip().splitlines()[-1].startswith("predicted time to the target as a fraction of grpo's, every exact saving:")
    assert "below 1: sooner" in out


def _peak_json() -> dict:
    """Two precisions at two lengths (auto resolved to none: float32 rows are read, though the mixed
    precision row at 64 tokens has more tokens), two engines."""

    def update(mixed, completion, tokens, seconds, optimizer, label="2 rows"):
        return {"label": label, "mixed_precision": mixed, "completion": completion, "prompt": 40, "tokens": tokens,
                "seconds": {"update": seconds, "optimizer": optimizer}}  # fmt: skip

    def call(engine, rollouts, completion, seconds):
        return {"engine": engine, "rollouts": rollouts, "completion": completion, "seconds": seconds}

    return {"machine": {"cpu": "a CPU"}, "date": "2026-11-29T00:00:00+00:00", "mixed_precision_auto": "none", "models": {
        "m": {"update": [update(False, 64, 128, 4.2, 0.2), update(True, 64, 256, 30.0, 0.2, "4 rows"), update(False, 256, 512, 10.2, 0.2)],
              "sampler": [call("transformers", 8, 64, 20.0), call("transformers", 8, 256, 80.0), call("vllm", 4, 64, 3.0),
                          call("vllm", 8, 64, 5.0), call("vllm", 8, 256, 20.0)]}}}  # fmt: skip


def test_the_peak_benchmarks_json_gives_the_update_and_sampling_costs(cost_model):
    """Runs of 100-token completions on average: the float32 row at 64 tokens (36 from it, against
    156 from 256): U0 = its optimizer's 0.2 s, U = (4.2 - 0.2) / 128 = 1/32 s a token; each engine's
    call of most rollouts at 64 tokens, W = its seconds / U."""
    got = cost_model.peak_inputs(_peak_json(), mean_length=100.0)
    assert (got["model"], got["u0"], got["u"]) == ("m", 0.2, pytest.approx(1 / 32))
    assert got["calls"] == [("transformers", pytest.approx(640.0), 8, 64.0), ("vllm", pytest.approx(160.0), 8, 64.0)]
    long = cost_model.peak_inputs(_peak_json(), mean_length=200.0)  # nearer 256: U = 10 / 512
    assert long["u"] == pytest.approx(10 / 512) and long["calls"][1] == ("vllm", pytest.approx(1024.0), 8, 256.0)
    with pytest.raises(SystemExit, match="--peak-model 'x'"):
        cost_model.peak_inputs(_peak_json(), 100.0, "x")


def test_peak_feeds_the_predictions(tmp_path):
    """--peak's figures replace the update's cost and the GPU-like sampler's grid."""
    path = tmp_path / "peak.json"
    path.write_text(json.dumps(_peak_json()))
    out = _run("--peak", str(path))
    assert "predictions with the update cost given: 0.20 s + 0.0312 s/token" in out
    assert "W 640 K 8" in out and "W 160 K 8" in out and "W 8800 K 8" not in out


def test_same_n_predicts_grpo_from_the_pods_runs_steps(cost_model):
    """--same-n (issue 67, item 4): GRPO(n) samples what PODS(n, m) sampled and updates every row of
    the groups with a signal. A step of 10 s sampling, 2 s updating, 1 s rest, 100 rollouts of 50
    tokens, a quarter of the groups with a signal: GRPO(n) updates 1250 tokens, at u0 = 1 s and u =
    0.01 s a token 13.5 s, so 10 + 13.5 + 1 = 24.5 s against 13 s measured; a step without any signal
    runs no update. Steps in a minute follow the mean step."""
    def step(zero):
        return {"time/generate": 10.0, "time/update": 2.0, "time/step": 13.0, "G": 5000.0, "zero_variance_groups": zero, "train_seconds": 0.0}

    k = {"u0": 1.0, "u": 0.01}
    got = cost_model.same_n([[step(0.75), step(0.75)]], k, minutes=1.0)
    assert got["step_predicted"] == pytest.approx(24.5) and got["step_measured"] == 13.0
    assert got["steps_predicted"] == pytest.approx(60 / 24.5) and got["steps_measured"] == pytest.approx(60 / 13)
    silent = cost_model.same_n([[step(1.0)]], k, minutes=1.0)
    assert silent["step_predicted"] == pytest.approx(11.0)  # sampling and rest only


def test_same_n_on_the_committed_long_runs():
    """On results/compare-long: GRPO(16)'s predicted step is longer than PODS(16, 4)'s measured one."""
    out = _run("--runs", "results/compare-long/runs", "--seeds", "0,1,2", "--baseline", "grpo_bf16_seq",
               "--methods", "grpo_bf16_seq,pods_n16_m4", "--per-token-sampling", "--same-n", "pods_n16_m4")  # fmt: skip
    got = re.search(r"a step ([\d.]+) s against pods_n16_m4's ([\d.]+) s", out)
    assert got and float(got[1]) > float(got[2]), out[-2000:]
