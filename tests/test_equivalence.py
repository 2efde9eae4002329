"""Answer checking with math-verify: where it and the numeric path differ, which one decides, and
failures (timeouts, exceptions, threads, a missing math-verify) that must not stop training."""

import subprocess
import sys
import threading
import time

import pytest

from podsrl.grading import equivalence
from podsrl.grading.answers import answers_match, extract_answer
from podsrl.grading.rewards import compute_rewards, is_correct
from podsrl.tasks import Example

pytest.importorskip("math_verify")


# (reference, completion, numeric path alone, is_correct). The numeric path is what podsrl did
# before math-verify: extract_answer + answers_match.
DIFFERENCES = [
    # fractions
    ("\\frac{1}{2}", "\\boxed{\\frac12}", False, True),  # numbers path reads "12"
    ("\\frac{2}{3}", "\\boxed{\\dfrac{4}{6}}", True, True),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt3}{2}}", False, True),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{3}{2}}", False, False),
    ("1/3", "\\boxed{0.333333}", False, False),  # both plain numbers: exact, no rounding
    # boxes
    ("1024", "\\boxed{2^{10}}", False, True),
    ("4", "\\boxed{\\sqrt{16}}", False, True),
    ("\\sqrt{2}", "so \\boxed{\\sqrt{2}}", False, True),
    ("\\sqrt{2}", "so \\boxed{2}", False, False),
    ("3", "\\boxed{x = 3}", True, True),
    ("3", "\\boxed{x=2, y=3}", True, False),  # numeric path: the box's last number
    ("12", "\\boxed{7 + 5 = 12}", True, True),
    ("\\frac{3}{4}", "\\boxed{\\frac{3}{4}}, no: \\boxed{3}", False, False),  # the last box counts
    ("x^2+2x+1", "\\boxed{(x+1)^2}", False, True),
    ("10\\sqrt{2}", "\\boxed{\\sqrt{200}}", False, True),
    ("\\text{(C)}", "\\boxed{C}", False, True),
    # intervals and sets
    ("(-\\infty, 3]", "\\boxed{(-\\infty,3]}", False, True),
    ("(-\\infty, 3]", "\\boxed{(-\\infty, 3)}", False, False),
    ("[2, 5)", "\\boxed{[2,5)}", False, True),
    ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}", False, True),
    # units, currency, degrees, percent
    ("5", "\\boxed{5\\text{ cm}}", True, True),
    ("5\\text{ cm}", "\\boxed{5}", False, True),
    ("90^\\circ", "\\boxed{90}", False, True),
    ("18", "\\boxed{\\$18}", True, True),
    ("5", "\\boxed{5\\%}", True, True),  # "%" is dropped, not scaled, as for GSM8K
    ("0.05", "\\boxed{5\\%}", False, False),
    # words stay text: math-verify would read both as the product p*a*r*i*s
    ("Paris", "\\boxed{Pairs}", False, False),
    ("Paris", "The capital is \\boxed{paris}", True, True),
]


@pytest.mark.parametrize(("reference", "completion", "numeric", "verdict"), DIFFERENCES)
def test_where_math_verify_and_the_numeric_path_differ(reference, completion, numeric, verdict):
    assert answers_match(extract_answer(completion), reference) is numeric
    assert is_correct(completion, reference) is verdict


@pytest.mark.parametrize(
    ("reference", "completion", "verdict"),
    [
        ("12", "12", True),
        ("8", "The answer is 7. Wait, 8", True),
        ("1234", "Step 1.\n#### 1,234", True),
        ("0.75", "\\boxed{3/4}", True),
        ("-4", "3 - 7 = -4", True),
        ("5", "55", False),
        # Known limit of the numeric path: LaTeX outside a box is read as numbers ("\\frac12"
        # as 12), because a plain-number reference keeps the exact path unless the answer is boxed.
        ("\\frac{1}{2}", "The answer is $\\frac12$.", False),
    ],
)
def test_plain_numbers_take_the_numeric_path(reference, completion, verdict, monkeypatch):
    monkeypatch.setattr(equivalence, "matches", _fail_if_called)
    assert is_correct(completion, reference) is verdict


