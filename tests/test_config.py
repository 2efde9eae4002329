"""Configuration: defaults, TOML files, overrides, validation messages, and the to_toml round trip.

Every bad-config case is checked twice: ``load`` raises a ConfigError whose message names the field
(and the valid values or the fix), and the CLI turns it into exit code 2 with one line on stderr and
no traceback (tests/test_cli.py runs the same table through ``podsrl train``).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podsrl.config import DEFAULT_TASK_OPTIONS, Config, from_dict, load, to_toml
from podsrl.errors import ConfigError

# (overrides, fragments the message must contain). Shared with tests/test_cli.py.
BAD_OVERRIDES = [
    pytest.param(["rollout.n=16", "select.m=20"], ["select.m", "rollout.n", "20", "16"], id="m-exceeds-n"),
    pytest.param(["rollout.n=16", "select.m_final=17", "select.m_schedule=linear"], ["select.m_final", "rollout.n"], id="m_final-exceeds-n"),
    pytest.param(["select.m_final=8"], ["select.m_schedule", "'constant'", "select.m_final = 8", "linear"], id="m_final-never-reached"),
    pytest.param(["select.token_fraction=0.5", "select.token_fraction_final=1.0"], ["select.token_schedule", "never be reached"], id="token-fraction-final-never-reached"),
    pytest.param(["select.schedule_steps=1"], ["select.schedule_steps", ">= 2"], id="schedule-steps"),
    pytest.param(["select.m=0"], ["select.m", ">= 1"], id="m-below-1"),
    pytest.param(["select.rule=best"], ["select.rule", "'best'", "max_variance", "d3s_intra", "all"], id="unknown-rule"),
    pytest.param(["task.name=mmlu"], ["task.name", "'mmlu'", "arithmetic", "gsm8k", "jsonl"], id="unknown-task"),
    pytest.param(["task.options.digits=3"], ["task.options.digits", "'arithmetic'", "max_digits"], id="unknown-task-option"),
    # `name` is load_task's own argument (the task): as an option it was a TypeError (issue 57).
    pytest.param(["task.name=reasoning_gym", "task.options.name=chain_sum"], ["task.options.name", "task.name chooses the task", "--task.options.dataset=chain_sum"], id="option-named-name"),
    pytest.param(["task.options.name=x"], ["task.options.name", "task.name chooses the task", "valid options"], id="option-named-name-arithmetic"),
    pytest.param(["reward.names=corectness"], ["reward.names", "'corectness'", "correctness", "format"], id="unknown-reward"),
    pytest.param(["rollout.engine=sglang"], ["rollout.engine", "'sglang'", "auto", "transformers", "vllm"], id="unknown-engine"),
    pytest.param(["loss.aggregation=mean"], ["loss.aggregation", "sequence", "token", "constant"], id="unknown-aggregation"),
    pytest.param(["optim.lr_schedule=linear"], ["optim.lr_schedule", "cosine"], id="unknown-lr-schedule"),
    pytest.param(["optim.lr_schedule=cosine", "train.max_steps=none"], ["optim.lr_schedule", "'cosine'", "train.max_steps", "set train.max_steps"], id="cosine-without-max-steps"),
    pytest.param(["optim.lr_schedule=cosine", "train.max_steps=10", "optim.warmup_steps=10"], ["optim.warmup_steps = 10", "train.max_steps = 10", "'cosine'"], id="cosine-all-warmup"),
    pytest.param(["train.max_steps=10", "optim.warmup_steps=10"], ["optim.warmup_steps", "= 10", "train.max_steps = 10", "never reach optim.lr"], id="constant-all-warmup"),
    pytest.param(["loss.eps_low=1"], ["loss.eps_low", "[0, 1)", "1"], id="eps-low-one"),
    pytest.param(["select.m_schedule=fast"], ["select.m_schedule", "linear"], id="unknown-m-schedule"),
    pytest.param(["shuffle.seed=1"], ["unknown config section", "shuffle", "select", "rollout"], id="unknown-section"),
    pytest.param(["select.q=3"], ["unknown setting select.q", "rule", "m_final"], id="unknown-setting"),
    pytest.param(["m=3"], ["--section.key=value"], id="override-without-section"),
    pytest.param(["select.m"], ["select.m", "--section.key=value"], id="override-without-value"),
    pytest.param(["select.m=abc"], ["select.m", "whole number", "'abc'"], id="int-from-text"),
    pytest.param(["select.m=2.5"], ["select.m", "whole number"], id="int-from-float"),
    pytest.param(["optim.lr=fast"], ["optim.lr", "number", "'fast'"], id="float-from-text"),
    pytest.param(["model.lora=yes"], ["model.lora", "true or false"], id="bool-from-text"),
    pytest.param(["train.max_steps=ten"], ["train.max_steps", "whole number"], id="optional-int-from-text"),
    pytest.param(["rollout.n=8", "select.rule=all", "select.m=4"], ["select.m", "'all'", "rollout.n = 8"], id="all-needs-m-equal-n"),
    pytest.param(["reward.names=correctness,format", "reward.weights=1"], ["reward.weights", "1 entries", "2"], id="weights-length"),
    pytest.param(["eval.temperature=0", "eval.samples=4"], ["eval.samples", "greedy", "temperature"], id="greedy-with-samples"),
    pytest.param(["rollout.temperature=0"], ["rollout.temperature", "> 0"], id="rl-temperature-zero"),
    pytest.param(["select.token_fraction=0"], ["select.token_fraction", "(0, 1]"], id="token-fraction-zero"),
    pytest.param(["train.max_steps=none", "train.max_seconds=none"], ["train.max_steps", "max_seconds"], id="no-budget"),
    pytest.param(["model.dtype=int8"], ["model.dtype", "bfloat16"], id="unknown-dtype"),
    pytest.param(["optim.micro_batch_size=0"], ["optim.micro_batch_size", ">= 1"], id="micro-batch-zero"),
    pytest.param(["optim.micro_batch_tokens=-1"], ["optim.micro_batch_tokens", ">= 0"], id="micro-batch-tokens-negative"),
    pytest.param(["train.out_dir=runs/{model}-{seed}"], ["train.out_dir", "'model'", "{time}, {rule} and {seed}"], id="out-dir-field"),
]


@pytest.mark.parametrize("overrides, fragments", BAD_OVERRIDES)
def test_bad_override_raises_config_error_naming_the_field(overrides, fragments):
    with pytest.raises(ConfigError) as err:
        load(None, overrides)
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"
    assert "\n" not in message


def test_defaults_are_valid_and_load_without_arguments():
    cfg = load()
    assert cfg == Config()
    assert cfg.select.m is None and cfg.select.m_start(cfg.rollout.n) == 4  # n // 4 of the default n = 16


def test_toml_file_then_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        """
[rollout]
n = 8
temperature = 1   # an integer where a float is expected is accepted

