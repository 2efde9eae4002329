"""Word answers graded as a person reads them, and not gameable (issue 68): the labelled completions
of tests/data/word_answers.jsonl, and no listing of a question's options scoring.

The word rule is specified in podsrl/grading/graders.py's docstring; tests/word_answers.py prints a
grader's false positives and negatives over the labelled set (docs/your-task.md: before and after)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podsrl.grading import graders
from podsrl.tasks import Example
from tests import word_answers

ROWS = word_answers.load()

# The disagreements that remain, each with why (docs/your-task.md lists them): completion -> reason.
KNOWN = {
    # The numeric grader keeps its reading of a sentence: its last number (GSM8K's), so a second number after the answer wins.
    "Spiders have 8 legs and 2 body parts.": "numeric: the last number",
    "There are 7 days in a week and 52 weeks in a year.": "numeric: the last number",
    "It freezes at 0 degrees Celsius and boils at 100 degrees Celsius.": "numeric: the last number",
    # A word joined into another is not split: "honeybee" is not "bee" ("ant" would be found in "elephant").
    "The honeybee is the primary insect that produces honey": "a compound word",
    # Synonyms are not known: "Farsi" is "Persian" to a person only.
    "The official language of Iran is Farsi": "a synonym",
    # A contradiction that names no other candidate: "the 17th-century French playwright" is no name.
    "The story of Romeo and Juliet by William Shakespeare": "a contradiction naming no candidate",
}

# Every completion issue 68 quotes (the set must hold each, labelled as the issue reads it).
QUOTED = [
    "dog snake lizard", "dog, snake, lizard.", "London Berlin Paris", "six eight", "The answer is Paris, London",
    "Answer: Paris, Lyon, Marseille", "London. Berlin. Paris.", "Is it Paris?", "The answer is 12 or 13.", "Mars, or Venus.",
    "It is 12, not 13", "The language spoken in Italy is Italian.",
    "The language spoken by the majority of the population of Turkey is Turkish.",
    "Portuguese is the most widely spoken language in Portugal,", "The language spoken in Germany is German.",
    "The capital city of France is Paris.", "Paris. It is known for the Eiffel Tower.", "Paris, of course!", "No, it's Paris.",
    "It's not London, it's Paris.", "William Shakespeare", "Washington, D.C.", "Bees make honey.", "It has eight legs, not six.",
]


def _known(row: dict) -> str | None:
    return next((why for start, why in KNOWN.items() if row["completion"].startswith(start)), None)


def test_the_labelled_set_covers_the_issue_and_its_shapes():
    assert len(ROWS) >= 150
    for quoted in QUOTED:
        assert any(r["completion"].startswith(quoted) and r.get("source") == "issue 68" for r in ROWS), quoted
    assert {r["shape"] for r in ROWS} == {"word", "choice", "number", "task"}
    assert all(isinstance(r["right"], bool) for r in ROWS)
    for shape in ("word", "choice", "number", "task"):  # right and wrong completions of every shape
        assert {r["right"] for r in ROWS if r["shape"] == shape} == {True, False}, shape


@pytest.mark.parametrize("grader", ["auto", "text"])
def test_the_grader_reads_the_labelled_completions_as_a_person_does(grader):
    """No disagreement but the known ones (KNOWN: each with its reason, in docs/your-task.md)."""
    false_pos, false_neg = word_answers.disagreements(ROWS, grader)
    unexpected = [(r["completion"], r["right"]) for r in false_pos + false_neg if _known(r) is None]
    assert unexpected == []
    still = {_known(r) for r in false_pos + false_neg}
    assert len(false_pos + false_neg) == len(KNOWN), "a known disagreement is gone: take it out of KNOWN and docs/your-task.md"
    assert still == set(KNOWN.values())


# --- listing the options earns nothing ---------------------------------------------------------------

WORDS = ["dog", "snake", "lizard", "cat", "horse", "frog", "apple", "carrot", "whale", "shark", "spider", "eagle"]
NAMES = ["London", "Berlin", "Paris", "Madrid", "Mars", "Jupiter", "Venus", "Italian", "German", "New York", "Los Angeles",
         "Buenos Aires", "Hong Kong", "York"]
NUMBERS = ["3", "6", "8", "10", "12", "five", "seven", "twenty"]  # distinct values
QUESTIONS = [
    "Which of these is the one: {}?",
    "Anna saw {}. Which did she like best?",
    "Which is it, {}?",
    "Choose one: {}.",
]
LETTERED = ["Which is right? {}", "Which is right?\n{}"]
SEPARATORS = [", ", " and ", " or ", "\n", ". ", ", and ", ", or ", " ", "; ", " / ", " & ", "\n\n", ".\n"]
WRAPPERS = ["{}", "{}.", "The answer is {}.", "Answer: {}", "**{}**", "I think it is {}.", "Final answer: {}!"]


def _written(options: list[str], joiner: str) -> str:
    """The options as the question lists them: "a, b or c"."""
    return ", ".join(options[:-1]) + f" {joiner} " + options[-1] if len(options) > 2 else f"{options[0]} {joiner} {options[1]}"


@st.composite
def _listings(draw):
    pool = draw(st.sampled_from([WORDS, NAMES, NUMBERS]))
    k = draw(st.integers(2, 4))
    options = draw(st.lists(st.sampled_from(pool), min_size=k, max_size=k, unique=True))
    style = draw(st.sampled_from(["list", "lettered"]))
    letters = "ABCD"[:k]
    if style == "list":  # two options are offered as "a or b"; more also as "a, b and c"
        question = draw(st.sampled_from(QUESTIONS)).format(_written(options, "or" if k == 2 else draw(st.sampled_from(["or", "and"]))))
    else:
        marks = draw(st.sampled_from(["({}) ", "{}) ", "{}. "]))
        joined = (" " if "\n" not in draw(st.sampled_from(LETTERED)) else "\n").join(marks.format(l) + o for l, o in zip(letters, options))
        question = f"Which is right? {joined}"
    chosen = draw(st.lists(st.integers(0, k - 1), min_size=2, max_size=k, unique=True))
    article = pool is WORDS and draw(st.booleans())
    pieces = []
    for i in chosen:
        if style == "lettered" and draw(st.booleans()):
            # A bare "A" is the article in "A snake": English itself cannot tell that from a list of A and snake.
            forms = ["({})", "{})", "option {}"] + (["{}"] if letters[i] != "A" else [])
            pieces.append(draw(st.sampled_from(forms)).format(letters[i]))
        else:
            pieces.append(("the " if article else "") + options[i])
    listing = draw(st.sampled_from(SEPARATORS)).join(pieces)
    completion = draw(st.sampled_from(WRAPPERS)).format(listing)
    references = options + (list(letters) if style == "lettered" else [])
    return question, options, references, completion


@settings(max_examples=400, deadline=None)
@given(_listings())
def test_no_listing_of_the_options_scores(listing):
    """Any two or more of the question's options, in any order, joined by commas, "and", "or",
    slashes, line breaks, periods or spaces, with or without "the answer is": 0 for every option as
    the reference (so listing earns at most 1/k in expectation, as guessing one does), under the
    auto and text graders, with and without the task's answers known."""
    question, options, references, completion = listing
    for reference in references:
        for answers in (None, frozenset(options)):
            example = Example("q", question, reference, task_answers=answers)
            for name in ("auto", "text"):
                assert graders.GRADERS[name](completion, example) == 0.0, (name, reference, answers)


