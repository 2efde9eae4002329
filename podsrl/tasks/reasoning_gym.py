"""reasoning-gym's procedural datasets as a task (the optional extra ``podsrl[reasoning-gym]``).

Options: `dataset` (one dataset by name, e.g. "chain_sum") with `config` (its configuration, e.g.
{max_terms = 3}: the fields of its reasoning-gym config class, difficulty included), or `datasets`
(a weighted mix, reasoning-gym's composite dataset: a list of {name, weight = 1, config = {}}
tables); `num_train`, `num_eval`, `seed`; `answer_format` ("tags" or "plain"); `partial_credit`.

A list setting given without its weights ("operators" without "operators_weights", in
simple_equations and complex_arithmetic) gets even weights when the dataset's default weights do not
fit it (reasoning-gym would fail at its first item, weights and choices differing in number); where
they fit they are kept. Any other failure of reasoning-gym to generate an item from the settings it
accepted is a ConfigError naming the dataset, its settings and the error.

Problems. `num_train` problems are items 0..num_train-1 of the dataset built with a training seed,
the held-out ones are items of the same dataset built with an evaluation seed (both derived from
`seed` by hashing, so different seeds give different problems and one seed always the same). Two
seeds do not make two disjoint sets (a small space, such as 3-letter words to spell backward,
repeats), so the held-out items are read in order and an item whose question is already a
training question, or an earlier held-out one, is skipped, until `num_eval` are kept: held-out
questions never appear in training. A space too small to give them (after reading
`_SCAN_FACTOR` x num_eval + 100 items) is a ConfigError saying how many were found. Training
problems may repeat (as arithmetic's do).

Prompt. The dataset's question (which says what form the answer takes: "a comma-separated list",
"the puzzle above") then the instruction: with ``answer_format = "tags"`` (the default),
reasoning-gym's convention, "Give your final answer between <answer> and </answer> tags.", and no
system prompt; with ``"plain"``, "Give only the final answer." and the system prompt "Answer with
only the final answer." (a small model that cannot keep to tags). Either way the answer scored is
the answer podsrl extracts, from the last `<answer>` tag's content if there is one (read as an
untagged answer is): the marked number ("the answer is"), else the final one, when the reference
is a number ("The GCD of 50 and 46 is 2." scores "2"), else the last line's answer ("The answer
is: olleh." scores "olleh"), the whole completion for a reference of several lines
(:func:`podsrl.grading.reasoning_gym.extract`).

Grading. The task's grader is the dataset's own `score_answer` (:mod:`podsrl.grading.reasoning_gym`),
so the `correctness` reward is that score, partial credit included (``partial_credit = false``: 1.0
for full credit, else 0.0, which every dataset declares as its values), and held-out accuracy counts
the completions that get full credit. Each Example carries what scoring needs (``Example.data``:
the dataset's name, its config, the entry). Example ids are "<dataset>:<split>:<index>".
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from podsrl.errors import ConfigError
from podsrl.grading.reasoning_gym import require
from podsrl.tasks.types import Example, Task, check_count

# One line per option, printed by `podsrl config task --task.name=reasoning_gym` (podsrl/configdoc.py).
OPTION_HELP = {
    "dataset": "one reasoning-gym dataset by name, e.g. 'chain_sum', 'leg_counting', 'letter_counting', 'spell_backward', "
               "'word_sorting', 'gcd', 'countdown', 'knights_knaves', 'mini_sudoku' (an unknown name lists them all)",
    "config": "that dataset's own settings (difficulty), e.g. {min_terms = 2, max_terms = 2, max_digits = 1} for chain_sum: "
              "the fields of its reasoning-gym config class; seed and size come from seed, num_train and num_eval; a list "
              "given without its weights (operators without operators_weights) gets even weights if the default ones do not fit",
    "datasets": "instead of dataset: a weighted mix (reasoning-gym's composite), e.g. [{name = 'chain_sum', weight = 2, "
                "config = {max_terms = 3}}, {name = 'leg_counting'}]; weight defaults to 1, config to {}",
    "num_train": "training problems: items 0..num_train-1 of the dataset built with a training seed (they may repeat)",
    "num_eval": "held-out problems, from an evaluation seed; one whose question is a training question is skipped",
    "seed": "the draw of both splits (none given: train.seed)",
    "answer_format": "'tags': ask for the answer between <answer> and </answer> (reasoning-gym's convention) | 'plain': ask "
                     "for the answer alone; either way the answer is read from the last tag's content if there is one, else the whole completion, "
                     "as an untagged answer: the marked or final number (a numeric reference) or the last line's answer "
                     "('The answer is: X.' scores X)",
    "partial_credit": "true: the reward is the dataset's score_answer, partial credit included (held-out accuracy counts full "
                      "credit) | false: 1.0 for full credit, else 0.0 (declared values for every dataset: exact early stopping)",
}  # fmt: skip

ANSWER_FORMATS = {  # answer_format -> (system prompt, instruction)
    "tags": (None, "Give your final answer between <answer> and </answer> tags."),
    "plain": ("Answer with only the final answer.", "Give only the final answer."),
}
_SCAN_FACTOR = 20  # held-out items read at most per problem kept (module docstring)
_SET_BY_PODSRL = ("seed", "size")  # config fields the task's own options set


def load(
    *,
    dataset: str | None = None,
    config: dict[str, Any] | None = None,
    datasets: list[dict[str, Any]] | None = None,
    num_train: int = 1000,
    num_eval: int = 200,
    seed: int = 0,
    answer_format: str = "tags",
    partial_credit: bool = True,
) -> Task:
    """Problems from reasoning-gym; see the module docstring."""
    check_count("reasoning_gym", "num_train", num_train)
    check_count("reasoning_gym", "num_eval", num_eval)
    check_count("reasoning_gym", "seed", seed)
    if answer_format not in ANSWER_FORMATS:
        raise ConfigError(f"task 'reasoning_gym': option answer_format={answer_format!r} must be one of {', '.join(map(repr, ANSWER_FORMATS))}")
    if not isinstance(partial_credit, bool):
        raise ConfigError(f"task 'reasoning_gym': option partial_credit={partial_credit!r} must be true or false")
    specs = _specs(dataset, config, datasets)
    train_source = _build(specs, seed=_derived_seed("train", seed), size=max(num_train, 1))
    train = [_example(train_source, specs, "train", i) for i in range(num_train)]
    seen = {ex.question for ex in train}
    eval_source = _build(specs, seed=_derived_seed("eval", seed), size=_SCAN_FACTOR * num_eval + 100)
    held_out: list[Example] = []
    for i in range(_SCAN_FACTOR * num_eval + 100):
        if len(held_out) == num_eval:
            break
        example = _example(eval_source, specs, "eval", i)
        if example.question not in seen:
            seen.add(example.question)
            held_out.append(example)
    if len(held_out) < num_eval:
        raise ConfigError(
            f"task 'reasoning_gym': only {len(held_out)} held-out problems whose questions are not training questions "
            f"(num_eval={num_eval}, num_train={num_train}); the dataset's configuration gives too few distinct problems: "
            "lower num_eval or num_train, or widen the configuration (e.g. a larger difficulty range)"
        )
    system_prompt, instruction = ANSWER_FORMATS[answer_format]
    return Task(
        name="reasoning_gym",
        train=train,
        eval=held_out,
        system_prompt=system_prompt,
        instruction=instruction,
        grader="reasoning_gym" if partial_credit else "reasoning_gym_binary",
    )


def dataset_names() -> list[str]:
    """The datasets reasoning-gym offers (its registry; "composite" is the `datasets` option)."""
    from reasoning_gym.factory import DATASETS

    require()
    return sorted(name for name in DATASETS if name != "composite")


@dataclasses.dataclass(frozen=True)
class _Spec:
    name: str
    weight: float
    config: dict[str, Any]


def _specs(dataset: object, config: object, datasets: object) -> list[_Spec]:
    """The datasets to draw from, checked: names, weights, configuration fields and values."""
    require()
    usage = ("set task.options.dataset (e.g. 'chain_sum', with task.options.config for its settings) or "
             "task.options.datasets (a mix: [{name = 'chain_sum', weight = 2}, {name = 'leg_counting', config = {max_animals = 3}}])")  # fmt: skip
    if (dataset is None) == (datasets is None):
        given = "both" if dataset is not None else "neither"
        raise ConfigError(f"task 'reasoning_gym': {given} of the options dataset and datasets given; {usage}")
    if dataset is not None:
        specs = [_spec(dataset, 1.0, config, "dataset")]
    else:
        if config is not None:
            raise ConfigError("task 'reasoning_gym': option config goes with dataset; in a mix, each entry of datasets has its own config")
        if not isinstance(datasets, list) or not datasets:
            raise ConfigError(f"task 'reasoning_gym': option datasets={datasets!r} must be a non-empty list of tables; {usage}")
        specs = []
        for i, item in enumerate(datasets):
            where = f"datasets[{i}]"
            if not isinstance(item, dict) or "name" not in item or set(item) - {"name", "weight", "config"}:
                raise ConfigError(f"task 'reasoning_gym': option {where}={item!r} must be a table {{name, weight = 1, config = {{}}}}")
            specs.append(_spec(item["name"], item.get("weight", 1.0), item.get("config"), where))
        names = [spec.name for spec in specs]
        if len(set(names)) < len(names):
            raise ConfigError(f"task 'reasoning_gym': option datasets names a dataset twice ({names}); give each once, with one weight")
    return specs


def _spec(name: object, weight: object, config: object, where: str) -> _Spec:
    from reasoning_gym.factory import DATASETS

    known = dataset_names()
    if not isinstance(name, str) or name not in known:
        import difflib

        close = difflib.get_close_matches(str(name), known, n=3)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise ConfigError(
            f"task 'reasoning_gym': option {where} names {name!r}, not a reasoning-gym dataset; {hint}the {len(known)} "
            f"datasets: {', '.join(known)}"
        )
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ConfigError(f"task 'reasoning_gym': option {where}: weight={weight!r} must be a number > 0")
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise ConfigError(f"task 'reasoning_gym': {name}'s config={config!r} must be a table of its settings, e.g. {{}}")
    fields = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in _SET_BY_PODSRL]
    for key in config:
        if key in _SET_BY_PODSRL:
            option = "seed" if key == "seed" else "num_train and num_eval"
            raise ConfigError(f"task 'reasoning_gym': {name}'s config sets {key!r}, which the task sets from its option {option}; drop it")
        if key not in fields:
            raise ConfigError(f"task 'reasoning_gym': {name}'s config has no setting {key!r}; its settings: {', '.join(fields)}")
    return _Spec(name, float(weight), _even_weights(name, dict(config)))


def _weighted_lists(name: str) -> dict[str, str]:
    """The dataset's list settings with a weight per entry, by their defaults: {"operators":
    "operators_weights"} for simple_equations (arc_agi's rotations_weights, one entry longer than
    rotations, is no such pair)."""
    from reasoning_gym.factory import DATASETS

    defaults = DATASETS[name][1]()
    pairs = {}
    for field in dataclasses.fields(defaults):
        weights = f"{field.name}_weights"
        values, given = getattr(defaults, field.name), getattr(defaults, weights, None)
        if isinstance(values, (list, tuple)) and isinstance(given, (list, tuple)) and len(values) == len(given):
            pairs[field.name] = weights
    return pairs


def _even_weights(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with even weights for a weighted list given without its weights whose default weights
    do not fit it (module docstring); the defaults are kept where they fit."""
    from reasoning_gym.factory import DATASETS

    defaults = DATASETS[name][1]()
    for key, weights in _weighted_lists(name).items():
        values = config.get(key)
        if weights not in config and isinstance(values, (list, tuple)) and values and len(values) != len(getattr(defaults, weights)):
            config[weights] = [1 / len(values)] * len(values)
    return config


