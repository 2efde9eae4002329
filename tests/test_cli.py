"""``podsrl train | eval | plot`` end to end on the tiny model, and every user mistake as exit code 2
with a one-line message naming the field (no traceback)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import pytest

from podsrl.train import loop as trainer
from podsrl.cli import main
from podsrl.config import load, to_toml
from podsrl.grading.rewards import get_reward
from podsrl.run.metrics import read_jsonl
from podsrl.run.rundir import trained_m

from test_config import BAD_OVERRIDES

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The one-process runs here use the tiny model with a 686-token tokenizer, ten times faster a
    step than with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config

METRIC_FIELDS = (
    "step reward_mean reward_std reward_kept_mean zero_variance_groups kept_adv_var completion_len truncated "
    "clip_frac_low clip_frac_high entropy grad_norm tokens_kept tokens_total loss lr m token_fraction "
    "time/generate time/reward time/select time/update time/step train_seconds"
).split()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``podsrl ARGV``; argparse's own errors exit via SystemExit."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def assert_user_error(code: int, stderr: str, *fragments: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert "error:" in stderr
    for fragment in fragments:
        assert fragment in stderr, f"{fragment!r} missing from {stderr!r}"


# --------------------------------------------------------------------------- user mistakes


@pytest.mark.parametrize("overrides, fragments", BAD_OVERRIDES)
def test_bad_override_exits_2_with_the_message(tmp_path, overrides, fragments):
    code, _, err = run_cli(["train", "--out", str(tmp_path / "run"), "--no-plot", *(f"--{o}" for o in overrides)])
    assert_user_error(code, err, *fragments)
    if "--section.key=value" not in fragments:  # argparse's usage line comes only with its own errors
        assert err.count("\n") == 1 and err.startswith("podsrl: error: ")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_override_with_a_space_before_its_value(tmp_path):
    code, _, err = run_cli(["train", "--out", str(tmp_path / "run"), "--select.m", "3"])
    assert_user_error(code, err, "select.m", "--section.key=value")


def test_missing_config_file(tmp_path):
    code, _, err = run_cli(["train", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "run")])
    assert_user_error(code, err, "nope.toml", "does not exist")


def test_toml_syntax_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[select]\nm = = 3\n")
    code, _, err = run_cli(["train", str(path), "--out", str(tmp_path / "run")])
    assert_user_error(code, err, "bad.toml", "invalid TOML", "line 2")


def test_wrong_type_in_toml_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[rollout]\nn = "sixteen"\n')
    code, _, err = run_cli(["train", str(path), "--out", str(tmp_path / "run")])
    assert_user_error(code, err, "rollout.n", "whole number", "'sixteen'")


def test_resume_of_a_directory_that_is_not_a_run(tmp_path):
    code, _, err = run_cli(["train", "--resume", str(tmp_path)])
    assert_user_error(code, err, "--resume", str(tmp_path), "not a run directory")


def test_missing_gsm8k_directory(tmp_path):
    # The task is loaded before the model, so this fails fast even with the default model.
    code, _, err = run_cli(["train", "--out", str(tmp_path / "run"), "--task.name=gsm8k", "--task.options.path=/nonexistent"])
    assert_user_error(code, err, "gsm8k", "/nonexistent", "train.jsonl")


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("--task.options.digits=3", ["task 'arithmetic'", "'digits'", "max_digits"]),
        ("--reward.names=/nonexistent/rewards.py:score", ["/nonexistent/rewards.py", "does not exist"]),
        ("--model.name=/nonexistent/model", ["model.name", "/nonexistent/model", "does not exist"]),
    ],
    ids=["unknown-task-option", "missing-reward-file", "missing-model-directory"],
)
def test_mistakes_found_when_the_run_starts(tmp_path, override, fragments):
    code, _, err = run_cli(["train", "--out", str(tmp_path / "run"), "--no-plot", override])
    assert_user_error(code, err, *fragments)
    assert err.count("\n") == 1


def test_eval_and_plot_of_a_directory_that_is_not_a_run(tmp_path):
    code, _, err = run_cli(["eval", "--run", str(tmp_path)])
    assert_user_error(code, err, "--run", "not a run directory")
    code, _, err = run_cli(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")])
    assert_user_error(code, err, "not a podsrl run directory")
    code, _, err = run_cli(["plot", str(tmp_path / "missing"), "-o", str(tmp_path / "x.png")])
    assert_user_error(code, err, "no such run directory")


@pytest.mark.parametrize("reward, detail", [("raising_reward", "ValueError: boom"), ("nan_reward", "returned nan")])
def test_failing_reward_exits_nonzero_with_the_message(make_config, reward_spec, tmp_path, reward, detail):
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(make_config(**{"reward.names": [reward_spec(reward)], "eval.at_start": False})))
    code, _, err = run_cli(["train", str(config), "--out", str(tmp_path / "run"), "--no-plot"])
    assert code not in (0, 2)
    assert "Traceback" not in err
    assert reward in err and detail in err and "prompt: 'What is" in err


def test_interrupt_prints_how_to_resume(make_config, tmp_path, monkeypatch):
    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train_step", interrupted)
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(make_config(**{"eval.at_start": False})))
    code, _, err = run_cli(["train", str(config), "--out", str(tmp_path / "run")])
    # Interrupted in step 1, before any checkpoint: the message names the run and how to restart it.
    assert code == 130 and str(tmp_path / "run") in err and "--overwrite" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ a real run


@pytest.fixture(scope="module")
def cli_run(make_config, tmp_path_factory, one_thread):
    """``podsrl train tiny.toml --out DIR`` for 2 steps: (run dir, config, stdout)."""
    root = tmp_path_factory.mktemp("cli")
    cfg = make_config(**{"train.max_steps": 2, "train.checkpoint_every": 1})
    config = root / "tiny.toml"
    config.write_text(to_toml(cfg))
    code, out, err = run_cli(["train", str(config), "--out", str(root / "run"), "--train.seed=3"])
    assert code == 0, err
    return root / "run", load(config, ["train.seed=3"]), out


def test_train_writes_the_run_directory(cli_run):
    run, cfg, out = cli_run
    assert load(run / "config.toml") == cfg  # the resolved config, overrides included
    assert cfg.train.seed == 3
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in METRIC_FIELDS:
            assert key in row and row[key] is not None and math.isfinite(row[key]), key
        assert row["time/update"] > 0 and row["train_seconds"] > 0
    assert rows[1]["train_seconds"] > rows[0]["train_seconds"]
    evals = read_jsonl(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2]
    assert {"accuracy", "ci_low", "ci_high", "problems", "pass_at_k", "seconds"} <= evals[0].keys()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "held-out accuracy" in out and "base model" in out and str(run) in out


def test_eval_of_a_run_prints_its_accuracy(cli_run, tmp_path):
    run, cfg, _ = cli_run
    code, out, err = run_cli(["eval", "--run", str(run), "--json", str(tmp_path / "eval.json")])
    assert code == 0, err
    assert "step-000002" in out
    assert any(line.startswith("accuracy: ") and f"on {cfg.eval.max_problems} problems" in line for line in out.splitlines())
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["problems"] == cfg.eval.max_problems and 0 <= result["accuracy"] <= 1
    assert "completions" not in result
    # Overrides apply to the run's config: here fewer problems, sampled, with pass@k; --completions
    # writes what the model answered, one line per problem, graded as the accuracy counts.
    answers = tmp_path / "answers.jsonl"
    code, out, err = run_cli(["eval", "--run", str(run), "--eval.max_problems=2", "--eval.temperature=1", "--eval.samples=2",
                              "--completions", str(answers)])  # fmt: skip
    assert code == 0, err
    assert "on 2 problems" in out and "pass@2" in out and str(answers) in out
    rows = read_jsonl(answers)
    assert len(rows) == 2 and all({"id", "question", "answer", "completions"} <= r.keys() for r in rows)
    assert all(len(r["completions"]) == 2 and all(isinstance(c["text"], str) and 0 <= c["grade"] <= 1 for c in r["completions"]) for r in rows)
    accuracy = float(next(line for line in out.splitlines() if line.startswith("accuracy: ")).split()[1].rstrip("%"))
    assert accuracy == pytest.approx(100 * sum(c["grade"] >= 1 for r in rows for c in r["completions"]) / 4, abs=0.05)
    # An output file that cannot be written is refused before the evaluation.
    code, out, err = run_cli(["eval", "--run", str(run), "--completions", str(tmp_path)])
    assert code == 2 and "--completions" in err and "is a directory" in err


def test_plot_writes_a_png(cli_run, tmp_path):
    run, _, _ = cli_run
    target = tmp_path / "plots" / "x.png"
    code, out, err = run_cli(["plot", str(run), str(run), "-o", str(target)])
    assert code == 0, err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(target) in out


def test_resume_through_the_cli(cli_run, tmp_path):
    run, _, _ = cli_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    code, out, err = run_cli(["train", "--resume", str(copy), "--train.max_steps=3", "--no-plot"])
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(copy / "metrics.jsonl")] == [1, 2, 3]
    assert load(copy / "config.toml").train.max_steps == 3
    assert (copy / "checkpoints" / "latest").read_text().strip() == "step-000003"
    # The evaluation at step 2 (the first run's end) stays; the resumed run adds its own at the end.
    assert [e["step"] for e in read_jsonl(copy / "eval.jsonl")] == [0, 2, 3]


def _set_in_section(config: Path, section: str, line: str, new: str) -> None:
    """Replace ``line`` under ``[section]`` of a saved config.toml (as text: the file a run of an
    older podsrl wrote, which today's validation may refuse)."""
    text = config.read_text()
    head, _, rest = text.partition(f"[{section}]\n")
    assert rest.count(line + "\n") >= 1, (section, line)
    config.write_text(head + f"[{section}]\n" + rest.replace(line + "\n", new + "\n", 1))


def test_a_run_trained_with_m_1_evaluates_and_exports_but_does_not_train(cli_run, tmp_path):
    """select.m = 1 over the kept subset learns nothing and is refused where training starts; a run
    directory trained with it before the check existed still loads for eval and export (the check
    ran when any config was read: "ConfigError: select.m = 1 ..." for every command)."""
    run, _, _ = cli_run
    old = tmp_path / "old"
    shutil.copytree(run, old)
    _set_in_section(old / "config.toml", "select", "m = 2", "m = 1")
    assert load(old / "config.toml").rollout.n == 4
    code, out, err = run_cli(["eval", "--run", str(old), "--eval.max_problems=2"])
    assert code == 0, err
    assert "accuracy: " in out
    code, out, err = run_cli(["export", str(old), "--out", str(tmp_path / "model")])
    assert code == 0, err
    assert (tmp_path / "model" / "config.json").is_file()
    refusal = "select.m = 1 keeps one rollout per prompt, and its advantage over the kept subset is always 0"
    code, _, err = run_cli(["train", "--resume", str(old), "--train.max_steps=3", "--no-plot"])
    assert_user_error(code, err, refusal)
    code, _, err = run_cli(["train", str(old / "config.toml"), "--out", str(tmp_path / "new"), "--no-plot"])
    assert_user_error(code, err, refusal)
    assert not (tmp_path / "new").exists()


def test_a_resumed_run_keeps_the_m_it_trained_with(make_config, tmp_path):
    """select.m's default was max(1, n // 4) before issue 38, max(2, n // 4) since: a run with n = 4 and
    m unset trained at m = 1 and resumed at m = 2 (its config.toml said none, so the change log, the
    model card and the comparison report saw nothing). A run's config.toml now holds the resolved m;
    one of an older podsrl, m unset, resumes at the m its first step logged, and says so."""
    cfg = make_config(**{"rollout.n": 4, "select.m": None, "train.max_steps": 1, "eval.at_start": False, "eval.at_end": False})
    config = tmp_path / "new.toml"
    config.write_text(to_toml(cfg))
    code, _, err = run_cli(["train", str(config), "--out", str(tmp_path / "new"), "--no-plot"])
    assert code == 0, err
    assert load(tmp_path / "new" / "config.toml").select.m == 2  # the resolved default, saved
    # A run of the old default: m = 1 (over the group, so it learns), then its config.toml as an older podsrl wrote it.
    old = tmp_path / "old"
    config.write_text(to_toml(make_config(**{"rollout.n": 4, "select.m": 1, "select.advantage_over": "group", "train.max_steps": 1,
                                             "eval.at_start": False, "eval.at_end": False})))  # fmt: skip
    code, _, err = run_cli(["train", str(config), "--out", str(old), "--no-plot"])
    assert code == 0, err
    _set_in_section(old / "config.toml", "select", "m = 1", "# m = (default: none)")
    assert load(old / "config.toml").select.m is None
    code, _, err = run_cli(["export", str(old), "--out", str(tmp_path / "card")])  # its card: the m it trained with
    assert code == 0, err
    assert "m = 1 per prompt" in (tmp_path / "card" / "README.md").read_text()
    bare = tmp_path / "bare"  # no step logged: the default of the podsrl that left m unset
    bare.mkdir()
    shutil.copy(old / "config.toml", bare / "config.toml")
    assert trained_m(bare)[0] == 1 and "m's default then" in trained_m(bare)[1]
    code, out, err = run_cli(["train", "--resume", str(old), "--train.max_steps=2", "--no-plot"])
    assert code == 0, err
    assert "leaves select.m unset" in out and "trained with m = 1 (as its first step in metrics.jsonl logged" in out
    assert "keeps m = 1" in out and "today's default for rollout.n = 4 is 2" in out
    assert [r["m"] for r in read_jsonl(old / "metrics.jsonl")] == [1, 1]
    assert load(old / "config.toml").select.m == 1  # saved: the run's m is no longer a default
    assert [list(r["changes"]) for r in read_jsonl(old / "config_changes.jsonl")] == [["train.max_steps"]]  # m did not change
    assert "m = 1 per prompt" in (old / "model" / "README.md").read_text()


def test_resume_of_a_run_without_checkpoint(tmp_path):
    (tmp_path / "config.toml").write_text("")
    code, _, err = run_cli(["train", "--resume", str(tmp_path)])
    assert_user_error(code, err, "--resume", "no checkpoint")


@pytest.mark.parametrize("command", [["train", "--resume"], ["eval", "--run"], ["export"]])
def test_a_trl_arms_run_directory_says_what_to_do_instead(tmp_path, command):
    """A TRL arm of podsrl compare (trainer.json) holds TRL's checkpoints, or none once finished:
    `train --resume`, `eval --run` and `export` said "no checkpoint ... train it again"; they name
    the trainer, how to continue it (the compare command) and where its evaluations are."""
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "trainer.json").write_text(json.dumps({"trainer": "trl"}))
    extra = ["--out", str(tmp_path / "model")] if command == ["export"] else []
    code, _, err = run_cli([*command, str(tmp_path), *extra])
    assert_user_error(code, err, "trained by TRL", "trainer = 'trl'", "`podsrl compare` command that made it", "eval.jsonl")
    assert "no checkpoint" not in err


