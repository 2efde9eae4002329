"""Never lose a run (issue 16): run-directory safety, atomic rewrites of run files, damaged or
mismatched checkpoints, hub ids, and the remaining bad inputs as one-line errors (exit code 2).

Each test reproduces one failure a user or a hostile tester hit; most go through the CLI, as the
user does. The runs are the tiny random model of conftest.py with the transformers engine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from podsrl.run import checkpoint as ckpt
from podsrl.run import metrics as run_logging
from podsrl.run import rundir
from podsrl.train import loop as trainer
from podsrl.config import load, to_toml
from podsrl.errors import ConfigError
from podsrl.run.metrics import read_jsonl

from test_cli import assert_user_error, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The one-process runs here use the tiny model with a 686-token tokenizer, ten times faster a
    step than with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"eval.at_start": False, "train.max_steps": 2, "train.checkpoint_every": 1, "train.keep_checkpoints": 2}


@pytest.fixture(scope="module")
def base_run(make_config, tmp_path_factory, one_thread):
    """(run dir, its TOML config file): ``podsrl train tiny.toml --out DIR`` for 2 steps, a
    checkpoint after each (both kept), evaluated at the end only. Tests copy it before changing it."""
    root = tmp_path_factory.mktemp("base")
    config = root / "tiny.toml"
    config.write_text(to_toml(make_config(**QUIET)))
    code, out, err = run_cli(["train", str(config), "--out", str(root / "run"), "--no-plot"])
    assert code == 0, err
    return root / "run", config


@pytest.fixture
def run_copy(base_run, tmp_path):
    run, config = base_run
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run", config


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != rundir.LOCK_FILE}


# ------------------------------------------------------------------------------ data loss


def test_train_refuses_a_directory_that_holds_a_run(run_copy):
    run, config = run_copy
    before = _snapshot(run)
    code, _, err = run_cli(["train", str(config), "--out", str(run), "--no-plot"])
    assert_user_error(code, err, str(run), "already holds a run", "--resume", "--overwrite")
    assert err.count("\n") == 1
    assert _snapshot(run) == before  # nothing truncated, appended or deleted


def test_overwrite_replaces_the_old_run_and_nothing_else(run_copy):
    run, config = run_copy
    (run / "notes.txt").write_text("mine")
    old_weights = (run / "checkpoints" / "step-000002" / "weights.safetensors").read_bytes()
    code, out, err = run_cli(["train", str(config), "--out", str(run), "--overwrite", "--no-plot", "--train.max_steps=1"])
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]
    assert [e["step"] for e in read_jsonl(run / "eval.jsonl")] == [1]
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000001"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000001"
    assert (run / "checkpoints" / "step-000001" / "weights.safetensors").read_bytes() != old_weights
    assert (run / "notes.txt").read_text() == "mine"  # only the run's own files are replaced


def test_resume_and_overwrite_or_out_conflict(run_copy, tmp_path):
    run, _ = run_copy
    code, _, err = run_cli(["train", "--resume", str(run), "--overwrite"])
    assert_user_error(code, err, "--resume", "--overwrite")
    code, _, err = run_cli(["train", "--resume", str(run), "--out", str(tmp_path / "elsewhere")])
    assert_user_error(code, err, "--resume", "--out")


_HOLDER = """
import sys, time
from pathlib import Path
from podsrl.run import rundir
claim = rundir.prepare(Path(sys.argv[1]))  # held while the claim lives (released when it is collected)
claim.open()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_locked_run_directory_is_refused_until_its_owner_dies(make_config, tmp_path):
    target = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(target)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError) as err:
            trainer.train(make_config(**QUIET), run_dir=target, log=lambda *_: None)
        assert str(target) in str(err.value) and "another podsrl process" in str(err.value)
        assert f"pid {holder.pid}" in str(err.value)
        assert not (target / "metrics.jsonl").exists() and not (target / "config.toml").exists()
        with pytest.raises(ConfigError, match="another podsrl process"):  # --overwrite deletes nothing of a live run
            trainer.train(make_config(**QUIET), run_dir=target, overwrite=True, log=lambda *_: None)
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel drops the lock
        holder.wait()
    claim = rundir.prepare(target)
    assert claim.open() == target  # the dead holder's lock is gone
    with pytest.raises(ConfigError, match="another podsrl process"):
        rundir.prepare(target).open()  # a second claim while this one holds it
    claim.close()
    rundir.prepare(target).open()


