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
    left out of comparisons (the id names the problem). `task_answers` is every reference answer of
    the example's task (train and held-out), one set shared by all its examples (`Task` gives it):
    the other answers a word answer is told apart from ("Italian, German" names two of a language
    task's answers); None where the task is not known (an Example built from a TRL row)."""

    id: str
    question: str
    answer: str
    grader: str = "auto"
    data: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    task_answers: frozenset[str] | None = field(default=None, compare=False, repr=False)

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
    ``dataclasses.replace(task, grader="text")`` regrades the whole task. Every example is also
    given the task's answers (`Example.task_answers`, one shared set), which the word graders tell
    a named answer apart from.
    """

    name: str
    train: list[Example]
    eval: list[Example]
    system_prompt: str | None
    instruction: str
    grader: str = "auto"

    def __post_init__(self) -> None:
        # The task decides; its examples carry the decision and the task's answers (new lists: the
        # caller's are left as they are).
        answers = frozenset(ex.answer for ex in (*self.train, *self.eval))
        shared = next((ex.task_answers for ex in (*self.train, *self.eval)), None)
        answers = shared if shared == answers else answers  # the set the examples already share, if it is this one
        for split in ("train", "eval"):
            examples = getattr(self, split)
            if any(ex.grader != self.grader or ex.task_answers is not answers for ex in examples):
                given = [ex if ex.grader == self.grader and ex.task_answers is answers else replace(ex, grader=self.grader, task_answers=answers)
                         for ex in examples]  # fmt: skip
                object.__setattr__(self, split, given)


def check_count(task: str, option: str, value: object, *, allow_none: bool = False) -> None:
    """Raise a ConfigError unless `value` is an int >= 0 (or None when `allow_none`)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        expected = "a whole number >= 0" + (" or None (all)" if allow_none else "")
        raise ConfigError(f"task {task!r}: option {option}={value!r} must be {expected}")
