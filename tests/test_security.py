"""SECURITY.md, claim by claim: what comes from elsewhere is data, never code (issue 37).

A planted pickle payload (:class:`Payload`: unpickling it would create a marker file) in every file
podsrl could unpickle; model directories whose config names their own Python code (``auto_map``);
tokens in the environment; the model card's snippets for a path with quotes; the reward code a
resume imports; the vLLM engine on a model with a short context. Each test is named in SECURITY.md
beside the claim it checks.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from test_cli import run_cli  # (exit code, stdout, stderr) of podsrl ARGV, in-process
from podsrl.config import from_dict, to_toml
from podsrl.errors import ConfigError
from podsrl.run import checkpoint as ckpt
from podsrl.run.metrics import read_jsonl
from podsrl.train import loop as trainer

from conftest import tiny_config_dict

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The runs here use the tiny model with a 686-token tokenizer, ten times faster a step than
    with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """What an attacker plants: unpickling it runs code (here: creates ``marker``)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def plant(file: Path, marker: Path) -> None:
    """Add a Payload to the pickled dict in ``file`` (a checkpoint that loads as before, plus the payload)."""
    blob = torch.load(file, weights_only=False)  # a file this test just had written (TRL's RNG file holds numpy states)
    blob["note"] = Payload(marker)
    torch.save(blob, file)




def _quiet(*args, **kwargs) -> None:
    pass


@pytest.fixture(scope="module")
def run(make_config, tmp_path_factory, one_thread):
    """A 2-step full fine-tuning run of the tiny model, both checkpoints kept, no export."""
    run = tmp_path_factory.mktemp("sec") / "run"
    cfg = make_config(**{"train.max_steps": 2, "train.checkpoint_every": 1, "train.keep_checkpoints": 2, "train.export_model": False})
    trainer.train(cfg, run_dir=run, log=_quiet)
    return run


@pytest.fixture
def run_copy(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _newest_state(run: Path) -> Path:
    return ckpt.latest(run) / "state.pt"


# ------------------------------------------------------------------------------ checkpoints are data


def test_podsrl_checkpoint_loads_as_plain_data(run):
    """podsrl's own state.pt (optimizer, scheduler, TrainState, RNG states) loads with weights_only=True."""
    for step in sorted((run / "checkpoints").glob("step-*")):
        blob = torch.load(step / "state.pt", weights_only=True)
        assert set(blob) == {"optimizer", "scheduler", "state", "rng"}
        assert type(blob["state"]) is dict and blob["state"]["step"] == int(step.name.removeprefix("step-"))
        assert ckpt.read_train_state(step).step == blob["state"]["step"]
        assert isinstance(blob["rng"]["torch"], torch.Tensor) and isinstance(blob["rng"]["python"], tuple)


def test_resume_refuses_a_planted_pickle(run_copy, tmp_path):
    marker = tmp_path / "pwned"
    state = _newest_state(run_copy)
    plant(state, marker)
    code, out, err = run_cli(["train", "--resume", str(run_copy), "--train.max_steps=3", "--no-plot"])
    assert not marker.exists()
    assert code == 2 and "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("podsrl: ")]  # one line (progress bars aside)
    assert str(state) in line and "weights_only=True" in line and "builtins.exec" in line
    # Not skipped for the older checkpoint either: the user decides what to do with such a run directory.
    assert [r["step"] for r in read_jsonl(run_copy / "metrics.jsonl")] == [1, 2]
    assert not (run_copy / "checkpoints" / "step-000003").exists()


def test_resume_api_refuses_a_planted_pickle_without_falling_back(run_copy, tmp_path, make_config):
    marker = tmp_path / "pwned"
    plant(_newest_state(run_copy), marker)
    cfg = make_config(**{"train.max_steps": 3})
    with pytest.raises(ckpt.UnsafeCheckpoint, match="step-000002"):
        trainer.train(cfg, run_dir=run_copy, resume=True, log=_quiet)
    assert not marker.exists()


def test_export_refuses_a_planted_pickle(run_copy, tmp_path):
    marker, out = tmp_path / "pwned", tmp_path / "model"
    state = _newest_state(run_copy)
    plant(state, marker)
    code, _, err = run_cli(["export", str(run_copy), "--out", str(out)])
    assert not marker.exists()
    assert code == 2 and "Traceback" not in err and str(state) in err and "weights_only=True" in err, err
    assert not out.exists()


def test_export_imports_no_reward_code(run_copy, reward_file, tmp_path):
    """``podsrl export`` reads a run's config.toml but imports none of the reward code it names."""
    marker, out = tmp_path / "pwned", tmp_path / "model"
    evil = tmp_path / "evil_reward.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef fn(completion, example):\n    return 0.0\n")
    config = run_copy / "config.toml"
    config.write_text(config.read_text().replace(f"{reward_file}:length_reward", f"{evil}:fn"))
    code, _, err = run_cli(["export", str(run_copy), "--out", str(out)])
    assert code == 0, err
    assert (out / "config.json").is_file() and f"{evil}:fn" in (out / "podsrl_config.toml").read_text()
    assert not marker.exists()


