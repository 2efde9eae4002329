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
  ("0.5" == "1/2", "1,000" == "1000"), read in its sentence with the word rule's corrections
  (:func:`podsrl.grading.naming.named_number`; issue 68): a number denied right before it is not
  the answer, the last one not denied is ("It is 12, not 13" -> 12, "It has 8, not 6 or 10." ->
  8), and a number hedged with another number standing free ("The answer is 12 or 13.", "12/13"
  spaced as a list; not "5A/5 or 20 = A", nor "0.60 or 60%"), one of a bare list ("6, 8",
  "6\\n8") or beside an option's letter ("(A), 6") names none. Elsewhere the reading is
  extract_answer's: the same grade as before on all 26,376 GSM8K solutions tried (tests/test_graders.py).
  A number word is a number: with no digit in the final sentence, the word rule reads it ("A
  spider has eight legs." for "8"). A reference that is not a number is never matched.
- ``text``: for a reference of words ("Paris", "New York", "Washington, D.C.") or the letter of one
  of the question's lettered choices ("B" for "(A) dog (B) snake"), the word rule below (or the
  whole completion is the reference, normalised: a reference of several lines); a number
  is compared as a number (``numeric``); anything else exactly after the normalisation users
  expect: case, runs of whitespace, surrounding whitespace, quotes and punctuation (a trailing
  period, "**bold**", backticks), LaTeX `\\text{}` (`\\textbf`, `\\mathrm`) and `$`, comparing the
  completion's answer (:func:`answer_text`: after "####", in the last `\\boxed{}` or
  `<answer>...</answer>`, else its last non-empty line, from after "answer is" / "answer:" when the
  line says so), or else the whole completion (a multi-line answer).
- ``math``: math-verify (:mod:`podsrl.grading.equivalence`: LaTeX, intervals, sets, expressions
  by value); a reference it cannot parse, or a missing math-verify, falls back to ``text``.
- ``auto`` (every built-in task's default but reasoning_gym): by what the reference is. A plain
  number: ``numeric`` (but a completion that boxes LaTeX, "\\boxed{\\frac12}", goes to math-verify);
  words, or a choice's letter: ``text`` (math-verify would read "Paris" as p*a*r*i*s, which "Pairs"
  equals); anything else ("x+1", "\\sqrt{2}", "(-\\infty, 3]"): the answer written exactly as the
  reference (case kept) is right, else math-verify decides, else ``text``.
- ``reasoning_gym``, ``reasoning_gym_binary``: the reasoning-gym dataset's own `score_answer` on the extracted answer
  (:mod:`podsrl.grading.reasoning_gym`), with its partial credit, or 1.0 only for full credit.