# ------------------------------------------------------------------- messages a newcomer reads


@pytest.mark.parametrize("command", [["train"], ["eval", "--run", "runs/x"], ["eval"], ["compare"]])
def test_a_setting_written_with_a_space_gets_one_message_for_every_command(command, tmp_path):
    """``--eval.max_problems 10`` made `podsrl eval --run RUN` say "drop 10" (10 read as a config file)."""
    code, _, err = run_cli([*command, "--eval.max_problems", "10"])
    assert_user_error(code, err, "--eval.max_problems 10", "--eval.max_problems=10", "--section.key=value")
    assert "drop" not in err and err.count("\n") == 1


def test_help_texts_say_what_a_newcomer_needs():
    code, out, _ = run_cli(["--help"])
    assert code == 0 and "``" not in out and "podsrl train" in out  # no RST markup; the examples
    _, out, _ = run_cli(["compare", "--help"])
    assert "configs/compare.toml" in out and ".py" not in out  # an example file, not a source file
    _, out, _ = run_cli(["config", "--help"])
    assert "podsrl config task --task.name=jsonl" in " ".join(out.split())
    _, out, _ = run_cli(["eval", "--help"])
    assert "task.grader" in " ".join(out.split()) and "reward.names" in out  # what accuracy measures: the task's grader