def test_plain_numbers_never_import_math_verify():
    # A fresh interpreter: the arithmetic demo must grade without sympy's start-up or parse costs.
    code = (
        "import sys\n"
        "from podsrl.grading.rewards import correctness\n"
        "from podsrl.tasks import Example\n"
        "assert correctness('7 + 5 = 12', Example('1', 'What is 7 + 5?', '12')) == 1.0\n"
        "assert correctness('#### 3.5', Example('2', 'q', '7/2')) == 1.0\n"
        "assert correctness('\\\\boxed{-4}', Example('3', 'q', '-4')) == 1.0\n"
        "print(sorted(m for m in sys.modules if m.startswith(('math_verify', 'latex2sympy'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_math_task_rewards_through_compute_rewards():
    examples = [Example("m:1", "Simplify.", "\\frac{\\sqrt{3}}{2}")] * 3
    completions = ["\\boxed{\\frac{\\sqrt 3}{2}}", "\\boxed{\\sqrt{3}/2}", "\\boxed{\\sqrt{3}}"]
    result = compute_rewards(completions, examples, [("correctness", 1.0), ("format", 0.5)])
    assert result.per_reward["correctness"] == [1.0, 1.0, 0.0]
    assert result.total == [1.5, 1.5, 0.5]


def test_a_timeout_scores_wrong_and_does_not_raise(monkeypatch):
    import math_verify.grader

    def slow(*args, **kwargs):
        time.sleep(5)
        return True

    monkeypatch.setattr(equivalence, "TIMEOUT_SECONDS", 1)
    assert is_correct("\\boxed{7^{1/2}}", "\\sqrt{7}") is True
    monkeypatch.setattr(math_verify.grader, "sympy_expr_eq", slow)
    start = time.perf_counter()
    # A real signal.alarm timeout. (Identical text would still match: math-verify also compares
    # the strings, and that does not time out.)
    assert is_correct("\\boxed{7^{1/2}}", "\\sqrt{7}") is False
    assert time.perf_counter() - start < 4


@pytest.mark.parametrize("error", [RuntimeError("sympy broke"), RecursionError()])
def test_a_parse_exception_scores_wrong_and_is_counted(monkeypatch, error):
    import math_verify

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(math_verify, "parse", broken)
    before = equivalence.failures
    assert is_correct(f"\\boxed{{\\sqrt{{{id(error)}}}}}", "\\sqrt{11}") is False
    assert equivalence.failures > before


def test_a_timeout_exception_from_math_verify_is_caught(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    def timing_out(*args, **kwargs):
        raise TimeoutException("alarm")  # a BaseException, not an Exception

    monkeypatch.setattr(math_verify, "verify", timing_out)
    assert equivalence.matches("\\boxed{\\sqrt{13}}", "\\sqrt{13}") is False


def test_grading_off_the_main_thread_works_without_signals():
    # math-verify's signal.alarm timeouts raise ValueError outside the main thread.
    results = {}

    def grade():
        try:
            results["right"] = is_correct("\\boxed{\\sqrt{17}}", "\\sqrt{17}")
            results["wrong"] = is_correct("\\boxed{\\sqrt{19}}", "\\sqrt{17}")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            results["error"] = exc

    worker = threading.Thread(target=grade)
    worker.start()
    worker.join()
    assert results == {"right": True, "wrong": False}


def test_without_math_verify_latex_falls_back_to_text(monkeypatch):
    monkeypatch.setattr(equivalence, "available", lambda: False)
    assert is_correct("\\boxed{\\text{(C)}}", "\\text{(C)}") is True  # same text
    assert is_correct("\\boxed{C}", "\\text{(C)}") is False  # same choice, different text


def test_what_math_verify_cannot_parse_is_compared_as_written():
    assert is_correct("\\boxed{???}", "???") is True
    assert is_correct("\\boxed{??}", "???") is False
    assert is_correct("#### blue-green", "blue-green") is True  # words: text, case-insensitive
    assert is_correct("#### Blue-Green", "blue-green") is True


def test_answer_region_follows_podsrl_priority():
    assert equivalence.answer_region("x \\boxed{1} y \\boxed{2} z") == "\\boxed{2}"
    assert equivalence.answer_region("\\boxed{1}\n#### 3/4\nmore") == "3/4"
    long = "a" * 5000 + " so $x=1$"
    assert equivalence.answer_region(long).endswith("$x=1$")
    assert len(equivalence.answer_region(long)) == equivalence.MAX_CHARS


def _fail_if_called(*args, **kwargs):
    raise AssertionError("math-verify was called for plain numbers")
