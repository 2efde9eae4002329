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
  (a multi-line answer). Or else the sentence rule (:func:`names_answer`), for a reference of words
  or a number: the completion's final sentence (of its last non-empty line, or of what follows
  "####" or is in the box or tag) holds the reference as whole words, case and punctuation and
  markdown aside, a number also in digits or in words ("8" and "eight", zero to one hundred), and
  it is the sentence's answer: it opens or ends the sentence (a number may be followed by the
  question's words, its unit) and every other word is a word of the question or a filler
  (:data:`FILLERS`: articles, "it", "is", "the answer", "I think", "so", "called", ...). Right: "The
  capital of Germany is Berlin.", "bees make honey", "It is Mars", "Mars is the red planet.", "A
  spider has eight legs." (for "8"). Wrong, on purpose: a negation right before it ("not Mars",
  "It isn't Mars"), the reference inside another word ("Marsh") or number ("8.5" for "8"), several
  candidates ("Mars or Venus", "Mars and Venus", a word the question does not hold, either of the
  question's own "A or B" alternatives: "Mars is bigger than Jupiter" for "Which is bigger, Mars or
  Jupiter?"), the reference in the middle ("The opposite of winter is summer." for "winter"), or
  only in an earlier sentence. After a marker a clause may follow ("The answer is Mars, not
  Venus.", "... Mars because it is red."; not ", or Venus"). The rule reads no grammar: it errs
  towards wrong ("Berlin, a large city." is wrong), never towards a second candidate. A reference
  that is a number is compared as a number (``numeric``, which also reads a number word).
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
from podsrl.grading.answers import (
    NUMBER_WORDS, SURROUNDING, after_hashes, answer_region, answer_text, extract_answer, final_sentence, last_boxed, number_value,
    parse_number,
)  # fmt: skip
from podsrl.tasks.types import Example

__all__ = ["BELOW_ONE", "GRADERS", "RULES", "answer_text", "check_grader", "get_grader", "grade", "grade_values", "is_right", "names_answer", "text_key", "ungraded"]

Grader = Callable[[str, Example], float]

BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1.0: where a grade just under 1.0 is kept (grade)

# A reference of words, compared as text.
_WORDS = re.compile(r"[^\W\d_]{2,}(?:[\s'-]+[^\W\d_]+)*\.?")
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
# The sentence rule (`names_answer`, module docstring).
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+")  # a word, or a number with its decimals ("8.5" is not "8")
_CONTRACTED_NOT = re.compile(r"n[\'\u2019]t\b", re.IGNORECASE)  # "isn't" reads as "is not"
# Words a sentence may add around its answer without naming another one.
FILLERS = frozenset(
    "a an the it its s this that is are was were be has have had do does did i think believe guess would say my our final "
    "answer correct right so thus therefore hence then well called named known as".split()
)
NEGATIONS = frozenset("not no never neither nor none cannot".split())
_ARTICLES = frozenset(("a", "an", "the"))
# A marker right before the answer ("The answer is Mars, not Venus."): what follows may then be a clause of its own.
_MARKED_BEFORE = re.compile(r"\banswer\s*(?:is\b|:)[\s:*_\"'`]*(?:(?:the|a|an)\s+)?$", re.IGNORECASE)
_CLAUSE_AFTER = re.compile(
    r"[\s*_\"'`]*(?:$|[.!?]|[,;]\s*(?!(?:or|and)\b)|[(\u2014]|\s(?:because|since|as|not|but|which|while|given|instead)\b)",
    re.IGNORECASE,
)


def numeric(completion: str, example: Example) -> float:
    """1.0 if the completion's answer equals the reference, a number, exactly; a number written in
    words on either side ("eight") is that number (module docstring)."""
    value = number_value(example.answer)
    if value is None:
        return 0.0
    if number_value(extract_answer(completion) or "") == value:
        return 1.0
    # No number in digits in the final sentence: its answer may be a number word ("A spider has eight legs.").
    if value in NUMBER_WORDS and not re.search(r"\d", final_sentence(answer_region(completion).text)):
        return 1.0 if names_answer(completion, example.answer, example.question) else 0.0
    return 0.0


def text(completion: str, example: Example) -> float:
    """1.0 if the completion's answer is the reference's text, normalised, or its final sentence
    names the reference as its answer (module docstring); a reference that is a number is compared
    as a number."""
    if parse_number(example.answer) is not None:
        return numeric(completion, example)
    return 1.0 if _same_text(completion, example.answer) or names_answer(completion, example.answer, example.question) else 0.0


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


# What each built-in grader counts as right, in a line (the zero-signal warning names it: podsrl.run.watch).
RULES: dict[str, str] = {
    "auto": "a number as a number, the marked or last one; words as the reference alone or marked ('The answer is Mars.', "
    "'**Mars.**') or named by the final sentence, opening or ending it ('The red planet is Mars.', 'Mars is the red planet.'); "
    "LaTeX by math-verify",
    "numeric": "the answer's number equals the reference: after '####', in a box or <answer> tag, marked by 'the answer is', "
    "else the last number; a number word ('eight') is a number",
    "text": "the answer is the reference's text ('The answer is Mars.', '**Mars.**'), or the final sentence names it, opening or "
    "ending it, every other word the question's or a filler ('The red planet is Mars.', 'Mars is the red planet.')",
    "math": "math-verify finds the answer equal to the reference",
    "reasoning_gym": "the reasoning-gym dataset's own checker on the extracted answer",
    "reasoning_gym_binary": "the reasoning-gym dataset's own checker on the extracted answer, full credit only",
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
    text_ = " ".join(_unmacro(text_).strip(SURROUNDING).split())
    return text_.casefold() if casefold else text_


def _same_text(completion: str, reference: str, *, casefold: bool = True) -> bool:
    key = text_key(reference, casefold=casefold)
    if not key:
        return False
    return text_key(answer_text(completion), casefold=casefold) == key or text_key(completion, casefold=casefold) == key


def names_answer(completion: str, reference: str, question: str = "") -> bool:
    """Whether the completion's final sentence names ``reference`` as its answer (the sentence rule,
    module docstring): the reference as whole words (a number also in digits or words), opening or
    ending the sentence (a number may be followed by the question's words), every other word of the
    sentence a word of the ``question`` or a filler (:data:`FILLERS`), no negation right before it,
    no "or", none of the question's "A or B" alternatives; after a marker ("The answer is Mars, not
    Venus.") a clause of its own may follow it. For references of words or numbers only."""
    forms = _forms(reference)
    if not forms:
        return False
    sentence = _CONTRACTED_NOT.sub(" not", _unmacro(final_sentence(answer_region(completion).text)))
    spans = [(m.group().casefold(), m.start(), m.end()) for m in _TOKEN.finditer(sentence)]
    words = [w for w, _, _ in spans]
    asked, alternatives = _question_words(question)
    is_number = number_value(reference) is not None
    for form in forms:
        k = len(form)
        allowed = lambda w: w not in ("or", "nor") and (w in FILLERS or w in asked) and (w in form or w not in alternatives)  # noqa: E731
        for i in range(len(words) - k + 1):
            if tuple(words[i : i + k]) != form:
                continue
            before, after = words[:i], words[i + k :]
            unarticled = [w for w in before if w not in _ARTICLES]
            if unarticled and unarticled[-1] in NEGATIONS or not all(map(allowed, before)):
                continue  # "not Mars", "It isn't Mars"; another word before it
            # It opens or ends the sentence ("Mars is the red planet.", "It is Mars."); a number may be
            # followed by the question's words, its unit ("A spider has eight legs.").
            opens, ends = set(before) <= FILLERS, set(after) <= FILLERS or is_number
            if (opens or ends) and all(map(allowed, after)):
                return True
            start, end = spans[i][1], spans[i + k - 1][2]
            if _MARKED_BEFORE.search(sentence[:start]) and _CLAUSE_AFTER.match(sentence[end:]) and not {"or", "nor"} & set(after):
                return True
    return False


def _forms(reference: str) -> tuple[tuple[str, ...], ...]:
    """The ways a sentence may write ``reference``, as words: its own, and for a number from zero to
    one hundred its digits and its words; () for a reference the sentence rule does not read."""
    reference = reference.strip()
    value = number_value(reference)
    if value is None and not _WORDS.fullmatch(reference):
        return ()
    forms = {tuple(w.casefold() for w in _TOKEN.findall(reference))}
    if value is not None and value in NUMBER_WORDS:
        forms |= {(str(int(value)),), NUMBER_WORDS[int(value)]}
    return tuple(sorted(f for f in forms if f))


@lru_cache(maxsize=4096)  # a prompt's n rollouts share its question
def _question_words(question: str) -> tuple[frozenset[str], frozenset[str]]:
    """The question's words, and its alternatives: the words either side of each "or" ("Mars or Venus")."""
    words = [w.casefold() for w in _TOKEN.findall(_CONTRACTED_NOT.sub(" not", question))]
    alternatives = {words[j] for i, w in enumerate(words) if w == "or" for j in (i - 1, i + 1) if 0 <= j < len(words)}
    return frozenset(words), frozenset(alternatives)


def _unmacro(text_: str) -> str:
    previous = None
    while previous != text_:  # nested \text{\textbf{..}}
        previous, text_ = text_, _TEXT_MACRO.sub(r"\1", text_)
    return text_


def _numeric_decides(completion: str, reference: str) -> bool:
    """The reference is a plain number and the completion's answer is not a box of LaTeX."""
    if parse_number(reference) is None:
        return False
    if after_hashes(completion) is not None:
        return True  # GSM8K's marker outranks any box (`extract_answer`)
    boxed = last_boxed(completion)
    return boxed is None or parse_number(boxed) is not None
