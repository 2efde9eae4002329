"""`podsrl config [SECTION]`: every configuration field with its default and a one-line description,
written as a TOML file a user can start from.

The descriptions are the trailing comments on the dataclass fields in `podsrl/config.py` (and, for
`[select]`, in `podsrl/core/downsample.py`: `name: type = default  # description`), read at run time with `ast` (where each field's statement
ends) and `tokenize` (the comment on that line), so they are written in one place and cannot drift
from the code; `tests/test_configdoc.py` fails when a field has none. The values are those of the
resolved `Config`, so `--section.key=value` overrides show up, and `task.options` is the
default task's merged options.

The output parses with `tomllib` and `podsrl.config.load` reads it back to the same `Config`:
TOML has no null, so a None is written as the string "none", which the loader reads as None.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
from functools import lru_cache

from podsrl import config as config_mod
from podsrl.errors import ConfigError

HEADER = """\
# podsrl configuration: every setting with its default value and what it does.
# Save this (podsrl config > my.toml), edit it, and run `podsrl train my.toml`. Settings you delete
# keep their defaults; any one can also be given on the command line as --section.key=value.
# TOML has no null: "none" means None.
"""


def sections() -> dict[str, type]:
    """Config section name -> its dataclass, in the order of `Config`'s fields."""
    return dict(config_mod._type_hints(config_mod.Config))  # resolved once, as every config build does


def field_help() -> dict[str, dict[str, str]]:
    """{section: {field: description}} from the trailing comments on the config dataclasses.

    A field without a trailing comment is absent from its section's dict.
    """
    return {section: field_comments(cls) for section, cls in sections().items()}


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """{field: the trailing comment on its line} for a dataclass, read from the source of the
    classes that declare its fields (a subclass such as SelectConfig inherits its base's)."""
    result: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass.__module__ == "builtins":
            continue
        source = inspect.getsource(inspect.getmodule(klass))
        comments = {
            token.start[0]: token.string.lstrip("#").strip()
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        }
        node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == klass.__name__)
        result.update({
            item.target.id: comments[item.end_lineno]
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.end_lineno in comments
        })  # fmt: skip
    fields = {f.name for f in dataclasses.fields(cls)}
    return {name: text for name, text in result.items() if name in fields}


def render(cfg: config_mod.Config | None = None, section: str | None = None) -> str:
    """The TOML text of `cfg` (default: the defaults), one section or all, with descriptions."""
    cfg = config_mod.Config() if cfg is None else cfg
    names = list(sections())
    if section is not None and section not in names:
        raise ConfigError(f"unknown config section {section!r}; valid sections: {', '.join(names)}")
    helps = field_help()
    blocks = [HEADER]
    for name in names if section is None else [section]:
        values = getattr(cfg, name)
        rows = [
            (f"{f.name} = {_value(getattr(values, f.name))}", helps[name].get(f.name, ""))
            for f in dataclasses.fields(values)
        ]
        width = min(max(len(setting) for setting, _ in rows), 44)
        lines = [f"[{name}]"]
        for setting, description in rows:
            lines.append(f"{setting:<{width}}  # {description}" if description else setting)
        if name == "task":
            lines.append(_task_options_comment(cfg.task.name))
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def _value(value: object) -> str:
    return '"none"' if value is None else config_mod._toml_value(value)


def _task_options_comment(task: str) -> str:
    """A comment listing the options the task's loader takes, with their defaults."""
    from podsrl.tasks import TASKS, task_options

    parameters = task_options(task).values()
    options = ", ".join(
        f"{p.name} (required)" if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in parameters
    )
    module = TASKS[task].__module__.replace(".", "/")
    text = f"options of task {task!r} (see {module}.py; another task takes its own): {options}"
    lines = [textwrap.fill(text, width=100, initial_indent="# ", subsequent_indent="#   ")]
    # A task module may describe its options, one line each (`OPTION_HELP`, e.g. podsrl/tasks/reasoning_gym.py).
    described = getattr(inspect.getmodule(TASKS[task]), "OPTION_HELP", {})
    for p in parameters:
        if p.name in described:
            lines.append(textwrap.fill(f"{p.name}: {described[p.name]}", width=100, initial_indent="#   ", subsequent_indent="#       "))
    return "\n".join(lines)
