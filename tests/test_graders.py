"""Graders (podsrl/grading/graders.py): a task chooses how its answers are judged, and held-out
accuracy and the `correctness` reward both use that choice (issue 45: word answers scored 0% at
every evaluation while training rewarded them, and `podsrl compare` said the untrained model
already met the target)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podsrl.engines import Rollouts, Sampling
from podsrl.errors import ConfigError
from podsrl.grading import graders
from podsrl.grading.rewards import correctness, task_values
from podsrl.integrations.rewards import as_trl_reward
from podsrl.tasks import Example, load_task
from podsrl.train.evaluate import EvalSettings, evaluate

WORDS = ["Paris", "Cat", "Blue", "Oslo", "Tiger", "Seven", "Apple", "Rome"]


def test_as_trl_reward_grades_text_answers():
    """Only numbers and \\boxed{} scored: ("CAT", "CAT") was 0.0."""
    reward = as_trl_reward("correctness")
    completions = ["CAT", "Paris", "x+1", "dog", "Lyon", "x+2"]
    answers = ["CAT", "Paris", "x+1", "CAT", "Paris", "x+1"]
    assert reward(["q"] * 6, completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "completion, reference, right",
    [
        ("cat", "CAT", True),  # case
        ("  Paris \n", "Paris", True),  # surrounding whitespace
        ("Paris.", "Paris", True),  # a trailing period
        ("**Paris**", "Paris", True),  # markdown emphasis
        ('"Paris"', "Paris", True),  # quotes
        ("\u201cParis\u201d", "Paris", True),
        ("\\text{Paris}", "Paris", True),  # LaTeX \text{}
        ("$\\text{New  York}$", "new york", True),  # runs of whitespace, $
        ("The answer is Paris.", "Paris", True),  # a marked answer on the last line
        ("I think so.\nFinal answer: Paris", "Paris", True),
        ("#### Paris", "Paris", True),
        ("\\boxed{Paris}", "Paris", True),
        ("<answer>Paris</answer>", "Paris", True),
        ("The capital of France is Paris.", "Paris", True),  # named as the answer (issue 68; was wrong: not marked)
        ("Pairs", "Paris", False),  # math-verify would call p*a*i*r*s = p*a*r*i*s
        ("Paris, or Lyon", "Paris", False),
        ("1,000", "1000", True),  # numbers stay numeric
        ("The answer is 12.0", "12", True),
        ("twelve", "12", True),  # a number word is that number (issue 57)
        ("thirteen", "12", False),
        ("x+1", "x+1", True),
        ("red\ngreen\nblue", "red\ngreen\nblue", True),  # words of several lines: the whole completion
        ("red\ngreen", "red\ngreen\nblue", False),
        ("(C)", "\\text{(C)}", True),
        ("C", "\\text{(C)}", False),
    ],
)
def test_text_grader(completion, reference, right):
    assert graders.text(completion, Example("1", "q", reference)) == (1.0 if right else 0.0)


@pytest.mark.parametrize(
    "completion, reference, right",
    [
        ("CAT", "CAT", True),
        ("Paris", "Paris", True),
        ("x+1", "x+1", True),  # spelt as the reference: no parser needed
        ("The answer is Paris.", "Paris", True),
        ("\\boxed{1+x}", "x+1", True),  # math-verify
        ("\\boxed{\\frac12}", "0.5", True),
        ("#### 1,234", "1234", True),
        ("12 apples", "13", False),
        ("Pairs", "Paris", False),
    ],
)
def test_auto_grader_reads_numbers_words_and_mathematics(completion, reference, right):
    example = Example("1", "q", reference)
    assert graders.auto(completion, example) == (1.0 if right else 0.0)
    assert correctness(completion, example) == (1.0 if right else 0.0)  # "auto" is an Example's default grader


def test_numeric_grader_never_matches_words_and_the_start_up_check_says_so():
    examples = [Example(str(i), "q", word, grader="numeric") for i, word in enumerate(WORDS) if word != "Seven"]
    assert all(graders.grade(ex.answer, ex) == 0.0 for ex in examples)
    assert graders.grade("Seven", Example("7", "q", "Seven", grader="numeric")) == 1.0  # a number word is a number
    note = graders.ungraded_note(examples + [Example("n", "q", "12", grader="numeric")])
    assert note is not None
    assert f"{len(examples)} of {len(examples) + 1} held-out answers" in note and "'numeric'" in note and "'text'" in note
    assert graders.ungraded_note([dataclasses.replace(ex, grader="auto") for ex in examples]) is None
    assert graders.ungraded_note([Example("n", "q", "12", grader="numeric")]) is None


def _word_task(tmp_path, **options):
    path = tmp_path / "words.jsonl"
    path.write_text("".join(json.dumps({"question": f"Which word is number {i}?", "answer": w}) + "\n" for i, w in enumerate(WORDS * 2)))
    return load_task("jsonl", path=str(path), num_eval=8, **options)


class _Answering:
    """A stand-in engine: the completion of prompt i is ``answers[i]``."""

    def __init__(self, answers: list[str]):
        self.answers = answers

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollouts:
        texts = [self.answers[p[0]] for p in prompt_ids for _ in range(sampling.n)]
        return Rollouts(prompt_ids=prompt_ids, completion_ids=[[1, 2]] * len(texts), texts=texts, truncated=[False] * len(texts))


def test_held_out_accuracy_of_a_jsonl_task_with_word_answers(tmp_path):
    task = _word_task(tmp_path)
    assert task.grader == "auto" and {ex.grader for ex in task.eval} == {"auto"}
    prompts = [[i] for i in range(len(task.eval))]  # the stand-in reads the problem's index
    right = [f"{ex.answer.upper()}." for ex in task.eval]  # case and a period: still right
    assert evaluate(_Answering(right), prompts, task.eval).accuracy == 1.0
    half = [ex.answer if i % 2 else "no idea" for i, ex in enumerate(task.eval)]
    assert evaluate(_Answering(half), prompts, task.eval).accuracy == 0.5
    # The numeric grader cannot read them: what the issue saw, 0% however right the model is.
    numeric = dataclasses.replace(task, grader="numeric")
    assert {ex.grader for ex in numeric.eval} == {"numeric"}
    readable = sum(ex.answer == "Seven" for ex in numeric.eval)  # a number word: the numeric grader reads it
    assert evaluate(_Answering(right), prompts, numeric.eval).accuracy == readable / len(numeric.eval) < 0.5


def test_evaluation_keeps_what_the_model_answered_when_asked(tmp_path, write_module):
    """keep_completions (`podsrl eval --completions`): one record per problem in the held-out order,
    each completion with its grade, which is what the accuracy counted; none kept by default."""
    task = _word_task(tmp_path)
    prompts = [[i] for i in range(len(task.eval))]
    half = [ex.answer if i % 2 else "no idea" for i, ex in enumerate(task.eval)]
    assert evaluate(_Answering(half), prompts, task.eval).completions is None
    result = evaluate(_Answering(half), prompts, task.eval, EvalSettings(samples=2), keep_completions=True)
    assert [r["id"] for r in result.completions] == [ex.id for ex in task.eval]
    assert [r["answer"] for r in result.completions] == [ex.answer for ex in task.eval]
    assert all(r["question"] == ex.question for r, ex in zip(result.completions, task.eval))
    assert [[c["text"] for c in r["completions"]] for r in result.completions] == [[t, t] for t in half]
    graded = [c["grade"] for r in result.completions for c in r["completions"]]
    assert sum(g >= 1.0 for g in graded) / len(graded) == result.accuracy == 0.5
    assert all(c["truncated"] is False for r in result.completions for c in r["completions"])
    assert "completions" not in result.to_dict()  # eval.jsonl stays one short line per evaluation
    # A partial grade is kept as given, and is not counted right.
    module = write_module("half_grader_kept", "def half(completion, example):\n    return 0.5 if completion else 0.0\n")
    partial = evaluate(_Answering(["x"]), [[0]], [Example("1", "q", "x", grader=f"{module}:half")], keep_completions=True)
    assert partial.accuracy == 0.0 and partial.completions[0]["completions"][0]["grade"] == 0.5


def test_the_first_evaluation_warns_of_wrong_completions_that_hold_their_reference(tmp_path, capsys):
    """Issue 68: a grader that misses right word answers understates the base model's accuracy. An
    evaluation counts the completions graded wrong that hold their reference (words) as a word; the
    run's first evaluation with any says so once, naming the grader and the count, and where to look."""
    from podsrl.config import load
    from podsrl.run.watch import RunWatch, named_but_wrong_note

    task = _word_task(tmp_path)
    prompts = [[i] for i in range(len(task.eval))]
    sentences = [f"The answer is {ex.answer.lower()}." for ex in task.eval]  # right, and holding the reference
    assert evaluate(_Answering(sentences), prompts, task.eval).wrong_with_reference == 0  # right: not counted
    numeric = dataclasses.replace(task, grader="numeric")
    unread = evaluate(_Answering(sentences), prompts, numeric.eval, EvalSettings(samples=2))
    readable = sum(ex.answer == "Seven" for ex in numeric.eval)  # a number word: numeric reads it
    assert unread.wrong_with_reference == 2 * (len(task.eval) - readable) > 0
    denied = [f"It is not {ex.answer}." for ex in task.eval]  # rightly wrong, counted all the same: the note says to look
    assert evaluate(_Answering(denied), prompts, task.eval).wrong_with_reference == len(task.eval)
    assert evaluate(_Answering(["no idea"] * len(task.eval)), prompts, task.eval).wrong_with_reference == 0
    numbers = [Example(str(i), "q", str(i)) for i in range(3)]  # references of numbers: not counted
    assert evaluate(_Answering(["It is not 0, 1 or 2."] * 3), [[0], [1], [2]], numbers).wrong_with_reference == 0

    watch = RunWatch(load(None, []), "numeric")
    [note] = watch.evaluation(unread, 0)
    assert note.startswith("podsrl: warning: the evaluation at step 0: task.grader = 'numeric' graded ")
    assert f"graded {unread.wrong_with_reference} completions of the {len(task.eval)} problems wrong" in note and "--completions" in note
    assert watch.evaluation(unread, 10) == []  # once per run
    assert named_but_wrong_note(evaluate(_Answering(sentences), prompts, task.eval), "auto", "x") is None
    from podsrl.cli import _print_evaluation  # `podsrl eval` says it too

    _print_evaluation(unread, load(None, []), "numeric")
    assert "podsrl: warning: this evaluation: task.grader = 'numeric' graded" in capsys.readouterr().out


