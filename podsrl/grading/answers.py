"""Final answers in completions: extraction and exact matching (a leaf: imports nothing of podsrl).

Answer extraction (`extract_answer`), in priority order:
  1. the first number after the last "####" (GSM8K's own answer marker);
  2. the content of the last `\\boxed{...}` (nested braces handled): the whole content if it is a
     number, else its last number, else the content as text;
  3. the content of the last `<answer>...</answer>` (reasoning-gym's tag, any case), read as a
     completion of its own is (steps 1, 2 and 4 inside it: "<answer>81.676.</answer>" gives
     "81.676", as the plain "81.676." does), else the content as text;
  4. the answer the final sentence marks (`marked_answer`): after its last "the answer is" /
     "answer:" up to the first clause break (", ", "; ", a sentence end, "(", " because", " since",
     " as", " not", " but", " and", " or", " which", " than", ...), that clause's last number:
     "The answer is 81.676 because it is smaller than 91.278." -> "81.676", "The answer is 12, not
     13." -> "12", "The answer is 3 + 4 = 7." -> "7";
  5. the last number anywhere in the text ("The answer is 7. Wait, 8" -> "8": the marker is not in
     the final sentence, which corrects it).
Numbers may carry a sign, thousands commas ("1,234"), decimals (".5", "3.50"), a fraction ("3/4",
"\\frac{3}{4}"), "$" or "%" around them, or a sentence's trailing period. A "-" right after a word
character or closing bracket is read as subtraction, not a sign ("7-5" gives 7 and 5).
Scientific notation and number words ("twelve") are not extracted; `number_value` reads a number
word from zero to one hundred where a grader compares one (podsrl.grading.graders).

Matching (`answers_match`) is exact: both sides become `fractions.Fraction`, so "0.5", ".5" and
"1/2" are equal and no float tolerance is needed; "%" is dropped without scaling ("5%" == "5"),
because GSM8K-style references write percentages as plain numbers. A reference that is not a
number is compared as text, ignoring case and runs of whitespace.
"""

import re
from fractions import Fraction
from typing import NamedTuple

__all__ = ["ANSWER_TAG", "NUMBER_WORDS", "SURROUNDING", "Region", "after_hashes", "answer_region", "answer_text", "answers_match", "ends_with_number", "extract_answer", "final_sentence", "last_boxed", "last_tag", "marked_answer", "number_value", "parse_number"]

_PLAIN = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"  # 1,234.5 | 1234 | .5
_LATEX_FRAC = r"\\[dt]?frac\{\s*-?(?:\d+(?:\.\d+)?)\s*\}\{\s*-?(?:\d+(?:\.\d+)?)\s*\}"
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])[-\u2212]\$?)?"  # a sign, unless it follows an operand (then it is minus)
    rf"(?:{_LATEX_FRAC}|(?:{_PLAIN})(?:/\d+(?:\.\d+)?)?)"
)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:/|$)")
_FRAC_PARTS = re.compile(r"^(-?)\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}$")
_BOXED = re.compile(r"\\boxed\s*\{")
# What may follow a final answer and still count as "the number ends the text" (`ends_with_number`).
_TRAILING = " \t\r\n.!?*\"'`)$%"


# Number words, 0 to 100, as the words a sentence writes them in ("twenty-one" is twenty, one).
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
NUMBER_WORDS: dict[int, tuple[str, ...]] = {
    **{n: (word,) for n, word in enumerate(_UNITS)},
    **{20 + 10 * t + u: (tens,) + ((_UNITS[u],) if u else ()) for t, tens in enumerate(_TENS) for u in range(10)},
    100: ("one", "hundred"),
}
_WORD_NUMBERS = {words: n for n, words in NUMBER_WORDS.items()} | {("hundred",): 100, ("a", "hundred"): 100}


def number_value(text: str) -> int | Fraction | None:
    """The value of a number written in digits (`parse_number`) or in words from zero to one
    hundred ("eight", "Twenty-one"), or None."""
    value = parse_number(text)
    if value is not None:
        return value
    return _WORD_NUMBERS.get(tuple(re.findall(r"[a-z]+", text.casefold())))


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
    tag = last_tag(text)
    if tag is not None:  # no tag inside it: its content is read as a plain completion
        return extract_answer(tag) or tag.strip() or None
    marked = marked_answer(text)
    if marked:
        inside = _NUMBER.findall(marked)
        if inside:
            return _normalise(inside[-1])
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


