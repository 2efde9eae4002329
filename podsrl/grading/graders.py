"""Graders: how a task's answers are judged, for held-out accuracy and for the `correctness` reward.

A grader is a function ``fn(completion: str, example: Example) -> float``: the completion's grade in
[0, 1], where 1.0 is correct and anything below is wrong (or, from a grader that gives partial
credit, partly right). Held-out accuracy counts a completion as correct when its grade is 1.0
(:func:`is_right`, exactly 1.0: a partial credit of 0.9999 is not a right answer); the `correctness`
reward is the grade itself. A grade below 1.0 stays below 1.0 where training stores it, in float32
(:func:`grade`): one within float32 rounding of 1.0 becomes :data:`BELOW_ONE` (1 - 2**-24, the
largest float32 under 1) instead of rounding up to full credit. A partial credit summed in floats
can land there: reasoning-gym's spell_backward adds 1/L L times for an answer with every letter in
place and more after them, 0.9999999999999999 for L = 6, 7, 9, 10, ..., which float32 stored as 1.0
(reference "ycnamorihc", completion "ycnamorihcx": full reward in training, wrong in accuracy). A task chooses its grader (`Task.grader`; `task.grader` in a config
overrides it) and every Example carries the choice (`Example.grader`), so a completion is graded the
same way wherever it is scored: the training loop, a reward worker process, `podsrl eval`, TRL
(:func:`podsrl.integrations.rewards.as_trl_reward`).

The built-in graders (`GRADERS`), each 0.0 or 1.0:

- ``numeric``: the completion's answer (:func:`podsrl.grading.answers.extract_answer`: after
  "####", in the last `\\boxed{}` or `<answer>` tag, else the answer its final sentence marks, "The
  answer is 12, not 13." -> 12, else the last number) equals the reference exactly, as fractions
  ("0.5" == "1/2", "1,000" == "1000"). A reference that is not a number is never matched.
- ``text``: exact match after the normalisation users expect: case, runs of whitespace, surrounding
  whitespace, quotes and punctuation (a trailing period, "**bold**", backticks), LaTeX `\\text{}`
  (`\\textbf`, `\\mathrm`) and `$`. What is compared is the completion's answer (:func:`answer_text`:
  after "####", in the last `\\boxed{}` or `<answer>...</answer>`, else its last non-empty line,
  from after "answer is" / "answer:" when the line says so), or else the whole completion
  (a multi-line answer). "The capital is Paris." is not "Paris": ask for the answer alone, or mark
  it ("The answer is Paris."). A reference that is a number is compared as a number (``numeric``).
- ``math``: math-verify (:mod:`podsrl.grading.equivalence`: LaTeX, intervals, sets, expressions
  by value); a reference it cannot parse, or a missing math-verify, falls back to ``text``.
- ``auto`` (every built-in task's default but reasoning_gym): by what the reference is. A plain
  number: ``numeric`` (but a completion that boxes LaTeX, "\\boxed{\\frac12}", goes to math-verify);
  words ("Paris", "New York"): ``text`` (math-verify would read "Paris" as p*a*r*i*s, which "Pairs"
  equals); anything else ("x+1", "\\sqrt{2}", "(-\\infty, 3]"): the answer written exactly as the
  reference (case kept) is right, else math-verify decides, else ``text``.
- ``reasoning_gym``, ``reasoning_gym_binary``: the reasoning-gym dataset's own `score_answer` on the extracted answer
  (:mod:`podsrl.grading.reasoning_gym`), with its partial credit, or 1.0 only for full credit.

A user grader is ``"module:function"`` or ``"path/to/file.py:function"``, loaded as a user reward is
(:mod:`podsrl.grading.user`). A grader may declare the grades it gives as ``fn.reward_values = (0.0,
1.0)``, or, when they depend on the problems, ``fn.values_for(examples) -> tuple | None``
(:func:`grade_values`); that is what the `correctness` reward then declares (exact early stopping).

:func:`ungraded` is the start-up check: a held-out reference that, written as the whole completion,
does not grade 1.0 can never be counted right (word answers under ``numeric`` scored 0% at every
evaluation while training rewarded them).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Sequence
from functools import lru_cache

from podsrl.errors import ConfigError
from podsrl.grading import equivalence
from podsrl.grading.answers import SURROUNDING, answer_text, answers_match, extract_answer, last_boxed, parse_number
from podsrl.tasks.types import Example

__all__ = ["BELOW_ONE", "GRADERS", "answer_text", "check_grader", "get_grader", "grade", "grade_values", "is_right", "text_key", "ungraded"]

Grader = Callable[[str, Example], float]

BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1.0: where a grade just under 1.0 is kept (grade)

# A reference of words, compared as text.
_WORDS = re.compile(r"[^\W\d_]{2,}(?:[\s'-]+[^\W\d_]+)*\.?")
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
# What surrounds an answer without being part of it: quotes, sentence punctuation, markdown emphasis, `$`.


def numeric(completion: str, example: Example) -> float:
    """1.0 if the completion's final number equals the reference, a number, exactly (module docstring)."""
    if parse_number(example.answer) is None:
        return 0.0
    return 1.0 if answers_match(extract_answer(completion), example.answer) else 0.0


