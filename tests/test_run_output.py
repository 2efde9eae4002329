"""What a person reads while and after a run (issue 38): the progress bar, the end-of-run summary."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from podsrl.config import load
from podsrl.run.metrics import RunLogger


def _metrics(step: int, reward: float) -> dict:
    return {"step": step, "reward_mean": reward, "reward_kept_mean": reward, "completion_len": 7.0, "time/step": 1.5,
            "signal_rows": 1, "truncated": 0.0}  # fmt: skip


def _drawn(err: str) -> str:
    """What the bar shows now: the last line tqdm drew (it redraws with a carriage return)."""
    return err.replace("\n", "\r").rstrip("\r").split("\r")[-1]


@pytest.fixture
def bar_config():
    return load(None, ["train.progress=true", "train.max_steps=4"])


def test_the_bar_shows_the_step_just_taken(tmp_path, bar_config, capsys):
    logger = RunLogger(tmp_path, bar_config)
    logger.bar.mininterval = 0  # draw on every update
    for step, reward in ((1, 0.25), (2, 0.5)):
        logger.log_step(_metrics(step, reward), SimpleNamespace(step=step))
        shown = _drawn(capsys.readouterr().err)
        assert f"{step}/4" in shown and f"reward {reward:.2f}" in shown, shown
    logger.close()


@pytest.mark.parametrize("max_steps", ["4", "none"])
def test_the_bars_two_step_times_are_labelled(tmp_path, max_steps, capsys):
    """The bar showed "246.21s/step ... 179.6s/step" (issue 57): tqdm's rate, now the mean wall time
    a step since the bar started (evaluations and checkpoints included; the ETA is read from it),
    and the step's own time/step. Each is named; no step time stands unlabelled."""
    import re

    logger = RunLogger(tmp_path, load(None, ["train.progress=true", f"train.max_steps={max_steps}", "train.max_seconds=60"]))
    logger.bar.mininterval = 0
    for step in (1, 2):
        logger.log_step(_metrics(step, 0.5), SimpleNamespace(step=step))
    shown = _drawn(capsys.readouterr().err)
    assert "this step 1.5s" in shown, shown
    times = re.findall(r"(\S+) +(?:\?|[\d.]+)(?:s/step|step/s)", shown)
    assert times == ["mean"], shown  # the rate, labelled (tqdm pads a rate below 10 to five characters)
    assert logger.bar.smoothing == 0  # tqdm's rate is the mean since the bar started, not a moving average
    logger.close()


def test_a_resumed_bar_shows_the_last_evaluation(tmp_path, bar_config, capsys):
    rows = [{"step": 0, "train_seconds": 0.0, "accuracy": 0.1}, {"step": 2, "train_seconds": 9.0, "accuracy": 0.42}]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    logger = RunLogger(tmp_path, bar_config, start_step=2)
    logger.bar.mininterval = 0
    logger.log_step(_metrics(3, 0.5), SimpleNamespace(step=3))
    shown = _drawn(capsys.readouterr().err)
    assert "3/4" in shown and "eval 42%" in shown, shown
    logger.close()


def test_plot_labels_tell_runs_of_one_comparison_apart(tmp_path, monkeypatch):
    """`podsrl plot` of two runs of one compare labelled both "seed0"."""
    from matplotlib.axes import Axes

    from podsrl.run.plot import distinct_names, plot_runs

    runs = [tmp_path / "cmp" / "runs" / method / "seed0" for method in ("grpo", "pods")]
    for run in runs:
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train_seconds": 1.0, "reward_mean": 0.5}) + "\n")
    legends = []
    real = Axes.legend
    monkeypatch.setattr(Axes, "legend", lambda ax, *a, **k: legends.append([t.get_text() for t in real(ax, *a, **k).get_texts()]))
    plot_runs(runs, tmp_path / "x.png")
    assert legends == [["grpo/seed0", "pods/seed0"]]
    assert distinct_names([tmp_path / "a", tmp_path / "b" / "a"]) == [f"{tmp_path.name}/a", "b/a"]
    assert distinct_names([tmp_path / "a", tmp_path / "a"]) == ["a", "a"]
