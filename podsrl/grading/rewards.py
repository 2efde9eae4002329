"""Verifiable rewards: pure functions `fn(completion: str, example: Example) -> float`.

A reward is chosen by name from `REWARDS` (built-ins) or given as a user function
"module:function" / "path/to/file.py:function" (`get_reward`). `compute_rewards` scores N
completions against their aligned examples with a weighted sum of reward functions.

Answers are extracted and matched by :mod:`podsrl.grading.answers`.

`correctness` is the completion's grade by the example's grader (`Example.grader`, chosen by the task:
:mod:`podsrl.grading.graders`), 0.0 or 1.0 for the built-in graders, partial credit where a task's
grader gives it (reasoning_gym). Held-out accuracy uses the same grader. The default grader,
``auto``, decides by what the two answers are:
  - numeric (exact, no sympy): the reference is a plain number and so is the completion's answer
    ("12", "#### 1,234", "\\boxed{3/4}", "\\frac{3}{4}");
  - text: the reference is words ("Paris", "New York"), compared after normalising case,
    whitespace, quotes, surrounding punctuation and LaTeX `\\text{}`;
  - symbolic, with math-verify (`podsrl.grading.equivalence`): everything else, i.e. a LaTeX or symbolic
    reference ("\\sqrt{2}", "(-\\infty, 3]", "x^2+1") that the answer does not already spell exactly, or a
    plain-number reference answered in a box that holds more than a number ("\\boxed{\\frac12}",
    "\\boxed{2^{10}}", "\\boxed{5\\text{ cm}}"). A reference math-verify cannot parse, or a missing
    math-verify, falls back to text.
Where they differ: numeric equality is exact ("0.333333" is not 1/3) while math-verify rounds to
6 places; math-verify reads LaTeX the numeric path misreads ("\\boxed{\\frac12}" is 1/2, not 12)
and compares intervals, sets, roots and expressions by value.

A reward function that raises, or returns NaN, inf or a non-number, stops the run with a
RewardError showing the prompt and completion: silently scoring 0 would look like a model that
does not learn.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from podsrl.errors import ConfigError, RewardError
from podsrl.grading import graders
from podsrl.grading.answers import after_hashes, ends_with_number, last_boxed
from podsrl.grading.user import RewardFn, load_user_reward
from podsrl.tasks.types import Example, Task


def correctness(completion: str, example: Example) -> float:
    """The completion's grade by the example's grader (`Example.grader`; module docstring): 1.0
    right, 0.0 wrong, partial credit in between where the grader gives it."""
    return graders.grade(completion, example)


def is_correct(completion: str, reference: str) -> bool:
    """Whether the completion's final answer equals `reference` by the ``auto`` grader: numerically
    when both are plain numbers, as text when the reference is words, else with math-verify
    (module docstring)."""
    return graders.auto(completion, Example("", "", reference)) >= 1.0


def format_reward(completion: str, example: Example) -> float:
    """1.0 if the completion marks a final answer clearly, else 0.0 (the caller applies a weight).

    Clearly marked means any of: an answer after "####"; a non-empty `\\boxed{}`; or, for the
    short "Give only the final number." prompt style, the text ends with a number once trailing
    whitespace and `. ! ? * " ' ` ) $ %` are stripped ("12", "The answer is $18.", "**7**").
    "12 apples." does not count: the answer must be the last thing written. Correctness is not
    checked here. (Named `format_reward` so as not to shadow the builtin; registered as "format".)
    """
    del example  # the rule depends on the completion only
    if after_hashes(completion) is not None:
        return 1.0
    boxed = last_boxed(completion)
    if boxed is not None and boxed.strip():
        return 1.0
    return 1.0 if ends_with_number(completion) else 0.0


REWARDS: dict[str, RewardFn] = {
    "correctness": correctness,
    "format": format_reward,
}

_REL_TOL = 1e-6  # declared values vs rewards that went through float32, as podsrl.core.early_stop compares them

# The values a reward function can return, declared for exact early stopping
# (podsrl.core.early_stop); a user function may declare its own as ``fn.reward_values = (0.0, 1.0)``.
# correctness's are its grader's (`task_values`); (0, 1), those of every built-in grader but
# reasoning_gym's, where no task says otherwise.
correctness.reward_values = (0.0, 1.0)
format_reward.reward_values = (0.0, 1.0)

# Values declared for a reward function by the task rather than by the function: {name: values or None}.
Declared = dict[str, tuple[float, ...] | None]


def task_values(task: Task) -> Declared:
    """What the task declares: the values of `correctness` are the grades its grader gives on its
    training problems (:func:`podsrl.grading.graders.grade_values`; None: undeclared)."""
    return {"correctness": graders.grade_values(task.grader, task.train)}


@lru_cache(maxsize=None)  # a user file is imported once, not once per training step
def get_reward(name: str) -> RewardFn:
    """A built-in reward by name, or a user function "module:function" / "file.py:function".

    A user module is a dotted name importable from sys.path, or a path to a .py file. Every
    failure (unknown name, module not found, import error, missing attribute, not callable, wrong
    arguments) is a ConfigError naming the spec and the fix.
    """
    if ":" in name:
        return load_user_reward(name)
    if name not in REWARDS:
        raise ConfigError(
            f"unknown reward {name!r}; valid rewards: {', '.join(sorted(REWARDS))}, "
            "or a user function as 'module:function' or 'path/to/file.py:function'"
        )
    return REWARDS[name]


@dataclass(frozen=True)
class RewardSpec:
    """One reward function and its weight in the total (negative weights are penalties)."""

    name: str
    weight: float = 1.0


@dataclass(frozen=True)
class RewardResult:
    """Scores for N completions.

    `total` is the weighted sum, [N]; `per_reward` maps each reward name to its UNWEIGHTED
    values, [N], so metrics read directly as accuracy or format rate.
    """

    total: list[float]
    per_reward: dict[str, list[float]]
    timeouts: list[int] = field(default_factory=list)  # [N]: how many functions timed out on each (reward.timeout_seconds)
    timed_out: dict[str, list[bool]] = field(default_factory=dict)  # per function served by the pool: [N], whether its call timed out


class Scorer(Protocol):
    """Scores some reward functions away from this process: :class:`podsrl.grading.pool.RewardPool`
    (worker processes, each call limited by ``reward.timeout_seconds``)."""

    def serves(self, name: str) -> bool: ...

    def score(self, name: str, completions: Sequence[str], examples: Sequence[Example]) -> tuple[list[float], list[bool]]:
        """(value per completion, whether its call timed out)."""
        ...


def resolve_specs(specs: Sequence[RewardSpec | tuple[str, float]]) -> list[RewardSpec]:
    """Validated RewardSpecs, every function already loaded, so a bad name or weight fails at
    start-up rather than after the first rollouts. Duplicate names are an error."""
    if not specs:
        raise ConfigError("no reward functions given; add at least one, e.g. ('correctness', 1.0)")
    resolved = [_as_spec(spec) for spec in specs]
    seen: set[str] = set()
    for spec in resolved:
        weight = spec.weight
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise ConfigError(f"reward {spec.name!r}: weight {weight!r} must be a finite number")
        if not math.isfinite(weight):
            raise ConfigError(f"reward {spec.name!r}: weight {weight!r} must be a finite number")
        if spec.name in seen:
            raise ConfigError(f"reward {spec.name!r} is listed twice; give it once with one weight")
        seen.add(spec.name)
        get_reward(spec.name)
    return resolved


def compute_rewards(
    completions: Sequence[str],
    examples: Sequence[Example],
    specs: Sequence[RewardSpec | tuple[str, float]],
    *,
    pool: Scorer | None = None,
) -> RewardResult:
    """Score completions[i] against examples[i] (the caller repeats each example per rollout).

    Raises RewardError if any reward function raises or returns a non-finite or non-number
    value; nothing is silently scored 0. The functions ``pool`` serves (user functions, with
    ``reward.timeout_seconds``: :mod:`podsrl.grading.pool`) run in its worker processes, where a
    call that times out scores ``reward.timeout_score`` and is counted in ``timeouts`` (and flagged in
    ``timed_out``, per function); whether too many did is the caller's check, over a whole training
    step (:func:`podsrl.grading.pool.check_timeouts`).
    """
    if len(completions) != len(examples):
        raise ValueError(
            f"{len(completions)} completions but {len(examples)} examples; "
            "repeat each example once per completion"
        )
    resolved = resolve_specs(specs)
    per_reward: dict[str, list[float]] = {}
    timed_out: dict[str, list[bool]] = {}
    timeouts = [0] * len(completions)
    for spec in resolved:
        if pool is not None and pool.serves(spec.name):
            per_reward[spec.name], timed_out[spec.name] = pool.score(spec.name, completions, examples)
            timeouts = [t + int(out) for t, out in zip(timeouts, timed_out[spec.name])]
        else:
            fn = get_reward(spec.name)
            per_reward[spec.name] = [_score(spec.name, fn, completion, example) for completion, example in zip(completions, examples)]
    total = [
        math.fsum(spec.weight * per_reward[spec.name][i] for spec in resolved)
        for i in range(len(completions))
    ]
    return RewardResult(total=total, per_reward=per_reward, timeouts=timeouts, timed_out=timed_out)


def declared_values(
    specs: Sequence[RewardSpec], *, extra: dict[str, float] | None = None, declared: Declared | None = None, limit: int = 4096
) -> tuple[float, ...] | None:
    """Every value the weighted total of ``specs`` can take, from each function's ``reward_values``
    (``declared[name]`` instead where the task declares it: :func:`task_values`), plus
    ``extra[name]`` (e.g. the score of a call that timed out); None when a function declares none,
    or when there would be more than ``limit`` combinations."""
    sets = []
    for spec in specs:
        values = function_values(spec.name, declared)
        if values is None:
            return None
        sets.append(sorted(set(values) | ({float(extra[spec.name])} if extra and spec.name in extra else set())))
    return _totals(specs, sets, limit)


def function_values(name: str, declared: Declared | None = None) -> tuple[float, ...] | None:
    """The values reward function ``name`` declares it can return (its ``reward_values``, or
    ``declared[name]`` when the task declares them: :func:`task_values`), sorted; None when it
    declares none. A declaration that is not a non-empty collection of finite numbers
    is a ConfigError naming the function: ``reward_values = 1.0`` is refused rather than read as "always
    1.0", which is far more often a slip for ``(0.0, 1.0)`` (a function that only ever returns 1.0
    declares ``(1.0,)``)."""
    if declared is not None and name in declared:
        return declared[name]
    declared = getattr(get_reward(name), "reward_values", None)
    if declared is None:
        return None
    usage = "declare every value it can return as a list or tuple of numbers, e.g. reward_values = (0.0, 1.0)"
    if isinstance(declared, (str, bytes)) or not isinstance(declared, Iterable):
        raise ConfigError(
            f"reward {name!r}: reward_values = {declared!r} is not a list of values; {usage} "
            f"(a function that only ever returns {declared!r}: reward_values = ({declared!r},))"
        )
    values = list(declared)
    if not values or not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in values):
        raise ConfigError(f"reward {name!r}: reward_values = {declared!r} must hold finite numbers, at least one; {usage}")
    return tuple(sorted({float(v) for v in values}))


def timeout_values(specs: Sequence[RewardSpec], reward) -> dict[str, float]:
    """name -> ``reward.timeout_score`` for the functions whose calls can time out (``reward``: the
    run's :class:`podsrl.config.RewardConfig`): the user functions, when ``reward.timeout_seconds``
    runs them in worker processes (:meth:`podsrl.grading.pool.RewardPool.from_config`)."""
    if reward.timeout_seconds is None:
        return {}
    return {spec.name: float(reward.timeout_score) for spec in specs if ":" in spec.name}


def total_values(specs: Sequence[RewardSpec], reward, *, timeouts: bool = True, declared: Declared | None = None) -> tuple[float, ...] | None:
    """Every value the run's total reward can take: ``reward.values`` when given, else the weighted
    sums of the functions' declared values (:func:`declared_values`; ``declared``: the task's,
    :func:`task_values`), a timed-out call scoring ``reward.timeout_score`` (``timeouts``); None when
    undeclared."""
    if reward.values is not None:
        return tuple(sorted({float(v) for v in reward.values}))
    return declared_values(specs, extra=timeout_values(specs, reward) if timeouts else None, declared=declared)


def timeout_totals_undeclared(specs: Sequence[RewardSpec], reward, declared: Declared | None = None) -> list[float]:
    """The totals a timed-out call (scored ``reward.timeout_score``) can give that ``reward.values``
    leaves out, where they can be known: every function declares its values, or a single function's
    are ``reward.values`` / its weight. Empty without ``reward.values``, without timeouts, or when
    they cannot be known (each reward is still checked as it comes: :func:`explain_undeclared`)."""
    extra = timeout_values(specs, reward)
    if reward.values is None or not extra:
        return []
    sets = [function_values(spec.name, declared) for spec in specs]
    if len(specs) == 1 and sets[0] is None and specs[0].weight != 0:
        sets = [tuple(v / specs[0].weight for v in reward.values)]
    if any(values is None for values in sets):
        return []
    without = _totals(specs, sets) or ()
    with_timeouts = _totals(specs, [sorted({*values, extra[spec.name]} if spec.name in extra else values) for spec, values in zip(specs, sets)])
    return [t for t in with_timeouts or () if not _listed(t, reward.values) and not _listed(t, without)]


def explain_undeclared(specs: Sequence[RewardSpec], values: Sequence[Sequence[float]], reward, declared: Declared | None = None) -> str:
    """Who broke the declaration, and the fix, for the RewardError of
    :func:`podsrl.core.early_stop.check_values`: ``values`` [S][F] are each function's value (in
    ``specs`` order) on the S rollouts whose total was undeclared; ``reward`` the run's RewardConfig,
    ``declared`` the task's declarations (:func:`task_values`)."""
    names = [spec.name for spec in specs]
    then = (
        "or go on without early stopping (--rollout.early_stop=off); the declaration and rollout.early_stop may "
        "change when the run is resumed"
    )
    if reward.values is not None:
        returned = ", ".join(f"{name!r} returned {_listing(column)}" for name, column in zip(names, zip(*values)))
        return f"the total reward is declared by reward.values; at those rollouts {returned}. Add the totals to reward.values, {then}"
    extra = timeout_values(specs, reward)
    blamed = []
    for spec, column in zip(specs, zip(*values)):
        listed = function_values(spec.name, declared) or ()
        allowed = (*listed, extra[spec.name]) if spec.name in extra else listed
        stray = [v for v in column if not _listed(v, allowed)]
        if stray:
            timeout = f" or reward.timeout_score {extra[spec.name]:g}" if spec.name in extra else ""
            source = " (its task's grader's values)" if declared is not None and spec.name in declared else ""
            blamed.append(f"reward function {spec.name!r} returned {_listing(stray)}, not in its `reward_values` {list(listed)}{source}{timeout}")
    if not blamed:  # float rounding of a weighted sum: name the functions at least
        blamed = [f"the reward functions {', '.join(map(repr, names))} (each one's `reward_values`)"]
    return f"{'; '.join(blamed)}. Add every value a function can return to its `reward_values`, {then}"


def _totals(specs: Sequence[RewardSpec], sets: Sequence[Sequence[float]], limit: int = 4096) -> tuple[float, ...] | None:
    """The weighted sums of one value from each of ``sets`` (aligned with ``specs``); None past ``limit`` combinations."""
    if math.prod(len(v) for v in sets) > limit:
        return None
    totals = {math.fsum(spec.weight * v for spec, v in zip(specs, combo)) for combo in itertools.product(*sets)}
    return tuple(sorted(totals))


def _listed(value: float, values: Sequence[float]) -> bool:
    """``value`` is one of ``values``, to the tolerance of rewards that went through float32
    (:mod:`podsrl.core.early_stop`)."""
    return any(abs(value - v) <= _REL_TOL * max(1.0, abs(v)) for v in values)


def _listing(values: Sequence[float]) -> str:
    distinct = sorted(set(values))
    return ", ".join(f"{v:g}" for v in distinct[:5]) + (" ..." if len(distinct) > 5 else "")


def _as_spec(spec: RewardSpec | tuple[str, float]) -> RewardSpec:
    if isinstance(spec, RewardSpec):
        return spec
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str):
        return RewardSpec(spec[0], spec[1])
    raise ConfigError(f"reward {spec!r} must be a (name, weight) pair, e.g. ('correctness', 1.0)")


def _score(name: str, fn: RewardFn, completion: str, example: Example) -> float:
    try:
        value = fn(completion, example)
    except Exception as exc:
        problem = f"raised {type(exc).__name__}: {exc}"
        raise RewardError(describe_failure(name, problem, completion, example)) from exc
    return check_value(name, value, completion, example)


def check_value(name: str, value: object, completion: str, example: Example) -> float:
    """``value`` as a float when it is a finite number; else the RewardError that stops the run."""
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value)
    problem = f"returned {value!r} ({type(value).__name__}); a reward must be a finite number"
    raise RewardError(describe_failure(name, problem, completion, example))


def describe_failure(name: str, problem: str, completion: str, example: Example) -> str:
    return (
        f"reward function {name!r} {problem}\n"
        f"  example id: {example.id}\n"
        f"  prompt: {_truncate(example.question)!r}\n"
        f"  completion: {_truncate(completion)!r}"
    )


def _truncate(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text)} chars]"