def test_eval_does_not_import_the_runs_reward_and_says_what_accuracy_means(make_config, reward_file, tmp_path):
    """Accuracy is the task's grader, not the run's reward: `podsrl eval --run` of a run whose reward
    file is gone (another machine, another directory) still evaluates it."""
    rewards = tmp_path / "my_rewards.py"
    shutil.copy(reward_file, rewards)
    cfg = make_config(**{"reward.names": [f"{rewards}:length_reward"], "train.max_steps": 1, "eval.at_start": False,
                         "eval.at_end": False, "eval.max_new_tokens": 4})  # fmt: skip
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(cfg))
    code, out, err = run_cli(["train", str(config), "--out", str(tmp_path / "run"), "--no-plot"])
    assert code == 0, err
    # No evaluation ran: the summary does not list an eval.jsonl.
    assert "eval.jsonl" not in out and "metrics.jsonl" in out
    rewards.unlink()
    get_reward.cache_clear()  # the training above imported it into this process
    code, out, err = run_cli(["eval", "--run", str(tmp_path / "run")])
    assert code == 0, err
    assert "final answer equals the problem's reference answer" in out and "task.grader" in " ".join(out.split())
    # The random model's 4 tokens never end: every completion is cut off, and the output says which setting.
    assert "100% of the completions were cut off at the token limit (eval.max_new_tokens = 4)" in out and "raise eval.max_new_tokens" in out


