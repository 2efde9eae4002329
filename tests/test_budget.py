"""Budgets that hold (issue 68): no step starts that the recent steps predict will not fit in
``train.max_seconds``, in podsrl's loop and in the TRL arms' clock, also after a resume; the run
says so in its log. The training clock is faked (each step takes exactly 10 s on it), so the
stops are exact whatever the machine's speed."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from podsrl.compare.trl_arm import checkpoints as trl_checkpoints
from podsrl.compare.trl_arm import clock as trl_clock
from podsrl.compare.trl_arm.run import train_trl
from podsrl.config import from_dict
from podsrl.run import checkpoint as ckpt
from podsrl.run.metrics import read_jsonl
from podsrl.train import loop as trainer

from conftest import tiny_config_dict

QUIET = {"eval.at_start": False, "eval.at_end": False, "train.progress": False, "train.export_model": False}


def _cfg(max_seconds, max_steps=None):
    return SimpleNamespace(train=SimpleNamespace(max_seconds=max_seconds, max_steps=max_steps))


def test_the_next_step_is_predicted_from_the_longest_of_the_recent_ones():
    state = ckpt.TrainState()
    assert state.next_step_seconds() is None and not state.done(_cfg(1.0))  # the first step always runs
    for seconds in [1.0, 9.0, 2.0, 2.0, 2.0, 2.0]:
        state.record_step(seconds)
    assert state.train_seconds == 18.0 and state.step_seconds == [9.0, 2.0, 2.0, 2.0, 2.0]  # the last RECENT_STEPS
    assert ckpt.RECENT_STEPS == 5 and state.next_step_seconds() == 1.25 * 9.0
    assert not state.done(_cfg(18.0 + 11.25))  # fits exactly
    assert state.done(_cfg(18.0 + 11.0)) and "the next step would not fit" in state.overrun_note(_cfg(29.0))
    state.record_step(2.0)  # the 9 s step leaves the window
    assert state.next_step_seconds() == 2.5
    assert state.overrun_note(_cfg(20.0)) is None and state.done(_cfg(20.0))  # spent: no prediction to report
    assert state.overrun_note(_cfg(None, max_steps=10)) is None and not state.done(_cfg(None, max_steps=10))


def test_a_checkpoint_keeps_the_recent_steps_and_an_older_one_loads_without_them(tmp_path, small_vocab_model_dir):
    import torch

    from podsrl.models import load_policy

    cfg = from_dict(tiny_config_dict(small_vocab_model_dir, tmp_path / "unused.py", **{"reward.names": ["correctness"]}))
    model = load_policy(cfg.model).model
    opt, sched = trainer.make_optimizer(cfg, model)
    state = ckpt.TrainState(step=2)
    state.record_step(3.0), state.record_step(4.5)
    path = ckpt.save(tmp_path, model, opt, sched, state)
    assert ckpt.read_train_state(path).step_seconds == [3.0, 4.5]
    blob = torch.load(path / "state.pt", weights_only=True)
    del blob["state"]["step_seconds"]  # as podsrl wrote it before issue 68
    torch.save(blob, path / "state.pt")
    assert ckpt.read_train_state(path).step_seconds == []


@pytest.fixture
def ten_second_steps(monkeypatch):
    """Every training step of podsrl's loop takes 10 s on its clock."""
    clock = [0.0]
    monkeypatch.setattr(trainer, "time", SimpleNamespace(perf_counter=lambda: clock[0] + time.perf_counter(), strftime=time.strftime))
    real = trainer.train_step

    def step(*args, **kwargs):
        out = real(*args, **kwargs)
        clock[0] += 10.0
        return out

    monkeypatch.setattr(trainer, "train_step", step)


@pytest.mark.usefixtures("one_thread", "ten_second_steps")
def test_the_loop_starts_no_step_predicted_not_to_fit_and_says_so(make_small_vocab_config, tmp_path):
    # 10 s steps predicted at 12.5 s: after 3 steps (30 s) the next would end near 42.5 s > 35 s.
    # Before issue 68 the run took a 4th step, to 40 s.
    lines: list[str] = []
    cfg = make_small_vocab_config(**QUIET, **{"train.max_steps": None, "train.max_seconds": 35.0, "train.checkpoint_every": 0})
    run = trainer.train(cfg, run_dir=tmp_path / "run", log=lines.append)
    steps = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3] and 30.0 <= steps[-1]["train_seconds"] < 35.0
    assert any(line.startswith("podsrl: stopping after step 3: the next step would not fit in train.max_seconds = 35") for line in lines), lines
    clock = [0.0] + [r["train_seconds"] for r in steps]
    assert ckpt.read_train_state(ckpt.latest(run)).step_seconds == pytest.approx([b - a for a, b in zip(clock, clock[1:])])


@pytest.mark.usefixtures("one_thread", "ten_second_steps")
def test_a_resumed_run_predicts_from_its_checkpoint(make_small_vocab_config, tmp_path):
    # One step (10 s, predicted next at 12.5 s) under a 21 s budget and max_steps = 1; resumed with
    # the steps raised, the checkpoint's step time says a second step would not fit: none is taken.
    cfg = make_small_vocab_config(**QUIET, **{"train.max_steps": 1, "train.max_seconds": 21.0, "train.checkpoint_every": 1})
    run = trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    lines: list[str] = []
    more = make_small_vocab_config(**QUIET, **{"train.max_steps": 10, "train.max_seconds": 21.0, "train.checkpoint_every": 1})
    trainer.train(more, run_dir=run, resume=True, log=lines.append)
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]
    assert any("already reached its budget (the next step would not fit" in line for line in lines), lines


@pytest.mark.usefixtures("one_thread")
def test_the_trl_clock_starts_no_step_predicted_not_to_fit(tmp_path, small_vocab_model_dir, reward_file, monkeypatch):
    """The TRL arm's clock (``time.perf_counter`` in podsrl.compare.trl_arm.clock) takes 10 s a step: under
    25 s, two steps (20 s; a third predicted to end near 32.5 s), not three; the checkpoint's clock file
    keeps the step times for a resume."""
    import json

    from podsrl.compare.plan import load_plan
    from test_compare_trl import GRPO, _config

    offset = [0.0]
    monkeypatch.setattr(trl_clock, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0]))
    real_end = trl_clock.TrainingClock.on_step_end

    def on_step_end(self, *args, **kwargs):
        offset[0] += 10.0
        return real_end(self, *args, **kwargs)

    monkeypatch.setattr(trl_clock.TrainingClock, "on_step_end", on_step_end)
    path = _config(tmp_path, small_vocab_model_dir, reward_file, {"trl_grpo": {"trainer": "trl", **GRPO}}, max_steps=None, max_seconds=25.0)
    cfg = load_plan(path).config("trl_grpo", 0)
    run = train_trl(cfg, "trl", run_dir=tmp_path / "run", log=lambda *_: None)
    steps = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["train_seconds"] < 25.0
    clock = trl_checkpoints.read_clock(trl_checkpoints.latest_checkpoint(run))
    assert len(clock["step_seconds"]) == 2 and all(s >= 10.0 for s in clock["step_seconds"])
