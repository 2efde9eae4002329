"""Rewards: answer extraction on GSM8K-style text, exact matching, the registry, user functions,
and failures that must stop the run instead of scoring 0."""

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from podsrl.errors import ConfigError, RewardError
from podsrl.grading.answers import answers_match, extract_answer, last_boxed, parse_number
from podsrl.grading.rewards import REWARDS, RewardSpec, compute_rewards, correctness, format_reward, get_reward, resolve_specs
from podsrl.tasks import Example
from podsrl.tasks.jsonl import reference_answer
from conftest import function_refs


def ex(answer: str, question: str = "How many?") -> Example:
    return Example(id="t:1", question=question, answer=answer)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step 1: 1000 + 234.\n#### 1,234", "1234"),
        ("The answer is \\boxed{\\frac{3}{4}}.", "3/4"),
        ("She earns 9 per hour, so she has $18.", "18"),
        ("-5", "-5"),
        ("x = -5 degrees", "-5"),
        ("7-5 = 2", "2"),  # a minus after an operand is subtraction, not a sign
        ("3.50", "3.50"),
        ("The answer is 7. Wait, 8", "8"),
        ("She saved 25%.", "25"),
        ("Half is .5", ".5"),
        ("So 48/2 = 24 clips.", "24"),
        ("#### 12\nThe answer is 13", "12"),  # "####" wins over the last number
        ("Maybe 3. \\boxed{4}. Or 5", "4"),  # a box wins over the last number
        ("#### 3 \\boxed{4}", "3"),  # "####" wins over a box
        ("\\boxed{\\text{{x}} = 18 \\text{ dollars}}", "18"),  # nested braces, last number inside
        ("\\boxed{1{,}234}", "1234"),
        ("#### Paris", "Paris"),  # non-numeric answers survive
        ("\\boxed{Paris}", "Paris"),
        ("\\boxed{7", "7"),  # a cut-off box is ignored; the last number remains
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_last_boxed_handles_nesting_and_truncation():
    assert last_boxed("\\boxed{a} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{ok} \\boxed{cut") == "ok"
    assert last_boxed("none") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,234", Fraction(1234)),
        ("-3.50", Fraction(-7, 2)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-\\dfrac{1}{3}", Fraction(-1, 3)),
        ("$5", Fraction(5)),
        ("5%", Fraction(5)),
        ("5.", Fraction(5)),
        (" +7 ", Fraction(7)),
        (".5", Fraction(1, 2)),
        ("1,23", None),  # commas only as thousands separators
        ("3/0", None),
        ("nan", None),
        ("inf", None),
        ("twelve", None),
        ("", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("pred", "ref", "same"),
    [
        ("0.5", "1/2", True),
        (".5", "0.5", True),
        ("3.50", "3.5", True),
        ("3/4", "0.75", True),
        ("1234", "1,234", True),
        ("18", "18.0", True),
        ("0.33", "1/3", False),  # exact, no float tolerance
        ("8", "7", False),
        ("Paris", "paris.", True),  # non-numeric reference: text comparison
        ("New  York", "new york", True),
        ("Paris", "7", False),
        (None, "7", False),
    ],
)
def test_answers_match(pred, ref, same):
    assert answers_match(pred, ref) is same


def test_correctness_on_gsm8k_style_completions():
    assert correctness("48 / 2 = 24, 48 + 24 = 72.\n#### 72", ex("72")) == 1.0
    assert correctness("The answer is \\boxed{\\frac{3}{4}}.", ex("0.75")) == 1.0
    assert correctness("... so she has $1,234.", ex("1234")) == 1.0
    assert correctness("The answer is 7. Wait, 8", ex("7")) == 0.0
    assert correctness("I don't know", ex("7")) == 0.0


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("12", 1.0),
        ("The answer is $18.", 1.0),
        ("**42**", 1.0),
        ("It is -3/4.\n", 1.0),
        ("Work...\n#### 5", 1.0),
        ("Work... \\boxed{5} as shown", 1.0),
        ("12 apples.", 0.0),  # the number is not the last thing written
        ("I think so.", 0.0),
        ("#### ", 0.0),
        ("\\boxed{}", 0.0),
    ],
)
def test_format_reward(completion, score):
    assert format_reward(completion, ex("1")) == score


def test_registry_and_unknown_names():
    assert REWARDS == {"correctness": correctness, "format": format_reward}
    assert get_reward("format") is format_reward
    unknown = "unknown reward 'corect'; valid rewards: correctness, format"
    with pytest.raises(ConfigError, match=unknown):
        get_reward("corect")


def test_compute_rewards_weights_and_breakdown():
    completions = ["12", "The answer is 11.", "eleven"]
    specs = [("correctness", 1.0), RewardSpec("format", 0.1)]
    result = compute_rewards(completions, [ex("12")] * 3, specs)
    assert result.per_reward == {"correctness": [1.0, 0.0, 0.0], "format": [1.0, 1.0, 0.0]}
    assert result.total == pytest.approx([1.1, 0.1, 0.0])