def test_restarting_a_run_without_checkpoint_keeps_its_own_config(make_config, tmp_path, monkeypatch):
    """The advice for a run stopped before its first checkpoint names its config.toml: a bare
    `--out DIR --overwrite` trained the default demo instead of the user's settings."""
    real_step = trainer.train_step

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train_step", interrupted)
    cfg = make_config(**{"eval.at_start": False, "eval.at_end": False, "train.max_steps": 1})
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(cfg))
    run = tmp_path / "run"
    code, _, err = run_cli(["train", str(config), "--out", str(run)])
    command = f"podsrl train {run / 'config.toml'} --out {run} --overwrite"
    assert code == 130 and command in err
    code, _, err = run_cli(["train", "--resume", str(run)])
    assert_user_error(code, err, command)
    monkeypatch.setattr(trainer, "train_step", real_step)
    code, _, err = run_cli([*command.split()[1:], "--no-plot"])
    assert code == 0, err
    assert load(run / "config.toml") == cfg  # the user's settings, not the demo's
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]


def test_eval_says_what_it_will_do_and_shows_its_progress(tiny_model_dir, reward_file, tmp_path):
    """`podsrl eval` of GSM8K with 512 tokens printed nothing for minutes (issue 45): now the device and
    engine, problems x samples and the token limit come first, a bar moves over the problems (stderr),
    and on a CPU a long limit gets a caution. (SmolLM2's tokenizer: with the small one the first call
    ends before tqdm redraws the bar, and 16/30 is never shown; on a fast CPU it may not be either.)"""
    from podsrl.config import from_dict

    from conftest import tiny_config_dict

    cfg = from_dict(tiny_config_dict(tiny_model_dir, reward_file, **{"task.options": {"ops": ["+"], "min_digits": 1, "max_digits": 1, "num_train": 50,
                                                                                      "num_eval": 30}, "eval.max_problems": None, "train.progress": True}))  # fmt: skip
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(cfg))
    code, out, err = run_cli(["eval", str(config), "--eval.temperature=1", "--eval.samples=4"])
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("podsrl: model on cpu") and "rollout engine transformers" in first, out
    assert first.endswith("; 30 problems x 4 samples of up to 4 new tokens (temperature 1)"), out
    assert "note: on a CPU" not in out
    # tqdm's bar over the 30 problems, moved by each engine call (64 completions at least on a CPU, 16
    # problems); the redraw at 16/30 shows only where the first call outlasts tqdm's 0.1 s between
    # redraws, which a fast CPU's does not (an Intel Xeon with AMX, 2026-12-01): 0/30 and 30/30 always.
    assert "eval:" in err and "problem" in err and "| 0/30 " in err and "30/30" in err, err
    code, out, err = run_cli(["eval", str(config), "--eval.max_problems=2", "--eval.max_new_tokens=256",
                              "--eval.temperature=1", "--eval.samples=2", "--train.progress=false"])  # fmt: skip
    assert code == 0, err
    assert "2 problems x 2 samples of up to 256 new tokens (temperature 1)" in out
    assert "note: on a CPU, completions of up to 256 tokens are slow" in out and "its first call of 2 problems is done" in out
    assert "--eval.max_problems=N" in out
    assert "eval:" not in err  # train.progress = false: no bar


