"""Surviving the cluster (issue 23): restart in place, preemption, hung ranks, hung rewards, full
disks and dead engines, each injected by the test (a reward function that reads environment
variables, or a monkeypatch), never by a hook in podsrl.

One process: ``--resume auto``; SIGTERM in a step made slow, mid-generation and mid-update (issue
68: the step is abandoned within seconds, the last completed step's checkpoint, exit 75, exact
resume), in an evaluation (abandoned; the resume evaluates there first) and in the optimizer step
(the step is finished and checkpointed); a reward that sleeps forever is timed out, counted and the
run goes on; a checkpoint write that fails with ENOSPC leaves the previous one loadable; an engine
failure names the engine and the run to resume. ``torchrun --nproc-per-node=2`` (gloo, the tiny
model): a rank killed at step 3 under ``--max-restarts=1`` with ``--resume auto`` (the job restarts
and ends with the weights of an uninterrupted run); SIGTERM to one rank in the middle of step 2
(every rank abandons that step, exit code 75, ``--resume`` continues exactly); SIGTERM to every rank
in a step made slow, in its rewards and (slow-marked) in its update (exit 75 within seconds); a
rank that hangs in its reward (every process exits within the heartbeat's bound, naming the rank
and its phase). A killed vLLM engine and a stop in vLLM's generation are slow-marked.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from podsrl import errors
from podsrl.config import from_dict, load, to_toml
from podsrl.engines.hf import TransformersEngine
from podsrl.errors import EXIT_CHECKPOINT, EXIT_ENGINE, EXIT_HUNG, EXIT_PREEMPTED, CheckpointWriteError, ConfigError, EngineError, RewardError
from podsrl.grading.pool import RewardPool
from podsrl.grading.rewards import compute_rewards
from podsrl.run import checkpoint as ckpt
from podsrl.run import preemption
from podsrl.run.metrics import read_jsonl
from podsrl.tasks.types import Example
from podsrl.train import heartbeat
from podsrl.train import loop as trainer

from conftest import tiny_config_dict
from test_cli import assert_user_error, run_cli
from test_distributed import _env

ROOT = Path(__file__).resolve().parents[1]

# The test's own reward, with faults chosen by environment variables: PODSRL_TEST_FAULT =
# "kill:RANK:CALL" (SIGKILL, as the OOM killer would), "term:RANK:CALL" (SIGTERM, as a scheduler's
# preemption would, and go on), "termall:RANK:CALL" (SIGTERM to every rank, as SLURM and torchrun
# send it, after writing the time to PODSRL_TEST_MARK) or "hang:RANK:CALL" (sleep, after writing
# the time to PODSRL_TEST_MARK) at that rank's CALL-th call, on the first attempt only (torchrun's
# restarts count in TORCHELASTIC_RESTART_COUNT); PODSRL_TEST_PIDS: a directory where each rank
# writes its pid; PODSRL_TEST_SLOW = "CALL:SECONDS": every call from the CALL-th on sleeps SECONDS
# (a slow step), on every rank, first attempt only; PODSRL_TEST_SLEEP_ONCE: a file created by the
# one call that sleeps forever.
FAULTY_REWARD = '''
import os, signal, time
from pathlib import Path

_calls = 0


def faulty_reward(completion, example):
    global _calls
    _calls += 1
    rank = os.environ.get("RANK", "0")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("PODSRL_TEST_PIDS") and _calls == 1:
        Path(os.environ["PODSRL_TEST_PIDS"], f"rank{rank}-{attempt}").write_text(str(os.getpid()))
    kind, _, where = os.environ.get("PODSRL_TEST_FAULT", "").partition(":")
    fault_rank, _, call = where.partition(":")
    if kind and rank == fault_rank and _calls == int(call) and attempt == "0":
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        if kind == "termall":
            Path(os.environ["PODSRL_TEST_MARK"]).write_text(str(time.time()))
            for pid in Path(os.environ["PODSRL_TEST_PIDS"]).glob("rank*-0"):
                os.kill(int(pid.read_text()), signal.SIGTERM)
        if kind == "hang":
            Path(os.environ["PODSRL_TEST_MARK"]).write_text(str(time.time()))
            time.sleep(3600)
    slow_from, _, seconds = os.environ.get("PODSRL_TEST_SLOW", "").partition(":")
    if slow_from and _calls >= int(slow_from) and attempt == "0":
        time.sleep(float(seconds))
    once = os.environ.get("PODSRL_TEST_SLEEP_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL))
            time.sleep(3600)
        except FileExistsError:
            pass
    return len(completion) / 40.0
'''

QUIET = {"eval.at_start": False, "eval.at_end": False, "train.progress": False, "train.export_model": False}
ABANDON = {"train.max_steps": 3, "train.checkpoint_every": 0}  # the one-process stop tests' runs


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The one-process runs here use the tiny model with a 686-token tokenizer, ten times faster a
    step than with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config


@pytest.fixture(scope="module")
def faulty(write_module) -> str:
    return f"{write_module('faulty_reward', FAULTY_REWARD)}:faulty_reward"


@pytest.fixture
def stop_handlers():
    """A stopped run leaves its stop signals ignored (the process is exiting): put them back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="module")
def reference(make_config, tmp_path_factory) -> Path:
    """The uninterrupted run of :data:`ABANDON` that every stopped and resumed one must reproduce."""
    path = tmp_path_factory.mktemp("reference")
    config = _config(make_config, path, **{**ABANDON, "train.checkpoint_every": 1, "train.keep_checkpoints": 3})  # every step's weights
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return trainer.train(load(config), run_dir=path / "run", log=lambda *_: None)
    finally:
        torch.set_num_threads(before)


def _config(make_config, tmp_path, **overrides) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(to_toml(make_config(**{**QUIET, **overrides})))
    return path


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step-{step:06d}" / "weights.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(run / "metrics.jsonl")]


# ------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.resume=yes", "train.resume"),
        ("train.stop_signals=SIGKILL", "train.stop_signals"),
        ("train.stop_signals=NOPE", "train.stop_signals"),
        ("train.checkpoint_failure=ignore", "train.checkpoint_failure"),
        ("reward.timeout_seconds=0", "reward.timeout_seconds"),
        ("reward.max_timeout_fraction=1.5", "reward.max_timeout_fraction"),
        ("reward.workers=0", "reward.workers"),
        ("distributed.hang_seconds=0", "distributed.hang_seconds"),
        ("distributed.hang_seconds=1800", "distributed.hang_seconds"),
    ],
)
def test_bad_fault_settings_name_the_field(override, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment) + ":"):
        load(None, [override])


