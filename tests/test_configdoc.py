"""`podsrl config`: every field documented, and the printed TOML reads back to the same config."""

import dataclasses
import tomllib

import pytest

from podsrl import config as config_mod
from podsrl.cli import main
from podsrl.configdoc import field_help, render, sections
from podsrl.errors import ConfigError


def test_every_config_field_has_a_one_line_description():
    helps = field_help()
    missing = [
        f"{section}.{f.name}"
        for section, cls in sections().items()
        for f in dataclasses.fields(cls)
        if not helps[section].get(f.name)
    ]
    assert not missing, (
        "give these fields a trailing comment in podsrl/config.py "
        f"(name: type = default  # description): {', '.join(missing)}"
    )


def test_descriptions_are_the_trailing_comments():
    helps = field_help()
    assert helps["rollout"]["n"] == "rollouts sampled per prompt"
    assert helps["select"]["m_final"] == "m at the end of training (progress 1), reached along m_schedule; None: m throughout"  # from DownsampleSpec
    assert set(helps) == set(sections()) and "model" in helps and "train" in helps


def test_the_schedules_say_that_time_can_drive_their_progress():
    """A schedule reached its end at step 2 of max_steps = 4 because train.max_seconds governed its
    progress, which only docs/integrating.md said (issue 45): `podsrl config` says it where the
    settings are."""
    text = render(config_mod.load(None, []))
    line = lambda name: next(row for row in text.splitlines() if row.startswith(f"{name} = "))  # noqa: E731
    for name in ("m_schedule", "token_schedule"):
        assert "train.max_steps" in line(name) and "training time / train.max_seconds" in line(name), line(name)
    assert 'set train.max_seconds = "none" for steps alone' in line("m_schedule")
    assert "drives the schedules (select.m_schedule" in line("max_seconds")


def _load_text(tmp_path, text):
    path = tmp_path / "printed.toml"
    path.write_text(text)
    return config_mod.load(path)


def test_the_defaults_print_as_toml_that_loads_back_to_the_defaults(tmp_path):
    text = render()
    data = tomllib.loads(text)
    assert list(data) == list(sections())
    for section, cls in sections().items():
        assert set(data[section]) == {f.name for f in dataclasses.fields(cls)}, section
    assert data["select"]["m_final"] == "none"  # TOML has no null
    assert _load_text(tmp_path, text) == config_mod.Config()


@pytest.mark.parametrize("section", list(sections()))
def test_one_section_prints_alone_and_loads_back(tmp_path, section):
    text = render(section=section)
    assert list(tomllib.loads(text)) == [section]
    assert _load_text(tmp_path, text) == config_mod.Config()


def test_overrides_are_printed_and_load_back(tmp_path):
    overrides = [
        "select.m=8", "rollout.n=32", "train.max_steps=5", "task.name=math",
        "task.options.path=data/math.jsonl", "task.system_prompt=none",
        'task.instruction=Say "hi"\\n then \\boxed{}',
    ]
    cfg = config_mod.load(None, overrides)
    assert _load_text(tmp_path, render(cfg)) == cfg


def test_unknown_section_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown config section 'sel'; valid sections: model, task"):
        render(section="sel")


def test_cli_config_prints_toml(capsys, tmp_path):
    assert main(["config", "select", "--select.m=2"]) == 0
    out = capsys.readouterr().out
    assert tomllib.loads(out)["select"]["m"] == 2
    assert "m = 2" in out and "# rollouts kept per prompt at the start of training" in out
    assert main(["config", "nope"]) == 2
    assert "unknown config section 'nope'" in capsys.readouterr().err


def test_train_help_points_to_podsrl_config(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "podsrl config [SECTION]" in " ".join(capsys.readouterr().out.split())
