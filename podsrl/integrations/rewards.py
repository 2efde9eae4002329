"""Rewards both ways between podsrl and TRL (this module does not import TRL).

podsrl's rewards are per completion, ``fn(completion: str, example: Example) -> float``; TRL's are
batched, ``fn(prompts, completions, **columns) -> list[float | None]``, where ``columns`` are the
dataset's other columns, one value per completion (TRL also passes ``completion_ids``,
``trainer_state``, ``log_extra`` and ``log_metric``).

- :func:`as_trl_reward` turns a podsrl reward (a name such as ``"correctness"``, a
  ``"module:function"`` spec, or a function) into a TRL reward function. The reference answer
  comes from the dataset column ``answer_column`` (default ``"answer"``), the question from the
  prompt (the last user message of a conversational prompt). A conversational completion is scored
  on its last message's content. ``grader=`` names the grader of those examples (``"auto"``:
  numbers, words and LaTeX; :mod:`podsrl.grading.graders`); ``examples=`` (a podsrl task's examples)
  instead looks each row's Example up by its ``id`` column, grader and grading data included, so
  that TRL grades a task's problems exactly as ``podsrl train`` does (a reasoning_gym task:
  ``examples/trl_reasoning_gym.py``).
- :func:`from_batched` (:mod:`podsrl.grading.user`, re-exported here) turns a TRL-style batched
  function into a podsrl reward; ``podsrl train`` does this by itself for a ``"module:function"`` reward whose function has a parameter named
  ``completions`` (:func:`is_batched`). It is called with ``prompts=[question]``,
  ``completions=[completion]`` (plain strings, TRL's "standard" format), ``answer=[answer]``,
  ``id=[id]`` and ``question=[question]``, only the names the function accepts unless it takes
  ``**kwargs``; it must return one number. One call per completion: correct, not batched.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from podsrl.errors import ConfigError
from podsrl.grading.graders import check_grader
from podsrl.grading.rewards import get_reward
from podsrl.grading.user import from_batched, is_batched
from podsrl.tasks.types import Example

__all__ = ["as_trl_reward", "from_batched", "is_batched"]


def _text(message: Any) -> str:
    """The text of a completion or prompt: a string as is, a conversation's last message's content."""
    if isinstance(message, str):
        return message
    if isinstance(message, (list, tuple)) and message and isinstance(message[-1], dict):
        content = message[-1].get("content", "")
        if isinstance(content, list):  # content blocks [{"type": "text", "text": ...}]
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return str(content)
    return str(message)


def _question(prompt: Any) -> str:
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return _text(users[-1:]) if users else _text(prompt)
    return _text(prompt)


def as_trl_reward(
    reward: str | Callable[[str, Example], float],
    *,
    answer_column: str = "answer",
    grader: str = "auto",
    examples: Iterable[Example] | None = None,
) -> Callable[..., list[float]]:
    """A TRL reward function ``fn(prompts, completions, **columns) -> list[float]`` from a podsrl reward.

    ``reward`` is a built-in name (``"correctness"``, ``"format"``), a ``"module:function"`` spec,
    or a function ``fn(completion, example) -> float``. The returned function is named after the
    reward (TRL logs it as ``rewards/<name>/mean``). Each completion is scored against an Example
    built from its row (``answer_column``, the prompt, ``id``) with grader ``grader``; with
    ``examples``, against the Example whose id is the row's ``id`` column (a dataset built from a
    podsrl task, e.g. ``task.train + task.eval``).
    """
    check_grader(grader, "grader")
    by_id = None
    if examples is not None:
        by_id = {ex.id: ex for ex in examples}
    if isinstance(reward, str):
        fn, name = get_reward(reward), reward.rpartition(":")[2]
    elif callable(reward):
        fn, name = reward, getattr(reward, "__name__", "reward")
    else:
        raise ConfigError(f"reward must be a name or a function fn(completion, example), got {type(reward).__name__}")

    def trl_reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        if by_id is not None:
            return [float(fn(_text(completion), _lookup(by_id, id_))) for completion, id_ in zip(completions, _ids(columns, name), strict=True)]
        answers = columns.get(answer_column)
        if answers is None:
            raise ValueError(
                f"podsrl reward {name!r} needs the reference answer in a dataset column {answer_column!r}; "
                f"the columns passed were {sorted(k for k in columns if not k.startswith(('trainer_', 'log_')))}; "
                "add the column or pass answer_column=... to as_trl_reward"
            )
        ids = columns.get("id") or [str(i) for i in range(len(completions))]
        return [
            float(fn(_text(completion), Example(str(id_), _question(prompt), str(answer), grader=grader)))
            for prompt, completion, answer, id_ in zip(prompts, completions, answers, ids, strict=True)
        ]

    trl_reward.__name__ = trl_reward.__qualname__ = name
    trl_reward.__doc__ = f"podsrl reward {name!r} as a TRL reward function."
    return trl_reward


def _ids(columns: dict[str, Any], name: str) -> list[Any]:
    ids = columns.get("id")
    if ids is None:
        raise ValueError(
            f"podsrl reward {name!r} was given examples=, so it looks each row up by its 'id' column, which the dataset "
            "lacks; add the column (the Example ids: podsrl.integrations.rewards docstring) or drop examples="
        )
    return list(ids)


def _lookup(by_id: dict[str, Example], id_: Any) -> Example:
    try:
        return by_id[str(id_)]
    except KeyError:
        raise ValueError(f"no Example with id {id_!r} among the {len(by_id)} given to as_trl_reward(examples=...)") from None