def text(completion: str, example: Example) -> float:
    """1.0 if the completion's answer is the reference's text, normalised (module docstring); a
    reference that is a number is compared as a number."""
    if parse_number(example.answer) is not None:
        return numeric(completion, example)
    return 1.0 if _same_text(completion, example.answer) else 0.0


def math_(completion: str, example: Example) -> float:
    """1.0 if math-verify finds the completion's answer equal to the reference (module docstring)."""
    verdict = equivalence.matches(completion, example.answer)
    if verdict is None:  # math-verify cannot read the reference, or is not installed
        return text(completion, example)
    return 1.0 if verdict else 0.0


def auto(completion: str, example: Example) -> float:
    """By what the reference is: a number, words, or mathematics (module docstring)."""
    reference = example.answer
    if _numeric_decides(completion, reference):
        return numeric(completion, example)
    if _WORDS.fullmatch(reference.strip()):
        return text(completion, example)
    if _same_text(completion, reference, casefold=False):  # "x+1" for "x+1": no parser needed
        return 1.0
    verdict = equivalence.matches(completion, reference)
    if verdict is not None:
        return 1.0 if verdict else 0.0
    return text(completion, example)


def _reasoning_gym(completion: str, example: Example) -> float:
    from podsrl.grading import reasoning_gym

    return reasoning_gym.score(completion, example)


def _reasoning_gym_binary(completion: str, example: Example) -> float:
    return 1.0 if _reasoning_gym(completion, example) >= 1.0 else 0.0


def _reasoning_gym_values(examples: Sequence[Example]) -> tuple[float, ...] | None:
    from podsrl.grading import reasoning_gym

    return reasoning_gym.score_values(examples)


for _fn in (numeric, text, math_, auto, _reasoning_gym_binary):
    _fn.reward_values = (0.0, 1.0)
_reasoning_gym.values_for = _reasoning_gym_values

GRADERS: dict[str, Grader] = {
    "auto": auto,
    "numeric": numeric,
    "text": text,
    "math": math_,
    "reasoning_gym": _reasoning_gym,
    "reasoning_gym_binary": _reasoning_gym_binary,
}


def check_grader(name: object, where: str = "task.grader") -> None:
    """A ConfigError unless ``name`` is a built-in grader or a "module:function" spec (not loaded here)."""
    if not isinstance(name, str) or (name not in GRADERS and ":" not in name):
        raise ConfigError(
            f"{where} = {name!r} is not a grader; valid graders: {', '.join(GRADERS)}, or a function of yours as "
            "'module:function' or 'path/to/file.py:function', def grade(completion, example) -> float (1.0: right)"
        )


@lru_cache(maxsize=None)  # a user file is imported once
def get_grader(name: str) -> Grader:
    """The grader ``name``: a built-in, or a user function loaded as a user reward is; every failure a
    ConfigError naming ``task.grader``."""
    check_grader(name)
    if name in GRADERS:
        return GRADERS[name]
    from podsrl.grading.user import load_user_reward

    try:
        return load_user_reward(name)
    except ConfigError as err:
        raise ConfigError(f"task.grader = {name!r}: {err}") from None


