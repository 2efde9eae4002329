"""Which answer a completion names, read as a person reads it: how the word rule of the ``text``,
``auto`` and ``numeric`` graders is computed (issue 68). The rule itself, with its choices and
limits, is specified in :mod:`podsrl.grading.graders`' docstring; this module follows it.

Pure string work on one completion: no model, no global state. A question's reading (its listed
options, its words) and the index of a task's answers are cached by value, since a prompt's n
rollouts share the question and every example of a task shares its answers; a completion's
sentences are read from its end, each when first needed. What it costs a grade: ``bench/grading.py``
(its figures, dated: docs/results.md, "Benchmarks").

A leaf beside :mod:`podsrl.grading.answers` (imports only it). The pieces, in reading order:

- :func:`split_sentences`, :func:`tokens`: sentences (". ", "! ", "? ", line breaks; not after
  "D.C." or "St.") and their words and numbers, case and accents folded, "isn't" read "is not".
- :func:`read_question` (cached): the question's words, whether it is negative, its options
  (lettered choices, lists "A, B or C", "X or Y", bullet lines), its topic and word triples.
- :class:`Lexicon`: what can be named: the reference's forms (:func:`word_forms`) or its number,
  the options, the task's other answers (:func:`answer_index`, cached), numbers; :func:`mentions`
  finds them in a sentence, longest first, with the full names no one listed (:func:`_names`).
- :func:`_standing`: whether each mention is offered as the answer (``main``), said beside it
  (``aside``) or set against it (``excluded``).
- :class:`Sentences`, :func:`answer_sentence`: the sentence that answers and its part after a
  marker; :func:`names_reference` (words, number words) and :func:`named_number` (digits) decide.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from podsrl.grading.answers import NUMBER_WORDS, answer_region, parse_number

__all__ = [
    "Lexicon", "Question", "Tok", "answer_index", "contains_reference", "is_letter_choice", "is_words", "named_number",
    "names_reference", "read_question", "split_sentences", "tokens",
]  # fmt: skip

REF = "reference"  # the key of the reference's mentions; a candidate's key is its words, a number's ("number", value)

# Word classes (folded, lower case). Which words set a mention against the answer:
NEGATIONS = frozenset("not no never neither nor none cannot nothing nobody wrong incorrect false".split())
_AFTER_ONLY = frozenset(("wrong", "incorrect", "false"))  # negate what stands before them ("London is wrong"), never what follows
CONTRASTS = frozenset("than unlike except besides instead".split())  # "bigger than Jupiter": Jupiter is not offered
# Words opening a part that explains or adds ("Mars because it is red", "a Romance language like
# Spanish"), and those that do after a comma ("Italian, which is ...": "The city which is ..." is not one).
ASIDES = frozenset("because since although though including like such".split())
ASIDES_AFTER_COMMA = frozenset("which who whom whose where as".split())
# A first clause opening with these restates the options ("Between Mars and Jupiter, Jupiter is bigger.").
RESTATING = frozenset("between among amongst of from out".split())
# A later sentence opening with these that names something new unsettles the answer ("Mars. Or Venus.").
CORRECTIONS = frozenset("or but actually wait".split())
ARTICLES = frozenset(("a", "an", "the"))
# Words that are never an answer of their own: a segment opening with one is a clause, not a list item
# ("Paris, of course", "Paris, and it is big", "No, Paris"), and a sentence of only these names nothing.
FUNCTION_WORDS = ARTICLES | frozenset(
    # pronouns
    "i you he she it we they me him her us them my your his its our their this that these those there here s "
    # auxiliaries and modals
    "is are was were be been being am do does did has have had will would shall should can could may might must "
    # prepositions and conjunctions
    "of in on at to for with by about from into onto as like so and or but if then than "
    # interjections, hedges and words an answer is wrapped in
    "yes yeah yep well hmm um uh ok okay sure oh ah right correct indeed course obviously definitely certainly surely "
    "clearly probably likely maybe perhaps actually basically simply exactly absolutely again also too please thanks "
    "thank final answer option choice letter think believe guess say sure called named known what which who how why when where "
    # connectives
    "however therefore thus hence moreover furthermore additionally overall anyway instead otherwise first second finally".split()
)
_LIST_WORDS = frozenset(("and", "or"))
# A clause break inside a sentence: , ; : brackets and dashes (a hyphen between spaces).
_CLAUSE_GAP = re.compile(r"[,;:()\[\]\u2014\u2013]|\s-\s")
_LIST_GAP = re.compile(r"^[\s,;/&*_\"'`\u201c\u201d\u2018\u2019]*$")  # what a bare list puts between its items
_CONTRACTED_NOT = re.compile(r"n[\'\u2019]t\b", re.IGNORECASE)  # "isn't" reads as "is not"
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
_TOKEN = re.compile(r"(?<![\w)\]}])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:/\d+)?)|[^\W\d_]+")
_BULLET = re.compile(r"^[ \t]*[-*\u2022+][ \t]+(?=\S)", re.MULTILINE)  # "- x", "* x"
_NUMBERED = re.compile(r"^[ \t]*\d{1,2}[.)][ \t]+(?=[^\W\d_]{2})", re.MULTILINE)  # "1. word" on two lines or more
# "the answer is", "answer:", "the answer would be"; not "the answer is not" (then the whole sentence is read).
_MARKER = re.compile(r"\banswer\s*(?:is\b|:|would\s+be\b|should\s+be\b)(?!\s*not\b)", re.IGNORECASE)
# Where a sentence ends: . ! ? (and closing quotes, brackets, markdown) before whitespace, or a line break.
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]*_]*(?=\s|$)|\n")
_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Mt|Ft|Jr|Sr|Prof|vs|etc|approx|No|e\.g|i\.e)|(?<![\w])[A-Z])\.$")
_WORD_VALUES = {words: n for n, words in NUMBER_WORDS.items()} | {("hundred",): 100, ("a", "hundred"): 100}
# A reference of words: letters, with spaces, hyphens, apostrophes, periods, commas and "&" ("Washington, D.C.").
_WORDS = re.compile(r"[^\W\d_]{2,}[^\W\d_\s.,'\u2019&-]*(?:[\s.,'\u2019&-]+[^\W\d_]+)*\.?")
_LETTER_REFERENCE = re.compile(r"[(\[]?\s*([A-Ja-j])\s*[)\].:]?")
_LETTERED = re.compile(r"(?:^|(?<=\s))(?:\(([A-Ja-j])\)|([A-J])[).:])[ \t]+(?=\S)")


class Tok(NamedTuple):
    """A word or a number of a text: its folded form, where it is, whether it was written with a
    capital, and its value when it is a number in digits."""

    norm: str
    start: int
    end: int
    upper: bool
    value: Fraction | None


def fold(word: str) -> str:
    """Case and accents folded ("Zürich" -> "zurich")."""
    word = word.casefold()
    if word.isascii():
        return word
    return "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))


def unmacro(text: str) -> str:
    """LaTeX ``\\text{}`` (``\\textbf``, ``\\mathrm``, ...) unwrapped, nested ones too."""
    previous = None
    while previous != text:
        previous, text = text, _TEXT_MACRO.sub(r"\1", text)
    return text


def prepare(text: str) -> str:
    """A text as it is tokenised: macros unwrapped, "n't" as " not"."""
    return _CONTRACTED_NOT.sub(" not", unmacro(text))


def tokens(text: str) -> list[Tok]:
    """The words and numbers of a prepared text (:func:`prepare`)."""
    out = []
    for m in _TOKEN.finditer(text):
        word = m.group()
        # isdecimal, not isdigit: '²' is a digit to str.isdigit (and a word character to the pattern)
        # but no int; a decimal digit of any script is both.
        if not word[-1].isdecimal():
            out.append(Tok(fold(word), m.start(), m.end(), word[0].isupper(), None))
        else:  # an int where it is one: Fraction is slow to build, and equal to it where compared
            out.append(Tok(word, m.start(), m.end(), False, int(word) if word.isdecimal() else parse_number(word)))
    return out


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``: ended by . ! ? before whitespace (not after an abbreviation or a
    single capital letter: "D.C.", "St.") or by a line break; bullets ("- ", and "1. " where two
    lines or more are numbered) dropped."""
    text = _BULLET.sub("", text)
    if len(_NUMBERED.findall(text)) >= 2:  # a numbered list ("1. dog\n2. snake"), not "3. five."
        text = _NUMBERED.sub("", text)
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.group() != "\n" and _ABBREVIATION.search(text[start : m.start() + 1]):
            continue
        piece = text[start : m.end()].strip()
        if piece:
            out.append(piece)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def is_words(reference: str) -> bool:
    """Whether a reference is words ("Paris", "New York", "Washington, D.C.", "twenty-one"): what the
    word rule reads (a number is read as a number)."""
    return bool(_WORDS.fullmatch(unmacro(reference).strip()))