def test_partial_credit_is_not_a_right_answer_for_held_out_accuracy(write_module):
    module = write_module("half_grader", "def half(completion, example):\n    return 0.5 if completion else 0.0\n")
    example = Example("1", "q", "x", grader=f"{module}:half")
    assert correctness("x", example) == 0.5  # the reward is the grade
    assert evaluate(_Answering(["x"]), [[0]], [example]).accuracy == 0.0  # accuracy counts only full marks
    assert graders.grade_values(example.grader, [example]) is None  # undeclared


def test_task_grader_from_the_config(tmp_path, write_module):
    from podsrl.config import load
    from podsrl.tasks.build import build_task

    path = tmp_path / "words.jsonl"
    path.write_text("".join(json.dumps({"question": "q", "answer": w}) + "\n" for w in WORDS))
    base = ["task.name=jsonl", f"task.options.path={path}", "task.options.num_eval=2"]
    assert build_task(load(None, base)).grader == "auto"
    task = build_task(load(None, [*base, "task.grader=text"]))
    assert task.grader == "text" and {ex.grader for ex in task.train + task.eval} == {"text"}
    module = write_module("my_grader", "def exact(completion, example):\n    return float(completion == example.answer)\n"
                                       "exact.reward_values = (0.0, 1.0)\n")  # fmt: skip
    task = build_task(load(None, [*base, f"task.grader={module}:exact"]))
    assert task_values(task) == {"correctness": (0.0, 1.0)}
    assert correctness(task.eval[0].answer, task.eval[0]) == 1.0
    with pytest.raises(ConfigError, match=r"task.grader = 'exakt' is not a grader; valid graders: auto, numeric, text, math"):
        load(None, [*base, "task.grader=exakt"])
    with pytest.raises(ConfigError, match=r"task.grader = '.*:missing': reward .*has no attribute 'missing'"):
        build_task(load(None, [*base, f"task.grader={module}:missing"]))