def test_eval_of_a_run_unpickles_nothing(run_copy, tmp_path, monkeypatch):
    """``podsrl eval --run`` reads the weights (safetensors) only: a planted state.pt is never opened."""
    marker = tmp_path / "pwned"
    for step in (run_copy / "checkpoints").glob("step-*"):
        plant(step / "state.pt", marker)
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    code, out, err = run_cli(["eval", "--run", str(run_copy)])
    assert code == 0, err
    assert not marker.exists() and loads == []


# What loads code or pickles, by qualified name: any use of these (a call, a base class, a callback).
UNSAFE_NAMES = (
    "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "_pickle.Unpickler", "cloudpickle", "dill",
    "joblib", "shelve", "marshal.load", "marshal.loads", "yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.UnsafeLoader",
    "builtins.eval", "builtins.exec",
)  # fmt: skip
WEIGHTS_ONLY_LOADERS = ("torch.load", "torch.serialization.load")  # safe only called with weights_only=True
UNSAFE_KEYWORDS = {"trust_remote_code": True, "weights_only": False, "allow_pickle": True}


def unsafe_loads(source: str) -> list[str]:
    """The lines of ``source`` (Python) that could unpickle or run code from data: a use of a name in
    :data:`UNSAFE_NAMES`, a torch loader (:data:`WEIGHTS_ONLY_LOADERS`) not called with
    ``weights_only=True``, a call with one of :data:`UNSAFE_KEYWORDS`. Names are resolved through
    the module's imports, aliases included (``from torch import load as L``, ``import pickle as p``,
    ``from torch import serialization``); the builtins ``eval`` and ``exec`` by name, a method of that
    name (``model.eval()``) is not one."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> what it names
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    for name in ("eval", "exec"):
        bound.setdefault(name, f"builtins.{name}")

    def qualified(node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in bound:
            return None
        return ".".join([bound[node.id], *reversed(parts)])

    def unsafe(name: str) -> bool:
        return any(name == u or name.startswith(u + ".") for u in UNSAFE_NAMES)

    called_safely = set()  # the loader nodes called with weights_only=True
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            given = {k.arg: k.value.value for k in node.keywords if k.arg and isinstance(k.value, ast.Constant)}
            if given.get("weights_only") is True:
                called_safely.add(id(node.func))
            for key, bad in UNSAFE_KEYWORDS.items():
                if key in given and given[key] is bad:
                    found.append(f"{node.lineno}: {key}={bad}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [f"{node.lineno}: import {node.module}.{a.name}" for a in node.names if unsafe(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if unsafe(a.name)]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            name = qualified(node)
            if name is None:
                continue
            if name in WEIGHTS_ONLY_LOADERS and id(node) not in called_safely:
                found.append(f"{node.lineno}: {name} without weights_only=True")
            elif unsafe(name) and not (isinstance(node, ast.Attribute) and unsafe(qualified(node.value) or "")):
                found.append(f"{node.lineno}: {name}")  # (once per chain: pickle.Unpickler(f).load is one use)
    return found


@pytest.mark.parametrize(
    "source,want",
    [
        ("from torch import load\nload(f)\n", ["2: torch.load without weights_only=True"]),
        ("import torch\ntorch.serialization.load(f, map_location='cpu')\n", ["2: torch.serialization.load without weights_only=True"]),
        ("from torch import serialization as s\ns.load(f)\n", ["2: torch.serialization.load without weights_only=True"]),
        ("import pickle\nclass Mine(pickle.Unpickler):\n    pass\n", ["2: pickle.Unpickler"]),
        ("from pickle import Unpickler as U\nU(f).load()\n", ["1: import pickle.Unpickler", "2: pickle.Unpickler"]),
        ("import pickle as p\nx = p.loads(b)\n", ["2: pickle.loads"]),
        ("import torch as T\nloader = T.load\n", ["2: torch.load without weights_only=True"]),
        ("import torch\ntorch.load(f, weights_only=False)\n", ["2: weights_only=False", "2: torch.load without weights_only=True"]),
        ("import numpy as np\nnp.load(f, allow_pickle=True)\n", ["2: allow_pickle=True"]),
        ("exec(text)\n", ["1: builtins.exec"]),
        # safe: a weights-only load under any name, pickling out, methods named eval or load
        ("import torch, pickle\nfrom torch import load as L\nL(f, weights_only=True)\ntorch.load(f, weights_only=True, mmap=True)\n"
         "pickle.dumps(x)\nmodel.eval()\nstate.load(f)\nexcept_ = pickle.UnpicklingError\n", []),
    ],
)  # fmt: skip
def test_the_unsafe_loader_check_reads_imports_and_aliases(source, want):
    assert unsafe_loads(source) == want


def test_no_unsafe_loader_in_the_source():
    """No module of podsrl, bench/ or examples/ loads code or pickles from data (:func:`unsafe_loads`:
    every torch loader called with weights_only=True; no pickle.load(s) or Unpickler, joblib, dill,
    shelve, marshal, numpy allow_pickle, yaml.load, eval/exec, or trust_remote_code=True)."""
    found = []
    for folder in ("podsrl", "bench", "examples"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            found += [f"{file.relative_to(ROOT)}:{line}" for line in unsafe_loads(file.read_text())]
    assert found == []


# ------------------------------------------------------------------------------ TRL: PODSTrainer


_TRL_LOADERS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_rng_state", "_load_scaler", "_load_callback_state", "_load_best_model")


def test_pods_trainer_leaves_checkpoint_loading_to_transformers():
    """PODSTrainer reads no file on resume: its checkpoint loaders are GRPOTrainer's, which are
    transformers' Trainer's (weights_only=True) plus, in TRL 1.16, one JSON file; neither TRL's
    trainer nor podsrl's integration unpickles anything."""
    pytest.importorskip("trl")
    import inspect

    import trl.trainer.grpo_trainer as grpo_module
    from transformers import Trainer
    from trl import GRPOTrainer

    from podsrl.integrations import trl as integration
    from podsrl.integrations.trl import PODSTrainer

    for name in _TRL_LOADERS:
        if hasattr(Trainer, name):
            assert getattr(PODSTrainer, name) is getattr(GRPOTrainer, name), name
    for module in (grpo_module, integration):
        assert not re.search(r"torch\.load|pickle\.load|np\.load", inspect.getsource(module)), module.__name__