def _strip_articles(words: tuple[str, ...]) -> tuple[str, ...]:
    while len(words) > 1 and words[0] in ARTICLES:
        words = words[1:]
    return words


def _inflections(word: str) -> set[str]:
    """A word and its regular English plural or singular ("bee" / "bees", "berry" / "berries",
    "leaf" / "leaves"); irregular ones ("mouse" / "mice") are not known."""
    out = {word}
    if len(word) < 3 or not word.isalpha():
        return out
    out |= {word + "s", word + "es"}
    if word.endswith("y"):
        out.add(word[:-1] + "ies")
    if word.endswith("f"):
        out.add(word[:-1] + "ves")
    if word.endswith("fe"):
        out.add(word[:-2] + "ves")
    if word.endswith("ies"):
        out.add(word[:-3] + "y")
    if word.endswith("ves"):
        out |= {word[:-3] + "f", word[:-3] + "fe"}
    if word.endswith("es"):
        out.add(word[:-2])
    if word.endswith("s") and not word.endswith("ss"):
        out.add(word[:-1])
    return out


def _stem(word: str) -> str:
    """A word without a regular plural ending ("mammals" -> "mammal", "berries" -> "berry"), to tell
    whether two words are one ("Dogs are mammals" repeats "Which is a mammal?")."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-2] if word.endswith(("ches", "shes", "xes", "sses")) else word[:-1]
    return word


def word_forms(text: str) -> frozenset[tuple[str, ...]]:
    """The ways a text of words may be written, as folded words: its own words (a leading article
    dropped), the last one in the plural or singular, and letters written together or apart
    ("D.C." / "DC", "USA" / "U.S.A.")."""
    toks = tokens(prepare(text))
    if not toks or any(t.value is not None for t in toks):
        return frozenset()
    words = _strip_articles(tuple(t.norm for t in toks))
    forms = {words[:-1] + (last,) for last in _inflections(words[-1])}
    letters = [i for i, w in enumerate(words) if len(w) == 1]
    if len(letters) >= 2 and letters == list(range(letters[0], letters[-1] + 1)):  # "d c" -> "dc"
        forms.add(words[: letters[0]] + ("".join(words[letters[0] : letters[-1] + 1]),) + words[letters[-1] + 1 :])
    original = [m.group() for m in _TOKEN.finditer(prepare(text))][len(toks) - len(words) :]
    for i, raw in enumerate(original):  # "USA" -> "u s a"
        if 2 <= len(raw) <= 4 and raw.isupper() and raw.isalpha():
            forms.add(words[:i] + tuple(raw.casefold()) + words[i + 1 :])
    return frozenset(forms)


# --- the question ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One of the answers a question offers: its letter ("b", lettered choices only) and its words."""

    letter: str | None
    words: tuple[str, ...]


@dataclass(frozen=True)
class Question:
    """What a question contributes to reading an answer (:func:`read_question`)."""

    words: frozenset[str]
    topic: frozenset[str]  # its words that are neither function words nor options', as stems (:func:`_stem`: "mammal" in "Which is a mammal: dog, snake?")
    negated: bool  # "Which animal cannot fly?": an answer repeating the negation does not deny its subject
    options: tuple[Option, ...]
    triples: frozenset[tuple[str, str, str]]  # consecutive words, articles dropped: the swapped-frame check


@lru_cache(maxsize=4096)  # a prompt's n rollouts share its question
def read_question(question: str) -> Question:
    """The question's words, whether it is negative, its options and its word triples."""
    text = prepare(question)
    toks = tokens(text)
    words = [t.norm for t in toks]
    content = [w for w in words if w not in ARTICLES]
    options = _lettered(question) or _listed(text, toks) + _bulleted(question)
    offered = {w for o in options for w in o.words}
    return Question(
        words=frozenset(words),
        topic=frozenset(_stem(w) for w in words if w not in FUNCTION_WORDS and w not in NEGATIONS and w not in offered and len(w) > 1),
        negated=any(w in NEGATIONS and w not in _AFTER_ONLY for w in words),
        options=tuple(dict.fromkeys(options)),
        triples=frozenset(zip(content, content[1:], content[2:])),
    )


def _lettered(question: str) -> list[Option]:
    """Lettered choices, "(A) dog (B) snake" or "A) dog" / "A. dog" / "A: dog" on lines of their own:
    two or more, lettered from A in order."""
    marks = list(_LETTERED.finditer(question))
    letters = [(m.group(1) or m.group(2)).casefold() for m in marks]
    run = 0
    while run < len(letters) and letters[run] == "abcdefghij"[run]:
        run += 1
    if run < 2:
        return []
    out = []
    for i in range(run):
        end = marks[i + 1].start() if i + 1 < run else len(question)
        text = question[marks[i].end() : end].split("\n")[0]
        if i + 1 == run:  # the last choice ends at its sentence ("(C) lizard. Answer with the letter.")
            text = re.split(r"[.?!](?:\s|$)", text)[0]
        words = _strip_articles(tuple(t.norm for t in tokens(prepare(text.strip(" \t.,;"))))) if text.strip() else ()
        out.append(Option(letters[i], words if 0 < len(words) <= 8 else ()))
    return out


