"""Symbolic answer checking with math-verify (the checker TRL and open-r1 use), for LaTeX answers.

`rewards.correctness` sends a completion here only when its answer is not a plain number compared
with a plain number (that exact path never imports sympy; see the `podsrl.grading.rewards` docstring).
Here both sides are parsed by math-verify into SymPy objects and compared by value:
"\\frac{1}{2}" and "\\boxed{\\frac12}", "10\\sqrt{2}" and "\\sqrt{200}", "x^2+2x+1" and
"(x+1)^2", "[2,5)" and "[2, 5)" (but not "[2,5]"), "\\{1,2\\}" and "\\{2,1\\}", "5" and
"5\\text{ cm}", "90^\\circ" and "90"; floats match to 6 decimal places ("\\frac{1}{3}" and
"0.333333").

Which part of the completion is parsed follows podsrl's own extraction order (`answer_region`): the
text after the last "####", else the last `\\boxed{...}` on its own (math-verify alone would read
every box of "\\boxed{3} no, \\boxed{4}" as the set {3, 4}), else the last `MAX_CHARS` characters,
where math-verify takes what follows "the answer is" or "final answer:", else the last LaTeX
expression or number.

The reference is parsed as the content of a box, `\\boxed{<reference>}`. What math-verify cannot
parse as mathematics, on either side, it keeps as the string and compares exactly as written.

Failures never stop training: a parse or comparison that raises, or runs past `TIMEOUT_SECONDS`,
scores as wrong. Parse failures and errors escaping math-verify are counted in `failures` (the first
few are logged); a comparison that times out is caught and logged by math-verify itself. Its
timeouts use `signal.alarm`, which works only in the main thread (elsewhere math-verify raises
ValueError); off the main thread podsrl turns them off, and the input is at most `MAX_CHARS`
characters, which bounds how long the regexes and the LaTeX parser can take.
"""

from __future__ import annotations

import logging
import threading
import warnings
from functools import lru_cache

from podsrl.grading.answers import after_hashes, last_boxed

TIMEOUT_SECONDS = 3  # per parse and per comparison; signal.alarm takes whole seconds
MAX_CHARS = 2000  # the longest text parsed: the end of a completion without "####" or a box

failures = 0  # parses or comparisons that raised or timed out (each scored as wrong)
_log = logging.getLogger(__name__)


@lru_cache(maxsize=None)
def available() -> bool:
    """Whether math-verify can be imported (a dependency of podsrl, but an install may lack it);
    warns once when it cannot."""
    try:
        import math_verify  # noqa: F401
    except ImportError:
        warnings.warn(
            "math-verify is not installed, so LaTeX and symbolic answers are compared as text; "
            "pip install math-verify (a dependency of podsrl)",
            stacklevel=2,
        )
        return False
    return True


def answer_region(completion: str) -> str:
    """The part of a completion that holds its final answer, in podsrl's priority order."""
    tail = after_hashes(completion)
    if tail is not None:
        return tail[:MAX_CHARS]
    boxed = last_boxed(completion)
    if boxed is not None:
        return f"\\boxed{{{boxed}}}" if len(boxed) <= MAX_CHARS else ""  # a runaway box: wrong
    return completion[-MAX_CHARS:]


def matches(completion: str, reference: str) -> bool | None:
    """Whether the completion's final answer equals the LaTeX `reference` by math-verify.

    None when math-verify is not installed or finds nothing in the reference (the caller then
    compares text). Never raises for a bad completion: a parse error or timeout counts as wrong.
    """
    if not available():
        return None
    gold = _parse_reference(reference)
    if not gold:
        return None
    predicted = _parse(answer_region(completion))
    if not predicted:
        return False
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        # Lists: verify reads a tuple as one Tuple expression, not as alternatives.
        return bool(verify(list(gold), list(predicted), timeout_seconds=_timeout()))
    except (Exception, TimeoutException) as exc:  # TimeoutException is a BaseException
        _count_failure("comparing", reference, exc)
        return False


def _parse_reference(reference: str) -> tuple:
    return _parse(f"\\boxed{{{reference.strip()}}}")


def _parse(text: str) -> tuple:
    """math-verify's parse of `text` (SymPy objects, then the string), () if it fails."""
    from math_verify.errors import TimeoutException

    try:
        return _parse_cached(text)
    except (Exception, TimeoutException) as exc:  # not cached: a timeout may pass next time
        _count_failure("parsing", text, exc)
        return ()


# One reference is graded once per rollout of its prompt, and sampled completions repeat their
# final answers often.
@lru_cache(maxsize=16384)
def _parse_cached(text: str) -> tuple:
    from math_verify import parse

    return tuple(parse(text, parsing_timeout=_timeout(), raise_on_error=True))


def _timeout() -> int | None:
    # signal.alarm exists only in the main thread; None turns math-verify's timeout off.
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


def _count_failure(doing: str, text: str, exc: BaseException) -> None:
    global failures
    failures += 1
    if failures <= 3 or failures % 1000 == 0:
        _log.warning(
            "math-verify failed %s %r (%s: %s); scored as wrong (%d failure%s so far)",
            doing, text[:100], type(exc).__name__, exc, failures, "" if failures == 1 else "s",
        )
