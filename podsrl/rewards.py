"""Verifiable rewards: pure functions `fn(completion: str, example: Example) -> float`.

A reward is chosen by name from `REWARDS` (built-ins) or given as a user function
"module:function" / "path/to/file.py:function" (`get_reward`). `compute_rewards` scores N
completions against their aligned examples with a weighted sum of reward functions.

Answer extraction (`extract_answer`), in priority order:
  1. the first number after the last "####" (GSM8K's own answer marker);
  2. the content of the last `\\boxed{...}` (nested braces handled): the whole content if it is a
     number, else its last number, else the content as text;
  3. the last number anywhere in the text ("The answer is 7. Wait, 8" -> "8").
Numbers may carry a sign, thousands commas ("1,234"), decimals (".5", "3.50"), a fraction ("3/4",
"\\frac{3}{4}"), "$" or "%" around them, or a sentence's trailing period. A "-" right after a word
character or closing bracket is read as subtraction, not a sign ("7-5" gives 7 and 5).
Scientific notation and number words ("twelve") are not recognised.

Matching (`answers_match`) is exact: both sides become `fractions.Fraction`, so "0.5", ".5" and
"1/2" are equal and no float tolerance is needed; "%" is dropped without scaling ("5%" == "5"),
because GSM8K-style references write percentages as plain numbers. A reference that is not a
number is compared as text, ignoring case and runs of whitespace.

`correctness` (`is_correct`) decides with one of three comparisons, by what the two answers are:
  - numeric (the above, exact, no sympy): the reference is a plain number and so is the
    completion's answer ("12", "#### 1,234", "\\boxed{3/4}", "\\frac{3}{4}");
  - text (the above): the reference is words ("Paris", "New York");
  - symbolic, with math-verify (`podsrl.symbolic`): everything else, i.e. a LaTeX or symbolic
    reference ("\\sqrt{2}", "(-\\infty, 3]", "x^2+1"), or a plain-number reference answered in a
    box that holds more than a number ("\\boxed{\\frac12}", "\\boxed{2^{10}}",
    "\\boxed{5\\text{ cm}}"). A reference math-verify cannot parse, or a missing math-verify,
    falls back to text.
Where they differ: numeric equality is exact ("0.333333" is not 1/3) while math-verify rounds to
6 places; math-verify reads LaTeX the numeric path misreads ("\\boxed{\\frac12}" is 1/2, not 12)
and compares intervals, sets, roots and expressions by value.

A reward function that raises, or returns NaN, inf or a non-number, stops the run with a
RewardError showing the prompt and completion: silently scoring 0 would look like a model that
does not learn.
"""

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from podsrl import symbolic
from podsrl.errors import ConfigError, RewardError
from podsrl.tasks import Example

RewardFn = Callable[[str, Example], float]

_PLAIN = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"  # 1,234.5 | 1234 | .5
_LATEX_FRAC = r"\\[dt]?frac\{\s*-?(?:\d+(?:\.\d+)?)\s*\}\{\s*-?(?:\d+(?:\.\d+)?)\s*\}"
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])[-\u2212]\$?)?"  # a sign, unless it follows an operand (then it is minus)
    rf"(?:{_LATEX_FRAC}|(?:{_PLAIN})(?:/\d+(?:\.\d+)?)?)"
)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:/|$)")
_FRAC_PARTS = re.compile(r"^(-?)\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}$")
_BOXED = re.compile(r"\\boxed\s*\{")
# A reference of words, compared as text: math-verify would read "Paris" as the product of the
# symbols p*a*r*i*s (which "Pairs" equals).
_WORDS = re.compile(r"[^\W\d_]{2,}(?:[\s'-]+[^\W\d_]+)*\.?")
# What may follow a final answer and still count as "the number ends the text" for `format`.
_TRAILING = " \t\r\n.!?*\"'`)$%"


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number written as text, or None if it is not one number.

    Accepts "1,234" (commas only as thousands separators), "-3.50", ".5", "3/4", "\\frac{3}{4}",
    "$5", "\\$5", "5%" (= 5, not 0.05), "5." (= 5), surrounding whitespace and a leading "+".
    """
    cleaned = _clean(text)
    if "," in cleaned:
        if not _THOUSANDS.match(cleaned):
            return None
        cleaned = cleaned.replace(",", "")
    numerator, slash, denominator = cleaned.partition("/")
    try:
        value = Fraction(numerator)
        if slash:
            value /= Fraction(denominator)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def extract_answer(text: str) -> str | None:
    """The final answer in a completion, normalised ("1,234." -> "1234"), or None if there is none.

    See the module docstring for the priority order. Numbers come back without commas, "$", "%"
    or trailing period, and "\\frac{a}{b}" as "a/b"; non-numeric answers (after "####" or in a
    box) come back stripped.
    """
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        first = _NUMBER.search(tail)
        if first:
            return _normalise(first.group())
        if tail.strip():
            return tail.strip().splitlines()[0].strip()
    boxed = last_boxed(text)
    if boxed is not None:
        if parse_number(boxed) is not None:
            return _normalise(boxed)
        inside = _NUMBER.findall(boxed)
        if inside:
            return _normalise(inside[-1])
        if boxed.strip():
            return boxed.strip()
    numbers_ = _NUMBER.findall(text)
    return _normalise(numbers_[-1]) if numbers_ else None


def answers_match(pred: str | None, ref: str) -> bool:
    """Whether a predicted answer equals the reference: exact numeric equality when the reference
    is a number, else text equality ignoring case, whitespace runs and a trailing period."""
    if pred is None:
        return False
    ref_value = parse_number(ref)
    if ref_value is not None:
        return parse_number(pred) == ref_value
    return _text_key(pred) == _text_key(ref)


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}`, nested braces included, or None."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth = 1
        for i in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[match.end() : i]
    return None  # none, or every box is cut off (a truncated completion)


def correctness(completion: str, example: Example) -> float:
    """1.0 if the completion's final answer equals the reference (`is_correct`), else 0.0."""
    return 1.0 if is_correct(completion, example.answer) else 0.0