def test_a_stop_signal_raises_inside_a_region_and_only_there(stop_handlers):
    from podsrl.train.distributed import Dist

    alone = Dist()
    stop = preemption.StopSignals(["SIGUSR1"]).install()
    try:
        with pytest.raises(preemption.StepAbandoned) as abandoned, stop.region(alone):
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(5)  # cut short: the handler raises as soon as the main thread runs Python again
        assert abandoned.value.signal == signal.SIGUSR1 and not abandoned.value.told
        stop.received = None
        with stop.region(alone):
            stop.commit(alone)  # the optimizer step's place: from here on a signal is only recorded
            os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == signal.SIGUSR1 and stop.agreed(alone) == signal.SIGUSR1
        with pytest.raises(preemption.StepAbandoned):  # recorded outside: the next region is abandoned as it opens
            with stop.region(alone):
                pytest.fail("the region ran")
    finally:
        stop.restore(ignore_after_stop=False)


def test_stop_signal_names():
    assert load(None, ["train.stop_signals=term,SIGUSR1"]).train.stop_signals == ["term", "SIGUSR1"]
    assert [s.name for s in preemption.StopSignals(["term", "usr1"]).signals] == ["SIGTERM", "SIGUSR1"]


# --------------------------------------------------------------------- restart in place


def test_resume_auto_starts_resumes_restarts_and_refuses_another_run(make_config, tmp_path, one_thread):
    config = _config(make_config, tmp_path, **{"train.max_steps": 2, "train.checkpoint_every": 1})
    run = tmp_path / "run"
    code, out, err = run_cli(["train", str(config), "--out", str(run), "--resume", "auto", "--no-plot"])
    assert code == 0, err
    assert f"starting {run}" in out and _steps(run) == [1, 2]
    code, out, err = run_cli(["train", str(config), "--out", str(run), "--resume", "auto", "--no-plot", "--train.max_steps=3"])
    assert code == 0, err
    assert f"resuming {run}" in out and "resumed" in out and _steps(run) == [1, 2, 3]
    # The same run that died before its first checkpoint starts again from scratch.
    (run / "checkpoints").rename(tmp_path / "old-checkpoints")
    code, out, err = run_cli(["train", str(config), "--out", str(run), "--resume", "auto", "--no-plot", "--train.max_steps=3"])
    assert code == 0, err
    assert f"restarting {run}" in out and _steps(run) == [1, 2, 3]
    # Only the same run resumes.
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--resume", "auto", "--no-plot", "--select.m=3"])
    assert_user_error(code, err, str(run), "select.m")
    # A name that changes at every start cannot be found again.
    code, _, err = run_cli(["train", str(config), "--resume", "auto", "--train.out_dir=runs/{time}"])
    assert_user_error(code, err, "train.resume", "--out")


# -------------------------------------------------------------------------- preemption