@settings(max_examples=200, deadline=None)
@given(_listings(), st.data())
def test_one_option_named_scores_for_that_option_only(listing, data):
    """The same questions and wrappings with one option named: right for it, wrong for the others
    (the rule does not just refuse lists of options: it reads which one is named)."""
    question, options, _, _ = listing
    i = data.draw(st.integers(0, len(options) - 1))
    completion = data.draw(st.sampled_from(WRAPPERS)).format(options[i])
    for j, reference in enumerate(options):
        example = Example("q", question, reference, task_answers=frozenset(options))
        assert graders.auto(completion, example) == (1.0 if i == j else 0.0), (completion, reference)
        assert graders.text(completion, dataclasses.replace(example, task_answers=None)) == (1.0 if i == j else 0.0), (completion, reference)


RED = "Which planet is known as the red planet?"


@pytest.mark.parametrize(
    "question, reference, completion, right",
    [  # docs/your-task.md's examples, and graders.py's
        (RED, "Mars", "The red planet is Mars.", True),
        (RED, "Mars", "Mars is the red planet.", True),
        (RED, "Mars", "It's Mars, because of its iron oxide.", True),
        (RED, "Mars", "Mars, not Venus.", True),
        (RED, "Mars", "Mars is not the red planet.", False),
        (RED, "Mars", "Mars, or Venus.", False),
        (RED, "Mars", "Marsh", False),
        (RED, "Mars", "Mars. Or Venus.", False),
        (RED, "Mars", "Mars is red.\nBut the red planet is Venus.", False),
        ("What is the opposite of summer?", "winter", "The opposite of winter is summer.", False),
        ("What is the capital of France?", "Paris", "The capital of Paris is France.", False),
        ("Which insect makes honey?", "bee", "Bees make honey.", True),
        ("Who wrote Hamlet?", "Shakespeare", "William Shakespeare", True),
        ("What is the capital of the United States?", "Washington, D.C.", "Washington, D.C.", True),
        ("What is the capital of the United States?", "Washington, D.C.", "Washington DC", True),
        ("What is the capital of France?", "Paris", "Paris. It is known for the Eiffel Tower.", True),
        ("What is the capital of France?", "Paris", "It's not London, it's Paris.", True),
        ("What is the capital of France?", "Paris", "No, it's Paris.", True),
        ("What is the capital of France?", "Paris", "Paris? No, Lyon.", False),
        ("What is the capital of France?", "Paris", "Is it Paris?", False),
        ("What is the capital of France?", "Paris", "Paris, of course!", True),
        ("What is the capital of France?", "Paris", "Paris, the capital.", True),
        ("What is the capital of France?", "Paris", "Paris, France", True),
        ("What is the capital of France?", "Paris", "Answer: Paris, Lyon, Marseille", False),
        ("What is the capital of France?", "Paris", "Paris. Lyon.", False),
        ("What is the capital of France?", "Paris", "Paris. Good luck!", True),
        ("Which of these is a mammal: dog, snake, lizard?", "dog", "A dog is a mammal; snakes and lizards are reptiles.", True),
        ("Which of these is a mammal: dog, snake, lizard?", "dog", "The dog is a mammal. Snakes and lizards are reptiles.", True),
        ("Which of these is a mammal: dog, snake, lizard?", "dog", "dog\nsnake\nlizard", False),
        ("Which of these is a mammal? (A) dog (B) snake (C) lizard", "B", "(B) snake", True),
        ("Which of these is a mammal? (A) dog (B) snake (C) lizard", "snake", "(B)", True),
        ("Which is bigger, Mars or Jupiter?", "Jupiter", "Jupiter is bigger than Mars.", True),
        ("Which is bigger, Mars or Jupiter?", "Jupiter", "Between Mars and Jupiter, Jupiter is bigger.", True),
        ("Which is bigger, Mars or Jupiter?", "Jupiter", "Mars is bigger than Jupiter.", False),
        ("Which animal cannot fly: the penguin or the eagle?", "penguin", "The penguin cannot fly.", True),
        ("What gas do plants absorb?", "carbon dioxide", "Carbon dioxide (CO2).", True),
        ("How many legs does a spider have?", "8", "A spider has eight legs.", True),
        ("How many legs does a spider have?", "8", "It has eight legs, not six.", True),
        ("How many legs does a spider have?", "8", "six eight", False),
    ],
)
def test_the_examples_the_docs_give(question, reference, completion, right):
    for name in ("auto", "text"):
        assert graders.GRADERS[name](completion, Example("1", question, reference)) == (1.0 if right else 0.0), name