def _bulleted(question: str) -> list[Option]:
    """Options on bullet lines ("- dog", "* snake", "1. lizard"): two or more lines of at most four words."""
    lines = [m for m in re.finditer(r"^[ \t]*(?:[-*\u2022]|\d{1,2}[.)])[ \t]+(\S.*)$", question, re.MULTILINE)]
    items = [_strip_articles(tuple(t.norm for t in tokens(prepare(m.group(1).strip(" .,;"))))) for m in lines]
    items = [w for w in items if 0 < len(w) <= 4]
    return [Option(None, w) for w in items] if len(items) >= 2 else []


class _Unit(NamedTuple):
    """A list item of a question: its kind, its tokens [first, last] and its words."""

    kind: str  # "number" | "name" (capitalised words) | "word"
    first: int
    last: int
    words: tuple[str, ...]


def _unit(toks: list[Tok], text: str, i: int) -> _Unit | None:
    """The list item that starts at token i (articles before it skipped by the caller): a number, a
    run of capitalised words (up to four; "start" when it opens a sentence, where a capital says
    nothing: it goes with names or words), or one content word."""
    t = toks[i]
    if t.value is not None or (t.norm,) in _WORD_VALUES:
        return _Unit("number", i, i, (t.norm,))
    if t.norm in FUNCTION_WORDS or t.norm in NEGATIONS:
        return None
    if t.upper:
        j = i
        while j + 1 < len(toks) and j - i < 3 and toks[j + 1].upper and not text[toks[j].end : toks[j + 1].start].strip():
            j += 1
        return _Unit("start" if _sentence_start(text, t.start) else "name", i, j, tuple(x.norm for x in toks[i : j + 1]))
    return _Unit("word", i, i, (t.norm,))


def _sentence_start(text: str, position: int) -> bool:
    before = text[:position].rstrip(" \t\"'*_(")
    return not before or before[-1] in ".!?\n"


_WH = frozenset("which what who whom whose how where when".split())


def _asked_before(text: str, toks: list[Tok], first: int) -> bool:
    """Whether a "which" / "what" / ... stands before token ``first`` in its sentence, up to a comma:
    the word is then part of what is asked ("What color is the sky, blue or green?")."""
    k = first - 1
    while k >= 0 and not re.search(r"[,.;:!?\n]", text[toks[k].end : toks[k + 1].start]):
        if toks[k].norm in _WH:
            return True
        k -= 1
    return False


def _same_kind(a: str, b: str) -> bool:
    return a == b or "start" in (a, b) and "number" not in (a, b)


def _listed(text: str, toks: list[Tok]) -> list[Option]:
    """The items of the question's lists: "dog, snake, lizard", "London, Berlin and Paris", "6, 8
    or 10", "Mars or Jupiter", "between 5 and 7"; items of one kind (numbers, names or words), three
    or more, or two joined by "or" (or after "between" or a colon). A word right after "is" ("Which is
    bigger, a cat or a dog?") is not an item."""
    options: list[Option] = []
    i, n = 0, len(toks)
    while i < n:
        k = i
        while k < n and toks[k].norm in ARTICLES:
            k += 1
        unit = _unit(toks, text, k) if k < n else None
        if unit is None:
            i = k + 1
            continue
        run, joiners = [unit], []
        while True:
            k = run[-1].last + 1
            while k < n and toks[k].norm in ARTICLES | _LIST_WORDS and k - run[-1].last <= 2:
                k += 1
            following = _unit(toks, text, k) if k < n else None
            joiner = _joiner(text, toks, run[-1].last, k) if following is not None else None
            if joiner is None or not _same_kind(following.kind, run[-1].kind):
                break
            run.append(following)
            joiners.append(joiner)
        if len(run) >= 3 and joiners[0] == "," and run[0].kind != "number" and _asked_before(text, toks, run[0].first):
            run, joiners = run[1:], joiners[1:]  # "Which is bigger, a cat or a dog?": "bigger" is asked about, not offered
        if len(run) >= 3 or (len(run) == 2 and (joiners[0] == "or" or _opens_pair(text, toks, run[0]))):
            options.extend(Option(None, u.words) for u in run)
        i = run[-1].last + 1
    return options


def _joiner(text: str, toks: list[Tok], last: int, start: int) -> str | None:
    """How the tokens between two list items (token ``last`` ends one, ``start`` opens the next, after
    its article) join them: "," ("A, B"), "and" / "or" ("A and B", "A, or B"), "/"; None when they do not."""
    between = [t.norm for t in toks[last + 1 : start] if t.norm not in ARTICLES]
    gap = text[toks[last].end : toks[start].start]
    if not between:
        if "/" in gap and _LIST_GAP.match(gap):
            return "/"
        return "," if re.fullmatch(r"\s*,\s*", gap) else None
    if len(between) == 1 and between[0] in _LIST_WORDS and re.fullmatch(r"[\s,]*", text[toks[last].end : toks[last + 1].start]):
        return between[0]
    return None


def _opens_pair(text: str, toks: list[Tok], first: _Unit) -> bool:
    """Whether two items joined by "and" are offered as options: after "between" or a colon."""
    before = first.first - 1
    while before >= 0 and toks[before].norm in ARTICLES:
        before -= 1
    if before >= 0 and toks[before].norm == "between":
        return True
    return text[: toks[first.first].start].rstrip(" \t*_\"'").endswith(":")


# --- what can be named ----------------------------------------------------------------------------


@lru_cache(maxsize=64)  # every example of a task shares one frozenset
def answer_index(answers: frozenset[str]) -> dict[str, tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]]:
    """A task's answers that are words, by their first word: first word -> ((form, key), ...), the
    key being the answer's own words (numbers and mathematics are left out: a number is told apart
    from the reference by where it stands, not by being another problem's answer)."""
    index: dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for answer in answers:
        if not is_words(answer):
            continue
        forms = word_forms(answer)
        key = _strip_articles(tuple(t.norm for t in tokens(prepare(answer))))
        for form in forms:
            index.setdefault(form[0], []).append((form, key))
    return {first: tuple(sorted(entries, key=lambda e: -len(e[0]))) for first, entries in index.items()}


