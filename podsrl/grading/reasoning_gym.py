"""reasoning-gym's own checkers as podsrl graders (the optional extra ``podsrl[reasoning-gym]``).

Each reasoning-gym dataset scores an answer with its `score_answer(answer, entry)`, a number in
[0, 1], and some give partial credit (word_sorting: the share of words in the right place; the
library's default: len(reference) / len(answer) when the answer contains the reference). podsrl's
graders ``reasoning_gym`` (that score) and ``reasoning_gym_binary`` (1.0 for full credit, else 0.0)
call it on the completion's extracted answer (:func:`extract`), the same for the reward and for
held-out accuracy, whichever ``answer_format`` the task asked for:

1. the content of the last `<answer>...</answer>` (reasoning-gym's own answer format; the tag in any
   case, :data:`podsrl.grading.answers.ANSWER_TAG`), read by steps 2-4 as an untagged completion
   is: one unwrapping for both, so "<answer>81.676.</answer>" is scored as "81.676", as the plain
   "81.676." is (reasoning-gym's own reading, the content as written, gave the checker "81.676.",
   which float() refuses: 0 for a right answer), and "<answer>The answer is 12.</answer>" as "12";
2. when the example's reference answer is a number as text (an integer, a decimal, a
   fraction: one that podsrl's numeric extraction reads back whole, so not "1.7e-22"), the
   completion's final number by podsrl's numeric extraction, the one the arithmetic task's
   correctness uses (:func:`podsrl.grading.answers.extract_answer`: after "####", in the last
   `\\boxed{}`, else the answer the final sentence marks ("The answer is 12, not 13." -> "12"), else
   the last number; normalised, "1,234." -> "1234"): "12", "The answer is 12.",
   "gcd = 12" and "6 + 6 = 12" all give "12"; but a final number in scientific notation comes back
   as written ("The largest is 5.9671e+01." gives "5.9671e+01", which number_format's checker reads
   as 59.671), where podsrl's numeric extraction, which does not read that notation, would give its
   exponent ("01");
3. else, when the reference is one line of text (a word, a list, a sentence), podsrl's text
   extraction, the one the ``text`` grader uses (:func:`podsrl.grading.answers.answer_text`: after
   "####", in the last `\\boxed{}`, else the last non-empty line, from after its last "answer is" /
   "answer:"), stripped of surrounding whitespace, quotes, markdown emphasis and sentence
   punctuation, except what the reference itself begins or ends with ("Smith has to perform."
   keeps its period): "The answer is: olleh." gives "olleh"; also a number's when step 2 finds
   no number (the checker then refuses what it gets);
4. else (a reference of several lines, a grid, where the last line would cut it; or none, a
   checker that accepts many answers) the whole completion, stripped, as reasoning-gym's checker
   of such answers reads it.

An empty result is None, which every checker scores 0. A checker that raises on an answer it cannot
read (prime_factorization's int() on a sentence) scores it 0.0, as reasoning-gym's own would refuse it.

Where podsrl differs from reasoning-gym's `reasoning_gym.utils.extract_answer` (the last
`<answer>` tag's content, stripped, else None, so 0 for any untagged completion) and why: podsrl
scores an untagged completion too (steps 2-4), and a tag's content as it scores an untagged one, because a small model asked for the answer alone
(``answer_format = "plain"``) answers in a sentence ("The GCD of 50 and 46 is 2."), and a checker
given the whole sentence gives it 0, or a sliver of partial credit for its length, although the
answer is right: the embedded model's cheap checks scored 0-5% on every dataset that way while up
to 70% of its completions held the right answer (results/screen-reasoning-gym/README.md). The
reward is then the problem's answer, not the sentence's length, as in podsrl's arithmetic task.
podsrl's tag pattern is reasoning-gym's but in any case. Partial credit is the dataset's, on the extracted answer
(reasoning-gym's default on "The answer is 120." for a reference "12": "120" holds "12", 2/3).

What scoring an example needs travels with it, in ``Example.data`` (set by
:mod:`podsrl.tasks.reasoning_gym`): ``dataset`` (the dataset that generated it, also inside a mix),
``config`` (that dataset's configuration options, as given) and ``entry`` (reasoning-gym's entry:
question, answer, metadata). The dataset object that scores is built once per process from
``dataset`` and ``config`` (:func:`_scorer`).

Declared values (:func:`score_values`, the `correctness` reward's `reward_values` under this grader,
for exact early stopping): read from reasoning-gym 0.1.25's source (the extra pins it) for the
datasets in `VALUES`; any other dataset gives None (undeclared: its partial credit can take any
value, e.g. the library default's length ratio). ``reasoning_gym_binary`` always declares (0, 1).
The run checks every reward against the declaration (:func:`podsrl.core.early_stop.check_values`),
so a table that drifted from the library stops the run with the dataset named rather than training on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from podsrl.errors import ConfigError
from podsrl.grading.answers import SURROUNDING, answer_text, extract_answer, last_tag, parse_number

if TYPE_CHECKING:  # a leaf below podsrl.tasks, whose reasoning_gym loader imports this module
    from podsrl.tasks.types import Example

EXTRA = "reasoning-gym"  # pip install 'podsrl[reasoning-gym]'
# A number in scientific notation, as Python's float() reads it ("5.9671e+01", "-1E-3", ".5e2");
# whether it is the completion's final number is _final_scientific's check.
_SCIENTIFIC = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)[eE][-+]?\d+")


def require() -> Any:
    """The ``reasoning_gym`` module; a ConfigError naming the extra when it is not installed."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise ConfigError(
            f"the reasoning_gym task and graders need the reasoning-gym package, which is not installed ({err}); "
            f"pip install 'podsrl[{EXTRA}]' (`make setup` installs it)"
        ) from None
    return reasoning_gym