def grade(completion: str, example: Example) -> float:
    """The completion's grade in [0, 1] by the example's grader (`Example.grader`); a grade in
    (:data:`BELOW_ONE`, 1) is :data:`BELOW_ONE`, so that float32 does not round it to 1.0."""
    value = get_grader(example.grader)(completion, example)
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"grader {example.grader!r} returned {value!r}; a grade is a number in [0, 1] (1.0: right)")
    value = float(value)
    # Not full credit stays not full credit in float32 (module docstring): 1 - 1e-16 would round to 1.0.
    return BELOW_ONE if BELOW_ONE < value < 1.0 else value


def is_right(completion: str, example: Example) -> bool:
    """Whether the completion is right: its grade is 1.0 (what held-out accuracy counts)."""
    return grade(completion, example) >= 1.0


def grade_values(name: str, examples: Sequence[Example]) -> tuple[float, ...] | None:
    """Every grade the grader ``name`` can give on ``examples``, sorted: its ``values_for(examples)``,
    else its ``reward_values``; None when it declares none (or a declaration is malformed: then the
    `correctness` reward is simply undeclared)."""
    fn = get_grader(name)
    values_for = getattr(fn, "values_for", None)
    declared = values_for(examples) if values_for is not None else getattr(fn, "reward_values", None)
    if declared is None or isinstance(declared, (str, bytes)):
        return None
    try:
        values = sorted({float(v) for v in declared})
    except (TypeError, ValueError):
        return None
    return tuple(values) if values and all(math.isfinite(v) for v in values) else None


def ungraded(examples: Sequence[Example]) -> list[Example]:
    """The examples whose reference answer, written as the whole completion, does not grade 1.0 by
    their grader (so no completion of that answer can count as right); a grader that raises on it
    counts it too. An example without a reference answer (a reasoning-gym dataset whose checker
    accepts many answers, e.g. graph_color) is not checked."""
    out = []
    for example in examples:
        if not example.answer.strip():
            continue
        try:
            right = is_right(example.answer, example)
        except Exception:  # noqa: BLE001 - a grader that cannot grade its own reference
            right = False
        if not right:
            out.append(example)
    return out


def ungraded_note(examples: Sequence[Example]) -> str | None:
    """The start-up warning when some held-out answers cannot be graded right (:func:`ungraded`), or None."""
    missed = ungraded(examples)
    if not missed:
        return None
    names = sorted({ex.grader for ex in missed})
    shown = ", ".join(repr(ex.answer if len(ex.answer) <= 40 else ex.answer[:40] + "...") for ex in missed[:3])
    return (
        f"{len(missed)} of {len(examples)} held-out answers ({shown}{', ...' if len(missed) > 3 else ''}) are not graded "
        f"right by task.grader = {' / '.join(map(repr, names))} even when a completion is exactly that answer, so held-out "
        "accuracy can never count them; choose a grader that reads them (task.grader = 'text' for words, 'auto' for "
        "numbers, words and LaTeX; `podsrl config task` lists them)"
    )


def text_key(text_: str, *, casefold: bool = True) -> str:
    """``text_`` as the ``text`` grader compares it: LaTeX `\\text{}` unwrapped, surrounding quotes,
    punctuation and whitespace stripped, runs of whitespace made one space, case folded."""
    previous = None
    while previous != text_:  # nested \text{\textbf{..}}
        previous, text_ = text_, _TEXT_MACRO.sub(r"\1", text_)
    text_ = " ".join(text_.strip(SURROUNDING).split())
    return text_.casefold() if casefold else text_


def _same_text(completion: str, reference: str, *, casefold: bool = True) -> bool:
    key = text_key(reference, casefold=casefold)
    if not key:
        return False
    return text_key(answer_text(completion), casefold=casefold) == key or text_key(completion, casefold=casefold) == key


def _numeric_decides(completion: str, reference: str) -> bool:
    """The reference is a plain number and the completion's answer is not a box of LaTeX."""
    if parse_number(reference) is None:
        return False
    if "####" in completion and completion.rsplit("####", 1)[1].strip():
        return True  # GSM8K's marker outranks any box (`extract_answer`)
    boxed = last_boxed(completion)
    return boxed is None or parse_number(boxed) is not None