def test_the_start_up_warning_is_logged_once(make_config, tmp_path, monkeypatch):
    """A run whose grader cannot read its held-out answers says so before training, once."""
    from podsrl.train import loop as trainer

    path = tmp_path / "words.jsonl"
    path.write_text("".join(json.dumps({"question": "Name it.", "answer": w}) + "\n" for w in WORDS))
    settings = {"task.name": "jsonl", "task.options": {"path": str(path), "num_eval": 4}, "train.max_steps": 1}
    logs: list[str] = []
    trainer.train(make_config(**settings, **{"task.grader": "numeric"}), run_dir=tmp_path / "run", log=logs.append)
    warnings = [line for line in logs if "held-out answers" in line]
    assert len(warnings) == 1 and warnings[0].startswith("podsrl: warning: 4 of 4 held-out answers"), logs
    # (Under the default grader, "auto", nothing to warn about: test_numeric_grader_never_matches_words...)


def test_compare_does_not_say_the_untrained_model_meets_a_target_of_zero(tmp_path):
    from tests.test_compare import _plan, _write_run
    from podsrl import compare

    plan = _plan(tmp_path, seeds=1)
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.0), (100, 0.0), (200, 0.0)])
    _write_run(out, plan, "pods", 0, [(0, 0.0), (100, 0.0), (200, 0.0)])
    report = compare.build_report(plan, out)
    assert not any("already meets the target" in n for n in report["notes"])
    assert any("never answered a held-out problem right" in n and "task.grader" in n for n in report["notes"])
    assert report["methods"]["pods"]["steps_to_target"] is None