@dataclass
class Lexicon:
    """What a completion may name, for one reference: the reference's forms (or its number), the
    question's options and the task's other answers, each keyed by what it names (:data:`REF` for
    the reference)."""

    question: Question
    number: Fraction | int | None = None  # the reference's value, when it is a number
    forms: dict[str, list[tuple[tuple[str, ...], object]]] = field(default_factory=dict)  # first word -> (form, key)
    letters: dict[str, object] = field(default_factory=dict)  # an option's letter -> its key
    numbers: dict = field(default_factory=dict)  # a number option's value -> its key (a letter reference's "(B) 6")
    answers: dict = field(default_factory=dict)  # answer_index of the task's answers

    @classmethod
    def build(cls, reference: str, question: str, answers: Iterable[str] | None) -> Lexicon | None:
        """The lexicon for ``reference`` (None when it is neither words, a number nor a choice's letter)."""
        q = read_question(question)
        lex = cls(q)
        value = _number_value(reference)
        ref_forms: frozenset[tuple[str, ...]] = frozenset()
        letter = _choice_letter(reference, q)
        if value is not None:
            lex.number = value
        elif letter is None:
            ref_forms = word_forms(reference)
            if not is_words(reference) or not ref_forms:
                return None
        for form in ref_forms:
            lex._add(form, REF)
        for option in q.options:
            is_ref = letter is not None and option.letter == letter or bool(option.words and _forms_meet(option.words, ref_forms))
            key = REF if is_ref else option.words or ("letter", option.letter)
            option_value = _number_value(" ".join(option.words)) if option.words else None
            if option_value is not None and not is_ref:  # a number option is keyed as a number mention is
                key = REF if option_value == value else ("number", option_value)
            if option_value is not None:
                lex.numbers[option_value] = key
            for form in (word_forms(" ".join(option.words)) if option.words and value is None else ()):
                if key == REF or form not in ref_forms:
                    lex._add(form, key)
            if option.letter is not None:
                lex.letters[option.letter] = key
        if answers and value is None:
            lex.answers = answer_index(answers if isinstance(answers, frozenset) else frozenset(answers))
        return lex

    def _add(self, form: tuple[str, ...], key: object) -> None:
        entries = self.forms.setdefault(form[0], [])
        if (form, key) not in entries:
            entries.append((form, key))
            entries.sort(key=lambda e: (-len(e[0]), e[1] != REF))

    def is_reference_words(self, words: tuple[str, ...]) -> bool:
        return any(form == words for form, key in self.forms.get(words[0], ()) if key == REF) if words else False


def _forms_meet(words: tuple[str, ...], ref_forms: frozenset[tuple[str, ...]]) -> bool:
    return bool(word_forms(" ".join(words)) & ref_forms)


def _number_value(text: str) -> Fraction | int | None:
    value = parse_number(text)
    if value is not None:
        return value
    return _WORD_VALUES.get(tuple(re.findall(r"[a-z]+", fold(text))))


def _choice_letter(reference: str, question: Question) -> str | None:
    """The letter of a reference that is a lettered choice of the question ("B", "(B)", "b)"), else None."""
    if not any(o.letter for o in question.options):
        return None
    m = _LETTER_REFERENCE.fullmatch(unmacro(reference).strip())
    return m.group(1).casefold() if m and any(o.letter == m.group(1).casefold() for o in question.options) else None


def is_letter_choice(reference: str, question: str) -> bool:
    """Whether ``reference`` is the letter of one of the question's lettered choices ("B" for "(A) dog (B) cat")."""
    return _choice_letter(reference, read_question(question)) is not None


class Mention(NamedTuple):
    """A span of tokens [first, last] that names ``key``; ``number``: its value, a number in number
    mode; ``letter``: an option's letter ("(B)")."""

    key: object
    first: int
    last: int
    number: Fraction | int | None = None
    letter: bool = False


def mentions(toks: list[Tok], text: str, lex: Lexicon) -> list[Mention]:
    """What a sentence names, longest first, left to right: the reference, options, the task's
    answers (not those made of the question's words: "Mars is the red planet" does not name the
    answer "red"), option letters, and numbers (in number mode: every number, the reference's value
    keyed :data:`REF`)."""
    out: list[Mention] = []
    i, n = 0, len(toks)
    while i < n:
        found = _match_words(toks, i, lex)
        number = _match_number(toks, i) if lex.number is not None or lex.numbers else None
        if number is not None and lex.number is None and number[1] not in lex.numbers:
            number = None  # in word mode only the options' numbers are named
        letter = _match_letter(toks, text, i, lex)
        if number is not None and (found is None or number[0] >= found[0]):
            length, value = number
            found = (length, REF if value == lex.number else lex.numbers.get(value, ("number", value)))
            out.append(Mention(found[1], i, i + length - 1, value if lex.number is not None else None))
        elif found is not None:
            out.append(Mention(found[1], i, i + found[0] - 1))
        elif letter is not None:
            found = (1, letter)
            out.append(Mention(letter, i, i, letter=True))
        i += found[0] if found else 1
    if lex.number is None:
        out = sorted(out + _names(toks, text, out, lex.question), key=lambda m: m.first)
    return out


_PARTICLES = frozenset("von van de da del der di du la le al bin ibn".split())


def _names(toks: list[Tok], text: str, found: list[Mention], q: Question) -> list[Mention]:
    """Full names the grader does not know, each a candidate of its own: two or more capitalised
    words in a row ("Artemisia Gentileschi", "Carl von Sollár": particles between them), not the
    question's ("the Mona Lisa"), not around a mention ("William Shakespeare" is the reference, "the
    Pacific Ocean" too), a leading article or function word left out ("The Eiffel Tower")."""
    covered = {k for m in found for k in range(m.first, m.last + 1)}
    out, k, n = [], 0, len(toks)
    while k < n:
        j = k
        while j < n and (toks[j].upper or toks[j].norm in _PARTICLES and j > k) and j not in covered:
            if j > k and re.search(r"[^\s]", text[toks[j - 1].end : toks[j].start]):
                break
            j += 1
        run = list(range(k, j))
        while run and (toks[run[0]].norm in FUNCTION_WORDS or toks[run[0]].norm in _PARTICLES):
            run.pop(0)
        while run and toks[run[-1]].norm in _PARTICLES:
            run.pop()
        touching = (run and (run[0] - 1 in covered or run[-1] + 1 in covered))
        capitals = [x for x in run if toks[x].upper and toks[x].norm not in FUNCTION_WORDS]
        words = tuple(toks[x].norm for x in run)
        if len(capitals) >= 2 and not touching and not set(words) <= q.words | _PARTICLES:
            out.append(Mention(("name", words), run[0], run[-1]))
        k = max(j, k + 1)
    return out


def _match_words(toks: list[Tok], i: int, lex: Lexicon) -> tuple[int, object] | None:
    best = None
    first = toks[i].norm
    for form, key in lex.forms.get(first, ()):
        if best is None or len(form) > best[0]:
            if tuple(t.norm for t in toks[i : i + len(form)]) == form:
                best = (len(form), key)
    for form, key in lex.answers.get(first, ()):
        if best is not None and len(form) <= best[0]:
            break  # longest first
        if tuple(t.norm for t in toks[i : i + len(form)]) == form and not set(key) <= lex.question.words:
            best = (len(form), REF if lex.is_reference_words(form) else key)
    return best