def test_sigterm_in_the_optimizer_step_finishes_the_step_and_resume_continues_exactly(make_config, tmp_path, monkeypatch, stop_handlers,
                                                                                         one_thread, reference):
    """A signal in the step's optimizer step (or after it) is recorded; the step ends, is
    checkpointed, and the run exits with 75."""
    config = _config(make_config, tmp_path, **ABANDON)
    real_step, calls = torch.optim.AdamW.step, []

    def signalled_in_step_2(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered now; the step still finishes
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", signalled_in_step_2)
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    assert code == EXIT_PREEMPTED, err
    assert "stopped by SIGTERM after step 2;" in err and f"podsrl train --resume {run}" in err and "Traceback" not in err
    assert _steps(run) == [1, 2] and ckpt.latest(run).name == "step-000002"  # checkpoint_every = 0: the stop's own
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a second SIGTERM cannot cut the exit short
    monkeypatch.undo()
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot"])
    assert code == 0, err
    assert _steps(run) == [1, 2, 3]
    assert _max_diff(_weights(run, 3), _weights(reference, 3)) == 0.0


def _slow_from_the_signal(real, armed, fired, pause: float = 0.1, calls: int = 300):
    """``real`` made slow when ``armed()``: a timer thread sends SIGTERM 0.3 s in (its time into
    ``fired``), and the call then runs ``real`` ``calls`` times with ``pause`` s between (at least 30 s
    of torch work and sleep) unless the signal cuts it short. Returns the wrapper."""

    def slow(*args, **kwargs):
        if not armed() or fired:
            return real(*args, **kwargs)
        fired.append(None)
        threading.Timer(0.3, lambda: (fired.__setitem__(0, time.monotonic()), os.kill(os.getpid(), signal.SIGTERM))).start()
        for _ in range(calls):
            out = real(*args, **kwargs)
            time.sleep(pause)
        return out

    return slow


@pytest.mark.parametrize("where", ["generation", "update"])
def test_sigterm_mid_step_abandons_it_within_seconds_and_resume_continues_exactly(make_config, tmp_path, monkeypatch, stop_handlers, one_thread,
                                                                                reference, where):
    """SIGTERM in the middle of step 2, made slow (30 s or more of generation, or of the update's
    forward passes, when nothing cuts it short): the step is abandoned at once, step 1's checkpoint
    is written (checkpoint_every = 0: none before), exit 75; the resume reproduces the uninterrupted run."""
    from podsrl.train import update

    config = _config(make_config, tmp_path, **ABANDON)
    real_step, in_step_2, fired = trainer.train_step, [], []

    def step(s, model, optimizer, scheduler, state):
        in_step_2[:] = [state.step == 1]
        return real_step(s, model, optimizer, scheduler, state)

    monkeypatch.setattr(trainer, "train_step", step)
    if where == "generation":
        monkeypatch.setattr(TransformersEngine, "generate", _slow_from_the_signal(TransformersEngine.generate, lambda: in_step_2 == [True], fired))
    else:  # the update's forward passes with gradients, before its optimizer step
        armed = lambda: in_step_2 == [True] and torch.is_grad_enabled()  # noqa: E731
        monkeypatch.setattr(update, "forward_logprobs", _slow_from_the_signal(update.forward_logprobs, armed, fired))
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    elapsed = time.monotonic() - fired[0]
    assert code == EXIT_PREEMPTED, err
    assert elapsed < 10, f"{elapsed:.1f} s from the signal to the exit"  # the step alone would take 30 s more
    assert "stopped by SIGTERM after step 1, abandoning step 2;" in err and "(from step-000001)" in err and "Traceback" not in err, err
    assert _steps(run) == [1] and ckpt.latest(run).name == "step-000001"
    assert _max_diff(_weights(run, 1), _weights(reference, 1)) == 0.0  # the weights of step 1's end
    monkeypatch.undo()
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot"])
    assert code == 0, err
    assert _steps(run) == [1, 2, 3]
    assert _max_diff(_weights(run, 3), _weights(reference, 3)) == 0.0


def test_an_abandoned_step_keeps_the_checkpoint_its_last_step_has(make_config, tmp_path, monkeypatch, stop_handlers, one_thread, reference):
    """With a checkpoint every step, the abandon writes none: step 1's is there already, untouched."""
    config = _config(make_config, tmp_path, **{**ABANDON, "train.checkpoint_every": 1})
    real_step, in_step_2, fired = trainer.train_step, [], []

    def step(s, model, optimizer, scheduler, state):
        in_step_2[:] = [state.step == 1]
        return real_step(s, model, optimizer, scheduler, state)

    monkeypatch.setattr(trainer, "train_step", step)
    monkeypatch.setattr(TransformersEngine, "generate", _slow_from_the_signal(TransformersEngine.generate, lambda: in_step_2 == [True], fired))
    real_save, saved = ckpt.save, []
    monkeypatch.setattr(ckpt, "save", lambda *a, **k: saved.append(a[4].step) or real_save(*a, **k))
    with pytest.raises(preemption.Preempted) as stopped:
        trainer.train(load(config), run_dir=tmp_path / "run", log=lambda *_: None)
    assert stopped.value.abandoned == "step 2" and stopped.value.checkpoint.name == "step-000001" and saved == [1]


def test_sigterm_mid_evaluation_abandons_it_and_the_resume_evaluates_there_first(make_config, tmp_path, monkeypatch, stop_handlers, one_thread,
                                                                                  reference):
    """An evaluation (every step here) made slow and signalled at step 1: abandoned at once, step 1's
    checkpoint written (its evaluation is not in eval.jsonl); the resume evaluates at step 1 first,
    then goes on as the uninterrupted run."""
    config = _config(make_config, tmp_path, **{**ABANDON, "eval.every_steps": 1})
    real_eval, evaluating, fired = trainer.run_eval, [], []

    def run_eval(run, state, *args, **kwargs):
        evaluating[:] = [state.step]
        try:
            return real_eval(run, state, *args, **kwargs)
        finally:
            evaluating[:] = []

    monkeypatch.setattr(trainer, "run_eval", run_eval)
    monkeypatch.setattr(TransformersEngine, "generate", _slow_from_the_signal(TransformersEngine.generate, lambda: evaluating == [1], fired))
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    assert code == EXIT_PREEMPTED and time.monotonic() - fired[0] < 10, err
    assert "stopped by SIGTERM after step 1, abandoning the evaluation at step 1;" in err and "(from step-000001)" in err, err
    assert _steps(run) == [1] and read_jsonl(run / "eval.jsonl") == [] and ckpt.latest(run).name == "step-000001"
    monkeypatch.undo()
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot"])
    assert code == 0, err
    assert _steps(run) == [1, 2, 3] and [r["step"] for r in read_jsonl(run / "eval.jsonl")] == [1, 2]  # none at the end: eval.at_end = false
    assert _max_diff(_weights(run, 3), _weights(reference, 3)) == 0.0


def test_a_stop_signal_before_the_first_step_stops_without_a_checkpoint(make_config, tmp_path, monkeypatch, stop_handlers, one_thread):
    cfg = make_config(**{**QUIET, "eval.at_start": True, "train.stop_signals": ["SIGUSR1"]})
    real_eval = trainer.run_eval

    def signalled_during_eval(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR1)
        return real_eval(*args, **kwargs)

    monkeypatch.setattr(trainer, "run_eval", signalled_during_eval)
    with pytest.raises(preemption.Preempted) as stopped:
        trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    assert stopped.value.step == 0 and stopped.value.checkpoint is None and "--overwrite" in stopped.value.advice()


# ------------------------------------------------------------------------ reward timeouts


def test_a_reward_that_sleeps_forever_is_timed_out_counted_and_the_run_goes_on(make_config, tmp_path, faulty, monkeypatch, one_thread):
    monkeypatch.setenv("PODSRL_TEST_SLEEP_ONCE", str(tmp_path / "slept"))
    config = _config(
        make_config, tmp_path, **{"train.max_steps": 3, "reward.names": [faulty], "reward.timeout_seconds": 2.0}
    )  # fmt: skip
    start = time.monotonic()
    code, out, err = run_cli(["train", str(config), "--out", str(tmp_path / "run"), "--no-plot"])
    assert code == 0, err
    assert time.monotonic() - start < 120
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sum(r["reward/timeouts"] for r in rows) == 1 and (tmp_path / "slept").exists()
    assert f"reward function {faulty!r} timed out (> 2 s" in err and "on 1 of 8 completions" in err


def test_reward_pool_scores_counts_and_stops_past_the_fraction(faulty, tmp_path, monkeypatch):
    examples = [Example(str(i), "q", "1") for i in range(4)]
    warnings: list[str] = []
    pool = RewardPool([faulty], timeout=1.0, workers=2, timeout_score=-1.0, max_fraction=0.25, warn=warnings.append)
    try:
        monkeypatch.setenv("PODSRL_TEST_SLEEP_ONCE", str(tmp_path / "once"))  # the workers inherit it
        completions = ["a", "bb", "ccc", "dddd"]
        result = compute_rewards(completions, examples, [(faulty, 1.0), ("correctness", 1.0)], pool=pool)
        values = result.per_reward[faulty]
        assert result.timeouts.count(1) == 1 and [v == -1.0 for v in values] == [t == 1 for t in result.timeouts]
        assert all(v == len(c) / 40 for v, c, t in zip(values, completions, result.timeouts) if not t)
        assert result.per_reward["correctness"] == [0.0] * 4 and len(warnings) == 1 and "on 1 of 4 completions" in warnings[0]
        monkeypatch.setenv("PODSRL_TEST_FAULT", "hang:0:1")  # now every fresh worker's first call hangs
        monkeypatch.setenv("PODSRL_TEST_MARK", str(tmp_path / "mark"))
        pool.close()
        result = compute_rewards(["a", "bb", "ccc", "dddd"], examples, [(faulty, 1.0)], pool=pool)  # the pool warns only
        assert result.timed_out[faulty] == [True] * 4
        with pytest.raises(RewardError, match=r"timed out .* on 4 of the step's 4 completions, more than reward.max_timeout_fraction = 0.25"):
            pool.check_timeouts({faulty: sum(result.timed_out[faulty])}, 4)  # the step's check (podsrl.train.sampling)
    finally:
        pool.close()


def test_reward_pool_reports_a_raising_function_like_in_process(reward_spec):
    pool = RewardPool([reward_spec("raising_reward")], timeout=30.0)
    try:
        with pytest.raises(RewardError, match="raised ValueError: boom from the test reward") as err:
            compute_rewards(["x"], [Example("7", "q", "1")], [(reward_spec("raising_reward"), 1.0)], pool=pool)
        assert "example id: 7" in str(err.value) and "boom" in str(err.value.__cause__)
    finally:
        pool.close()


def test_no_pool_for_built_in_rewards_or_without_a_limit(make_config, reward_spec):
    with_limit = make_config(**{"reward.timeout_seconds": 5.0}).reward
    assert RewardPool.from_config(with_limit, ["correctness", "format"]) is None
    assert RewardPool.from_config(make_config().reward, [reward_spec("length_reward")]) is None
    pool = RewardPool.from_config(with_limit, ["correctness", reward_spec("length_reward")])
    assert pool.names == [reward_spec("length_reward")] and not pool.serves("correctness")


# ------------------------------------------------------------------- rewards outside their declaration

SWITCHABLE_REWARD = """
import os


def switchable(completion, example):
    \"\"\"Binary, as declared, until PODSRL_TEST_HALF is set: then 0.5, which it does not declare.\"\"\"
    return 0.5 if os.environ.get("PODSRL_TEST_HALF") else float(len(completion) % 2)


switchable.reward_values = DECLARED
"""


def test_a_reward_outside_its_declaration_stops_the_run_and_the_message_s_way_forward_resumes_it(make_config, tmp_path, monkeypatch, one_thread):
    """Early stopping relies on the declared values: a reward outside them stops the run, naming the
    function and the two ways on, and each way works with --resume (the function's declaration fixed,
    or early stopping off: both may change on resume)."""
    import shutil

    from podsrl.grading.rewards import get_reward
    from podsrl.run.rundir import CHANGES_FILE

    source = tmp_path / "switchable.py"
    source.write_text(SWITCHABLE_REWARD.replace("DECLARED", "(0.0, 1.0)"))
    name = f"{source}:switchable"
    settings = {"reward.names": [name], "rollout.n": 4, "rollout.early_stop": "exact", "rollout.round_size": 2,
                "select.rule": "max_reward", "select.m": 2, "train.max_steps": 1, "train.checkpoint_every": 1}  # fmt: skip
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(_config(make_config, tmp_path, **settings)), "--out", str(run), "--no-plot"])
    assert code == 0, err
    monkeypatch.setenv("PODSRL_TEST_HALF", "1")
    code, _, err = run_cli(["train", "--resume", str(run), "--train.max_steps=2", "--no-plot"])
    assert code == errors.EXIT_REWARD and "Traceback" not in err
    for fragment in ("reward values [0.5] are outside the declared values [0.0, 1.0]", f"reward function {name!r} returned 0.5",
                     "`reward_values`", "--rollout.early_stop=off", f"resume with `podsrl train --resume {run}` (from step-000001)"):  # fmt: skip
        assert fragment in err, f"{fragment!r} missing from {err!r}"
    assert _steps(run) == [1]
    shutil.copytree(run, tmp_path / "other")
    # Way 1: early stopping off.
    code, _, err = run_cli(["train", "--resume", str(run), "--train.max_steps=2", "--rollout.early_stop=off", "--no-plot"])
    assert code == 0, err
    assert _steps(run) == [1, 2]
    changes = [json.loads(line) for line in (run / CHANGES_FILE).read_text().splitlines()]
    assert changes[-1]["changes"]["rollout.early_stop"] == {"run": "exact", "now": "off"}
    # Way 2: the function declares every value it returns (a new process reads the file again).
    source.write_text(SWITCHABLE_REWARD.replace("DECLARED", "(0.0, 0.5, 1.0)"))
    get_reward.cache_clear()
    try:
        code, _, err = run_cli(["train", "--resume", str(tmp_path / "other"), "--train.max_steps=2", "--no-plot"])
        assert code == 0, err
        assert _steps(tmp_path / "other") == [1, 2]
    finally:
        get_reward.cache_clear()