def test_default_run_names_started_in_the_same_second_do_not_collide(make_config, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer.time, "strftime", lambda *_: "20261123-120000")
    cfg = make_config(**{**QUIET, "train.max_steps": 1, "eval.at_end": False, "train.out_dir": str(tmp_path / "runs" / "{time}-{rule}")})
    first = trainer.train(cfg, log=lambda *_: None)
    second = trainer.train(cfg, log=lambda *_: None)
    assert first != second and first.parent == second.parent == tmp_path / "runs"
    assert first.name == "20261123-120000-max_variance" and second.name.startswith(first.name)
    for run in (first, second):
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]
    # Claiming is atomic: two claims of the same default name at once get different directories.
    a = rundir.prepare(tmp_path / "x", unique=True)
    b = rundir.prepare(tmp_path / "x", unique=True)
    assert a.open() != b.open()
    a.close()
    b.close()


def _half_write(real, name):
    """``Path.write_text`` that is killed halfway through writing the file ``name`` (or a
    temporary file named after it)."""

    def write_text(self, data, *args, **kwargs):
        if name in self.name:
            with open(self, "w") as f:
                f.write(data[: len(data) // 2])
            raise KeyboardInterrupt("killed mid-write")
        return real(self, data, *args, **kwargs)

    return write_text


@pytest.mark.parametrize("name", ["metrics.jsonl", "eval.jsonl", "config.toml"])
def test_a_kill_while_resume_rewrites_a_run_file_loses_nothing(run_copy, make_config, monkeypatch, name):
    run, _ = run_copy
    before = (run / name).read_bytes()
    cfg = make_config(**{**QUIET, "train.max_steps": 3})
    monkeypatch.setattr(Path, "write_text", _half_write(Path.write_text, name))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg, run_dir=run, resume=True, log=lambda *_: None)
    monkeypatch.undo()
    assert (run / name).read_bytes() == before
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert load(run / "config.toml").train.max_steps in (2, 3)  # the old config or the new, whole


def test_truncating_metrics_on_resume_is_atomic(tmp_path, make_config, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i}) + "\n" for i in (1, 2, 3)))
    monkeypatch.setattr(Path, "write_text", _half_write(Path.write_text, "metrics.jsonl"))
    with pytest.raises(KeyboardInterrupt):
        run_logging.RunLogger(tmp_path, make_config(), start_step=2)
    monkeypatch.undo()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary file left


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("--select.m=3", ["select.m", "2", "3"]),
        ("--model.lora=true", ["model.lora", "false", "true"]),
        ("--optim.lr=0.01", ["optim.lr"]),
        ("--eval.samples=2", ["eval.samples", "podsrl eval --run"]),
        ("--train.max_steps=1", ["train.max_steps", "raise"]),
    ],
    ids=["select-m", "lora", "lr", "eval-samples", "lower-budget"],
)
def test_resume_refuses_a_changed_training_config(run_copy, override, fragments):
    run, _ = run_copy
    before = _snapshot(run)
    extra = ["--eval.temperature=1"] if "samples" in override else []
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot", override, *extra])
    assert_user_error(code, err, "--resume", str(run), *fragments)
    assert err.count("\n") == 1
    assert _snapshot(run) == before


def test_resume_may_raise_the_budget_and_records_what_changed(run_copy):
    run, _ = run_copy
    code, out, err = run_cli(["train", "--resume", str(run), "--no-plot", "--train.max_steps=3", "--train.progress=false"])
    assert code == 0, err
    assert "train.max_steps" in out
    assert load(run / "config.toml").train.max_steps == 3
    (record,) = read_jsonl(run / rundir.CHANGES_FILE)
    assert record["step"] == 2 and record["changes"] == {"train.max_steps": {"run": 2, "now": 3}}
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


class _FakeWandb:
    """A stand-in ``wandb`` module: records every ``init`` and what each run logs."""

    def __init__(self):
        self.inits: list[dict] = []
        self.logged: list[tuple[int, dict]] = []

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class Run:
            def log(self, values, step):
                fake.logged.append((step, values))

            def finish(self):
                pass

        return Run()