def _match_number(toks: list[Tok], i: int) -> tuple[int, Fraction | int] | None:
    if toks[i].value is not None:
        return 1, toks[i].value
    if i + 1 < len(toks) and (toks[i].norm, toks[i + 1].norm) in _WORD_VALUES and toks[i].norm != "a":
        return 2, _WORD_VALUES[(toks[i].norm, toks[i + 1].norm)]
    if (toks[i].norm,) in _WORD_VALUES:
        return 1, _WORD_VALUES[(toks[i].norm,)]
    return None


_LETTER_VERBS = frozenset("is was would seems fits sounds and or nor".split())  # "A is right", "A and B": A is a letter


def _match_letter(toks: list[Tok], text: str, i: int, lex: Lexicon) -> object | None:
    """An option's letter written as one: "(B)", "B)", "B.", "B:", "option B", "B is", "B and", or "B"
    alone; a capital "A" or "I" followed by a word in lower case is the article or the pronoun ("A
    dog is a mammal", "I think"), followed by a capitalised one a letter ("A Berlin")."""
    t = toks[i]
    if len(t.norm) != 1 or not t.upper or t.norm not in lex.letters:
        return None
    before = text[toks[i - 1].end if i else 0 : t.start]
    after = text[t.end : toks[i + 1].start if i + 1 < len(toks) else len(text)]
    if t.norm not in ("a", "i"):
        return lex.letters[t.norm]
    marked = "(" in before or "[" in before or after[:1] in (")", "]", ":", ".") or i + 1 == len(toks) or after.strip(" *_\"'")[:1] in (",", ";")
    named = i > 0 and toks[i - 1].norm in ("option", "choice", "letter", "answer", "is")
    followed = i + 1 < len(toks) and (toks[i + 1].norm in _LETTER_VERBS or toks[i + 1].upper or _match_number(toks, i + 1) is not None)
    return lex.letters[t.norm] if marked or named or followed else None


# --- where each mention stands ----------------------------------------------------------------------


MAIN, ASIDE, EXCLUDED = "main", "aside", "excluded"


def _standing(toks: list[Tok], text: str, found: list[Mention], q: Question, offset: int = 0) -> list[str]:
    """For each mention: MAIN (offered as the answer), ASIDE (in a part that explains: after "which",
    "because", in brackets) or EXCLUDED (negated in its clause, after "than" / "unlike" / "except",
    in a first clause restating the options). ``offset``: the first token of the part read (after a
    marker); clauses are counted from there."""
    clause = _clauses(toks, text, offset)
    covered = _covered(found)
    spans: dict[int, list[int]] = {}
    for k in range(offset, len(toks)):
        spans.setdefault(clause[k], []).append(k)
    out = []
    for m in found:
        c = clause[m.first]
        span = spans[c]
        before = [k for k in span if k < m.first and k not in covered]
        after = [k for k in span if k > m.last and k not in covered]
        words_before = {toks[k].norm for k in before}
        negated_before = any(_negates(toks, k, offset) and toks[k].norm not in _AFTER_ONLY for k in before)
        # A negation after it in its clause denies it ("Mars is not the red planet"), unless the
        # question is negative and the answer repeats it ("The penguin cannot fly."); up to an aside.
        after_main = []
        for k in after:
            if toks[k].norm in ASIDES or toks[k].norm in ASIDES_AFTER_COMMA:
                break
            after_main.append(k)
        negated_after = any(_negates(toks, k, offset) and (not q.negated or toks[k].norm in _AFTER_ONLY) for k in after_main)
        if negated_before or negated_after or CONTRASTS & words_before or _restating(toks, text, clause, c, offset):
            out.append(EXCLUDED)
        elif _in_brackets(text, toks, span, m) or ASIDES & words_before or _aside_clause(toks, text, span, m):
            out.append(ASIDE)
        else:
            out.append(MAIN)
    return _focus(toks, found, out, clause, q)


def _focus(toks: list[Tok], found: list[Mention], standing: list[str], clause: list[int], q: Question) -> list[str]:
    """Where the sentence's clauses offer different things, the clauses that repeat most of the
    question's own words are the answer, the others are said beside it ("A dog is a mammal; snakes
    and lizards are reptiles."); a tie keeps them all ("dog, snake, lizard")."""
    offered = [i for i, st in enumerate(standing) if st == MAIN]
    clauses = {clause[found[i].first] for i in offered}
    if len(clauses) < 2 or len({found[i].key for i in offered}) < 2:
        return standing
    covered = {k for m in found for k in range(m.first, m.last + 1)}
    overlap = {c: sum(1 for k, t in enumerate(toks) if clause[k] == c and k not in covered and _stem(t.norm) in q.topic) for c in clauses}
    best = max(overlap.values())
    return [ASIDE if i in offered and overlap[clause[found[i].first]] < best else st for i, st in enumerate(standing)]


def _negates(toks: list[Tok], k: int, offset: int) -> bool:
    """Whether token k is a negation: not "no" opening the sentence ("No it's Paris") nor "no doubt"."""
    w = toks[k].norm
    if w not in NEGATIONS:
        return False
    if w == "no" and (k == offset or (k + 1 < len(toks) and toks[k + 1].norm in ("doubt", "wonder"))):
        return False
    return True


_CLAUSE_WORDS = frozenset(("but", "while", "whereas"))  # open a clause of their own ("X is a mammal while Y is a reptile")


def _clauses(toks: list[Tok], text: str, offset: int) -> list[int]:
    """Each token's clause number: a new clause at , ; : brackets and dashes, and at "but", "while", "whereas"."""
    out = [0] * len(toks)
    c = 0
    for k in range(offset, len(toks)):
        gap = text[toks[k - 1].end : toks[k].start] if k > offset else ""
        if k > offset and (_CLAUSE_GAP.search(gap) or toks[k].norm in _CLAUSE_WORDS):
            c += 1
        out[k] = c
    return out


def _restating(toks: list[Tok], text: str, clause: list[int], c: int, offset: int) -> bool:
    """Whether clause c is a first clause that restates the options: it opens with "between", "of",
    "among", "from" or "out" and another clause follows ("Of the three, the dog is a mammal.")."""
    if c != 0 or offset >= len(toks) or toks[offset].norm not in RESTATING:
        return False
    return any(x > 0 for x in clause[offset:])


def _in_brackets(text: str, toks: list[Tok], span: list[int], m: Mention) -> bool:
    """Whether mention m is in a bracketed part of the sentence ("Carbon dioxide (CO2)"), not itself
    the whole of it, as an option's letter is ("(A)")."""
    if not span:
        return False
    opening = text[toks[span[0] - 1].end if span[0] else 0 : toks[span[0]].start]
    label = span == list(range(m.first, m.last + 1)) and text[toks[m.last].end :].lstrip(" *_")[:1] in (")", "]")
    return ("(" in opening or "[" in opening) and not label