def test_a_config_that_names_grader_code_says_so(tmp_path, write_module, capsys):
    """A user grader is code that evaluation imports and runs (SECURITY.md)."""
    from podsrl.cli import _say_reward_code
    from podsrl.config import load

    module = write_module("said_grader", "def exact(completion, example):\n    return float(completion == example.answer)\n")
    _say_reward_code(load(None, ["task.grader=auto"]), tmp_path / "config.toml")
    assert capsys.readouterr().out == ""
    _say_reward_code(load(None, [f"task.grader={module}:exact"]), tmp_path / "config.toml")
    assert capsys.readouterr().out == f"podsrl: {tmp_path / 'config.toml'} names grader code, which is imported and run (task.grader): {module}:exact\n"


def test_a_grade_just_under_one_is_not_full_credit_in_float32(tmp_path):
    """Any grader's sum of partial credits can land within float error of 1.0 (issue 57): such a grade
    stays below 1.0 where training keeps it (float32); 1.0 and ordinary partial credit are unchanged."""
    import torch

    from podsrl.grading.graders import BELOW_ONE

    (tmp_path / "near.py").write_text("def grade(completion, example):\n    return float(completion)\n")
    spec = f"{tmp_path / 'near.py'}:grade"
    for written, expected in (("0.9999999999999999", BELOW_ONE), ("0.99999997", BELOW_ONE), ("1.0", 1.0), ("0.5", 0.5), ("0.9999999", 0.9999999)):
        value = graders.grade(written, Example("q", "", "x", grader=spec))
        assert value == expected, written
        assert (torch.tensor([value], dtype=torch.float32).item() < 1.0) == (float(written) < 1.0), written


def test_one_answer_tag_read_alike_by_every_grader():
    """The `<answer>` tag is one definition (answers.ANSWER_TAG, any case), whose content the numeric
    and text graders read as they read a plain completion (issue 57)."""
    from podsrl.grading import answers, reasoning_gym

    assert not hasattr(reasoning_gym, "_ANSWER_TAG") and answers.ANSWER_TAG.flags & __import__("re").IGNORECASE
    assert graders.numeric("<answer>81.676.</answer>", Example("q", "", "81.676")) == graders.numeric("81.676.", Example("q", "", "81.676")) == 1.0
    assert graders.numeric("<Answer>12</Answer> and then 13", Example("q", "", "12")) == 1.0  # the tag marks the answer
    assert graders.text("<answer>The answer is Paris.</answer>", Example("q", "", "Paris")) == 1.0
    assert graders.auto("<ANSWER>**Paris**</ANSWER>", Example("q", "", "Paris")) == 1.0