def test_a_resumed_run_resumes_its_weights_and_biases_run(make_config, tmp_path, monkeypatch):
    # Issue 32: resume="allow" without an id started a new W&B run on every resume.
    import types

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=fake.init))
    settings = {**QUIET, "eval.at_end": False, "train.wandb": True}
    run = trainer.train(make_config(**{**settings, "train.max_steps": 1}), run_dir=tmp_path / "run", log=lambda *_: None)
    trainer.train(make_config(**{**settings, "train.max_steps": 2}), run_dir=run, resume=True, log=lambda *_: None)
    first, second = fake.inits
    assert first["id"] and second["id"] == first["id"] and first["resume"] == second["resume"] == "allow"
    assert first["dir"] == second["dir"] == str(run) and first["project"] == "podsrl"
    assert [step for step, values in fake.logged if "train/reward_mean" in values] == [1, 2]
    trainer.train(make_config(**{**settings, "train.max_steps": 1}), run_dir=run, overwrite=True, log=lambda *_: None)
    assert fake.inits[2]["id"] != first["id"]  # a new run in the directory: a new W&B run


def test_a_bfloat16_full_finetuning_run_of_an_older_version_resumes_in_float32(run_copy):
    # Issue 32 refuses bfloat16 full fine-tuning (AdamW on bf16 weights); a run trained so before
    # resumes with --model.dtype=float32 (its weights and optimizer state are upcast exactly).
    from safetensors.torch import load_file, save_file

    run, _ = run_copy
    text = (run / "config.toml").read_text()
    assert 'dtype = "float32"' in text
    (run / "config.toml").write_text(text.replace('dtype = "float32"', 'dtype = "bfloat16"', 1))
    for step in sorted((run / "checkpoints").glob("step-*")):
        weights = load_file(str(step / "weights.safetensors"))
        save_file({k: v.bfloat16() for k, v in weights.items()}, str(step / "weights.safetensors"))
        blob = torch.load(step / "state.pt", weights_only=False)
        for state in blob["optimizer"]["state"].values():
            state.update({k: v.bfloat16() for k, v in state.items() if k != "step" and v.is_floating_point()})
        torch.save(blob, step / "state.pt")
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot", "--train.max_steps=3"])
    assert_user_error(code, err, "model.dtype = 'bfloat16'", "--model.dtype=float32")
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot", "--train.max_steps=3", "--model.dtype=float32"])
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    assert load(run / "config.toml").model.dtype == "float32"
    weights = load_file(str(run / "checkpoints" / "step-000003" / "weights.safetensors"))
    assert all(v.dtype == torch.float32 for v in weights.values())
    # Lowering the precision on resume is still refused.
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot", "--train.max_steps=4", "--model.dtype=bfloat16", "--model.lora=false"])
    assert code == 2 and "model.dtype" in err


# --------------------------------------------------------------------- resume and checkpoints


def _small_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def _two_checkpoints(tmp_path):
    model, opt, sched = _small_state()
    ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=1), policy=ckpt.SavePolicy(keep=2))
    ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=2), policy=ckpt.SavePolicy(keep=2))
    return tmp_path / "checkpoints"


def test_latest_pointer_deleted_falls_back_to_the_newest_complete_step(tmp_path):
    root = _two_checkpoints(tmp_path)
    (root / "latest").unlink()
    assert ckpt.latest(tmp_path) == root / "step-000002"
    shutil.rmtree(root / "step-000002")
    assert ckpt.latest(tmp_path) == root / "step-000001"


