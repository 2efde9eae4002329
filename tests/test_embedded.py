"""Two training steps of the embedded default model (SmolLM2-135M-Instruct) with the transformers
engine: the real model, tokenizer, prompts and rewards end to end, on small settings.

Slow (about a minute or more on two CPU cores): run with ``pytest -m slow`` or ``make test-slow``.
"""

from __future__ import annotations

import math

import pytest

from podsrl.config import Config, load
from podsrl.run.metrics import read_jsonl
from podsrl.train.loop import train


@pytest.mark.slow
def test_embedded_model_trains_two_steps(tmp_path):
    assert Config().model.name == "smollm2-135m-instruct"
    cfg = load(
        None,
        [
            "rollout.engine=transformers",
            "train.prompts_per_step=2",
            "rollout.n=4",
            "select.rule=max_variance",
            "select.m=2",
            "select.filter_zero_variance=false",
            "rollout.max_new_tokens=16",
            "eval.max_problems=8",
            "eval.temperature=0",
            "eval.samples=1",
            "train.max_steps=2",
            "train.max_seconds=none",
            "train.progress=false",
        ],
    )
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)

    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("reward_mean", "reward_std", "completion_len", "truncated", "time/generate", "time/update"):
            assert row[key] is not None and math.isfinite(row[key]), key
        assert 0 < row["completion_len"] <= 16
        assert row["kept"] == 4
        for key in ("loss", "grad_norm", "clip_frac_low", "clip_frac_high"):
            assert row[key] is not None and math.isfinite(row[key]), key
        assert row["tokens_kept"] > 0
        # A step whose kept groups all scored alike runs no row (and the transformers engine returns
        # no sampling log-probs to measure): its entropy is not measured, null rather than 0.
        assert row["entropy"] > 0 if row["rows_run"] else row["entropy"] is None, row
    assert any(row["rows_run"] for row in rows)
    evals = read_jsonl(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2]
    assert all(e["problems"] == 8 and 0 <= e["accuracy"] <= 1 for e in evals)
    assert (run / "checkpoints" / "latest").is_file()
    assert load(run / "config.toml") == cfg