def last_tag(text: str) -> str | None:
    """The content of the last complete `<answer>...</answer>` (any case), or None."""
    tags = ANSWER_TAG.findall(text)
    return tags[-1] if tags else None


def ends_with_number(text: str) -> bool:
    """Whether a number is the last thing written, once trailing whitespace and
    `. ! ? * " ' ` ) $ %` are stripped ("12", "The answer is $18.", "**7**"; not "12 apples.")."""
    text = text.rstrip(_TRAILING)
    numbers_ = list(_NUMBER.finditer(text))
    return bool(numbers_) and numbers_[-1].end() == len(text)


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


# The text grader's reading of a completion (podsrl.grading.graders' ``text``; reasoning-gym's
# extraction uses it too): here, in the leaf, so that both import it from below.
# reasoning-gym's answer tag, in any case ("<Answer>"): the one definition (`last_tag`).
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# "the answer is", "Answer:", "Final answer:"; not "the answer is not" (nor "isn't").
_MARKER = re.compile(r"\banswer\s*(?:is\b|:)(?!\s*not\b)", re.IGNORECASE)
# Where a sentence ends and another begins: . ! ? and whitespace, or a line break, before more text.
_SENTENCE_BREAK = re.compile(r"[.!?]+\s+(?=\S)|\n\s*(?=\S)")
# Where a marked answer's clause ends (`marked_answer`).
_CLAUSE_BREAK = re.compile(
    r"[,;]\s|[.!?](?:\s|$)|\s*[(\u2014]|\s(?:because|since|as|not|but|and|or|which|while|than|so|given|from|instead)\b",
    re.IGNORECASE,
)
SURROUNDING = " \t\r\n\"'`.,;:!?*_$\u201c\u201d\u2018\u2019\u00ab\u00bb"  # stripped around a text answer


def final_sentence(text: str) -> str:
    """The last sentence of ``text``: after its last ". ", "! ", "? " or line break that more text follows."""
    text = text.strip()
    start = 0
    for match in _SENTENCE_BREAK.finditer(text):
        start = match.end()
    return text[start:]


def marked_answer(text: str) -> str | None:
    """The answer the completion's final sentence marks: from after its last "the answer is" /
    "answer:" to the first clause break (module docstring, step 4), surrounding `*`, quotes and
    whitespace stripped; None when the final sentence has no marker."""
    sentence = final_sentence(text)
    markers = list(_MARKER.finditer(sentence))
    if not markers:
        return None
    rest = sentence[markers[-1].end() :].lstrip(" \t:*_\"'`")
    return _CLAUSE_BREAK.split(rest, maxsplit=1)[0].strip(SURROUNDING)


def after_hashes(completion: str) -> str | None:
    """The first line after a completion's last "####" (GSM8K's answer line), stripped; None when it
    has no "####" or nothing follows it."""
    if "####" not in completion:
        return None
    tail = completion.rsplit("####", 1)[1].strip()
    return tail.splitlines()[0] if tail else None


class Region(NamedTuple):
    """Where a completion's answer is (:func:`answer_region`): its text and which rule found it."""

    text: str
    where: str  # "####" | "boxed" | "tag" | "line" (the last non-empty line; "" when there is none)


def answer_region(completion: str) -> Region:
    """Where the completion's answer is, in podsrl's priority: after the last "####" (its first line),
    in the last `\\boxed{}`, in the last `<answer>` tag, else its last non-empty line."""
    tail = after_hashes(completion)
    if tail is not None:
        return Region(tail, "####")
    boxed = last_boxed(completion)
    if boxed is not None:
        return Region(boxed, "boxed")
    tag = last_tag(completion)
    if tag is not None:
        return Region(tag, "tag")
    lines = [line for line in completion.splitlines() if line.strip()]
    return Region(lines[-1] if lines else "", "line")


def answer_text(completion: str) -> str:
    """The part of a completion that holds its answer, for the ``text`` grader: its
    :func:`answer_region`, a tag's content read as a plain completion ("<answer>The answer is:
    x</answer>"), a last line from after its last "answer is" / "answer:" if it has one."""
    region = answer_region(completion)
    if region.where == "tag":
        return answer_text(region.text)
    if region.where != "line":
        return region.text
    markers = list(_MARKER.finditer(region.text))
    return region.text[markers[-1].end() :] if markers else region.text