def is_correct(completion: str, reference: str) -> bool:
    """Whether the completion's final answer equals `reference`: numerically when both are plain
    numbers, as text when the reference is words, else with math-verify (module docstring)."""
    if not _numeric_decides(completion, reference) and not _WORDS.fullmatch(reference.strip()):
        verdict = symbolic.matches(completion, reference)
        if verdict is not None:  # None: math-verify cannot parse the reference, or is missing
            return verdict
    return answers_match(extract_answer(completion), reference)


def _numeric_decides(completion: str, reference: str) -> bool:
    """The reference is a plain number and the completion's answer is not a box of LaTeX."""
    if parse_number(reference) is None:
        return False
    if "####" in completion and completion.rsplit("####", 1)[1].strip():
        return True  # GSM8K's marker outranks any box (`extract_answer`)
    boxed = last_boxed(completion)
    return boxed is None or parse_number(boxed) is not None


def format_reward(completion: str, example: Example) -> float:
    """1.0 if the completion marks a final answer clearly, else 0.0 (the caller applies a weight).

    Clearly marked means any of: an answer after "####"; a non-empty `\\boxed{}`; or, for the
    short "Give only the final number." prompt style, the text ends with a number once trailing
    whitespace and `. ! ? * " ' ` ) $ %` are stripped ("12", "The answer is $18.", "**7**").
    "12 apples." does not count: the answer must be the last thing written. Correctness is not
    checked here. (Named `format_reward` so as not to shadow the builtin; registered as "format".)
    """
    del example  # the rule depends on the completion only
    if "####" in completion and completion.rsplit("####", 1)[1].strip():
        return 1.0
    boxed = last_boxed(completion)
    if boxed is not None and boxed.strip():
        return 1.0
    text = completion.rstrip(_TRAILING)
    numbers_ = list(_NUMBER.finditer(text))
    return 1.0 if numbers_ and numbers_[-1].end() == len(text) else 0.0


REWARDS: dict[str, RewardFn] = {
    "correctness": correctness,
    "format": format_reward,
}


@lru_cache(maxsize=None)  # a user file is imported once, not once per training step
def get_reward(name: str) -> RewardFn:
    """A built-in reward by name, or a user function "module:function" / "file.py:function".

    A user module is a dotted name importable from sys.path, or a path to a .py file. Every
    failure (unknown name, module not found, import error, missing attribute, not callable, wrong
    arguments) is a ConfigError naming the spec and the fix.
    """
    if ":" in name:
        return _load_user_reward(name)
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
) -> RewardResult:
    """Score completions[i] against examples[i] (the caller repeats each example per rollout).

    Raises RewardError if any reward function raises or returns a non-finite or non-number
    value; nothing is silently scored 0.
    """
    if len(completions) != len(examples):
        raise ValueError(
            f"{len(completions)} completions but {len(examples)} examples; "
            "repeat each example once per completion"
        )
    resolved = resolve_specs(specs)
    per_reward = {
        spec.name: [
            _score(spec.name, get_reward(spec.name), completion, example)
            for completion, example in zip(completions, examples)
        ]
        for spec in resolved
    }
    total = [
        math.fsum(spec.weight * per_reward[spec.name][i] for spec in resolved)
        for i in range(len(completions))
    ]
    return RewardResult(total=total, per_reward=per_reward)


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
        raise RewardError(_describe_failure(name, problem, completion, example)) from exc
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value)
    problem = f"returned {value!r} ({type(value).__name__}); a reward must be a finite number"
    raise RewardError(_describe_failure(name, problem, completion, example))