@pytest.mark.parametrize("name", ["numeric", "text", "auto"])
def test_the_marked_answer_is_graded_not_the_last_number(name):
    """Where the final sentence marks its answer ("the answer is", "answer:"), that answer is graded,
    not a number after it (issue 57); a marker a later sentence corrects is not."""
    grader = graders.GRADERS[name]
    cases = [
        ("The answer is 81.676 because it is smaller than 91.278.", "81.676", "91.278"),
        ("The answer is 12, not 13.", "12", "13"),
        ("Answer: **12** (13 was a slip)", "12", "13"),
        ("The final answer is 3 + 4 = 7.", "7", "3"),
        ("The answer is $1,234. ", "1234", "1"),
        ("The answer is 7. Wait, 8", "8", "7"),  # the final sentence corrects it
        ("The answer is not 5, it is 6", "6", "5"),
    ]
    for completion, right, wrong in cases:
        assert grader(completion, Example("q", "", right)) == 1.0, (completion, right)
        assert grader(completion, Example("q", "", wrong)) == 0.0, (completion, wrong)


RED = "Which planet is known as the red planet?"
SPIDER = "How many legs does a spider have?"


@pytest.mark.parametrize(
    "question, reference, completion, right",
    [
        # Issue 57's new-user trial: right in a sentence, graded 0 before.
        ("What is the capital of Germany?", "Berlin", "The capital of Germany is Berlin.", True),
        ("What is the opposite of summer?", "winter", "The opposite of summer is winter.", True),
        ("What is the largest planet in our solar system?", "Jupiter", "The largest planet in our solar system is Jupiter.", True),
        ("What do bees make?", "honey", "bees make honey", True),
        (RED, "Mars", "The red planet is Mars.", True),
        (RED, "Mars", "It is Mars", True),
        (RED, "Mars", "Mars is the red planet.", True),
        (RED, "Mars", "Let me think.\nI think it's **Mars**!", True),
        # ... and graded right before, still right.
        (RED, "Mars", "The answer is Mars.", True),
        (RED, "Mars", "mars", True),
        (RED, "Mars", "Answer: Mars", True),
        (RED, "Mars", "**Mars.**", True),
        (RED, "Mars", "The answer is Mars, not Venus.", True),  # marked: a clause may follow
        (RED, "Mars", "The answer is Mars because it is red.", True),
        # Numbers and number words alike.
        (SPIDER, "eight", "8", True),
        (SPIDER, "8", "eight", True),
        (SPIDER, "8", "A spider has eight legs.", True),
        (SPIDER, "eight", "A spider has 8 legs.", True),
        (SPIDER, "eight", "The answer is 8.", True),
        (SPIDER, "twenty-one", "21", True),
        # Must stay wrong: a negation before it,
        (RED, "Mars", "It is not Mars.", False),
        (RED, "Mars", "It isn't Mars.", False),
        (RED, "Mars", "Venus, not Mars.", False),
        (SPIDER, "8", "Not eight.", False),
        # the reference inside another word, or another number,
        (RED, "Mars", "Marsh", False),
        (RED, "Mars", "The red planet is Marsh.", False),
        (SPIDER, "eight", "A spider has 8.5 legs.", False),
        (SPIDER, "8", "A spider has nine legs.", False),
        # several candidates ("or", a list, the question's alternatives, a word the question does not hold),
        (RED, "Mars", "Mars or Venus", False),
        (RED, "Mars", "Venus or Mars", False),
        (RED, "Mars", "The answer is Mars, or Venus.", False),
        (RED, "Mars", "Mars and Venus", False),
        (RED, "Mars", "Mars is bigger than Venus.", True),  # Mars offered, Venus compared (issue 68; was wrong: words the question lacks)
        ("Which is bigger, Mars or Jupiter?", "Jupiter", "Mars is bigger than Jupiter.", False),
        ("Which is bigger, Mars or Jupiter?", "Jupiter", "Mars Jupiter", False),
        # not the sentence's answer: neither its first nor its last words,
        ("What is the opposite of summer?", "winter", "The opposite of winter is summer.", False),
        (RED, "Mars", "Mars is not the red planet.", False),
        # not in the final sentence.
        (RED, "Mars", "The red planet is Mars. Or Venus.", False),
        (RED, "Mars", "Mars is red.\nBut the red planet is Venus.", False),
    ],
)
def test_a_word_answer_in_a_sentence(question, reference, completion, right):
    """The word rule (graders' docstring, docs/your-task.md): the reference named as the answer, no
    other candidate beside it (issues 57, 68)."""
    example = Example("1", question, reference)
    for name in ("text", "auto"):
        assert graders.GRADERS[name](completion, example) == (1.0 if right else 0.0), name