def _build(specs: list[_Spec], *, seed: int, size: int) -> Any:
    """One reasoning-gym dataset, or reasoning-gym's composite for a mix; a configuration it refuses is a ConfigError."""
    rg = require()
    try:
        if len(specs) == 1 and specs[0].weight == 1.0:
            return rg.create_dataset(specs[0].name, **specs[0].config, seed=seed, size=size)
        from reasoning_gym.composite import DatasetSpec

        mix = [DatasetSpec(name=s.name, weight=s.weight, config=dict(s.config)) for s in specs]
        return rg.create_dataset("composite", datasets=mix, seed=seed, size=size)
    except (AssertionError, ValueError, TypeError) as err:
        names = ", ".join(s.name for s in specs)
        raise ConfigError(f"task 'reasoning_gym': reasoning-gym refused the configuration of {names}: {err or type(err).__name__}") from None


def _example(source: Any, specs: list[_Spec], split: str, index: int) -> Example:
    try:
        entry = source[index]
    except Exception as err:  # noqa: BLE001 - any failure of reasoning-gym's generator on this configuration
        raise ConfigError(_generation_error(specs, index, err)) from None
    name = entry["metadata"]["source_dataset"]
    config = next(s.config for s in specs if s.name == name)
    answer = entry["answer"]
    return Example(
        id=f"{name}:{split}:{index}",
        question=entry["question"],
        answer="" if answer is None else str(answer),  # None: the dataset's checker accepts many answers
        grader="reasoning_gym",
        data={"dataset": name, "config": config, "entry": entry},
    )