class _Echo:
    """A stand-in engine that answers every problem right (prompt i is [i]) and records its calls."""

    def __init__(self, examples):
        self.examples, self.calls = examples, []

    def generate(self, prompt_ids, sampling):
        from podsrl.engines import Rollouts

        self.calls.append((len(prompt_ids), sampling.seed))
        texts = [self.examples[p[0]].answer for p in prompt_ids for _ in range(sampling.n)]
        return Rollouts(prompt_ids=prompt_ids, completion_ids=[[1]] * len(texts), texts=texts, truncated=[False] * len(texts))


def test_evaluation_calls_the_engine_in_parts_with_a_seed_each():
    from podsrl.tasks import Example
    from podsrl.train.evaluate import CALL_SEED_OFFSET, CALLS, EvalSettings, calls, evaluate

    assert calls(5) == [range(i, i + 1) for i in range(5)]  # fewer problems than CALLS: one each
    assert [len(r) for r in calls(45)] == [3] * 15 and calls(45)[-1].stop == 45
    assert len(calls(1319)) == CALLS and sum(len(r) for r in calls(1319)) == 1319
    assert calls(20, samples=1, min_call=64) == [range(20)]  # a call has a cost of its own: not 20 calls of 1
    assert [len(r) for r in calls(200, samples=4, min_call=64)] == [16] * 12 + [8]
    examples = [Example(str(i), f"q{i}", str(i)) for i in range(45)]
    engine = _Echo(examples)
    result = evaluate(engine, [[i] for i in range(45)], examples, EvalSettings(temperature=1.0, samples=2, seed=7))
    assert result.accuracy == 1.0 and result.problems == 45  # the parts' completions line up with their problems
    assert engine.calls == [(3, 7 + CALL_SEED_OFFSET * c) for c in range(15)]  # the first call: the seed as before