def test_resume_may_change_early_stopping_and_the_declared_values(make_config, tmp_path):
    from podsrl.run.rundir import prepare

    (tmp_path / "config.toml").write_text(to_toml(make_config(**{"rollout.early_stop": "exact", "rollout.round_size": 2})))
    changed = make_config(**{"rollout.early_stop": "off", "rollout.round_size": 1, "reward.values": [0.0, 0.5, 1.0]})
    assert set(prepare(tmp_path, changed, resume=True).changes) == {"rollout.early_stop", "rollout.round_size", "reward.values"}
    with pytest.raises(ConfigError, match="reward.timeout_score"):  # a reward's value is learned from: not free
        prepare(tmp_path, make_config(**{"rollout.early_stop": "exact", "rollout.round_size": 2, "reward.timeout_score": 1.0}), resume=True)


# ----------------------------------------------------------------------------- full disk


def test_a_checkpoint_that_hits_enospc_keeps_the_previous_one(make_config, tmp_path, monkeypatch, one_thread):
    config = _config(make_config, tmp_path, **{"train.max_steps": 3, "train.checkpoint_every": 1, "train.keep_checkpoints": 1})
    real_save = ckpt.torch.save

    def full_disk_from_step_2(obj, path, *args, **kwargs):
        if obj["state"]["step"] >= 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", full_disk_from_step_2)
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    assert code == EXIT_CHECKPOINT and "Traceback" not in err
    for fragment in (f"cannot write checkpoint step-000002 in {run / 'checkpoints'}", "No space left on device", "needs about", "free there",
                     f"podsrl train --resume {run}", "step-000001"):  # fmt: skip
        assert fragment in err, f"{fragment!r} missing from {err!r}"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000001"]  # no partial copy left
    monkeypatch.undo()
    code, out, err = run_cli(["train", "--resume", str(run), "--no-plot"])  # the previous checkpoint loads
    assert "resumed" in out and "at step 1" in out
    assert code == 0, err
    assert _steps(run) == [1, 2, 3]


def test_the_free_space_of_a_failed_checkpoint_is_measured_after_the_partial_file_is_released(tmp_path, monkeypatch):
    # Issue 32: the message said 12.9 MB free while the failed write's partial file was still open
    # (deleted, but its blocks held until closed); df showed 24 MB once the process had exited.
    import weakref

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    partial: list = []

    def enospc(obj, path, *args, **kwargs):
        file = open(path, "wb")  # as torch's zip writer: open when the error is raised ...
        file.write(b"x" * 4096)
        partial.append(weakref.ref(file))
        loop = [file]
        loop.append(loop)  # ... and released only when the garbage collector gets to it
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    seen = []

    def disk_usage(path):
        file = partial[0]() if partial else None
        seen.append({"open": file is not None and not file.closed, "partial dir": any((tmp_path / "checkpoints").glob(".tmp-*"))})
        return shutil_usage(total=10**9, used=10**9 - 24_000_000, free=24_000_000)

    import collections

    shutil_usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(ckpt.torch, "save", enospc)
    monkeypatch.setattr(ckpt.shutil, "disk_usage", disk_usage)
    with pytest.raises(CheckpointWriteError) as err:
        ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=1))
    assert seen == [{"open": False, "partial dir": False}]  # measured once the partial copy was gone
    assert "No space left on device" in str(err.value) and "24.0 MB free there" in str(err.value)