def extract(completion: str, reference: str | None) -> str | None:
    """The answer of ``completion`` that reasoning-gym's checker scores, given the example's
    reference answer (None: it has none); None when empty. The rules, in order, are the module
    docstring's."""
    tag = last_tag(completion)
    if tag is not None:
        completion = tag  # read as an untagged completion is (module docstring, step 1)
    reference = None if reference is None else str(reference)
    if reference is None or "\n" in reference.strip():
        return completion.strip() or None
    if _is_number(reference):
        scientific = _final_scientific(completion)
        if scientific is not None:
            return scientific
        number = extract_answer(completion)
        if number is not None:
            return number
    return _unwrap(answer_text(completion), reference, SURROUNDING) or None


def score(completion: str, example: Example) -> float:
    """The example's dataset's `score_answer` on the completion's extracted answer; 0.0 when the
    checker raises on it (an answer it cannot read)."""
    data = _data(example)
    scorer = _scorer(data["dataset"], json.dumps(data.get("config") or {}, sort_keys=True))
    entry = data["entry"]
    answer = extract(completion, entry.get("answer"))
    try:
        return float(scorer.score_answer(answer, entry))
    except Exception:  # noqa: BLE001 - e.g. prime_factorization's int() on "The answer is: 2 x 3"
        return 0.0


def _final_scientific(completion: str) -> str | None:
    """The completion's final number when it is written in scientific notation ("... is
    5.9671e+01." gives "5.9671e+01"), else None (also when a digit follows it)."""
    matches = list(_SCIENTIFIC.finditer(completion))
    if not matches or re.search(r"\d", completion[matches[-1].end() :]):
        return None
    return matches[-1].group()


def _is_number(reference: str) -> bool:
    """Whether the reference is a number that podsrl's numeric extraction reads back whole ("12",
    "-0.5", "3/4", "$244/607$"; not "1.7e-22", whose "e-22" it would read as another number)."""
    value = parse_number(reference)
    if value is None:
        return False
    extracted = extract_answer(reference)
    return extracted is not None and parse_number(extracted) == value


def _unwrap(text: str, reference: str, surrounding: str) -> str:
    """``text`` without the ``surrounding`` characters around it (the ``text`` grader's: quotes,
    emphasis, sentence punctuation, whitespace), but with those the reference itself begins or ends
    with, where ``text`` has them there ("perform." for a reference "perform.")."""
    core = text.strip(surrounding)
    if not core:
        return ""
    start = text.index(core)
    before, after = text[:start], text[start + len(core) :]
    ref_core = reference.strip(surrounding)
    lead = reference[: reference.index(ref_core)] if ref_core else ""
    trail = reference[reference.index(ref_core) + len(ref_core) :] if ref_core else ""
    return (lead if lead and before.endswith(lead) else "") + core + (trail if trail and after.startswith(trail) else "")


def score_values(examples: Sequence[Example]) -> tuple[float, ...] | None:
    """Every score ``reasoning_gym`` can give on ``examples`` (module docstring), or None when one of
    their datasets has no entry in `VALUES`."""
    values: set[float] = set()
    for example in examples:
        data = _data(example)
        rule = VALUES.get(data["dataset"])
        if rule is None:
            return None
        values |= rule(data["entry"])
    return tuple(sorted(values)) if values else None


def _data(example: Example) -> dict:
    data = example.data
    if not isinstance(data, dict) or not {"dataset", "entry"} <= set(data):
        raise ValueError(
            f"example {example.id!r} has no reasoning-gym entry (Example.data with 'dataset' and 'entry'), so the "
            f"grader {example.grader!r} cannot score it; it grades the reasoning_gym task's problems only"
        )
    return data


@lru_cache(maxsize=None)
def _scorer(name: str, config_json: str) -> Any:
    return require().create_dataset(name, **json.loads(config_json))


def _fractions(count: int) -> set[float]:
    return {k / count for k in range(count + 1)} if count > 0 else {0.0}


# The values of `score_answer` per dataset, as a function of the entry (reasoning-gym 0.1.25's source).
VALUES: dict[str, Callable[[dict], set[float]]] = {
    # Exact comparisons: 1.0 or 0.0.
    **dict.fromkeys(
        ["ab", "bitwise_arithmetic", "decimal_chain_sum", "dice", "needle_haystack", "number_format",
         "palindrome_partitioning", "self_reference", "zebra_puzzles"],
        lambda entry: {0.0, 1.0},
    ),  # fmt: skip
    # 1.0 solved; 0.05 every given number used, wrong value; 0.01 anything else.
    "countdown": lambda entry: {0.01, 0.05, 1.0},
    # 1.0 all right; 0.3 + 0.7 m / n with m of n people right (m >= 1); else 0.0.
    "knights_knaves": lambda entry: {0.0, 1.0} | {0.3 + 0.7 * m / len(entry["metadata"]["names"]) for m in range(1, len(entry["metadata"]["names"]) + 1)},
    # k / L letters right in place (L the word's length, summed 1/L at a time; within float tolerance), 0.8 for
    # every letter right and more written after them, 1.0 exact. For L = 6, 7, 9, 10, 11, 13, ... that sum is
    # 0.9999999999999999, not 1.0, so the 0.8 is never taken off: podsrl keeps it below 1.0 in float32
    # (podsrl.grading.graders.BELOW_ONE, within float tolerance of the declared 1.0) but cannot know the 0.8 meant.
    "spell_backward": lambda entry: _fractions(len(entry["answer"])) | {0.8},
    # k / N words in place; at least 0.2 for the right words in another order.
    "word_sorting": lambda entry: _fractions(len(entry["metadata"]["sorted_words"])) | {0.2},
}