@pytest.mark.parametrize("pointer", ["absolute", "../x"])
def test_a_latest_pointer_outside_the_run_is_ignored(tmp_path, capsys, pointer):
    """``checkpoints/latest`` naming anything but a checkpoint of checkpoints/ (an absolute path, or
    one through ``..``) is not followed: a run directory reads nothing outside itself. The newest
    complete step decides, with a warning."""
    root = _two_checkpoints(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere" / "step-000009"
    shutil.copytree(root / "step-000001", elsewhere)  # complete: the pointer alone decides
    shutil.copytree(root / "step-000001", tmp_path / "run" / "x")
    (root / "latest").write_text(f"{elsewhere}\n" if pointer == "absolute" else "../x\n")
    assert ckpt.candidates(tmp_path / "run") == [root / "step-000002", root / "step-000001"]
    assert "is ignored and the newest complete step is used (step-000002)" in capsys.readouterr().err
    (root / "latest").write_text("step-000001\n")  # a checkpoint of its own is followed
    assert ckpt.latest(tmp_path / "run") == root / "step-000001"


def test_resume_through_the_cli_without_the_latest_pointer(run_copy):
    run, _ = run_copy
    (run / "checkpoints" / "latest").unlink()
    code, out, err = run_cli(["train", "--resume", str(run), "--no-plot", "--train.max_steps=3"])
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


def test_resume_names_a_run_config_that_no_longer_loads(run_copy):
    run, _ = run_copy
    cfg = run / "config.toml"
    cfg.write_text(cfg.read_text().replace("[select]", "[select]\nm_typo = 3", 1))
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot"])
    assert_user_error(code, err, str(cfg), "m_typo")


def test_compare_out_that_is_a_file_is_refused(tmp_path):
    out = tmp_path / "results.txt"
    out.write_text("mine")
    code, _, err = run_cli(["compare", "--out", str(out), "--report-only"])
    assert_user_error(code, err, str(out), "is a file")
    assert out.read_text() == "mine"


@pytest.mark.parametrize("damaged", ["weights.safetensors", "state.pt"])
def test_a_truncated_checkpoint_file_falls_back_or_is_named(tmp_path, damaged):
    root = _two_checkpoints(tmp_path)
    file = root / "step-000002" / damaged
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    logs = []
    model, opt, sched = _small_state()
    path, state = ckpt.load_newest(tmp_path, model, opt, sched, log=logs.append)
    assert path == root / "step-000001" and state.step == 1
    assert any(str(file) in line and "damaged" in line for line in logs)
    # With no complete copy left, the error names the damaged file.
    shutil.rmtree(root / "step-000001")
    with pytest.raises(ConfigError) as err:
        ckpt.load_newest(tmp_path, model, opt, sched, log=logs.append)
    assert str(file) in str(err.value) and "damaged" in str(err.value) and "\n" not in str(err.value)


def test_resume_of_a_truncated_checkpoint_through_the_cli(run_copy):
    run, _ = run_copy
    shutil.rmtree(run / "checkpoints" / "step-000001")
    weights = run / "checkpoints" / "step-000002" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, err = run_cli(["train", "--resume", str(run), "--no-plot", "--train.max_steps=3"])
    assert_user_error(code, err, str(weights), "damaged")
    code, _, err = run_cli(["eval", "--run", str(run)])
    assert_user_error(code, err, str(weights), "damaged")


def test_resume_falls_back_to_an_older_complete_checkpoint(run_copy):
    run, _ = run_copy
    state = run / "checkpoints" / "step-000002" / "state.pt"
    state.write_bytes(b"")
    code, out, err = run_cli(["train", "--resume", str(run), "--no-plot", "--train.max_steps=3"])
    assert code == 0, err
    assert str(state) in out + err
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]  # step 2 redone from step 1


def test_checkpoint_of_another_lora_setting_is_named_not_a_traceback(tmp_path):
    model, opt, sched = _small_state()
    ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=1))
    torch.manual_seed(0)
    wider = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    with pytest.raises(ConfigError, match="LoRA setting"):
        ckpt.load_weights(ckpt.latest(tmp_path), wider)
    renamed = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 2)))
    with pytest.raises(ConfigError, match="LoRA setting"):
        ckpt.load_weights(ckpt.latest(tmp_path), renamed)


def test_eval_of_a_run_with_another_lora_setting(run_copy):
    run, _ = run_copy
    code, _, err = run_cli(["eval", "--run", str(run), "--model.lora=true"])
    assert_user_error(code, err, "model.lora", str(run))


def test_the_run_directory_is_printed_and_named_on_ctrl_c(make_config, tmp_path, monkeypatch):
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(make_config(**QUIET)))
    real_step = trainer.train_step

    def interrupt_at_step_2(s, model, optimizer, scheduler, state):
        if state.step == 1:
            raise KeyboardInterrupt
        return real_step(s, model, optimizer, scheduler, state)

    monkeypatch.setattr(trainer, "train_step", interrupt_at_step_2)
    code, out, err = run_cli(["train", str(config), "--out", str(tmp_path / "new")])
    assert code == 130 and "Traceback" not in err
    assert f"run directory {tmp_path / 'new'}" in out
    assert f"podsrl train --resume {tmp_path / 'new'}" in err
    # Before its first checkpoint there is nothing to resume: say how to start it again.
    config.write_text(to_toml(make_config(**{**QUIET, "train.checkpoint_every": 0})))
    code, out, err = run_cli(["train", str(config), "--out", str(tmp_path / "early")])
    assert code == 130 and str(tmp_path / "early") in err and "--overwrite" in err and "--resume" not in err