def _aside_clause(toks: list[Tok], text: str, span: list[int], m: Mention) -> bool:
    """Whether mention m is in a clause opened after a comma by "which", "who", "where", "as" ("Italian,
    which is a Romance language"; not "known as": that is how the answer is named)."""
    if not span or toks[span[0]].norm not in ASIDES_AFTER_COMMA or m.first == span[0]:
        return False
    opening = text[toks[span[0] - 1].end if span[0] else 0 : toks[span[0]].start]
    return "," in opening


def _swapped(toks: list[Tok], m: Mention, q: Question) -> bool:
    """Whether a mention of the reference stands where the question has another of its words ("The
    opposite of winter is summer." for "What is the opposite of summer?"): the two words before it
    are followed in the question by a word q, and the sentence names q elsewhere."""
    before = [t.norm for t in toks[: m.first] if t.norm not in ARTICLES][-2:]
    if len(before) < 2:
        return False
    covered = set(range(m.first, m.last + 1))
    elsewhere = {t.norm for k, t in enumerate(toks) if k not in covered}
    reference = {t.norm for t in toks[m.first : m.last + 1]}
    return any(a == before[0] and b == before[1] and w not in reference and w in elsewhere and w not in FUNCTION_WORDS for a, b, w in q.triples)


# --- reading the answer -------------------------------------------------------------------------------


@dataclass
class Sentence:
    """One sentence of the text read: its prepared text, tokens and mentions, and whether it asks."""

    text: str
    toks: list[Tok]
    found: list[Mention]
    question: bool  # it asks ("Is it Paris?"): a question is not an answer


class Sentences:
    """A text's sentences, each read (tokens, mentions, its standing as an answer) when first asked
    for: the grader reads a long completion from its end and usually stops after a sentence or two."""

    def __init__(self, text: str, lex: Lexicon):
        self.pieces = split_sentences(text)
        self.lex = lex
        self._read: dict[int, Sentence] = {}
        self._answers: dict[int, Answer | None] = {}

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, index: int) -> Sentence:
        if index not in self._read:
            piece = self.pieces[index]
            prepared = prepare(piece)
            toks = tokens(prepared)
            asks = piece.rstrip(" \t\"'*_)\u201d\u2019").endswith("?")
            self._read[index] = Sentence(prepared, toks, mentions(toks, prepared, self.lex), asks)
        return self._read[index]

    def answer(self, index: int) -> Answer | None:
        """Sentence ``index`` read as an answer part (from after its last marker), or None when it
        offers nothing: no mention, a question, every mention set against the answer."""
        if index not in self._answers:
            self._answers[index] = self._answer(index)
        return self._answers[index]

    def _answer(self, index: int) -> Answer | None:
        s, lex = self[index], self.lex
        if not s.found or s.question:
            return None
        offset = _after_marker(s)
        found = [m for m in s.found if m.first >= offset]
        standing = _standing(s.toks, s.text, found, lex.question, offset)
        if lex.number is None:
            standing = [EXCLUDED if m.key == REF and st != EXCLUDED and _swapped(s.toks, m, lex.question) else st
                        for m, st in zip(found, standing)]  # fmt: skip
        answer = Answer(s, offset, found, standing, index, self)
        return answer if answer.offered() else None


@dataclass
class Answer:
    """The answer part of a completion: its sentence, where the part starts (after a marker), its
    mentions and where each stands, and the sentences around it."""

    sentence: Sentence
    offset: int
    found: list[Mention]
    standing: list[str]
    index: int  # of the sentence among the text's
    sentences: Sentences

    def offered(self) -> list[Mention]:
        """The mentions offered as the answer: those in the main part, else (none there) the asides'."""
        main = [m for m, s in zip(self.found, self.standing) if s == MAIN]
        return main or [m for m, s in zip(self.found, self.standing) if s == ASIDE]

    def on_topic(self, q: Question) -> bool:
        """Whether it offers a mention in its main part and holds a word of the question's topic."""
        covered = _covered(self.found)
        return MAIN in self.standing and any(_stem(t.norm) in q.topic for k, t in enumerate(self.sentence.toks) if k not in covered)


def _covered(found: Iterable[Mention]) -> set[int]:
    return {k for m in found for k in range(m.first, m.last + 1)}


def answer_text(completion: str) -> str:
    """Where a completion's answer is read: after "####", in the last box, in the last `<answer>` tag
    (its content read as a completion), else the whole completion."""
    region = answer_region(completion)
    if region.where == "tag":
        return answer_text(region.text)
    return completion if region.where == "line" else region.text


_REMARKS = frozenset("also however additionally moreover furthermore".split())
# A sentence opening with one of these speaks of what was named before ("It is a Romance language like Spanish.").
_BACK_REFERENCES = frozenset("it its this these they their them he she his her those".split())
_CORRECTING = frozenset("actually no wait sorry correction rather".split())


def _remark(s: Sentence) -> bool:
    """Whether a sentence adds to an answer given before rather than giving one: it says "also",
    "however", "additionally", or opens with "it", "they", "this", ... and corrects nothing
    ("It is a Romance language like Spanish."; not "It's actually Paris.")."""
    words = {t.norm for t in s.toks}
    if words & _CORRECTING:
        return False
    return bool(words & _REMARKS) or bool(s.toks) and s.toks[0].norm in _BACK_REFERENCES


def answer_sentence(sentences: Sentences) -> Answer | None:
    """The answer part: the last sentence, not a question, that offers a mention (one not negated or
    set against the answer), read from after its last marker ("the answer is", "answer:") when it
    has one; None when no sentence offers one. When that sentence is a remark ("also", "however",
    "It ...": "However, Italian is also spoken elsewhere."), offers only asides, or says something
    of its own (none of the question's words, more than a bare answer: "Snakes and lizards are
    reptiles."), an earlier sentence that is no remark and offers a mention in its main part with
    the question's words, or as a bare answer, is the answer ("The dog is a mammal.")."""
    q = sentences.lex.question
    last = None
    for index in range(len(sentences) - 1, -1, -1):
        answer = sentences.answer(index)
        if answer is None:
            continue
        last = last or answer
        if not _remark(answer.sentence) and (answer.on_topic(q) or _bare_sentence(answer.sentence)):
            return answer
    return last


def _after_marker(s: Sentence) -> int:
    """The first token after the sentence's last marker ("the answer is"), or 0."""
    markers = list(_MARKER.finditer(s.text))
    if not markers:
        return 0
    end = markers[-1].end()
    return next((k for k, t in enumerate(s.toks) if t.start >= end), len(s.toks))


# --- deciding -------------------------------------------------------------------------------------------