def test_compute_rewards_checks_alignment_and_specs():
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        compute_rewards(["1", "2"], [ex("1")], [("correctness", 1.0)])
    with pytest.raises(ConfigError, match="listed twice"):
        resolve_specs([("format", 1.0), ("format", 0.5)])
    with pytest.raises(ConfigError, match="weight nan must be a finite number"):
        resolve_specs([("format", math.nan)])
    with pytest.raises(ConfigError, match="no reward functions"):
        resolve_specs([])
    with pytest.raises(ConfigError, match="unknown reward"):
        resolve_specs([("correctness", 1.0), ("nope", 1.0)])


def test_user_reward_from_file_and_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def short(completion, example):\n    return 1.0 if len(completion) < 5 else 0.0\n"
        "NOT_A_FUNCTION = 3\n"
        "def one_arg(completion):\n    return 1.0\n"
    )
    by_path = get_reward(f"{tmp_path}/my_rewards.py:short")
    assert by_path("hi", ex("1")) == 1.0
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "my_rewards:short"
    assert compute_rewards(["hi", "too long"], [ex("1")] * 2, [(spec, 2.0)]).total == [2.0, 0.0]

    with pytest.raises(ConfigError, match=r"no attribute 'long'.*its callables: one_arg, short"):
        get_reward("my_rewards:long")
    with pytest.raises(ConfigError, match="NOT_A_FUNCTION is a int, not a function"):
        get_reward("my_rewards:NOT_A_FUNCTION")
    with pytest.raises(ConfigError, match=r"cannot be called as fn\(completion, example\)"):
        get_reward("my_rewards:one_arg")
    with pytest.raises(ConfigError, match="no module named 'no_such_module_xyz'"):
        get_reward("no_such_module_xyz:fn")
    with pytest.raises(ConfigError, match="file '/no/such/rewards.py' does not exist"):
        get_reward("/no/such/rewards.py:fn")
    with pytest.raises(ConfigError, match="malformed"):
        get_reward("my_rewards:")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(ConfigError, match="running .*broken.py failed \\(SyntaxError"):
        get_reward(f"{tmp_path}/broken.py:f")


def _raises(completion, example):
    raise KeyError("missing_key")


@pytest.mark.parametrize(
    ("fn", "problem"),
    [
        (_raises, "raised KeyError: 'missing_key'"),
        (lambda c, e: math.nan, "returned nan"),
        (lambda c, e: math.inf, "returned inf"),
        (lambda c, e: None, "returned None"),
        (lambda c, e: "1.0", "returned '1.0'"),
    ],
)
def test_failing_reward_raises_reward_error_with_context(monkeypatch, fn, problem):
    monkeypatch.setitem(REWARDS, "flaky", fn)
    get_reward.cache_clear()  # the registry changed under the cache
    question = "Natalia sold clips to 48 of her friends. " * 10  # longer than the 200-char cut
    with pytest.raises(RewardError) as info:
        compute_rewards(["fine", "the completion"], [ex("1", question)] * 2, [("flaky", 1.0)])
    get_reward.cache_clear()
    message = str(info.value)
    assert "reward function 'flaky'" in message and problem in message
    assert "Natalia sold clips to 48 of her friends" in message and "[410 chars]" in message
    assert "'fine'" in message  # the first completion is the one that failed


def test_gsm8k_reference_solutions_score_full_marks():
    """Every GSM8K reference solution, read as a completion, is correct and well formatted."""
    path = Path("/work/shared/data/gsm8k/test.jsonl")
    if not path.is_file():
        pytest.skip(f"{path} not found")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        example = ex(reference_answer(row["answer"]), row["question"])
        assert correctness(row["answer"], example) == 1.0, row["answer"]
        assert format_reward(row["answer"], example) == 1.0


# ------------------------------------------------------------------ declared values (rollout.early_stop)

DECLARING_REWARDS = '''
def scalar(completion, example):
    return 1.0
scalar.reward_values = 1.0

def text(completion, example):
    return 1.0
text.reward_values = "01"

def empty(completion, example):
    return 1.0
empty.reward_values = []

def nan(completion, example):
    return 1.0
nan.reward_values = (0.0, float("nan"))

def only_one(completion, example):
    return 1.0
only_one.reward_values = (1.0,)

def binary(completion, example):
    return 0.5
binary.reward_values = [1, 0]

def undeclared(completion, example):
    return 0.5
'''


@pytest.fixture(scope="module")
def declaring(write_module):
    return function_refs(write_module("declaring", DECLARING_REWARDS))