def test_a_metrics_line_that_hits_enospc_stops_the_run_naming_the_file(make_config, tmp_path, monkeypatch, one_thread):
    config = _config(make_config, tmp_path, **{"train.max_steps": 3, "train.checkpoint_every": 1})
    from podsrl.run import metrics

    real_append = metrics._append

    def full_disk_at_step_2(path, line):
        if path.name == "metrics.jsonl" and json.loads(line)["step"] == 2:
            with open(path, "a") as f:
                f.write(line[:7])  # a torn line, as a full disk leaves it
            raise metrics.RunWriteError(f"could not write {path}: No space left on device; free space there")
        real_append(path, line)

    monkeypatch.setattr(metrics, "_append", full_disk_at_step_2)
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    assert code == EXIT_CHECKPOINT and "Traceback" not in err
    for fragment in ("podsrl: write error: could not write", "metrics.jsonl", "No space left", f"podsrl train --resume {run}"):
        assert fragment in err, f"{fragment!r} missing from {err!r}"
    monkeypatch.undo()
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot"])
    assert code == 0, err
    assert _steps(run) == [1, 2, 3]  # the torn line is gone, the steps after the checkpoint are redone


def test_metrics_append_turns_an_os_error_into_a_run_write_error(tmp_path):
    from podsrl.errors import RunWriteError
    from podsrl.run.metrics import _append

    with pytest.raises(RunWriteError, match=r"could not write .*missing.*metrics.jsonl"):
        _append(tmp_path / "missing" / "metrics.jsonl", "{}\n")