The word rule (:func:`names_answer`, computed by :mod:`podsrl.grading.naming`; issue 68) decides
whether a completion names the reference as its answer, as a person reads it, and so that listing
candidates earns nothing. The rule of before (the final sentence holds the reference, every other
word the question's or a filler) erred both ways: "dog snake lizard" scored for "dog" and for
"lizard", and "The language spoken in Italy is Italian." scored 0 unless the question held "spoken".

1. Where the answer is. After "####" (its line), in the last `\\boxed{}`, in the last `<answer>`
   tag (read as a completion), else anywhere in the completion, read sentence by sentence (". ",
   "! ", "? " and line breaks; not after "D.C." or "St."). The answer part is the last sentence
   that offers a mention (2, 3), from after its last marker ("the answer is", "answer:"); a
   question offers nothing ("Is it Paris?" is no answer, "Paris? No, Lyon." answers Lyon). A
   sentence that adds to an answer given before ("also", "however", or opening with "It", "They",
   "This": "Paris. It is known for the Eiffel Tower.") or says something of its own (none of the
   question's words, more than a bare answer: "The dog is a mammal. Snakes and lizards are
   reptiles.") gives way to an earlier one that answers with the question's words or bare.
2. What is named, as whole words, case, accents and markdown aside:
   - the reference: its words (a leading article dropped; "Washington, D.C." with its comma), its
     last word in the regular plural or singular ("bees" for "bee", "berries", "leaves"), letters
     together or apart ("Washington DC", "U.S.A."); as the end of a longer name too ("William
     Shakespeare" for "Shakespeare", "the Pacific Ocean"); a number in digits or in words from zero
     to one hundred ("8", "eight", "twenty-one");
   - the candidates: every option the question lists (its lists, "dog, snake, lizard", "London,
     Berlin and Paris", "Mars or Jupiter", "between 5 and 7"; its lettered choices "(A) dog (B)
     snake", by text or letter; its bullet lines), every other answer of the task
     (`Example.task_answers`: words only, not those made of the question's own words), a full name
     the grader does not know (two capitalised words or more: "Artemisia Gentileschi"), and for a
     number reference every other number. The longest match wins ("New York" over "York").
3. Where each mention stands (clauses end at , ; : brackets, dashes, "but", "while"):
   - set against the answer: a negation before it in its clause ("It's not London, it's Paris.",
     "No, it's Paris." names Paris), or after it ("Mars is not the red planet.") unless the question
     is negative and the answer repeats it ("The penguin cannot fly."); after "than", "unlike",
     "except", "instead" ("Jupiter is bigger than Mars."); in a first clause restating the options
     ("Between Mars and Jupiter, Jupiter is bigger."); the reference standing where the question
     has another of its words, named elsewhere in the sentence ("The opposite of winter is summer."
     for "What is the opposite of summer?"; "The capital of Paris is France.");
   - said beside it: after "because", "since", "although", "like", "such as", "including"; in
     brackets; in a clause opened after a comma by "which", "who", "where", "as"; and, where clauses
     offer different things, those repeating fewer of the question's words ("A dog is a mammal;
     snakes and lizards are reptiles.");
   - offered: the rest. The answer is what the main part offers, or (none there) the asides.
4. Right when the answer part offers the reference and no other candidate (for a number reference:
   the last number offered is it, with no option's letter beside it), and
   - nothing stands beside it as a second item of a list: joined by "or" or "/" to anything ("Mars,
     or Venus.", "The answer is 12 or 13."), by "," or "and" to an item of one to three words that
     are no function words, "-ly" adverbs, numbers or only the question's words ("Answer: Paris,
     Lyon, Marseille"; not "Paris, of course!", "Paris, the capital", "Paris, France" for a
     question about France, "Carbon dioxide (CO2)"); for numbers, a bare list ("six eight", "6, 8");
   - a bare answer is not one line of a list: a neighbouring sentence holding nothing but another
     candidate ("London. Berlin. Paris.", "dog\\nsnake\\nlizard"), or one to three unknown words
     ("Paris. Lyon."; not "Paris. Good luck!");
   - no later sentence opening with "or", "but", "actually" or "wait" names something new ("The red
     planet is Mars. Or Venus.", "Mars is red.\\nBut the red planet is Venus.").
So a listing of two or more of the question's options, in any order, joined by commas, "and",
"or", slashes, spaces, line breaks or periods, scores 0 for each of them (tests/test_word_answers.py
tries thousands), and listing earns no more than guessing one (1/k in expectation).

Limits, chosen and measured (docs/your-task.md: 368 labelled completions, tests/data/word_answers.jsonl):
a word that is neither an option, an answer of the task nor a full name is a candidate only where it
stands in a list beside the reference ("spring autumn winter" names "winter" when "spring" and
"autumn" are not known; "Paris, Lyon" does not); compound words are not split ("honeybee" is not
"bee": "ant" would be found in "elephant"), synonyms and irregular plurals are not known ("Farsi"
for "Persian", "mice"), a contradiction that names no candidate is not seen ("... by William
Shakespeare is attributed to the French playwright"), and a reference that ends a longer name
counts ("New York" names "York" unless "New York" is a candidate too).

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
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

from podsrl.errors import ConfigError
from podsrl.grading import equivalence, naming
from podsrl.grading.answers import (
    NUMBER_WORDS, SURROUNDING, after_hashes, answer_region, answer_text, extract_answer, final_sentence, last_boxed, number_value,
    parse_number,
)  # fmt: skip
from podsrl.tasks.types import Example

__all__ = ["BELOW_ONE", "GRADERS", "RULES", "answer_text", "check_grader", "get_grader", "grade", "grade_values", "is_right", "names_answer", "text_key", "ungraded"]

Grader = Callable[[str, Example], float]

BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1.0: where a grade just under 1.0 is kept (grade)

_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")


def numeric(completion: str, example: Example) -> float:
    """1.0 if the completion's answer equals the reference, a number, exactly; a number written in
    words on either side ("eight") is that number (module docstring)."""
    value = number_value(example.answer)
    if value is None:
        return 0.0
    if naming.named_number(completion, extract_answer(completion), example.question) == value:
        return 1.0
    # No number in digits in the final sentence: its answer may be a number word ("A spider has eight legs.").
    if value in NUMBER_WORDS and not re.search(r"\d", final_sentence(answer_region(completion).text)):
        return 1.0 if names_answer(completion, example.answer, example.question, example.task_answers) else 0.0
    return 0.0


def text(completion: str, example: Example) -> float:
    """1.0 if the completion names the reference as its answer (the word rule, module docstring); a
    reference that is not words is compared as text, normalised; one that is a number as a number."""
    if parse_number(example.answer) is not None:
        return numeric(completion, example)
    if _reads_words(example):  # the word rule; or the whole completion is the reference (one of several lines)
        named = names_answer(completion, example.answer, example.question, example.task_answers)
        return 1.0 if named or text_key(completion) == text_key(example.answer) else 0.0
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
    if _reads_words(example):
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
    "auto": "a number as a number, the marked or last one; words named as the answer ('The red planet is Mars.', 'Mars is the "
    "red planet.', 'It is not Venus, it is Mars.') with no other option or answer of the task beside them (not 'Mars or "
    "Venus', 'Mars, Venus'); LaTeX by math-verify",
    "numeric": "the answer's number equals the reference: after '####', in a box or <answer> tag, marked by 'the answer is', "
    "else the last number, not one denied ('12, not 13') nor hedged ('12 or 13'); a number word ('eight') is a number",
    "text": "the reference named as the answer ('The answer is Mars.', 'Mars is the red planet.', 'It is not Venus, it is "
    "Mars.') with no other option or answer of the task beside it (not 'Mars or Venus', 'Mars, Venus', 'Is it Mars?')",
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


def names_answer(completion: str, reference: str, question: str = "", answers: Iterable[str] | None = None) -> bool:
    """Whether the completion names ``reference`` as its answer, by the word rule (module docstring):
    ``question`` gives the options it lists, ``answers`` the task's other answers (`Example.task_answers`)."""
    return naming.names_reference(completion, reference, question, answers)


def _reads_words(example: Example) -> bool:
    """Whether the word rule reads the example's reference: words, or the letter of a lettered choice."""
    return naming.is_words(example.answer) or naming.is_letter_choice(example.answer, example.question)


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