SEASONS = frozenset(("spring", "summer", "autumn", "winter"))


def test_the_task_answers_are_candidates():
    """A listing of the task's other answers is wrong once they are known (`Example.task_answers`,
    which a Task gives its examples); a word the grader does not know stands beside the reference as
    a candidate only in a list ("spring, autumn, winter"), not juxtaposed: the documented limit."""
    question = "What is the opposite of summer?"
    known = Example("1", question, "winter", task_answers=SEASONS)
    unknown = Example("1", question, "winter")
    for completion in ("spring autumn winter", "Spring. Autumn. Winter.", "The opposite of summer is winter or autumn."):
        assert graders.text(completion, known) == 0.0, completion
    assert graders.text("spring, autumn, winter", unknown) == 0.0
    assert graders.text("spring autumn winter", unknown) == 1.0  # the limit (graders' docstring): neither is known
    for completion in ("Winter.", "The opposite of summer is winter, when it is cold.", "Summer's opposite is winter, not spring."):
        assert graders.text(completion, known) == 1.0, completion
    # "summer" is the question's own word: repeating it names no second answer.
    assert graders.text("The opposite of summer is winter.", known) == 1.0


def test_a_task_gives_its_examples_its_answers(tmp_path):
    """Task gives every example one shared set of the task's answers (train and held-out), kept when
    the task is regraded; an Example built outside a task has none."""
    path = tmp_path / "languages.jsonl"
    rows = [("Italy", "Italian"), ("Germany", "German"), ("France", "French"), ("Spain", "Spanish"), ("Japan", "Japanese")]
    path.write_text("".join(json.dumps({"question": f"What language do people in {c} speak?", "answer": a}) + "\n" for c, a in rows))
    task = load_task("jsonl", path=str(path), num_eval=2)
    answers = {ex.task_answers for ex in task.train + task.eval}
    assert len(answers) == 1 and next(iter(answers)) == {a for _, a in rows}
    assert len({id(ex.task_answers) for ex in task.train + task.eval}) == 1  # one set, shared
    regraded = dataclasses.replace(task, grader="text")
    assert all(ex.task_answers is task.train[0].task_answers for ex in regraded.train + regraded.eval)
    italy = next(ex for ex in task.train + task.eval if ex.answer == "Italian")
    assert graders.auto("People in Italy speak Italian.", italy) == 1.0
    assert graders.auto("Italian, German, French", italy) == 0.0  # the task's answers listed
    assert graders.auto("Italian German", italy) == 0.0
    assert graders.auto("Italian German", dataclasses.replace(italy, task_answers=None)) == 1.0  # unknown: the limit
    assert Example("1", "q", "a").task_answers is None