def names_reference(completion: str, reference: str, question: str = "", answers: Iterable[str] | None = None) -> bool:
    """Whether the completion names ``reference`` as its answer, by the word rule (the spec:
    :mod:`podsrl.grading.graders`): in its answer part (:func:`answer_sentence`) the reference is
    offered and no other candidate is (an option of the question, another of the task's ``answers``,
    a full name; for a number reference the last number offered is the answer, and no option's
    letter is offered beside it), nothing stands beside it as a second item of a list ("Paris,
    Lyon", "Mars or Venus", "six eight"), a bare answer is not one line of a list ("London. Berlin.
    Paris."), and no later sentence corrects it ("Or Venus.")."""
    lex = Lexicon.build(reference, question, answers)
    if lex is None:
        return False
    answer = answer_sentence(Sentences(answer_text(completion), lex))
    if answer is None:
        return False
    offered = answer.offered()
    if lex.number is not None:
        numbers = [m for m in offered if m.number is not None]
        if not numbers or numbers[-1].key != REF or {m.key for m in offered if m.letter} - {REF}:
            return False  # not the last number offered, or an option's letter offered beside it
        named = numbers[-1:]
    elif {m.key for m in offered} != {REF}:
        return False
    else:
        named = offered
    if any(_beside(answer, m, lex) for m in named):
        return False
    return not _listed_lines(answer) and not _corrected(answer)


def _beside(answer: Answer, m: Mention, lex: Lexicon) -> bool:
    """Whether something stands beside mention m as a second item of a list. Words: joined by "or"
    or "/" to anything ("Mars or Venus"), by "," or "and" to a short item ("Paris, Lyon"; not "Paris,
    of course", "Paris, the capital", "Paris, France" for a question about France). Numbers: joined
    by "or" or "/" to another number standing free ("12 or 13"; not "5A/5 or 20 = A"), or in a part
    that is nothing but numbers ("6, 8", "six eight", "It is 6 and 8")."""
    s, offset = answer.sentence, answer.offset
    toks, text = s.toks, s.text
    for side in (1, -1):
        segment, joiner = _neighbour(toks, text, m, side, offset)
        if not segment or toks[segment[0]].norm in NEGATIONS:
            continue
        if lex.number is not None:
            if joiner in ("or", "/") and _free_number(toks, text, segment, side, m):
                return True
        elif joiner in ("or", "/"):
            if any(toks[k].norm not in FUNCTION_WORDS for k in segment):
                return True
        elif joiner in (",", "and") and _is_item([toks[k] for k in segment], joiner, lex.question):
            return True
    if lex.number is not None:  # "6, 8", "6 and 8": a bare list of numbers ("12, not 13" is not one)
        values = {x.number for x, st in zip(answer.found, answer.standing) if x.number is not None and st != EXCLUDED}
        if len(values) >= 2 and _bare(toks, text, range(offset, len(toks)), answer.found):
            return True
    return False


def _neighbour(toks: list[Tok], text: str, m: Mention, side: int, offset: int) -> tuple[list[int], str | None]:
    """The tokens beside mention m on one side (1: after, -1: before), up to the next break, and what
    joins them to it: "or", "and", ",", "/" (a list's joints), " " (nothing but space); nothing
    (an empty segment) across a clause break or into a gloss in brackets ("Carbon dioxide (CO2)")."""
    k = m.last + 1 if side == 1 else m.first - 1
    if k < offset or k >= len(toks):
        return [], None
    gap = text[toks[min(k, m.last)].end : toks[max(k, m.first)].start]
    if "/" in gap or "&" in gap:
        joiner = "/" if "/" in gap else "and"
    elif "(" in gap or ")" in gap:  # a gloss, unless it hedges ("Paris (or Lyon)")
        if toks[k].norm not in _LIST_WORDS:
            return [], None
        joiner = ","
    elif "," in gap:
        joiner = ","
    elif not gap.strip(" \t*_\"'`"):
        joiner = " "
    else:
        return [], None
    if joiner in (",", " ") and toks[k].norm in _LIST_WORDS:  # ", or Lyon", "or Lyon"
        beyond = k + side
        if offset <= beyond < len(toks) and _CLAUSE_GAP.search(text[toks[min(k, beyond)].end : toks[max(k, beyond)].start].replace(",", "")):
            return [], None
        joiner = toks[k].norm
        k = beyond
    segment = []
    while offset <= k < len(toks) and len(segment) < 4:
        if segment:
            near, far = sorted((segment[-1], k))
            if re.search(r"[,;:()\[\]/.!?]", text[toks[near].end : toks[far].start]) or toks[k].norm in _LIST_WORDS:
                break
        segment.append(k)
        k += side
    return (segment if side == 1 else segment[::-1]), joiner


_OPERATORS = re.compile(r"[-+*/=^<>\u00d7\u00f7\u2013\u2212]")


def _free_number(toks: list[Tok], text: str, segment: list[int], side: int, m: Mention) -> bool:
    """Whether the segment beside number m opens (on m's side) with a number of another value that is
    no part of an expression: nothing but space and punctuation on its far side ("12 or 13"; not "5A/5
    or 20")."""
    k = segment[0] if side == 1 else segment[-1]
    value = toks[k].value if toks[k].value is not None else _WORD_VALUES.get((toks[k].norm,))
    if value is None or value == m.number or _written(text, toks[k]) != _written(text, toks[m.first]):
        return False  # not another number, or the same one restated ("0.60 or 60%")
    far = k + side
    beyond = text[toks[k].end : toks[far].start] if side == 1 and far < len(toks) else text[toks[far].end : toks[k].start] if side == -1 and far >= 0 else ""
    return not _OPERATORS.search(beyond)


def _written(text: str, t: Tok) -> tuple[bool, bool]:
    """How a number is written: with "$" before it, with "%" after it."""
    return text[: t.start].rstrip().endswith("$"), text[t.end :].lstrip().startswith("%")


def _is_item(segment: list[Tok], joiner: str, q: Question) -> bool:
    """Whether a segment beside the reference is another item of a list: one to three words, none a
    function word, a negation, an aside, a contrast, an adverb ("-ly" in lower case: "Paris,
    obviously") or a number, not an article-led apposition after a comma ("Paris, the capital"), not
    only the question's own words ("Paris, France")."""
    if segment[0].norm in ARTICLES:
        if joiner == ",":
            return False
        segment = [t for t in segment if t.norm not in ARTICLES]
    if not segment or len(segment) > 3:
        return False
    words = [t.norm for t in segment]
    if any(w in FUNCTION_WORDS or w in NEGATIONS or w in ASIDES or w in CONTRASTS or w[0].isdigit() for w in words):
        return False  # a clause or a phrase ("Paris, of course", "diamond, made of carbon"), not a name
    if any(not t.upper and t.norm.endswith("ly") for t in segment):
        return False
    return not set(words) <= q.words


def _bare(toks: list[Tok], text: str, part: Iterable[int], found: list[Mention]) -> bool:
    """Whether a part holds nothing but mentions, function words, negations and list punctuation
    ("Hmm, no, Paris.", "Answer: 3", "6, 8")."""
    part = list(part)
    covered = _covered(found)
    if not covered & set(part):
        return False
    for a, b in zip(part, part[1:]):
        gap = text[toks[a].end : toks[b].start]
        if not _LIST_GAP.match(gap) and not re.fullmatch(r"[\s.:]*", gap):
            return False
    return all(k in covered or toks[k].norm in FUNCTION_WORDS or toks[k].norm in NEGATIONS for k in part)