def _describe_failure(name: str, problem: str, completion: str, example: Example) -> str:
    return (
        f"reward function {name!r} {problem}\n"
        f"  example id: {example.id}\n"
        f"  prompt: {_truncate(example.question)!r}\n"
        f"  completion: {_truncate(completion)!r}"
    )


def _truncate(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text)} chars]"


def _clean(text: str) -> str:
    """Cosmetic wrapping off a number: whitespace, "$", "%", a trailing period, a leading "+",
    the unicode minus, LaTeX `{,}` separators, and "\\frac{a}{b}" rewritten as "a/b"."""
    text = text.strip().replace("\u2212", "-").replace("{,}", ",")
    for wrapper in ("\\$", "$", "\\%", "%"):
        text = text.replace(wrapper, "")
    text = text.strip().rstrip(".").lstrip("+").strip()
    frac = _FRAC_PARTS.match(text)
    if frac:
        sign, top, bottom = frac.groups()
        text = f"{sign}{top.strip()}/{bottom.strip()}"
    return re.sub(r"\s*/\s*", "/", text)


def _normalise(number: str) -> str:
    """An extracted number as returned by `extract_answer`: cleaned, without thousands commas."""
    return _clean(number).replace(",", "")


def _text_key(text: str) -> str:
    return " ".join(text.split()).rstrip(".").casefold()


def _load_user_reward(spec: str) -> RewardFn:
    module_name, _, attribute = spec.rpartition(":")
    usage = (
        "give a user reward as 'module:function' (importable from sys.path) or "
        "'path/to/file.py:function', where the function is "
        "def fn(completion: str, example: Example) -> float"
    )
    if not module_name or not attribute:
        raise ConfigError(f"reward {spec!r} is malformed; {usage}")
    is_file = module_name.endswith(".py") or "/" in module_name or "\\" in module_name
    module = _import_file(spec, Path(module_name)) if is_file else _import_module(spec, module_name)
    if not hasattr(module, attribute):
        available = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )
        raise ConfigError(
            f"reward {spec!r}: {module_name} has no attribute {attribute!r} "
            f"(its callables: {', '.join(available) or 'none'}); "
            f"define def {attribute}(completion: str, example: Example) -> float there"
        )
    fn = getattr(module, attribute)
    if not callable(fn):
        raise ConfigError(
            f"reward {spec!r}: {module_name}.{attribute} is a {type(fn).__name__}, not a "
            "function; it must be def fn(completion: str, example: Example) -> float"
        )
    # A TRL-style batched reward, fn(prompts, completions, **columns) -> list[float], is adapted.
    from podsrl.integrations.rewards import from_batched, is_batched

    if is_batched(fn):
        return from_batched(fn, spec)
    try:
        inspect.signature(fn).bind("", Example("", "", ""))
    except TypeError as exc:
        raise ConfigError(
            f"reward {spec!r}: {attribute} cannot be called as fn(completion, example) ({exc}); "
            "give it exactly those two parameters"
        ) from None
    except ValueError:
        pass  # no introspectable signature (some builtins): trust it, _score still guards calls
    return fn


def _import_module(spec: str, module_name: str) -> object:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"reward {spec!r}: no module named {module_name!r} on sys.path; check the "
                "spelling, install it, or pass a file path like 'path/to/file.py:function'"
            ) from None
        raise ConfigError(f"reward {spec!r}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            f"reward {spec!r}: importing {module_name} failed ({type(exc).__name__}: {exc})"
        ) from exc


def _import_file(spec: str, path: Path) -> object:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(
            f"reward {spec!r}: file {str(path)!r} does not exist; give a path to a .py file "
            "as 'path/to/file.py:function'"
        )
    # A unique module name per file, registered in sys.modules so the user's code can use
    # dataclasses, pickling and relative lookups as in any imported module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"podsrl_user_reward_{path.stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"reward {spec!r}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(
            f"reward {spec!r}: running {path} failed ({type(exc).__name__}: {exc})"
        ) from exc
    return module