@pytest.fixture(scope="module")
def trl_checkpoint(tiny_model_dir, tmp_path_factory, one_thread):
    """A one-step PODSTrainer run saved at step 1 (generation faked, as tests/test_trl.py does)."""
    pytest.importorskip("trl")
    out = tmp_path_factory.mktemp("trl") / "out"
    trainer = _pods_trainer(tiny_model_dir, out, max_steps=1)
    trainer.train()
    return out / "checkpoint-1"


def _pods_trainer(model_dir: Path, out: Path, max_steps: int):
    from datasets import Dataset

    from podsrl.integrations.trl import PODSConfig, PODSTrainer

    n = 4
    args = PODSConfig(
        output_dir=str(out), num_generations=n, per_device_train_batch_size=2 * n, max_completion_length=8, learning_rate=1e-3,
        report_to="none", use_cpu=True, bf16=False, save_strategy="steps", save_steps=1, max_steps=max_steps, logging_steps=1, seed=7,
        pods_m=2,
    )  # fmt: skip
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(8)]})

    def length(completions, **columns):
        return [len(c[0]["content"]) / 40.0 for c in completions]

    trainer = PODSTrainer(model=str(model_dir), reward_funcs=[length], args=args, train_dataset=data)
    calls = []

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        g = torch.Generator().manual_seed(len(calls))
        calls.append(1)
        return [torch.randint(300, 5000, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist() for _ in prompt_ids], None

    trainer._generate_single_turn = generate
    return trainer


@pytest.mark.parametrize("file", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"])
def test_trl_resume_runs_no_planted_pickle(trl_checkpoint, tiny_model_dir, tmp_path, file):
    """transformers 5 loads a TRL checkpoint's optimizer, scheduler and RNG files with weights_only=True
    (a payload is refused) and never reads training_args.bin on resume."""
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "out" / "checkpoint-1"
    shutil.copytree(trl_checkpoint, checkpoint)
    if file == "training_args.bin":
        torch.save(Payload(marker), checkpoint / file)
    else:
        plant(checkpoint / file, marker)
    trainer = _pods_trainer(tiny_model_dir, tmp_path / "out", max_steps=2)
    if file == "training_args.bin":
        trainer.train(resume_from_checkpoint=str(checkpoint))
        assert trainer.state.global_step == 2
    else:
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            trainer.train(resume_from_checkpoint=str(checkpoint))
    assert not marker.exists()


# ------------------------------------------------------------------------------ model directories


EVIL_MODULE = """
open({marker!r}, "w").close()


class EvilConfig:
    pass


class EvilModel:
    pass


class EvilTokenizer:
    pass
"""


def _model_with_code(source: Path, target: Path, marker: Path, *, model_type: str | None = None) -> Path:
    """A copy of ``source`` whose config.json and tokenizer_config.json name code in evil.py (``auto_map``)."""
    shutil.copytree(source, target)
    (target / "evil.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    config = json.loads((target / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    if model_type is not None:
        config["model_type"] = model_type
    (target / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((target / "tokenizer_config.json").read_text())
    tokenizer["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return target


def test_model_code_named_by_auto_map_is_never_imported(tiny_model_dir, reward_file, tmp_path):
    """``podsrl train``, its export and ``podsrl eval --model`` on a model directory whose config names its own code."""
    marker = tmp_path / "pwned"
    model = _model_with_code(tiny_model_dir, tmp_path / "model", marker)
    config = tmp_path / "tiny.toml"
    data = tiny_config_dict(model, reward_file, **{"train.max_steps": 1, "train.export_model": True})
    config.write_text(to_toml(from_dict(data)))
    code, _, err = run_cli(["train", str(config), "--out", str(tmp_path / "run"), "--no-plot"])
    assert code == 0, err
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    code, _, err = run_cli(["eval", "--model", str(model), "--eval.max_problems=2", "--eval.max_new_tokens=2", "--rollout.engine=transformers"])
    assert code == 0, err
    assert not marker.exists()


def test_model_code_is_refused_even_if_a_user_would_say_yes(tiny_model_dir, tmp_path, monkeypatch):
    """An architecture transformers does not know, with code: refused with a message, never asked
    about (transformers asks on stdin when trust_remote_code is left unset)."""
    marker = tmp_path / "pwned"
    model = _model_with_code(tiny_model_dir, tmp_path / "model", marker, model_type="podsrl_evil")
    monkeypatch.setattr("builtins.input", lambda *args: "y")
    code, _, err = run_cli(["eval", "--model", str(model), "--eval.max_problems=2", "--rollout.engine=transformers"])
    assert not marker.exists()
    assert code == 2 and "Traceback" not in err, err
    # podsrl's own line (transformers' said to pass trust_remote_code=True, with a hub URL made of the local path)
    assert f"model.name: '{model}' can only be loaded by running Python code that comes with it" in err
    assert "(model_type 'podsrl_evil')" in err and "podsrl never runs a model's own code" in err
    assert "Use a model whose architecture transformers ships" in err
    assert "trust_remote_code=True`" not in err and "hf.co" not in err and err.count("\n") == 1


# ------------------------------------------------------------------------------ datasets


def test_a_dataset_directory_is_read_as_data(tmp_path):
    """The task loaders read JSON lines; a loading script beside them is never run, and one behind
    a dataset name is refused by ``datasets`` (5.x: no loading scripts)."""
    from podsrl.tasks import load_task
    from podsrl.tasks.jsonl import load_dataset

    marker = tmp_path / "pwned"
    data = tmp_path / "gsm8k"
    data.mkdir()
    row = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
    for name in ("train.jsonl", "test.jsonl"):
        (data / name).write_text(json.dumps(row) + "\n")
    for name in ("gsm8k.py", "__init__.py"):
        (data / name).write_text(f"open({str(marker)!r}, 'w').close()\n")
    task = load_task("gsm8k", path=str(data))
    assert [e.answer for e in task.eval] == ["2"]
    pytest.importorskip("datasets")
    with pytest.raises(ConfigError, match="scripts are no longer supported"):
        load_dataset("gsm8k", str(data), None, what="a local directory", instead="pass path=")
    assert not marker.exists()


# ------------------------------------------------------------------------------ what runs when


def test_resume_imports_the_reward_code_it_names_and_eval_imports_none(run_copy, tmp_path):
    """A run directory's config.toml names reward code (here a module that writes a file when it is
    imported). ``podsrl train --resume`` imports and runs it, and says so first; ``podsrl eval --run``
    and ``eval --model`` of the run's export score with the task's grader and import none, and say
    nothing of it (they said "which is imported and run" while the file stayed unwritten)."""
    marker = tmp_path / "imported"
    evil = tmp_path / "evil_reward.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef fn(completion, example):\n    return float(len(completion) % 2)\n")
    config = run_copy / "config.toml"
    config.write_text(re.sub(r'^names = \[.*\]$', f'names = ["{evil}:fn"]', config.read_text(), count=1, flags=re.M))
    code, out, err = run_cli(["eval", "--run", str(run_copy), "--eval.max_problems=2"])
    assert code == 0, err
    assert not marker.exists() and "reward code" not in out
    code, _, err = run_cli(["export", str(run_copy), "--out", str(tmp_path / "model")])
    assert code == 0, err
    code, out, err = run_cli(["eval", "--model", str(tmp_path / "model"), "--eval.max_problems=2"])
    assert code == 0, err
    assert not marker.exists() and "reward code" not in out
    code, out, err = run_cli(["train", "--resume", str(run_copy), "--train.max_steps=3", "--no-plot"])
    assert code == 0, err
    assert marker.exists()
    lines = [line for line in out.splitlines() if "reward code" in line]
    assert lines == [f"podsrl: {config} names reward code, which is imported and run (reward.names): {evil}:fn"]


# ------------------------------------------------------------------------------ secrets


SECRETS = {"HF_TOKEN": "hf_podsrlTestSecret0123456789", "WANDB_API_KEY": "wandb0123456789podsrlTestSecret", "HUGGING_FACE_HUB_TOKEN": "hf_podsrlOtherSecret987"}


def test_tokens_in_the_environment_are_written_nowhere(make_config, tmp_path, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    cfg = make_config(**{"train.max_steps": 1, "train.export_model": True, "train.export_checkpoints": True})
    (tmp_path / "tiny.toml").write_text(to_toml(cfg))
    outputs = []
    for argv in (
        ["train", str(tmp_path / "tiny.toml"), "--out", str(tmp_path / "run")],
        ["export", str(tmp_path / "run"), "--out", str(tmp_path / "export")],
        ["eval", "--run", str(tmp_path / "run"), "--json", str(tmp_path / "eval.json")],
        ["env"],
    ):
        code, out, err = run_cli(argv)
        assert code == 0, err
        outputs += [out, err]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "README.md" for p in files) and any(p.name == "metrics.jsonl" for p in files)
    for value in SECRETS.values():
        assert all(value not in text for text in outputs)
        assert [p for p in files if value.encode() in p.read_bytes()] == []


# ------------------------------------------------------------------------------ the model card


WEIRD = "runs/it's a \"quoted\" dir\\with back\\slashes and $(spaces)/model"


@pytest.mark.parametrize("lora, merged", [(False, True), (True, True), (True, False)])
def test_model_card_snippets_quote_the_path(lora, merged):
    from podsrl.run.model_card import CardFacts, render

    cfg = from_dict({"model": {"name": "./base's \"model\"", "lora": lora}})
    text = render(CardFacts(cfg=cfg, run_dir=Path("/nonexistent"), step=1, train_seconds=1.0, world_size=1,
                            dtype="float32", merged=merged, location=WEIRD, name="demo"))  # fmt: skip
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    literals = []
    for block in blocks:
        for node in ast.walk(ast.parse(block)):  # each snippet is valid Python
            if isinstance(node, ast.Call):
                literals += [a.value for a in [*node.args, *(k.value for k in node.keywords)] if isinstance(a, ast.Constant)]
    assert WEIRD in literals
    if lora and merged:
        assert cfg.model.name in literals
    commands = re.findall(r"`((?:podsrl eval|vllm serve) [^`]*)`", text)
    assert commands
    for command in commands:  # shell commands: the path is one argument, nothing substituted
        assert shlex.split(command)[-1] == WEIRD


# ------------------------------------------------------------------------------ vLLM: a short context


def _context_config(**kwargs):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, **kwargs)


def test_vllm_max_model_len_is_capped_at_the_model_context():
    from podsrl.engines.vllm import Context, fit_max_model_len, model_context

    short = model_context(_context_config(max_position_embeddings=512))
    assert short == Context(512, "max_position_embeddings = 512 in its config.json")
    length, note = fit_max_model_len(1024, short)
    assert length == 512 and "rollout.max_model_len = 1024" in note and "max_position_embeddings = 512" in note
    assert fit_max_model_len(256, short) == (256, None) and fit_max_model_len(1024, None) == (1024, None)
    # Where else a length is stated: a smaller tokenizer limit, linear RoPE scaling, a pre-scaled RoPE.
    class Tokenizer:
        model_max_length = 300

    assert model_context(_context_config(max_position_embeddings=512), Tokenizer()).tokens == 300
    linear = _context_config(max_position_embeddings=512, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4})
    assert model_context(linear).tokens == 2048
    yarn = _context_config(max_position_embeddings=4096, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                                         "original_max_position_embeddings": 1024})  # fmt: skip
    assert model_context(yarn).tokens == 4096


def test_vllm_max_model_len_allows_longer_with_vllms_switch(monkeypatch):
    from podsrl.engines.vllm import Context, fit_max_model_len

    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert fit_max_model_len(1024, Context(512, "x")) == (1024, None)


def test_vllm_prompt_beyond_the_capped_length_names_the_model_limit():
    from podsrl.engines.vllm import Context, VLLMEngine

    engine = object.__new__(VLLMEngine)  # no vLLM: the length check alone
    engine.max_model_len, engine.context, engine.capped = 512, Context(512, "max_position_embeddings = 512 in its config.json"), True
    engine._check_lengths([[1] * 500], 12)
    with pytest.raises(ConfigError, match=r"prompt 0 has 500 tokens.*max_new_tokens = 13.*the model's context \(max_position_embeddings = 512"
                       r".*capped.*lower max_new_tokens"):  # fmt: skip
        engine._check_lengths([[1] * 500], 13)
    engine.max_model_len, engine.capped = 256, False
    with pytest.raises(ConfigError, match=r"raise rollout.max_model_len \(the model takes up to 512\)"):
        engine._check_lengths([[1] * 250], 13)


def test_vllm_refusing_the_length_is_a_config_error():
    """A length vLLM still refuses (a context read otherwise than here) is one line naming the setting."""
    from podsrl.engines.vllm import VLLMEngine

    engine = object.__new__(VLLMEngine)
    engine.max_model_len = 1024
    refusal = (
        "1 validation error for ModelConfig\n  Value error, User-specified max_model_len (1024) is greater than the derived "
        "max_model_len (max_position_embeddings=512.0 or model_max_length=None in model's config.json). To allow overriding..."
    )
    with pytest.raises(ConfigError) as err, engine._length_refused("DIR"):
        raise ValueError(refusal)
    assert str(err.value).startswith("rollout.max_model_len = 1024: vLLM refuses it for DIR (User-specified max_model_len (1024)")
    assert "max_position_embeddings=512.0" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="something else"), engine._length_refused("DIR"):
        raise ValueError("something else")


@pytest.mark.vllm
def test_vllm_eval_of_a_short_context_model(tmp_path):
    """``podsrl eval --model DIR --rollout.engine=vllm`` on a model of 512 positions (whose config
    also names its own code): runs with max_model_len 512 and says so; the code is never imported."""
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from podsrl.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    # Head size 128 / 2 = 64, the embedded model's, which vLLM's CPU build runs in tests/test_vllm.py.
    torch.manual_seed(0)
    source = tmp_path / "source"
    LlamaForCausalLM(config).save_pretrained(source)
    tokenizer.save_pretrained(source)
    marker = tmp_path / "pwned"
    model = _model_with_code(source, tmp_path / "model", marker)
    code, out, err = run_cli([
        "eval", "--model", str(model), "--rollout.engine=vllm", "--rollout.kv_cache_gib=0.25", "--eval.max_problems=2",
        "--eval.max_new_tokens=4", "--eval.temperature=0", "--eval.samples=1",
    ])  # fmt: skip
    assert code == 0, err
    assert "rollout.max_model_len = 1024 is longer than the model's context (max_position_embeddings = 512" in out
    assert "accuracy: " in out
    assert not marker.exists()