def _bare_sentence(s: Sentence) -> bool:
    return _bare(s.toks, s.text, range(len(s.toks)), s.found)


_ITEM_WRAPPERS = ARTICLES | _LIST_WORDS | NEGATIONS | frozenset("answer final option choice letter is it s i think maybe perhaps probably".split())


def _item_line(s: Sentence) -> bool:
    """Whether a sentence is nothing but what it names and the words an answer is wrapped in, with
    a list's punctuation between them, as a line of a list is ("Berlin.", "- the snake", "Answer:
    London", "I think it is London."; not "It is known for the Eiffel Tower.", "$30 - $20 = $10")."""
    covered = _covered(s.found)
    gaps = (s.text[a.end : b.start] for a, b in zip(s.toks, s.toks[1:]))
    return (bool(covered) and all(k in covered or t.norm in _ITEM_WRAPPERS for k, t in enumerate(s.toks))
            and all(_LIST_GAP.match(g) or re.fullmatch(r"[\s.:()\[\]]*", g) for g in gaps))  # fmt: skip


def _unknown_item(s: Sentence) -> bool:
    """A sentence of one to three words, none a function word or a number, not an exclamation: an
    item of a list the grader does not know ("Paris. Lyon."; not "Paris. Good luck!")."""
    return 1 <= len(s.toks) <= 3 and not s.question and not s.text.rstrip(" \"'*_").endswith("!") and all(
        t.norm not in FUNCTION_WORDS and t.value is None for t in s.toks
    )


def _listed_lines(answer: Answer) -> bool:
    """Whether a bare answer ("Paris.") is one line of a list: a neighbouring sentence is an item line
    offering something else ("London. Berlin. Paris.", "dog\nsnake"), or an unknown short item."""
    if not _bare_sentence(answer.sentence):
        return False
    keys = {m.key for m in answer.offered()}
    sentences = answer.sentences
    for step in (-1, 1):
        i = answer.index + step
        while 0 <= i < len(sentences):
            s = sentences[i]
            if s.found and _item_line(s):
                neighbour = sentences.answer(i)
                if neighbour is not None and {m.key for m in neighbour.offered()} - keys:
                    return True
            elif sentences.lex.number is not None or not _unknown_item(s):
                break
            elif not s.found:
                return True
            i += step
    return False


def _corrected(answer: Answer) -> bool:
    """Whether a later sentence opens with "or", "but", "actually" or "wait" and names something new
    (a capitalised word that is not the question's, a number): "Mars. Or Venus.", "Mars is red.
    But the red planet is Venus." """
    sentences, q = answer.sentences, answer.sentences.lex.question
    number_mode = sentences.lex.number is not None
    for i in range(answer.index + 1, len(sentences)):
        if not re.match(r"\W*(?:or|but|actually|wait)\b", sentences.pieces[i], re.IGNORECASE):
            continue
        for t in sentences[i].toks[1:]:
            if (t.upper and t.norm not in FUNCTION_WORDS and t.norm not in q.words) or (number_mode and t.value is not None):
                return True
    return False


_DIGIT = re.compile(r"\d")


def named_number(completion: str, extracted: str | None, question: str = "") -> Fraction | int | None:
    """The number a completion names in digits: ``extracted`` (by
    :func:`podsrl.grading.answers.extract_answer`), read in its sentence (the last with a digit,
    from after its marker) with the word rule's corrections. A number denied right before it ("not
    13", "isn't 13", "not 6 or 10") is not the answer: the last number of the sentence not denied is
    ("It is 12, not 13." names 12). A number hedged with another standing free ("12 or 13"), one of
    a bare list ("6, 8", "6\n8"), or offered beside an option's letter ("(A), 6") names none: None."""
    value = _number_value(extracted) if extracted is not None else None
    if value is None:
        return None
    lex = Lexicon.build(extracted, question, None)
    sentences = Sentences(answer_text(completion), lex)
    index = next((i for i in range(len(sentences) - 1, -1, -1) if _DIGIT.search(sentences.pieces[i])), None)
    if index is None:
        return value
    s = sentences[index]
    offset = _after_marker(s)
    found = [m for m in s.found if m.first >= offset]
    numbers = [m for m in found if m.number is not None]
    ours = [m for m in numbers if m.number == value]
    if not ours:
        return value  # not where the extraction found it (a LaTeX fraction, a sign): as extracted
    chosen = ours[-1]
    if _denied(s, chosen, numbers, offset):
        kept = [m for m in numbers if not _denied(s, m, numbers, offset)]
        if not kept:
            return None
        chosen = kept[-1]
    bare = _bare(s.toks, s.text, range(offset, len(s.toks)), found)
    # Where each mention stands matters to an option's letter beside it, and to a bare part (a list
    # of numbers, "12, not 13"); a sentence of reasoning (GSM8K's) needs neither.
    standing = _standing(s.toks, s.text, found, lex.question, offset) if bare or any(m.letter for m in found) else [MAIN] * len(found)
    answer = Answer(s, offset, found, standing, index, sentences)
    letters = {m.key for m, st in zip(found, standing) if m.letter and st == MAIN} - {chosen.key}
    lex.number = chosen.number
    if letters or _beside(answer, chosen, lex) or _listed_lines(answer):
        return None
    return chosen.number


def _denied(s: Sentence, m: Mention, numbers: list[Mention], offset: int) -> bool:
    """Whether a number is denied right before it: a negation just before it, articles aside ("not
    13", "It isn't 13"), or a joint ("or", "nor", ",") to a number that is ("not 6 or 10")."""
    k = m.first - 1
    while k >= offset and s.toks[k].norm in ARTICLES:
        k -= 1
    if k < offset:
        return False
    if _negates(s.toks, k, offset):
        return True
    joined = s.toks[k].norm in ("or", "nor") or re.fullmatch(r"\s*,\s*", s.text[s.toks[k].end : s.toks[m.first].start]) is not None
    if s.toks[k].norm in ("or", "nor"):
        k -= 1
    earlier = next((x for x in numbers if x.last == k), None)
    return joined and earlier is not None and _denied(s, earlier, numbers, offset)


def contains_reference(completion: str, reference: str) -> bool:
    """Whether the completion holds a reference of words as whole words anywhere (any of its forms:
    case, accents, a plural aside), whatever it means by it: the start-up check of a grader that may
    miss right answers (:mod:`podsrl.run.watch`)."""
    if not is_words(reference):
        return False
    forms = word_forms(reference)
    words = [t.norm for t in tokens(prepare(completion))]
    return any(tuple(words[i : i + n]) in forms for n in {len(f) for f in forms} for i in range(len(words) - n + 1))