def test_checkpoint_failure_retry_goes_on(make_config, tmp_path, monkeypatch, one_thread):
    config = _config(make_config, tmp_path, **{"train.max_steps": 3, "train.checkpoint_every": 1, "train.checkpoint_failure": "retry"})
    real_save = ckpt.save_file
    calls = {"n": 0}

    def fails_at_the_second_write(tensors, filename, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real_save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_file", fails_at_the_second_write)
    run = tmp_path / "run"
    code, out, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    assert code == 0, err
    assert "cannot write checkpoint step-000002" in out and "step-000001 stays the newest checkpoint" in out and "tries again" in out
    assert ckpt.latest(run).name == "step-000003" and _steps(run) == [1, 2, 3]


# ------------------------------------------------------------------------------- engines


def test_an_engine_failure_names_the_engine_and_the_run_to_resume(make_config, tmp_path, monkeypatch, one_thread):
    config = _config(make_config, tmp_path, **{"train.max_steps": 3, "train.checkpoint_every": 1})
    from podsrl.engines.hf import TransformersEngine

    real_generate = TransformersEngine.generate
    calls = {"n": 0}

    def dies_at_step_2(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise EngineError("the vLLM rollout engine (vLLM test) failed while generating: EngineDeadError: gone")
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(TransformersEngine, "generate", dies_at_step_2)
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    assert code == EXIT_ENGINE and "Traceback" not in err
    assert "vLLM rollout engine" in err and f"podsrl train --resume {run}` (from step-000001)" in err


@pytest.mark.vllm
def test_vllm_engine_failures_become_engine_errors():
    pytest.importorskip("vllm")
    from podsrl.engines import Sampling
    from podsrl.engines.vllm import VLLMEngine

    class DeadLLM:
        def generate(self, *args, **kwargs):
            raise AssertionError("pipeline model parallel group is not initialized")  # what a shut-down core raises

    engine = object.__new__(VLLMEngine)  # no real engine: only the failure path
    engine.llm, engine.version, engine.max_model_len, engine.sleep_mode, engine._asleep = DeadLLM(), "0.32.0", 64, False, False
    engine._SamplingParams, engine.eos_ids = (lambda **kw: kw), {0}
    with pytest.raises(EngineError, match=r"vLLM rollout engine \(vLLM 0.32.0\) failed while generating: AssertionError: pipeline") as err:
        engine.generate([[1, 2]], Sampling(n=1, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=None))
    assert 'to go on without vLLM, set rollout.engine = "transformers" (--rollout.engine=transformers' in str(err.value)
    engine.llm = None
    with pytest.raises(EngineError, match="after it was closed"):
        engine.generate([[1, 2]], Sampling(n=1, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=None))


@pytest.mark.vllm
def test_a_vllm_engine_that_fails_to_start_names_the_way_forward(tiny_model_dir, monkeypatch, capsys):
    """vLLM refusing to build its engine (here a stand-in raising what its CPU attention says of a head
    size it does not support): an EngineError with vLLM's reason and the way forward, the transformers
    engine; not vLLM's traceback. The trainer, then the CLI, add the rest (exit code 69)."""
    pytest.importorskip("vllm")
    import types

    import podsrl.engines.vllm as vllm_engine
    from podsrl.models import load_tokenizer

    class RefusingLLM:
        def __init__(self, **kwargs):
            raise NotImplementedError("Head size 8 is not supported by the CPU attention backend; supported: 32, 64, 80, 96")

    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: (types.SimpleNamespace(__version__="0.32.0"), RefusingLLM, dict))
    with pytest.raises(EngineError) as err:
        vllm_engine.VLLMEngine(str(tiny_model_dir), load_tokenizer(str(tiny_model_dir)))
    message = str(err.value)
    assert message.startswith(f"the vLLM rollout engine (vLLM 0.32.0) failed to start for {tiny_model_dir}: NotImplementedError: Head size 8")
    assert message.endswith('set rollout.engine = "transformers" (--rollout.engine=transformers: it samples with the policy itself, '
                            "slower on long completions; a run resumes with it too)")  # fmt: skip


# ------------------------------------------------------------------------------ heartbeat


def _beat(rank, tick=0, collectives=0, phase="update", done=False):
    return heartbeat.Beat(rank, tick, collectives, phase, f"x.py:{rank} in f", False, "host", 100 + rank, done)


def test_verdict_names_the_rank_that_keeps_the_others_waiting():
    seen: dict = {}
    beats = {0: _beat(0, collectives=5), 1: _beat(1, collectives=4, phase="reward"), 2: _beat(2, collectives=5)}
    heartbeat.observe(seen, beats, now=0.0)
    for t in range(1, 11):  # ticks keep coming: every process is alive; rank 1 never enters the collective
        beats = {r: _beat(r, tick=t, collectives=b.collectives, phase=b.phase) for r, b in beats.items()}
        heartbeat.observe(seen, beats, now=float(t))
    assert heartbeat.verdict(seen, beats, now=10.0, bound=10.0) is None  # not longer than the bound yet
    message = heartbeat.verdict(seen, beats, now=10.5, bound=10.0)
    assert message.startswith("rank 1 (host host, pid 101) has kept ranks 0, 2 waiting for 10 s")
    assert "in its reward phase, at x.py:1 in f" in message and "distributed.hang_seconds = 10" in message


def test_verdict_catching_up_setup_and_done_ranks_are_not_hangs():
    seen: dict = {}
    heartbeat.observe(seen, {0: _beat(0, collectives=3), 1: _beat(1, collectives=2, phase="setup")}, now=0.0)
    heartbeat.observe(seen, {0: _beat(0, 1, collectives=3), 1: _beat(1, 1, collectives=2, phase="setup")}, now=50.0)
    assert heartbeat.verdict(seen, {0: _beat(0, 1, 3), 1: _beat(1, 1, 2, "setup")}, now=50.0, bound=10.0) is None
    heartbeat.observe(seen, {0: _beat(0, 2, collectives=3), 1: _beat(1, 2, collectives=2)}, now=51.0)  # out of set-up
    heartbeat.observe(seen, {0: _beat(0, 3, collectives=3), 1: _beat(1, 3, collectives=3)}, now=58.0)  # caught up
    heartbeat.observe(seen, {0: _beat(0, 4, collectives=3), 1: _beat(1, 4, collectives=3)}, now=70.0)
    assert heartbeat.verdict(seen, {0: _beat(0, 4, 3), 1: _beat(1, 4, 3)}, now=70.0, bound=10.0) is None
    done = {0: _beat(0, 5, 9), 1: _beat(1, 3, 3, done=True)}
    heartbeat.observe(seen, done, now=100.0)
    assert heartbeat.verdict(seen, done, now=100.0, bound=10.0) is None  # a rank that left is not waited for


def test_verdict_a_slow_but_live_rank_is_not_a_hang():
    # Issue 32: rank 1 is always a collective behind (its reward takes longer), but it enters every
    # collective within 2.4 s; its short waits must not add up to one 20 s "hang".
    seen: dict = {}
    for t in range(0, 60):  # one beat a second; rank 1 catches up 3 s into each 4 s step, never seen level
        step = t // 4
        beats = {0: _beat(0, t, collectives=2 * step + 2), 1: _beat(1, t, collectives=2 * step + 1, phase="reward")}
        heartbeat.observe(seen, beats, now=float(t))
        assert heartbeat.verdict(seen, beats, now=float(t), bound=20.0) is None, t
    # Once it stops entering collectives, the clock runs from its last advance.
    for t in range(60, 82):
        beats = {0: _beat(0, t, collectives=32), 1: _beat(1, t, collectives=29, phase="reward")}
        heartbeat.observe(seen, beats, now=float(t))
    assert heartbeat.verdict(seen, beats, now=76.0, bound=20.0) is None
    assert "has kept rank 0 waiting for 21 s" in heartbeat.verdict(seen, beats, now=77.0, bound=20.0)


def test_verdict_names_a_lost_rank():
    seen: dict = {}
    heartbeat.observe(seen, {0: _beat(0), 1: _beat(1), 2: None}, now=0.0)
    heartbeat.observe(seen, {0: _beat(0, 1), 1: _beat(1), 2: None}, now=20.0)  # rank 1's ticks stopped
    message = heartbeat.verdict(seen, {0: _beat(0, 1), 1: _beat(1), 2: None}, now=20.0, bound=10.0)
    assert message.startswith("rank 1 (host host, pid 101) has sent no heartbeat for 20 s; last seen in its update phase")
    assert "frozen or its node is gone" in message


class _FakeDist:
    """What Heartbeat uses of a Dist, for threads of one process standing in for ranks."""

    def __init__(self, rank: int, world: int, collectives: int):
        self.rank, self.world, self.collectives, self.active = rank, world, collectives, True
        self.is_main = rank == 0

    def broadcast_object(self, obj):
        return obj


def test_heartbeat_threads_stop_every_rank_for_a_hung_one_and_a_lost_one():
    import torch.distributed as tdist

    # Hung: rank 1 beats on but never enters the collective rank 0 waits in (5 against 3).
    store, verdicts = tdist.HashStore(), {0: [], 1: []}
    beats = [heartbeat.Heartbeat(_FakeDist(r, 2, c), 1.0, store=store, interval=0.1, on_verdict=verdicts[r].append) for r, c in ((0, 5), (1, 3))]
    with beats[0], beats[1]:
        deadline = time.monotonic() + 20
        while not (verdicts[0] and verdicts[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert verdicts[0] == verdicts[1] and len(verdicts[0]) == 1  # rank 0 decides, rank 1 reads it
    assert verdicts[0][0].startswith("rank 1 (host ") and "has kept rank 0 waiting for 1 s" in verdicts[0][0]
    # Lost: rank 1 published once and went silent (its process frozen, its node gone).
    store, verdicts = tdist.HashStore(), []
    store.set("1", json.dumps(vars(heartbeat.Beat(1, 0, 3, "update", "x.py:1 in f", False, "node7", 42))))
    with heartbeat.Heartbeat(_FakeDist(0, 2, 3), 1.0, store=store, interval=0.1, on_verdict=verdicts.append):
        deadline = time.monotonic() + 20
        while not verdicts and time.monotonic() < deadline:
            time.sleep(0.05)
    assert verdicts and verdicts[0].startswith("rank 1 (host node7, pid 42) has sent no heartbeat for 1 s; last seen in its update phase")


def test_describe_reads_the_phase_and_line_from_the_stack(tmp_path):
    gate = threading.Event()
    blocker = tmp_path / "blocking.py"
    blocker.write_text("def blocking(completion, example):\n    GATE.wait()\n    return 1.0\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("podsrl_test_blocking", blocker)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.GATE = gate
    sys.modules["podsrl_test_blocking"] = module
    worker = threading.Thread(target=compute_rewards, args=(["x"], [Example("1", "q", "1")], [("podsrl_test_blocking:blocking", 1.0)]))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            phase, where, waiting = heartbeat.describe(worker.ident)
            if where.endswith("in wait"):
                break
            time.sleep(0.01)
        assert phase == "reward" and not waiting
        assert where.endswith("in wait")  # threading's Event.wait, under blocking() in compute_rewards
    finally:
        gate.set()
        worker.join()
        del sys.modules["podsrl_test_blocking"]


# ------------------------------------------------------------------------------- torchrun

DIST = {
    **QUIET,
    "train.prompts_per_step": 4,  # 2 prompts x 4 rollouts = 8 reward calls per step on each rank
    "rollout.n": 4,
    "select.m": 2,
    "optim.micro_batch_size": 2,
    "train.max_steps": 5,
    "train.checkpoint_every": 2,
}


def _launch(args: list[str], *, env: dict[str, str] | None = None, restarts: int = 0, script: list[str] | None = None) -> subprocess.Popen:
    """``torchrun --nproc-per-node=2 -m podsrl train ARGS`` (``script``: ``SCRIPT ARGS... train ARGS``);
    without torchrun's shared store, which makes restarts fail in gloo's set-up on the last attempt's
    keys (pytorch/pytorch#135712)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone", f"--max-restarts={restarts}",
           *(script or ["-m", "podsrl"]), "train", *args, "--no-plot"]  # fmt: skip
    env = {**_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {})}
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 400, pids: Path | None = None) -> tuple[int, str]:
    """(exit code, output) of a ``_launch``; past ``timeout`` it and its workers (their pids in
    ``pids``, written by the faulty reward) are killed and the test fails."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        for file in pids.iterdir() if pids is not None else ():
            try:
                os.kill(int(file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {timeout} s:\n{out[-3000:]}")
    return proc.returncode, out


@pytest.fixture(scope="module")
def dist_config(tmp_path_factory, tiny_model_dir, reward_file, faulty) -> Path:
    path = tmp_path_factory.mktemp("dist-faults") / "run.toml"
    path.write_text(to_toml(from_dict(tiny_config_dict(tiny_model_dir, reward_file, **{**DIST, "reward.names": [faulty]}))))
    return path


@pytest.fixture(scope="module")
def uninterrupted(dist_config, tmp_path_factory) -> Path:
    """The 2-rank run every faulty one must reproduce: its final weights."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    code, out = _finish(_launch([str(dist_config), "--out", str(run)]))
    assert code == 0, out[-3000:]
    return run


def test_torchrun_restarts_a_killed_rank_and_ends_as_if_uninterrupted(dist_config, uninterrupted, tmp_path):
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    fault = {"PODSRL_TEST_FAULT": "kill:1:17", "PODSRL_TEST_PIDS": str(pids)}  # rank 1's first reward call of step 3
    code, out = _finish(_launch([str(dist_config), "--out", str(run), "--resume", "auto"], env=fault, restarts=1), pids=pids)
    assert code == 0, out[-3000:]
    assert f"starting {run}" in out and f"resuming {run}" in out and "resumed" in out and "exitcode: -9" in out
    assert _steps(run) == [1, 2, 3, 4, 5]  # each once: steps 3.. were redone from the checkpoint of step 2
    assert _max_diff(_weights(run, 5), _weights(uninterrupted, 5)) == 0.0


def _abandoned(out: str) -> list[tuple[str, ...]]:
    """Each rank's (last completed step, abandoned step, run, checkpoint) from its stop message."""
    return re.findall(r"stopped by SIGTERM after step (\d+), abandoning step (\d+); resume with `podsrl train --resume (\S+)` \(from (\S+)\)", out)


def test_sigterm_to_one_rank_abandons_the_step_on_every_rank(dist_config, uninterrupted, tmp_path):
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    # SIGTERM reaches rank 1 alone, in the middle of step 2 (its 13th reward call of 8 a step): a
    # signal sent from here after some delay was not one test, as a fast machine could finish the
    # five steps first. Rank 1 abandons the step at once; rank 0 learns it at its next collective.
    fault = {"PODSRL_TEST_FAULT": "term:1:13", "PODSRL_TEST_PIDS": str(pids)}
    code, out = _finish(_launch([str(dist_config), "--out", str(run)], env=fault), pids=pids)
    stops = _abandoned(out)
    assert code != 0 and len(stops) == 2 and stops[0] == stops[1], out[-3000:]
    assert stops[0] == ("1", "2", str(run), "step-000001"), out[-3000:]  # step 1's checkpoint, written by the stop (checkpoint_every = 2)
    assert out.count("exitcode  : 75") == 2, out[-3000:]  # both ranks: the documented code
    assert _steps(run) == [1] and ckpt.latest(run).name == "step-000001"
    code, out = _finish(_launch(["--resume", str(run)]))
    assert code == 0, out[-3000:]
    assert _steps(run) == [1, 2, 3, 4, 5]
    assert _max_diff(_weights(run, 5), _weights(uninterrupted, 5)) == 0.0


def test_sigterm_to_every_rank_in_a_slow_step_stops_within_seconds(dist_config, tmp_path):
    """Step 2 made slow (every reward call sleeps 30 s: 4 minutes a step); SIGTERM to both ranks at
    rank 1's first call of it. Both abandon the step, step 1's checkpoint is written, and both exit
    with 75 within seconds, not minutes."""
    run, pids, mark = tmp_path / "run", tmp_path / "pids", tmp_path / "signalled"
    pids.mkdir()
    fault = {"PODSRL_TEST_FAULT": "termall:1:9", "PODSRL_TEST_SLOW": "9:30", "PODSRL_TEST_PIDS": str(pids), "PODSRL_TEST_MARK": str(mark)}
    code, out = _finish(_launch([str(dist_config), "--out", str(run)], env=fault), pids=pids)
    elapsed = time.time() - float(mark.read_text())
    assert code != 0 and out.count("exitcode  : 75") == 2, out[-3000:]
    assert elapsed < 30, f"torchrun ended {elapsed:.0f} s after the signal\n{out[-3000:]}"  # a step alone would take minutes
    stops = _abandoned(out)
    assert len(stops) == 2 and stops[0] == stops[1] == ("1", "2", str(run), "step-000001"), out[-3000:]
    assert _steps(run) == [1] and ckpt.latest(run).name == "step-000001"  # its resume is the one-rank test's


@pytest.mark.slow
def test_sigterm_to_every_rank_in_a_slow_update_stops_within_seconds(dist_config, uninterrupted, tmp_path):
    """Step 2's update made slow (its forward passes repeated for 30 s or more, tests/stop_mid_update.py),
    SIGTERM to both ranks in its first one: both abandon the step before its optimizer step, write
    step 1's checkpoint and exit with 75 within seconds; the resume reproduces the uninterrupted run."""
    run, where = tmp_path / "run", tmp_path / "ranks"
    where.mkdir()
    code, out = _finish(_launch([str(dist_config), "--out", str(run)], script=[str(ROOT / "tests" / "stop_mid_update.py"), str(where)]), pids=where)
    elapsed = time.time() - float((where / "signalled").read_text())
    assert code != 0 and out.count("exitcode  : 75") == 2, out[-3000:]
    assert elapsed < 30, f"torchrun ended {elapsed:.0f} s after the signal\n{out[-3000:]}"  # the update alone would take 30 s more
    stops = _abandoned(out)
    assert len(stops) == 2 and stops[0] == stops[1] == ("1", "2", str(run), "step-000001"), out[-3000:]
    assert _steps(run) == [1] and ckpt.latest(run).name == "step-000001"
    code, out = _finish(_launch(["--resume", str(run)]))
    assert code == 0, out[-3000:]
    assert _steps(run) == [1, 2, 3, 4, 5]
    assert _max_diff(_weights(run, 5), _weights(uninterrupted, 5)) == 0.0


def test_a_hung_rank_stops_every_rank_within_the_bound_naming_it(dist_config, tmp_path, faulty):
    # A few seconds: the job waits out the bound after the hang, so the test takes it too (20 s made it
    # the suite's slowest, issue 45). The tiny model's steps take well under a second, so no
    # legitimate wait before the hang comes near it; one that did would be named instead of rank 1's
    # reward, and the assertions on the verdict below would fail.
    bound = 6
    mark, pids = tmp_path / "hang-started", tmp_path / "pids"
    pids.mkdir()
    env = {"PODSRL_TEST_FAULT": "hang:1:9", "PODSRL_TEST_MARK": str(mark), "PODSRL_TEST_PIDS": str(pids)}  # step 2
    proc = _launch([str(dist_config), "--out", str(tmp_path / "run"), f"--distributed.hang_seconds={bound}"], env=env)
    code, out = _finish(proc, pids=pids)
    elapsed = time.time() - float(mark.read_text())
    assert code != 0 and elapsed < bound + 40, f"{elapsed:.0f} s after the hang\n{out[-3000:]}"
    verdicts = re.findall(r"podsrl: error: (rank 1 \(host \S+, pid (\d+)\) has kept rank 0 waiting for \d+ s: it is in its reward phase.*)", out)
    assert len(verdicts) == 2 and verdicts[0] == verdicts[1], out[-3000:]  # printed by both ranks
    assert verdicts[0][1] == (pids / "rank1-0").read_text() and Path(faulty.split(":")[0]).name in verdicts[0][0]
    assert f"exitcode  : {EXIT_HUNG}" in out
    for rank in (0, 1):  # every process is gone
        with pytest.raises(ProcessLookupError):
            os.kill(int((pids / f"rank{rank}-0").read_text()), 0)


# --------------------------------------------------------------------------- vLLM, slow

_KILL_ENGINE = """
import sys
from podsrl.cli import main
from podsrl.engines.vllm import VLLMEngine

real = VLLMEngine.generate
calls = {"n": 0}


def generate(self, *args, **kwargs):
    calls["n"] += 1
    if calls["n"] == 2:  # step 2: vLLM's engine core goes away under the trainer
        self.llm.llm_engine.engine_core.shutdown()
    return real(self, *args, **kwargs)


VLLMEngine.generate = generate
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.vllm
def test_a_dead_vllm_engine_is_a_clear_error_within_a_bound(tmp_path):
    pytest.importorskip("vllm")
    script = tmp_path / "kill_engine.py"
    script.write_text(_KILL_ENGINE)
    run = tmp_path / "run"
    args = ["train", "--out", str(run), "--no-plot", "--rollout.engine=vllm", "--train.max_steps=3", "--train.max_seconds=none",
            "--train.checkpoint_every=1", "--train.prompts_per_step=2", "--rollout.n=4", "--select.m=2", "--eval.at_start=false",
            "--eval.at_end=false", "--rollout.kv_cache_gib=0.25", "--train.progress=false"]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script), *args], env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == EXIT_ENGINE, done.stderr[-3000:]
    assert time.monotonic() - start < 600
    assert "podsrl: engine error: the vLLM rollout engine (vLLM" in done.stderr and "failed while generating" in done.stderr
    assert f"resume with `podsrl train --resume {run}` (from step-000001)" in done.stderr and "Traceback" not in done.stderr


_STOP_IN_VLLM = """
import os, signal, sys, threading, time
from podsrl.cli import main
from podsrl.engines.vllm import VLLMEngine
from podsrl.train import loop

real_generate, real_step, step, fired = VLLMEngine.generate, loop.train_step, [0], []


def train_step(run, model, optimizer, scheduler, state):
    step[0] = state.step + 1
    return real_step(run, model, optimizer, scheduler, state)


def generate(self, *args, **kwargs):  # step 2's sampling: vLLM's generation repeated for minutes, SIGTERM 1 s in
    if step[0] != 2 or fired:
        return real_generate(self, *args, **kwargs)
    fired.append(None)
    def signal_now():
        with open(os.environ["MARK"], "w") as mark:
            mark.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Timer(1.0, signal_now).start()
    for _ in range(1000):
        out = real_generate(self, *args, **kwargs)
    return out


loop.train_step, VLLMEngine.generate = train_step, generate
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.vllm
def test_sigterm_mid_vllm_generation_abandons_the_step(tmp_path):
    """The embedded model with vLLM's engine: SIGTERM in step 2's generation (made minutes long)
    abandons it, step 1's checkpoint is written, exit 75 within a minute (the checkpoint of a 135M
    model in float32 with its optimizer state included); the resume ends the run."""
    pytest.importorskip("vllm")
    script, run, mark = tmp_path / "stop_in_vllm.py", tmp_path / "run", tmp_path / "signalled"
    script.write_text(_STOP_IN_VLLM)
    args = ["train", "--out", str(run), "--no-plot", "--rollout.engine=vllm", "--train.max_steps=3", "--train.max_seconds=none",
            "--train.checkpoint_every=0", "--train.prompts_per_step=2", "--rollout.n=4", "--select.m=2", "--eval.at_start=false",
            "--eval.at_end=false", "--rollout.kv_cache_gib=0.25", "--train.progress=false", "--train.export_model=false"]  # fmt: skip
    done = subprocess.run([sys.executable, str(script), *args], env={**_env(), "MARK": str(mark)}, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    elapsed = time.time() - float(mark.read_text())
    assert done.returncode == EXIT_PREEMPTED, done.stderr[-3000:]
    assert elapsed < 60, f"{elapsed:.0f} s from the signal to the exit"
    assert "stopped by SIGTERM after step 1, abandoning step 2;" in done.stderr and "(from step-000001)" in done.stderr, done.stderr[-3000:]
    assert _steps(run) == [1] and ckpt.latest(run).name == "step-000001"
    code = subprocess.run([sys.executable, "-m", "podsrl", "train", "--resume", str(run), "--no-plot"], env=_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert code.returncode == 0, code.stderr[-3000:]
    assert _steps(run) == [1, 2, 3]
