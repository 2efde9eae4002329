"""Tasks: where prompts and reference answers come from.

A task is chosen by name from `TASKS`, a table of loaders with one signature,
`loader(**options) -> Task`; `load_task` checks the option names against the loader before
calling it, so a misspelt option is a `ConfigError` naming it rather than a `TypeError`.

Built-in tasks (each module's docstring gives its options):

- `arithmetic` (the default): generated "What is 7 + 5?" problems, seeded, train and eval
  disjoint by construction.
- `gsm8k`: grade-school maths from a local directory of `train.jsonl`/`test.jsonl` or the hub.
- `jsonl`: any JSON-lines file with a question field and an answer field.
- `math`: MATH-style problems with LaTeX answers (a JSON-lines file, a directory or a `datasets`
  dataset), graded with math-verify.
- `reasoning_gym`: any of reasoning-gym's procedural datasets, or a weighted mix, graded by the
  dataset's own checker (the optional extra ``podsrl[reasoning-gym]``).

A `Task` also names its grader (`Task.grader`, :mod:`podsrl.grading.graders`): how held-out
accuracy and the `correctness` reward judge its answers ("auto" unless the task says otherwise;
`task.grader` in a config overrides it).

A `Task` carries a default `instruction` appended to every question (`format_user_message`) and an
optional system prompt; `chat_messages` is the one place a prompt's chat is built, for every trainer
(podsrl's and a TRL arm's) and the model card; the chat template is applied elsewhere. To change the wording, `dataclasses.replace(task,
instruction=...)`.

Options mean the same in every task: `path` is the data to train on (a file, a directory or a
dataset id), `eval_path` a separate held-out file, `num_train` / `num_eval` how many problems,
`seed` the draw. An older name a task still accepts (`OPTION_ALIASES`: jsonl's `train_path`) is
read as the name it has now (`canonical_options`). A relative `path` or `eval_path` that exists is
made absolute when a run's config is built (`absolute_paths`), so the run's saved config.toml
finds its data from any directory (docs/run-directory.md).
"""

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from podsrl.errors import ConfigError
from podsrl.tasks import arithmetic, competition_math, gsm8k, jsonl, reasoning_gym
from podsrl.tasks.types import Example, Task

TaskLoader = Callable[..., Task]

TASKS: dict[str, TaskLoader] = {
    "arithmetic": arithmetic.load,
    "gsm8k": gsm8k.load,
    "jsonl": jsonl.load,
    "math": competition_math.load,
    "reasoning_gym": reasoning_gym.load,
}


# Older option names still accepted: task -> {old name: the name now}. jsonl's training file was
# `train_path` while gsm8k and math call theirs `path`; configs written with the old name still load.
OPTION_ALIASES: dict[str, dict[str, str]] = {"jsonl": {"train_path": "path"}}
# The options that name local files or directories (or, when no such path exists, a dataset id).
PATH_OPTIONS = ("path", "eval_path")


def canonical_options(name: str, options: Mapping[str, object]) -> dict[str, object]:
    """``options`` with every older name (`OPTION_ALIASES`) replaced by the name it has now; both
    names given is a ConfigError."""
    aliases = OPTION_ALIASES.get(name, {})
    out: dict[str, object] = {}
    for option, value in options.items():
        now = aliases.get(option, option)
        if now != option and now in options:
            raise ConfigError(f"task {name!r}: {option!r} is the older name of {now!r}, and both are given; give only {now!r}")
        out[now] = value
    return out


def absolute_paths(options: Mapping[str, object]) -> dict[str, object]:
    """``options`` with each relative `path` / `eval_path` that exists (against the working
    directory) made absolute, and every absolute one written without "." and ".." (``../shared/data``
    from /w/a and from /w/b is /w/shared/data: the same files, the same setting, also in a run saved
    before this normalised it); anything else (missing, a dataset id, ``~/...``) as given."""
    out = dict(options)
    for option in PATH_OPTIONS:
        value = out.get(option)
        if isinstance(value, str) and value:
            path = Path(value).expanduser()
            if os.path.isabs(value):
                out[option] = os.path.normpath(value)
            elif not path.is_absolute() and path.exists():
                out[option] = os.path.normpath(path.absolute())
    return out


def load_task(name: str, /, **options: object) -> Task:
    """Load the task `name` from `TASKS` with its loader's keyword `options`.

    Unknown task names, unknown option names (`check_option_names`) and missing required options
    raise ConfigError listing what is valid; each loader validates its option values. Older option
    names (`OPTION_ALIASES`) are accepted. `name` is positional-only, so an option called `name` is
    an unknown option like any other, not a second value for it.
    """
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    options = canonical_options(name, options)
    check_option_names(name, options)
    loader = TASKS[name]
    for option, parameter in task_options(name).items():
        if parameter.default is inspect.Parameter.empty and option not in options:
            raise ConfigError(f"task {name!r} needs option {option!r}; valid options: {_valid_options(name)}")
    task = loader(**options)
    # A split without problems would fail later, mid-run, with a traceback: training draws from
    # `train` and evaluation averages over `eval`.
    for split, option, what in ((task.train, "num_train", "training"), (task.eval, "num_eval", "held-out")):
        if not split:
            given = f" ({option}={options[option]!r})" if option in options else ""
            raise ConfigError(f"task {name!r}: no {what} problems{given}; set task.options.{option} to at least 1")
    return task


def task_options(name: str) -> Mapping[str, inspect.Parameter]:
    """The options task `name`'s loader takes (its keyword parameters, with their defaults): the one
    place they are read."""
    return inspect.signature(TASKS[name]).parameters


def check_option_names(name: str, options: Mapping[str, object]) -> None:
    """ConfigError naming ``task.options.X`` for an option that task `name`'s loader does not take,
    with the valid ones; read when a config is built and again by `load_task`. An option `name` is
    a likely mix-up with ``task.name`` (and, in reasoning-gym, with a mix's per-dataset `name`), so
    its message says where the task and its data are chosen."""
    parameters = task_options(name)
    for option, value in options.items():
        if option not in parameters:
            hint = ""
            if option == "name":
                data = next((p for p in ("dataset", "path") if p in parameters), None)
                hint = " (task.name chooses the task" + (f"; to train on {value!r}, give --task.options.{data}={value}" if data else "") + ")"
            raise ConfigError(f"task.options.{option}: task {name!r} has no option {option!r}{hint}; valid options: {_valid_options(name)}")


def _valid_options(name: str) -> str:
    """Task `name`'s option names, each older name (`OPTION_ALIASES`) beside the name it has now."""
    older = {now: old for old, now in OPTION_ALIASES.get(name, {}).items()}
    parameters = task_options(name)
    return ", ".join(f"{p} (or {older[p]}, its older name)" if p in older else p for p in parameters) or "(none)"


def format_user_message(example: Example, task: Task) -> str:
    """The user turn: the question, then the task's instruction on its own line (if any)."""
    if not task.instruction:
        return example.question
    return f"{example.question}\n{task.instruction}"


def chat_messages(example: Example, task: Task) -> list[dict[str, str]]:
    """The chat of one prompt: the task's system prompt (if any), then the user turn
    (:func:`format_user_message`). Every trainer builds its prompts from it, so that podsrl's and a
    TRL arm's cannot drift apart."""
    system = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
    return [*system, {"role": "user", "content": format_user_message(example, task)}]


__all__ = [
    "OPTION_ALIASES", "PATH_OPTIONS", "TASKS", "Example", "Task", "absolute_paths", "canonical_options", "check_option_names",
    "chat_messages", "format_user_message",
    "load_task", "task_options",
]  # fmt: skip
