"""reasoning-gym's own checkers as podsrl graders (the optional extra ``podsrl[reasoning-gym]``).

Each reasoning-gym dataset scores an answer with its `score_answer(answer, entry)`, a number in
[0, 1], and some give partial credit (word_sorting: the share of words in the right place; the
library's default: len(reference) / len(answer) when the answer contains the reference). podsrl's
graders ``reasoning_gym`` (that score) and ``reasoning_gym_binary`` (1.0 for full credit, else 0.0)
call it on the extracted answer (:func:`extract`): the content of the last `<answer>...</answer>`,
reasoning-gym's own answer format, else the whole completion, stripped (so a model asked for the
answer alone, ``answer_format = "plain"``, is scored on what it wrote).

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

if TYPE_CHECKING:  # a leaf below podsrl.tasks, whose reasoning_gym loader imports this module
    from podsrl.tasks.types import Example

EXTRA = "reasoning-gym"  # pip install 'podsrl[reasoning-gym]'
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


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


def extract(completion: str) -> str | None:
    """The answer reasoning-gym scores: the last `<answer>...</answer>`'s content, else the whole
    completion; stripped, None when empty."""
    tags = _ANSWER_TAG.findall(completion)
    answer = (tags[-1] if tags else completion).strip()
    return answer or None


def score(completion: str, example: Example) -> float:
    """The example's dataset's `score_answer` on the completion's extracted answer."""
    data = _data(example)
    scorer = _scorer(data["dataset"], json.dumps(data.get("config") or {}, sort_keys=True))
    return float(scorer.score_answer(extract(completion), data["entry"]))


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
    # every letter right and more written after them, 1.0 exact.
    "spell_backward": lambda entry: _fractions(len(entry["answer"])) | {0.8},
    # k / N words in place; at least 0.2 for the right words in another order.
    "word_sorting": lambda entry: _fractions(len(entry["metadata"]["sorted_words"])) | {0.2},
}