# ---------------------------------------------------------------------------- loading models

_LOAD_FROM_CACHE = """
from podsrl.config import ModelConfig
from podsrl.errors import ConfigError
from podsrl.models import load_policy, resolve_model_path
assert resolve_model_path("podsrl-test/tiny-llama") == "podsrl-test/tiny-llama"
policy = load_policy(ModelConfig(name="podsrl-test/tiny-llama", device="cpu"))
print("loaded", type(policy.model).__name__, policy.path)
try:
    load_policy(ModelConfig(name="podsrl-test/not-in-the-cache", device="cpu"))
except ConfigError as err:
    print("error", str(err).replace("\\n", "<NL>"))
"""


def test_a_hub_id_loads_from_the_local_hub_cache(tiny_model_dir, tmp_path):
    cache = tmp_path / "hub"
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--podsrl-test--tiny-llama"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", _LOAD_FROM_CACHE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "loaded LlamaForCausalLM podsrl-test/tiny-llama" in lines
    (error,) = [line for line in lines if line.startswith("error ")]
    assert "model.name" in error and "podsrl-test/not-in-the-cache" in error and "<NL>" not in error


def test_only_existing_or_explicit_paths_are_directories(tiny_model_dir, tmp_path, monkeypatch):
    from podsrl.models import resolve_model_path

    monkeypatch.chdir(tiny_model_dir.parent)
    assert Path(resolve_model_path(tiny_model_dir.name)).resolve() == tiny_model_dir.resolve()  # exists: a directory
    assert resolve_model_path("org/name") == "org/name"  # a hub id
    for name in ("./org/name", "~/podsrl-no-such-dir/x", str(tmp_path / "missing")):
        with pytest.raises(ConfigError, match="does not exist"):
            resolve_model_path(name)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not a model")
    with pytest.raises(ConfigError) as err:
        resolve_model_path(str(tmp_path / "notes"))
    assert str(tmp_path / "notes") in str(err.value) and "not a model" in str(err.value)


def test_a_directory_that_is_not_a_model_through_the_cli(tmp_path):
    (tmp_path / "stuff").mkdir()
    code, _, err = run_cli(["eval", f"--model.name={tmp_path / 'stuff'}", "--task.options.num_eval=2"])
    assert_user_error(code, err, "model.name", str(tmp_path / "stuff"), "not a model")
    assert err.count("\n") == 1


# ------------------------------------------------------------------ bad values, one line each


def test_non_utf8_toml_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("[task]\nsystem_prompt = \"R\xe9ponds\"\n".encode("latin-1"))
    code, _, err = run_cli(["train", str(path), "--out", str(tmp_path / "run")])
    assert_user_error(code, err, str(path), "UTF-8")
    assert not (tmp_path / "run").exists()


def test_non_utf8_comparison_file(tmp_path):
    from podsrl.compare import load_plan

    path = tmp_path / "compare.toml"
    path.write_bytes(b"[compare]\nseeds = 1 # \xe9\n")
    with pytest.raises(ConfigError) as err:
        load_plan(path)
    assert str(path) in str(err.value) and "UTF-8" in str(err.value)


def test_non_utf8_jsonl_task_file(tmp_path):
    from podsrl.tasks import load_task

    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"question": "1+1?", "answer": "2"}\n{"question": "caf\xe9", "answer": "3"}\n')
    with pytest.raises(ConfigError) as err:
        load_task("jsonl", train_path=str(path), num_eval=1)
    assert f"{path}:2" in str(err.value) and "UTF-8" in str(err.value)


BAD_VALUES = [
    pytest.param(["optim.beta1=2"], ["optim.beta1", "[0, 1)"], id="beta1-2"),
    pytest.param(["optim.beta2=1"], ["optim.beta2", "[0, 1)"], id="beta2-1"),
    pytest.param(["optim.beta1=-0.5"], ["optim.beta1"], id="beta1-negative"),
    pytest.param(["optim.lr=inf"], ["optim.lr", "finite", "inf"], id="lr-inf"),
    pytest.param(["optim.lr=nan"], ["optim.lr", "finite", "nan"], id="lr-nan"),
    pytest.param(["rollout.temperature=inf"], ["rollout.temperature", "finite"], id="temperature-inf"),
    pytest.param(["loss.eps_low=nan"], ["loss.eps_low", "finite"], id="eps-nan"),
    pytest.param(["eval.max_problems=-1"], ["eval.max_problems", ">= 1"], id="max-problems-negative"),
    pytest.param(["eval.max_problems=0"], ["eval.max_problems", ">= 1"], id="max-problems-zero"),
]