@pytest.mark.parametrize("name", ["numeric", "text", "auto"])
def test_a_number_denied_or_hedged_is_not_the_answer(name):
    """Issue 68's numeric fixes: "The answer is 12 or 13." names neither, "It is 12, not 13" names 12;
    a number in an expression beside "or" is no hedge ("5A/5 or 20 = A", GSM8K's), nor one restated
    ("0.60 or 60%")."""
    grader = graders.GRADERS[name]
    cases = [
        ("The answer is 12 or 13.", (), ("12", "13")),
        ("12 or 13", (), ("12", "13")),
        ("It is 12, not 13", ("12",), ("13",)),
        ("It's not 42, it's 48.", ("48",), ("42",)),
        ("It has 8 legs, not 6 or 10.", ("8",), ("6", "10")),
        ("6, 8, 10", (), ("6", "8", "10")),
        ("6\n8", (), ("6", "8")),
        ("Then 100/5 = 5A/5 or 20 = A.", ("20",), ("5",)),
        ("She saved 210/350 = 0.60 or 60% off.", ("60",), ("0.60",)),
        ("The answer is 12, not 13.", ("12",), ("13",)),
    ]
    for completion, right, wrong in cases:
        for reference in right:
            assert grader(completion, Example("q", "What is it?", reference)) == 1.0, (completion, reference)
        for reference in wrong:
            assert grader(completion, Example("q", "What is it?", reference)) == 0.0, (completion, reference)


def test_numeric_reads_gsm8k_solutions_as_before():
    """Where nothing is denied or hedged, the numeric grader reads what extract_answer reads: GSM8K's
    reference solutions, without their "####" line (the last number), with "The answer is N." after
    them, and without the calculator's <<...>> marks, grade as the extracted number says (26,376 of
    26,376 over train and test when this was written; the test split here)."""
    path = Path("/work/shared/data/gsm8k/test.jsonl")
    if not path.is_file():
        pytest.skip(f"{path} not found")
    from podsrl.grading.answers import extract_answer, number_value
    from podsrl.tasks.jsonl import reference_answer

    for line in path.read_text().splitlines():
        row = json.loads(line)
        reference = reference_answer(row["answer"])
        body = row["answer"].rsplit("####", 1)[0].strip()
        for completion in (body, f"{body}\nThe answer is {reference}.", body.replace("<<", "").replace(">>", " ")):
            before = float(number_value(extract_answer(completion) or "") == number_value(reference))
            assert graders.numeric(completion, Example("q", row["question"], reference)) == before, completion[-200:]


@pytest.mark.parametrize("name", ["auto", "numeric", "text"])
@pytest.mark.parametrize(
    "completion, right",
    [
        ("First, 6 + 49 = 13² by the whole-game process. The answer is 109.", True),  # a run of issue 67 raised on the '²'
        ("The area is 10 m², so the answer is 109.", True),
        ("x² + 1 makes 108.", False),
        ("The answer is ٣", False),  # another script's decimal digit is a number (3), not a crash
    ],
)
def test_superscripts_and_other_digits_are_read_not_raised_on(name, completion, right):
    """``str.isdigit`` holds for '²' where ``int`` refuses it: a grader must read such a completion (a
    word, not a number) instead of raising, which stopped a training run at step 13 (2026-11-29)."""
    example = Example("60+49", "What is 60 + 49?", "109")
    assert getattr(graders, name)(completion, example) == (1.0 if right else 0.0)


@pytest.mark.parametrize("name", ["auto", "numeric", "text"])
def test_no_completion_makes_a_grader_raise(name):
    """Whatever a policy writes (any Unicode but lone surrogates, digits of every kind, marks of
    answers and LaTeX around them), the built-in graders return a grade in [0, 1]: a built-in grader
    that raises stops the run (issue 67's run stopped on '²')."""
    pieces = st.sampled_from(["The answer is ", "Answer: ", "\\boxed{", "}", " ", ". ", "1", "09", "²", "³", "½", "٣", "१", "Ⅻ", "-", "/", ",", "=", "x", "Paris"])
    text = st.lists(st.one_of(pieces, st.text(st.characters(exclude_categories=("Cs",)), max_size=6)), max_size=12).map("".join)

    @settings(max_examples=300, deadline=None, database=None)
    @given(text, st.sampled_from(["109", "Paris", "1/2", "-3"]))
    def check(completion, reference):
        assert 0.0 <= getattr(graders, name)(completion, Example("1", "What is it?", reference)) <= 1.0

    check()
