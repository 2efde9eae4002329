"""The task types: an `Example` (question and reference answer) and a `Task` (train and held-out
examples, and how to prompt for them). A leaf: the task loaders and the rewards import it."""

from dataclasses import dataclass, fields

from podsrl.errors import ConfigError

__all__ = ["Example", "Task", "check_count"]


@dataclass(frozen=True)
class Example:
    """One problem. `answer` is the reference final answer as a string ("42", "-3.5", "3/4");
    rewards compare it numerically when it parses as a number."""

    id: str
    question: str
    answer: str

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
    """

    name: str
    train: list[Example]
    eval: list[Example]
    system_prompt: str | None
    instruction: str


def check_count(task: str, option: str, value: object, *, allow_none: bool = False) -> None:
    """Raise a ConfigError unless `value` is an int >= 0 (or None when `allow_none`)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        expected = "a whole number >= 0" + (" or None (all)" if allow_none else "")
        raise ConfigError(f"task {task!r}: option {option}={value!r} must be {expected}")