@pytest.mark.parametrize("overrides, fragments", BAD_VALUES)
def test_bad_value_is_a_config_error(overrides, fragments):
    with pytest.raises(ConfigError) as err:
        load(None, overrides)
    for fragment in fragments:
        assert fragment in str(err.value), f"{fragment!r} missing from {err.value}"


def test_bad_value_through_the_cli_leaves_no_run_directory(tmp_path):
    code, _, err = run_cli(["train", "--out", str(tmp_path / "run"), "--optim.beta1=2"])
    assert_user_error(code, err, "optim.beta1")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option", ["num_train", "num_eval"])
def test_a_task_with_no_problems_is_a_config_error(base_run, tmp_path, option):
    _, config = base_run
    code, _, err = run_cli(["train", str(config), "--out", str(tmp_path / "run"), "--no-plot", f"--task.options.{option}=0"])
    assert_user_error(code, err, option, "task 'arithmetic'")
    assert not (tmp_path / "run").exists()


def test_out_naming_a_file_or_an_unwritable_place(base_run, tmp_path):
    _, config = base_run
    file = tmp_path / "a-file"
    file.write_text("keep me")
    code, _, err = run_cli(["train", str(config), "--out", str(file)])
    assert_user_error(code, err, str(file), "is a file")
    code, _, err = run_cli(["train", str(config), "--out", str(file / "run")])
    assert_user_error(code, err, str(file / "run"), "cannot create")
    assert file.read_text() == "keep me"
    # Found only when the directory is made (root may write anywhere but /proc and /sys).
    code, _, err = run_cli(["train", str(config), "--out", "/proc/podsrl-run", "--no-plot"])
    assert_user_error(code, err, "/proc/podsrl-run", "cannot create")


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("--task.options.digits=3", ["'digits'"]),
        ("--model.name=/nonexistent/model", ["/nonexistent/model"]),
        ("--reward.names=/nonexistent/rewards.py:score", ["/nonexistent/rewards.py"]),
    ],
    ids=["task-option", "model", "reward-file"],
)
def test_a_run_that_fails_its_checks_leaves_no_directory(base_run, tmp_path, override, fragments):
    _, config = base_run
    code, _, err = run_cli(["train", str(config), "--out", str(tmp_path / "runs" / "run"), override])
    assert_user_error(code, err, *fragments)
    assert not (tmp_path / "runs").exists()


def test_plot_of_a_damaged_metrics_file(run_copy, tmp_path):
    run, _ = run_copy
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text(lines[0] + "\n<<<garbage>>>\n" + lines[1] + "\n")
    code, _, err = run_cli(["plot", str(run), "-o", str(tmp_path / "x.png")])
    assert_user_error(code, err, f"{metrics}:2", "not valid JSON")
    assert err.count("\n") == 1
    metrics.write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")  # no train_seconds
    code, _, err = run_cli(["plot", str(run), "-o", str(tmp_path / "x.png")])
    assert_user_error(code, err, str(metrics), "row 1", "train_seconds")
    metrics.write_bytes(b'{"step": 1, "note": "\xff"}\n')
    code, _, err = run_cli(["plot", str(run), "-o", str(tmp_path / "x.png")])
    assert_user_error(code, err, str(metrics), "UTF-8")


def test_plot_and_eval_json_to_an_unwritable_place(base_run, tmp_path):
    run, _ = base_run
    file = tmp_path / "a-file"
    file.write_text("")
    for target in (file / "x.png", tmp_path, tmp_path / "x.notanimage"):
        code, _, err = run_cli(["plot", str(run), "-o", str(target)])
        assert_user_error(code, err, str(target))
        assert err.count("\n") == 1
    code, _, err = run_cli(["eval", "--run", str(run), "--json", str(file / "e.json")])
    assert_user_error(code, err, "--json", str(file / "e.json"))


def test_write_text_atomic_replaces_or_keeps(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    rundir.write_text_atomic(path, "one\n")
    monkeypatch.setattr(rundir.os, "replace", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        rundir.write_text_atomic(path, "two\n")
    monkeypatch.undo()
    assert path.read_text() == "one\n"
    rundir.write_text_atomic(path, "three\n")
    assert path.read_text() == "three\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