class _Scripted:
    """A stand-in engine whose completions are given per problem: problem i's samples answer
    ``right[i]`` of them right (the first ones) and the rest wrong."""

    def __init__(self, examples, right):
        self.examples, self.right = examples, right

    def generate(self, prompt_ids, sampling):
        from podsrl.engines import Rollouts

        texts = [self.examples[p[0]].answer if s < self.right[p[0]] else "no idea" for p in prompt_ids for s in range(sampling.n)]
        return Rollouts(prompt_ids=prompt_ids, completion_ids=[[1]] * len(texts), texts=texts, truncated=[False] * len(texts))


def _evaluate_scripted(right: list[int], samples: int):
    from podsrl.tasks import Example
    from podsrl.train.evaluate import EvalSettings, evaluate

    examples = [Example(str(i), f"q{i}", str(i)) for i in range(len(right))]
    return evaluate(_Scripted(examples, right), [[i] for i in range(len(right))], examples, EvalSettings(temperature=1.0, samples=samples))


@pytest.mark.parametrize("problems", [10, 20, 50])
@pytest.mark.parametrize("all_right", [False, True], ids=["all-wrong", "all-right"])
def test_an_evaluation_with_no_spread_gets_the_interval_of_its_problem_count(problems, all_right):
    """Every sample wrong (or every one right), 4 samples a problem: the interval from the spread of
    the per-problem means was 0.0-0.0 (issue 57), while one sample a problem gave Wilson's 0-16.1 on
    20 problems. Without spread the design effect is unknown and its worst case is taken: Wilson's
    interval on the number of problems, the 1-sample evaluation's interval."""
    from podsrl.intervals import wilson_interval

    samples4 = _evaluate_scripted([4 * all_right] * problems, samples=4)
    samples1 = _evaluate_scripted([1 * all_right] * problems, samples=1)
    assert samples4.accuracy == samples1.accuracy == float(all_right)
    assert (samples4.ci_low, samples4.ci_high) == (samples1.ci_low, samples1.ci_high) == wilson_interval(problems * all_right, problems)
    assert samples4.ci_high - samples4.ci_low > 0.05  # 50 problems: 0-7.1%
    if problems == 20 and not all_right:
        assert samples4.summary() == "0.0% [95% CI 0.0-16.1] on 20 problems"


