"""The task types: an `Example` (question and reference answer) and a `Task` (train and held-out
examples, and how to prompt for them). A leaf: the task loaders and the rewards import it."""

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from podsrl.errors import ConfigError

__all__ = ["Example", "Task", "check_count"]


@dataclass(frozen=True)
class Example:
    """One problem. `answer` is the reference final answer as a string ("42", "-3.5", "Paris",
    "\\sqrt{2}"); `grader` names how a completion is judged against it (:mod:`podsrl.grading.graders`:
    "auto" compares numbers as numbers, words as text and LaTeX with math-verify), chosen by the task
    (`Task.grader`) and carried here so that a reward scored anywhere (a worker process, TRL) grades
    alike; `data` is what that grader needs besides the answer (reasoning_gym: the dataset's entry),
    left out of comparisons (the id names the problem)."""

    id: str
    question: str
    answer: str
    grader: str = "auto"
    data: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    def __getitem__(self, key: str) -> str:
        """``example["answer"]`` as well as ``example.answer``: a reward written for a TRL dataset
        row (a dict) reads an Example the same way."""
        names = [f.name for f in fields(self)]
        if key not in names:
            raise KeyError(f"{key!r}: an Example has {', '.join(map(repr, names))}")
        return getattr(self, key)


@dataclass(frozen=True)
class Task:
    """Train and held-out examples plus how to prompt for them.

    `train` may contain repeats (arithmetic samples with replacement when asked for more problems
    than exist); the trainer draws from it cyclically or at random. `eval` never overlaps `train`.
    `grader` is how held-out accuracy and the `correctness` reward judge answers
    (:mod:`podsrl.grading.graders`); every example is given it (`Example.grader`), so
    ``dataclasses.replace(task, grader="text")`` regrades the whole task.
    """

    name: str
    train: list[Example]
    eval: list[Example]
    system_prompt: str | None
    instruction: str
    grader: str = "auto"

    def __post_init__(self) -> None:
        # The task decides; its examples carry the decision (new lists: the caller's are left as they are).
        for split in ("train", "eval"):
            examples = getattr(self, split)
            if any(ex.grader != self.grader for ex in examples):
                object.__setattr__(self, split, [ex if ex.grader == self.grader else replace(ex, grader=self.grader) for ex in examples])


def check_count(task: str, option: str, value: object, *, allow_none: bool = False) -> None:
    """Raise a ConfigError unless `value` is an int >= 0 (or None when `allow_none`)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        expected = "a whole number >= 0" + (" or None (all)" if allow_none else "")
        raise ConfigError(f"task {task!r}: option {option}={value!r} must be {expected}")