@pytest.mark.parametrize(
    "name, fragments",
    [
        ("scalar", ["reward_values = 1.0 is not a list", "(0.0, 1.0)", "reward_values = (1.0,)"]),
        ("text", ["reward_values = '01' is not a list"]),
        ("empty", ["reward_values = []", "at least one"]),
        ("nan", ["reward_values = (0.0, nan)", "finite numbers"]),
    ],
)
def test_a_malformed_reward_values_declaration_is_a_config_error_naming_the_function(declaring, name, fragments):
    from podsrl.grading.rewards import declared_values, function_values

    for read in (lambda: function_values(declaring(name)), lambda: declared_values([RewardSpec(declaring(name))])):
        with pytest.raises(ConfigError) as err:
            read()
        assert f"reward {declaring(name)!r}: " in str(err.value)
        for fragment in fragments:
            assert fragment in str(err.value)


def test_reward_values_declarations_that_are_accepted(declaring):
    from podsrl.grading.rewards import declared_values, function_values

    assert function_values(declaring("only_one")) == (1.0,)
    assert function_values(declaring("binary")) == (0.0, 1.0)  # any collection of numbers, sorted
    assert function_values(declaring("undeclared")) is None
    assert declared_values([RewardSpec(declaring("binary"), 2.0), RewardSpec("correctness")]) == (0.0, 1.0, 2.0, 3.0)


def _reward_config(**settings):
    from podsrl.config import RewardConfig

    return RewardConfig(**{"names": ["correctness"], "weights": [1.0], **settings})


def test_explain_undeclared_names_the_function_that_broke_its_declaration(declaring):
    from podsrl.grading.rewards import explain_undeclared

    specs = [RewardSpec("correctness"), RewardSpec(declaring("binary"), 0.5)]
    reward = _reward_config(names=[s.name for s in specs], weights=[1.0, 0.5])
    text = explain_undeclared(specs, [[1.0, 0.5], [0.0, 0.5]], reward)
    assert f"reward function {declaring('binary')!r} returned 0.5, not in its `reward_values` [0.0, 1.0]" in text
    assert "'correctness'" not in text  # it kept its promise
    assert "--rollout.early_stop=off" in text and "resumed" in text
    # The timeout score counts as declared for a function that can time out.
    timed = lambda score: _reward_config(names=[s.name for s in specs], weights=[1.0, 0.5], timeout_seconds=5.0, timeout_score=score)  # noqa: E731
    assert "not in its `reward_values` [0.0, 1.0] or reward.timeout_score -1" in explain_undeclared(specs, [[1.0, 0.5]], timed(-1.0))
    assert "returned" not in explain_undeclared(specs, [[1.0, 0.5]], timed(0.5))  # 0.5 is its timeout score: nobody to blame
    # Declared by reward.values: name the setting and what each function returned there.
    values = _reward_config(names=[s.name for s in specs], weights=[1.0, 0.5], values=[0.0, 1.0])
    text = explain_undeclared(specs, [[1.0, 0.5]], values)
    assert "reward.values" in text and f"{declaring('binary')!r} returned 0.5" in text and "'correctness' returned 1" in text


def test_timeout_totals_undeclared(declaring):
    from podsrl.grading.rewards import timeout_totals_undeclared

    spec = [RewardSpec(declaring("undeclared"), 2.0)]
    reward = lambda **s: _reward_config(names=[declaring("undeclared")], weights=[2.0], **s)  # noqa: E731
    # One function: its values are reward.values / its weight; a timeout scores -1 -> a total of -2.
    assert timeout_totals_undeclared(spec, reward(values=[0.0, 2.0], timeout_seconds=1.0, timeout_score=-1.0)) == [-2.0]
    assert timeout_totals_undeclared(spec, reward(values=[0.0, 2.0], timeout_seconds=1.0, timeout_score=0.0)) == []
    assert timeout_totals_undeclared(spec, reward(values=[0.0, 2.0], timeout_score=-1.0)) == []  # no timeouts
    assert timeout_totals_undeclared(spec, reward(timeout_seconds=1.0, timeout_score=-1.0)) == []  # no reward.values
    # Two functions, both declared: every combination with a timeout.
    specs = [RewardSpec("correctness"), RewardSpec(declaring("binary"))]
    both = _reward_config(names=[s.name for s in specs], weights=[1.0, 1.0], values=[0, 1, 2], timeout_seconds=1.0, timeout_score=-1.0)
    assert timeout_totals_undeclared(specs, both) == [-1.0]
    # Two functions, one undeclared: unknowable here (every reward is still checked as it comes).
    specs = [RewardSpec("correctness"), RewardSpec(declaring("undeclared"))]
    mixed = _reward_config(names=[s.name for s in specs], weights=[1.0, 1.0], values=[0, 1, 2], timeout_seconds=1.0, timeout_score=-1.0)
    assert timeout_totals_undeclared(specs, mixed) == []