def test_an_evaluation_with_little_spread_is_no_narrower_than_its_completions_allow():
    """One right sample of 200 (50 problems x 4): the normal interval over the problems' means is
    0.5 +- 1.0 points, clipped at 0 (0-1.5%); no interval may be narrower than Wilson's on the 200
    completions counted as independent (0.1-2.8%), which a design effect of at least 1 allows."""
    from podsrl.intervals import normal_interval, wilson_interval

    result = _evaluate_scripted([1] + [0] * 49, samples=4)
    assert result.accuracy == 1 / 200
    assert normal_interval([0.25] + [0.0] * 49)[1] < wilson_interval(1, 200)[1]  # what the floor is for
    assert (result.ci_low, result.ci_high) == (0.0, wilson_interval(1, 200)[1])
    # With spread enough, the normal interval over the problems stands (here wider than the floor).
    means = [0.25 * (i % 5) for i in range(50)]
    result = _evaluate_scripted([i % 5 for i in range(50)], samples=4)
    assert (result.ci_low, result.ci_high) == normal_interval(means)


def test_a_run_with_relative_paths_is_evaluated_from_another_directory(tiny_model_dir, reward_file, tmp_path, monkeypatch):
    """`podsrl train` in a directory holding mytask.jsonl and my_rewards.py, then `podsrl eval --run`
    and `--model` from elsewhere: the saved config.toml holds absolute paths (it held them as given,
    and both evaluations failed)."""
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]
    (home / "mytask.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(reward_file, home / "my_rewards.py")
    (home / "tiny").symlink_to(tiny_model_dir)
    monkeypatch.chdir(home)
    code, _, err = run_cli([
        "train", "--out", "run", "--no-plot", "--model.name=tiny", "--task.name=jsonl", "--task.options.path=mytask.jsonl",
        "--task.options.num_eval=2", "--reward.names=my_rewards.py:length_reward", "--rollout.engine=transformers",
        "--rollout.n=4", "--rollout.max_new_tokens=4", "--train.prompts_per_step=2", "--train.max_steps=1",
        "--eval.at_start=false", "--eval.at_end=false", "--eval.temperature=0", "--eval.samples=1",
    ])  # fmt: skip
    assert code == 0, err
    saved = load(home / "run" / "config.toml")
    assert saved.task.options["path"] == str(home / "mytask.jsonl") and saved.model.name == str(home / "tiny")
    assert saved.reward.names == [f"{home / 'my_rewards.py'}:length_reward"]
    monkeypatch.chdir(elsewhere)
    for target in (["--run", str(home / "run")], ["--model", str(home / "run" / "model")]):
        code, out, err = run_cli(["eval", *target])
        assert code == 0, err
        assert "on 2 problems" in out