[select]
rule = "d3s_intra"
m = 2

[task.options]
ops = ["+", "-"]
max_digits = 3
num_train = 100
num_eval = 20

[reward]
names = ["correctness", "format"]
weights = [1.0, 0.1]
"""
    )
    cfg = load(path, ["select.m=4", "--optim.lr=1e-5", "task.options.max_digits=2", "model.lora_target_modules=q_proj,v_proj"])
    assert cfg.rollout.n == 8
    assert cfg.rollout.temperature == 1.0 and isinstance(cfg.rollout.temperature, float)
    assert cfg.select.rule == "d3s_intra"
    assert cfg.select.m == 4  # the override wins over the file
    assert cfg.optim.lr == 1e-5
    # A nested override changes one option and keeps the file's others; the demo's defaults fill in
    # what neither gives (min_digits).
    assert cfg.task.options == {**DEFAULT_TASK_OPTIONS["arithmetic"], "ops": ["+", "-"], "max_digits": 2, "num_train": 100, "num_eval": 20}
    assert cfg.reward.names == ["correctness", "format"] and cfg.reward.weights == [1.0, 0.1]
    assert cfg.model.lora_target_modules == ["q_proj", "v_proj"]
    assert cfg.select.advantages_over_group  # "auto" follows the d3s rule
    # Untouched sections keep their defaults.
    assert cfg.loss == Config().loss


def test_nested_override_starts_from_the_default_options():
    cfg = load(None, ["task.options.max_digits=3"])
    assert cfg.task.options == {**Config().task.options, "max_digits": 3}


def test_override_parses_lists_none_and_strings():
    cfg = load(
        None,
        [
            "reward.names=correctness,format",
            "reward.weights=1,0.5",
            "train.max_steps=none",
            "train.max_seconds=90",
            "eval.max_problems=None",
            "task.system_prompt=Be brief, be right.",
            "train.out_dir=runs/x-{seed}",
            "task.instruction=42",
            "model.lora_target_modules=q_proj",
        ],
    )
    assert cfg.task.instruction == "42"  # text fields take the text as written
    assert cfg.model.lora_target_modules == "q_proj"
    assert load(None, ["task.system_prompt=Be brief.", "task.system_prompt=none"]).task.system_prompt is None
    assert cfg.reward.names == ["correctness", "format"]
    assert cfg.reward.weights == [1.0, 0.5]
    assert cfg.train.max_steps is None and cfg.train.max_seconds == 90.0
    assert cfg.eval.max_problems is None
    assert cfg.task.system_prompt == "Be brief, be right."
    assert cfg.train.out_dir == "runs/x-{seed}"


@pytest.mark.parametrize(
    "text, fragments",
    [
        pytest.param("[select]\nm = 3\nm = 4\n", ["invalid TOML"], id="duplicate-key"),
        pytest.param("[select\nm = 3\n", ["invalid TOML"], id="unclosed-table"),
        pytest.param("[select]\nm = \n", ["invalid TOML"], id="missing-value"),
        pytest.param("[selection]\nm = 3\n", ["unknown config section [selection]", "select"], id="unknown-section"),
        pytest.param("[select]\nkeep = 3\n", ["unknown setting select.keep", "m_final"], id="unknown-setting"),
        pytest.param('[select]\nm = "3"\n', ["select.m", "whole number", "'3'"], id="string-for-int"),
        pytest.param("[model]\nlora = 1\n", ["model.lora", "true or false"], id="int-for-bool"),
        pytest.param("select = 3\n", ["[select] must be a table"], id="section-not-a-table"),
        pytest.param('[reward]\nnames = ["correctness"]\nweights = [1.0, 2.0]\n', ["reward.weights", "2 entries"], id="weights"),
    ],
)
def test_bad_toml_file(tmp_path, text, fragments):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    for fragment in fragments:
        assert fragment in str(err.value)
    if "invalid TOML" in fragments:
        assert str(path) in str(err.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.toml")


def test_select_m_message_says_how_to_fix():
    with pytest.raises(ConfigError) as err:
        load(None, ["rollout.n=4", "select.m=5"])
    assert str(err.value).startswith("select.m = 5 exceeds")
    assert "rollout.n = 4" in str(err.value) and "lower select.m or raise rollout.n" in str(err.value)


def test_rule_all_with_m_equal_n_is_valid():
    cfg = load(None, ["select.rule=all", "rollout.n=8", "select.m=8"])
    assert cfg.select.m == cfg.rollout.n == 8


def test_user_reward_names_are_not_rejected_by_the_config():
    # "module:function" and "file.py:function" are resolved (and checked) when the run starts.
    cfg = load(None, ["reward.names=correctness,my_rewards.py:brevity", "reward.weights=1,0.2"])
    assert cfg.reward.names == ["correctness", "my_rewards.py:brevity"]


def test_missing_gsm8k_directory_is_a_config_error():
    from podsrl.tasks.build import build_task

    # The arithmetic demo's options must not leak into another task's options.
    cfg = load(None, ["task.name=gsm8k", "task.options.path=/nonexistent/gsm8k"])
    assert cfg.task.options == {"path": "/nonexistent/gsm8k"}
    with pytest.raises(ConfigError) as err:
        build_task(cfg)
    assert "gsm8k" in str(err.value) and "/nonexistent/gsm8k" in str(err.value)


# --------------------------------------------------------------------------- to_toml round trip


def _round_trip(cfg: Config, tmp_path) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg))
    return load(path)


def test_to_toml_round_trips_the_defaults(tmp_path):
    assert _round_trip(Config(), tmp_path) == Config()


def test_to_toml_round_trips_non_defaults(tmp_path):
    cfg = load(
        None,
        [
            "model.lora=true",
            "model.lora_target_modules=q_proj,v_proj",
            "model.dtype=bfloat16",
            "task.options.max_digits=3",
            "task.options.ops=+,*",
            'task.system_prompt=Say "hi" \\ then answer.',
            "task.instruction=Answer:",
            "reward.names=correctness,format",
            "reward.weights=1.0,-0.25",
            "rollout.n=8",
            "rollout.top_p=0.95",
            "select.rule=d3s_intra",
            "select.m=2",
            "select.m_final=6",
            "select.m_schedule=linear",
            "select.token_fraction=0.5",
            "select.token_fraction_final=1.0",
            "select.token_schedule=cosine",
            "loss.eps_high=0.28",
            "loss.beta=0.04",
            "optim.lr=3e-7",
            "eval.temperature=0.7",
            "eval.samples=4",
            "eval.max_new_tokens=64",
            "eval.max_problems=50",
            "eval.every_seconds=12.5",
            "train.max_seconds=600",
            "train.seed=7",
        ],
    )
    assert _round_trip(cfg, tmp_path) == cfg


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.max_steps=none", "train.max_seconds=120"],
        ["train.max_steps=5", "train.max_seconds=none"],
        ["task.system_prompt=none", "task.instruction=none"],
        ["task.system_prompt=Be brief.", "task.instruction=Answer:"],
    ],
)
def test_to_toml_round_trips_none_whatever_the_default(tmp_path, overrides):
    # A None written as a comment would read back as the default: a run budgeted by time only
    # (max_steps = None) must stay so when its config.toml is loaded again (--resume, reproducing).
    cfg = load(None, overrides)
    assert _round_trip(cfg, tmp_path) == cfg
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            if getattr(getattr(cfg, section.name), f.name) is None:
                assert getattr(getattr(_round_trip(cfg, tmp_path), section.name), f.name) is None


# Any text but "none" (any case), which means None in a config (TOML has no null).
text_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).filter(
    lambda t: t.lower() != "none"
)


@settings(max_examples=60, deadline=None)
@given(
    system_prompt=text_values,
    instruction=text_values,
    out_dir=text_values.map(lambda t: t.replace("{", "{{").replace("}", "}}")),  # a valid format string
)
def test_to_toml_round_trips_any_text(system_prompt, instruction, out_dir):
    # Prompts are free text: newlines, quotes, backslashes, tabs and control characters must survive.
    cfg = Config()
    cfg = dataclasses.replace(
        cfg,
        task=dataclasses.replace(cfg.task, system_prompt=system_prompt, instruction=instruction),
        train=dataclasses.replace(cfg.train, out_dir=out_dir),
    )
    import tomllib

    data = tomllib.loads(to_toml(cfg))
    assert from_dict(data) == cfg


@settings(max_examples=60, deadline=None)
@given(
    lr=st.floats(min_value=1e-12, max_value=10, allow_subnormal=False),
    eps=st.floats(min_value=0, max_value=1, exclude_max=True),  # loss.eps_low is in [0, 1)
    max_seconds=st.one_of(st.none(), st.floats(min_value=1e-9, max_value=1e12)),
)
def test_to_toml_round_trips_floats_exactly(lr, eps, max_seconds):
    cfg = Config()
    cfg = dataclasses.replace(
        cfg,
        optim=dataclasses.replace(cfg.optim, lr=lr),
        loss=dataclasses.replace(cfg.loss, eps_low=eps),
        train=dataclasses.replace(cfg.train, max_steps=10, max_seconds=max_seconds),
    )
    import tomllib

    assert from_dict(tomllib.loads(to_toml(cfg))) == cfg


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.select.m = 3  # type: ignore[misc]


def test_engine_auto_is_vllm_when_installed_else_transformers(monkeypatch):
    import importlib.util

    from podsrl.engines import resolve_engine

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert resolve_engine("auto") == "transformers"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert resolve_engine("auto") == "vllm"
    assert resolve_engine("transformers") == "transformers"
    assert load().rollout.engine == "auto"


def test_sampler_dtype_reaches_vllm_and_is_refused_where_it_cannot_apply(monkeypatch):
    """rollout.sampler_dtype: a bad name names the field; the transformers engine, which samples
    with the policy itself, refuses any other than "auto"; vLLM is built in the dtype asked for
    ("auto": the policy's)."""
    import torch

    from podsrl.engines import make_engine
    from podsrl.engines.vllm import VLLMEngine

    with pytest.raises(ConfigError, match=r"rollout\.sampler_dtype"):
        load(overrides=["--rollout.sampler_dtype=fp8"])
    policy = type("Policy", (), {"model": torch.nn.Linear(2, 2), "tokenizer": None, "path": "/m"})()
    with pytest.raises(ConfigError, match=r"rollout\.sampler_dtype = 'bfloat16'.*rollout\.engine = 'transformers-static' \(or 'vllm'\)"):
        make_engine(load(overrides=["--rollout.engine=transformers", "--rollout.sampler_dtype=bfloat16"]).rollout, policy)
    built = []
    monkeypatch.setattr(VLLMEngine, "__init__", lambda self, path, tokenizer, options, **kw: built.append(options.dtype))
    for value, dtype in (("auto", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        VLLMEngine.from_config(load(overrides=[f"--rollout.sampler_dtype={value}"]).rollout, policy)
        assert built[-1] == dtype, value
