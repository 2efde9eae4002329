"""A newcomer's reward works as first written (issue 38): ``"my_rewards:fn"`` finds my_rewards.py in
the current directory, as ``python -m`` would; ``example["answer"]`` reads the Example like the dict
a TRL dataset row is; ``PODSTrainer(model="smollm2-135m-instruct")`` takes podsrl's embedded model."""

from __future__ import annotations

import functools
import inspect
import sys

import pytest

from podsrl.errors import ConfigError
from podsrl.grading.user import load_user_reward
from podsrl.tasks import Example

REWARD = '''
def exact(completion, example):
    return 1.0 if completion.strip() == example["answer"] else 0.0
'''


@pytest.fixture
def in_a_directory(tmp_path, monkeypatch):
    """A directory holding my_rewards.py, made the current one; sys.path restored afterwards."""
    (tmp_path / "my_rewards.py").write_text(REWARD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def test_module_spec_finds_a_file_in_the_current_directory(in_a_directory):
    reward = load_user_reward("my_rewards:exact")
    assert reward(" 42", Example("1", "6 x 7?", "42")) == 1.0
    assert reward("41", Example("1", "6 x 7?", "42")) == 0.0
    assert sys.path[-1] == str(in_a_directory)  # after the installed packages: it shadows none of them


def test_a_module_found_nowhere_is_still_a_clear_error(in_a_directory):
    with pytest.raises(ConfigError, match="no module named 'not_here_xyz' on sys.path or in the current directory"):
        load_user_reward("not_here_xyz:fn")


def test_a_module_is_found_from_the_current_directory_only_and_a_file_from_anywhere(in_a_directory, tmp_path_factory, monkeypatch):
    """What docs/your-task.md says of resuming a run from another directory (issue 45): the saved
    config keeps "my_rewards:exact" as written, found from the current directory only; a file name,
    "my_rewards.py:exact", is saved as an absolute path and loads from anywhere."""
    from podsrl.config import load

    module, file = (load(None, [f"reward.names={name}"]).reward.names[0] for name in ("my_rewards:exact", "my_rewards.py:exact"))
    assert module == "my_rewards:exact" and file == f"{in_a_directory / 'my_rewards.py'}:exact"
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    with pytest.raises(ConfigError, match="no module named 'my_rewards' on sys.path or in the current directory"):
        load_user_reward(module)
    assert load_user_reward(file)(" 42", Example("1", "6 x 7?", "42")) == 1.0


def test_example_reads_like_a_dataset_row():
    example = Example("gsm8k:3", "What is 6 x 7?", "42")
    assert (example["id"], example["question"], example["answer"]) == ("gsm8k:3", "What is 6 x 7?", "42")
    with pytest.raises(KeyError, match="'prompt'.*'id', 'question', 'answer'"):
        example["prompt"]


def test_podstrainer_takes_the_embedded_model_by_name(monkeypatch):
    pytest.importorskip("trl")
    from trl import GRPOTrainer

    from podsrl.integrations.trl import PODSConfig, PODSTrainer
    from podsrl.models import resolve_model_path

    seen, original = {}, GRPOTrainer.__init__

    @functools.wraps(original)  # PODSTrainer binds its arguments to this signature
    def stop(self, *args, **kwargs):
        seen.update(inspect.signature(original).bind(self, *args, **kwargs).arguments)
        raise RuntimeError("stop before loading")

    monkeypatch.setattr(GRPOTrainer, "__init__", stop)
    with pytest.raises(RuntimeError, match="stop before loading"):
        PODSTrainer(model="smollm2-135m-instruct", reward_funcs=[], args=PODSConfig(output_dir="out", use_cpu=True, bf16=False))
    assert seen["model"] == resolve_model_path("smollm2-135m-instruct")  # a local directory: no Hub lookup
