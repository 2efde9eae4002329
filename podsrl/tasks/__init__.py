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

A `Task` carries a default `instruction` appended to every question (`format_user_message`); the
chat template is applied elsewhere. To change the wording, `dataclasses.replace(task,
instruction=...)`.
"""

import inspect
from collections.abc import Callable

from podsrl.errors import ConfigError
from podsrl.tasks import arithmetic, competition_math, gsm8k, jsonl
from podsrl.tasks.types import Example, Task

TaskLoader = Callable[..., Task]

TASKS: dict[str, TaskLoader] = {
    "arithmetic": arithmetic.load,
    "gsm8k": gsm8k.load,
    "jsonl": jsonl.load,
    "math": competition_math.load,
}


def load_task(name: str, **options: object) -> Task:
    """Load the task `name` from `TASKS` with its loader's keyword `options`.

    Unknown task names, unknown option names and missing required options raise ConfigError
    listing what is valid; each loader validates its option values.
    """
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    loader = TASKS[name]
    parameters = inspect.signature(loader).parameters
    valid = ", ".join(parameters) or "(none)"
    for option in options:
        if option not in parameters:
            raise ConfigError(f"task {name!r} has no option {option!r}; valid options: {valid}")
    for option, parameter in parameters.items():
        if parameter.default is inspect.Parameter.empty and option not in options:
            raise ConfigError(f"task {name!r} needs option {option!r}; valid options: {valid}")
    task = loader(**options)
    # A split without problems would fail later, mid-run, with a traceback: training draws from
    # `train` and evaluation averages over `eval`.
    for split, option, what in ((task.train, "num_train", "training"), (task.eval, "num_eval", "held-out")):
        if not split:
            given = f" ({option}={options[option]!r})" if option in options else ""
            raise ConfigError(f"task {name!r}: no {what} problems{given}; set task.options.{option} to at least 1")
    return task


def format_user_message(example: Example, task: Task) -> str:
    """The user turn: the question, then the task's instruction on its own line (if any)."""
    if not task.instruction:
        return example.question
    return f"{example.question}\n{task.instruction}"


__all__ = ["TASKS", "Example", "Task", "format_user_message", "load_task"]