def _generation_error(specs: list[_Spec], index: int, err: Exception) -> str:
    """What to say when reasoning-gym accepted a configuration but cannot generate an item from it."""
    names = ", ".join(s.name for s in specs)
    where = "task.options.config" if len(specs) == 1 else "the config of each entry of task.options.datasets"
    hints = []
    for spec in specs:
        for key, weights in _weighted_lists(spec.name).items():
            if key in spec.config and weights in spec.config and len(spec.config[key]) != len(spec.config[weights]):
                hints.append(f"{spec.name}'s {key} has {len(spec.config[key])} entries and {weights} {len(spec.config[weights])}: "
                             f"give one weight per entry, or leave {weights} out for even weights")  # fmt: skip
    fix = "; ".join(hints) or "check its settings against the dataset's (`podsrl config task --task.name=reasoning_gym` names them)"
    given = {spec.name: spec.config for spec in specs}
    return (f"task 'reasoning_gym': reasoning-gym could not generate {names}'s item {index} with the settings {given} "
            f"({type(err).__name__}: {err}); {where}: {fix}")  # fmt: skip


def _derived_seed(split: str, seed: int) -> int:
    """A 32-bit seed for ``split``, the same in every process (hashlib, not Python's salted hash)."""
    return int.from_bytes(hashlib.sha256(f"podsrl-reasoning_gym-{split}-{seed}".encode()).digest()[:4], "big")
