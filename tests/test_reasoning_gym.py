"""The reasoning_gym task (podsrl/tasks/reasoning_gym.py) and its graders
(podsrl/grading/reasoning_gym.py): loading (sizes, seeds, held-out problems disjoint from training),
the dataset's own score_answer as the reward (right, wrong, partial credit) and as held-out
accuracy, declared reward values, a weighted mix, configuration errors, the missing extra, the
config docs, and the TRL example's reward (issue 47)."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from podsrl.errors import ConfigError
from podsrl.grading import reasoning_gym as rg_grading
from podsrl.grading.graders import grade, ungraded_note
from podsrl.grading.rewards import correctness, task_values
from podsrl.tasks import format_user_message, load_task
from podsrl.tasks import reasoning_gym as rg_task

from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]


def _missing_reasoning_gym(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "reasoning_gym" or name.startswith("reasoning_gym."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_a_missing_extra_is_a_config_error_naming_it(monkeypatch):
    _missing_reasoning_gym(monkeypatch)
    with pytest.raises(ConfigError, match=r"need the reasoning-gym package.*pip install 'podsrl\[reasoning-gym\]'"):
        load_task("reasoning_gym", dataset="chain_sum")
    with pytest.raises(ConfigError, match=r"podsrl\[reasoning-gym\]"):
        rg_grading.require()



def _task(dataset: str, **options):
    return load_task("reasoning_gym", dataset=dataset, **{"num_train": 20, "num_eval": 10, **options})


def test_loading_sizes_ids_prompt_and_what_scoring_needs():
    task = _task("chain_sum", config={"max_terms": 3})
    assert task.name == "reasoning_gym" and (len(task.train), len(task.eval)) == (20, 10)
    assert task.grader == "reasoning_gym" and {ex.grader for ex in task.train + task.eval} == {"reasoning_gym"}
    example = task.train[3]
    assert example.id == "chain_sum:train:3" and task.eval[0].id.startswith("chain_sum:eval:")
    assert example.data["dataset"] == "chain_sum" and example.data["config"] == {"max_terms": 3}
    assert example.data["entry"]["question"] == example.question and example.data["entry"]["answer"] == example.answer
    assert all(ex.data["entry"]["metadata"]["num_terms"] <= 3 for ex in task.train)  # the config reached the dataset
    # podsrl's prompt: the dataset's question, then the instruction for the answer format.
    assert format_user_message(example, task) == f"{example.question}\nGive your final answer between <answer> and </answer> tags."
    assert task.system_prompt is None
    plain = _task("chain_sum", answer_format="plain")
    assert (plain.system_prompt, plain.instruction) == ("Answer with only the final answer.", "Give only the final answer.")
    assert ungraded_note(task.eval) is None  # every reference, written as the answer, gets full credit


def test_the_same_seed_gives_the_same_problems_and_another_seed_others():
    first, again, other = _task("leg_counting", seed=1), _task("leg_counting", seed=1), _task("leg_counting", seed=2)
    questions = lambda t: [ex.question for ex in t.train + t.eval]  # noqa: E731
    assert questions(first) == questions(again)
    assert questions(first) != questions(other)


def test_held_out_problems_are_disjoint_from_training_even_in_a_small_space():
    """Two seeds alone overlap in a small space (2 one-digit terms: 200 problems); the check removes
    every held-out question that is a training question."""
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    task = _task("chain_sum", config=small, num_train=150, num_eval=30)
    train = {ex.question for ex in task.train}
    held_out = [ex.question for ex in task.eval]
    assert len(held_out) == 30 and len(set(held_out)) == 30 and not train & set(held_out)
    # What the check did: the first 30 items of the evaluation seed hold training questions.
    eval_seed = rg_task._derived_seed("eval", 0)
    raw = rg_task._build(rg_task._specs("chain_sum", small, None), seed=eval_seed, size=30)
    assert any(raw[i]["question"] in train for i in range(30))
    assert int(task.eval[-1].id.rsplit(":", 1)[1]) > 29  # so it read past them
    with pytest.raises(ConfigError, match=r"only \d+ held-out problems whose questions are not training questions.*lower num_eval"):
        _task("chain_sum", config=small, num_train=1000, num_eval=150)


def _tagged(answer: str) -> str:
    return f"Let me think.\n<answer>{answer}</answer>"


@pytest.mark.parametrize(
    "dataset, wrong, partial",
    [
        # (the dataset, a wrong answer from the right one, a partly right one and its score)
        ("chain_sum", lambda a: str(int(a) + 1), lambda a: (f"{a}0", len(a) / len(f"{a}0"))),
        ("leg_counting", lambda a: str(int(a) + 2), lambda a: (f"{a}0", len(a) / len(f"{a}0"))),
        ("letter_counting", lambda a: str(int(a) + 1), lambda a: (f"{a}0", len(a) / len(f"{a}0"))),
        ("spell_backward", lambda a: "zz", lambda a: (a[:-1] + ("a" if a[-1] != "a" else "b"), (len(a) - 1) / len(a))),
        ("word_sorting", lambda a: "zzz", lambda a: (", ".join(a.split(", ")[1:] + a.split(", ")[:1]), 0.2)),  # none in place
    ],
)
def test_the_reward_is_the_datasets_own_score(dataset, wrong, partial):
    config = {"min_words": 3, "max_words": 3} if dataset == "word_sorting" else {}
    task = _task(dataset, config=config, num_train=5, num_eval=2)
    example = task.train[0]
    answer = example.answer
    assert correctness(_tagged(answer), example) == 1.0
    assert correctness(answer, example) == 1.0  # no tags: the whole completion is the answer
    assert correctness(_tagged(wrong(answer)), example) == 0.0
    text, score = partial(answer)
    assert correctness(_tagged(text), example) == pytest.approx(score)
    assert 0 < score < 1
    assert grade(_tagged(text), example) == pytest.approx(score)


def test_knights_knaves_and_countdown_give_their_partial_credit():
    kk = _task("knights_knaves", num_train=2, num_eval=1).train[0]
    names = [str(n) for n in kk.data["entry"]["metadata"]["names"]]
    terms = kk.data["entry"]["metadata"]["knight_knave_terms"]
    one_wrong = kk.answer.replace(f"{names[0]} is {terms['a_knight']}", f"{names[0]} is {terms['a_knave']}") \
        if f"{names[0]} is {terms['a_knight']}" in kk.answer else kk.answer.replace(f"{names[0]} is {terms['a_knave']}", f"{names[0]} is {terms['a_knight']}")  # fmt: skip
    assert correctness(_tagged(kk.answer), kk) == 1.0
    assert correctness(_tagged(one_wrong), kk) == pytest.approx(0.3 + 0.7 * (len(names) - 1) / len(names))
    cd = _task("countdown", num_train=2, num_eval=1).train[0]
    assert correctness(_tagged(cd.answer), cd) == 1.0
    numbers, target = cd.data["entry"]["metadata"]["numbers"], cd.data["entry"]["metadata"]["target"]
    assert sum(numbers) != target  # (seed 0's first problem)
    assert correctness(_tagged(" + ".join(map(str, numbers))), cd) == 0.05  # every number used, another value
    assert correctness("no idea", cd) == 0.01


def test_held_out_accuracy_counts_full_credit_only():
    from tests.test_graders import _Answering
    from podsrl.train.evaluate import evaluate

    task = _task("spell_backward", num_train=5, num_eval=4)
    answers = [_tagged(ex.answer) if i < 2 else _tagged(ex.answer[:-1] + "#") for i, ex in enumerate(task.eval)]
    result = evaluate(_Answering(answers), [[i] for i in range(4)], task.eval)
    assert result.accuracy == 0.5  # two right, two with partial credit (all but one letter)


def test_declared_values_where_known():
    spell = _task("spell_backward")
    values = task_values(spell)["correctness"]
    assert values is not None and {0.0, 0.8, 1.0} <= set(values)
    # Every score a perturbed answer gets is declared (within the float tolerance rewards are checked with).
    for ex in spell.train:
        for text in (ex.answer, ex.answer[:-1], ex.answer + "x", ex.answer[::-1], "", ex.answer[1:], ex.answer.upper()):
            for completion in (_tagged(text), text, f"The answer is: {text}.", f"'{text}'"):  # tagged or extracted
                assert any(abs(grade(completion, ex) - v) <= 1e-6 for v in values), (ex.answer, completion)
    sort = _task("word_sorting", config={"min_words": 3, "max_words": 4})
    assert set(task_values(sort)["correctness"]) == {0.0, 0.2, 1 / 4, 1 / 3, 0.5, 2 / 3, 3 / 4, 1.0}
    assert task_values(_task("chain_sum"))["correctness"] is None  # the length-ratio partial credit takes any value
    binary = _task("chain_sum", partial_credit=False)
    assert binary.grader == "reasoning_gym_binary" and task_values(binary) == {"correctness": (0.0, 1.0)}
    example = binary.train[0]
    assert correctness(_tagged(example.answer), example) == 1.0 and correctness(_tagged(f"{example.answer}0"), example) == 0.0


def test_exact_early_stopping_follows_the_declared_values():
    from podsrl.config import load
    from podsrl.train.loop import preflight

    base = ["task.name=reasoning_gym", "task.options.num_train=20", "task.options.num_eval=5", "rollout.early_stop=exact"]
    assert preflight(load(None, [*base, "task.options.dataset=chain_sum", "task.options.partial_credit=false"]))[1] == (0.0, 1.0)
    with pytest.raises(ConfigError, match=r"rollout.early_stop = 'exact'.*declare"):
        preflight(load(None, [*base, "task.options.dataset=chain_sum"]))
    # More than two values: a rule that needs only the maximum (max_variance needs binary rewards).
    assert 0.2 in preflight(load(None, [*base, "task.options.dataset=word_sorting", "select.rule=max_reward"]))[1]


def test_a_weighted_mix_draws_from_each_dataset_with_its_config():
    task = load_task("reasoning_gym", datasets=[{"name": "chain_sum", "weight": 3}, {"name": "leg_counting", "config": {"max_animals": 3}}],
                     num_train=40, num_eval=10)  # fmt: skip
    sources = [ex.data["dataset"] for ex in task.train]
    assert set(sources) == {"chain_sum", "leg_counting"} and sources.count("chain_sum") > sources.count("leg_counting")
    legs = [ex for ex in task.train if ex.data["dataset"] == "leg_counting"]
    assert all(ex.data["config"] == {"max_animals": 3} and ex.data["entry"]["metadata"]["num_animals"] <= 3 for ex in legs)
    assert legs[0].id.startswith("leg_counting:train:")
    for ex in task.train[:6] + task.eval[:4]:  # each scored by its own dataset
        assert correctness(_tagged(ex.answer), ex) == 1.0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dataset": "chian_sum"}, r"'chian_sum', not a reasoning-gym dataset; did you mean 'chain_sum'"),
        ({}, r"neither of the options dataset and datasets given"),
        ({"dataset": "chain_sum", "datasets": [{"name": "gcd"}]}, r"both of the options dataset and datasets given"),
        ({"dataset": "chain_sum", "config": {"max_term": 3}}, r"chain_sum's config has no setting 'max_term'; its settings: min_terms, max_terms"),
        ({"dataset": "chain_sum", "config": {"seed": 3}}, r"sets 'seed', which the task sets from its option seed"),
        ({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}}, r"reasoning-gym refused the configuration of chain_sum"),
        ({"datasets": [{"name": "gcd", "weight": 0}]}, r"weight=0 must be a number > 0"),
        ({"datasets": [{"name": "gcd"}, {"name": "gcd"}]}, r"names a dataset twice"),
        ({"datasets": [{"nam": "gcd"}]}, r"must be a table \{name, weight = 1, config = \{\}\}"),
        ({"dataset": "gcd", "answer_format": "xml"}, r"answer_format='xml' must be one of 'tags', 'plain'"),
    ],
)
def test_bad_options_are_config_errors_that_say_the_fix(options, message):
    with pytest.raises(ConfigError, match=message):
        load_task("reasoning_gym", **{"num_train": 5, "num_eval": 2, **options})


def test_config_docs_describe_every_option():
    from podsrl.configdoc import render
    from podsrl.config import load

    text = render(load(None, ["task.name=reasoning_gym"]), "task")
    for option in ("dataset", "config", "datasets", "num_train", "num_eval", "seed", "answer_format", "partial_credit"):
        assert f"#   {option}: " in text, option
    assert "chain_sum" in text and "weighted mix" in text and "grader" in text


def test_the_trl_example_builds_a_dataset_and_a_reward_that_grades_its_rows():
    with script_module(ROOT / "examples" / "trl_reasoning_gym.py") as example:
        task, dataset, reward = example.build(dataset="word_sorting", config={"min_words": 3, "max_words": 3}, num_train=4, num_eval=2)
    assert dataset.column_names == ["prompt", "answer", "id"] and len(dataset) == 4
    rows = dataset[:3]
    assert rows["prompt"][0][-1]["content"].endswith("Give your final answer between <answer> and </answer> tags.")
    words = rows["answer"][0].split(", ")
    completions = [
        [{"role": "assistant", "content": _tagged(rows["answer"][0])}],  # right
        [{"role": "assistant", "content": _tagged("nothing")}],  # wrong
        [{"role": "assistant", "content": _tagged(", ".join([words[1], words[0], words[2]]))}],  # partly: one word in place
    ]
    scores = reward(rows["prompt"], completions, answer=rows["answer"], id=[rows["id"][0]] * 3)
    assert scores[:2] == [1.0, 0.0] and scores[2] == pytest.approx(1 / 3)
    assert reward.__name__ == "correctness"


def test_a_dataset_without_a_reference_answer_raises_no_false_warning():
    """graph_color accepts many colourings, so its entries have no answer: the start-up check (a
    reference written as the completion must get full marks) has nothing to check there."""
    task = _task("graph_color", num_train=3, num_eval=2)
    assert task.eval[0].answer == "" and ungraded_note(task.eval) is None
    assert correctness("<answer>not a colouring</answer>", task.eval[0]) == 0.0


# The extracted answer (podsrl.grading.reasoning_gym.extract): a completion that states the answer in a
# sentence is scored on the answer, as podsrl's own arithmetic task scores its final number.


def _positive(task):
    """A training example whose answer is a positive number (so "1" + answer is another number)."""
    return next(ex for ex in task.train if not ex.answer.startswith("-"))


@pytest.mark.parametrize("dataset", ["gcd", "basic_arithmetic", "chain_sum"])
def test_a_number_stated_in_a_sentence_gets_full_credit(dataset):
    example = _positive(_task(dataset))
    a = example.answer
    for completion in (a, f"The answer is {a}.", f"gcd = {a}", f"The GCD of 50 and 46 is {a}.", f"So, 3 + 4 = {a}.",
                       f"**{a}**", f"First 7, then\n{a}", f"The answer is \\boxed{{{a}}}."):  # fmt: skip
        assert grade(completion, example) == 1.0, completion
    assert correctness(f"The answer is {int(a) + 1}.", example) == 0.0  # a wrong number
    assert correctness(f"{a} + 1 = {int(a) + 1}", example) == 0.0  # the final number counts
    assert correctness("I do not know.", example) == 0.0


def test_a_word_answer_after_answer_is_gets_full_credit():
    for dataset, config in (("spell_backward", {}), ("word_sorting", {"min_words": 3, "max_words": 3}), ("letter_counting", {})):
        example = _task(dataset, config=config).train[0]
        for completion in (f"The answer is: {example.answer}.", f"Answer: {example.answer}", f'"{example.answer}"',
                           f"Let me think.\n{example.answer}", f"The answer is **{example.answer}**!"):  # fmt: skip
            assert grade(completion, example) == 1.0, (dataset, completion)
        assert grade(f"The answer is: {example.answer}0.", example) < 1.0, dataset  # another answer


def test_what_is_extracted():
    extract = rg_grading.extract
    assert extract("The GCD of 50 and 46 is 2.", "2") == "2"
    assert extract("7 - 9 = -2", "-2") == "-2" and extract("It is 1,234.", "1234") == "1234"
    assert extract("<answer>about 2</answer> or 3", "2") == "2"  # a tag's content, read as an untagged completion is
    assert extract("no number here", "2") == "no number here"  # no number: the text's answer, for the checker to refuse
    assert extract("The word is:\n'olleh'.", "olleh") == "olleh"
    assert extract("The answer is: Smith has to perform.", "Smith has to perform.") == "Smith has to perform."  # its own period kept
    assert extract("Reordered: Smith has to perform.", "Smith has to perform.") == "Reordered: Smith has to perform."  # no marker: the line
    assert extract("The answer is 1.7e-22", "1.7e-22") == "1.7e-22"  # scientific notation is not a number podsrl reads: text
    # A final number in scientific notation comes back whole (its exponent alone was read before).
    assert extract("The largest is 5.967100000000000e+01.", "59.671") == "5.967100000000000e+01"
    assert extract("x is -1.5E-3!", "2") == "-1.5E-3" and extract("2e3, or rather 5", "5") == "5" and extract("value 3e", "3") == "3"
    grid = "1 2\n3 4"
    assert extract(f"Here:\n{grid}\n", grid) == f"Here:\n{grid}"  # several lines: the whole completion (the last line is not the grid)
    assert extract("  anything  ", None) == "anything"  # no reference (a checker of many answers): the whole completion
    assert extract("  ", "2") is None and extract("<answer> </answer>", "x") is None


def test_number_format_accepts_the_candidate_as_written_in_scientific_notation():
    """number_format's candidates are written in several notations ("5.967100000000000e+01") and its
    checker reads the answer with float(): a candidate copied as written is the right answer."""
    task = _task("number_format", config={"min_num_candidates": 2, "max_num_candidates": 2, "min_n": 1, "max_n": 100}, num_train=40)
    written, example = next(
        (word, ex) for ex in task.train for word in ex.data["entry"]["question"].split()
        if "e+" in word and abs(float(word) - float(ex.answer)) < 1e-2
    )  # fmt: skip
    assert correctness(f"The answer is {written}.", example) == 1.0
    assert correctness(f"It is {float(written) + 1:e}.", example) == 0.0


def test_a_tagged_answer_is_read_as_the_plain_one_is():
    """One unwrapping for a tag's content and an untagged completion (issue 57): "<answer>81.676.</answer>"
    scored 0 (the checker's float() refused the period) while the plain "81.676." scored 1."""
    task = _task("number_format", config={"min_num_candidates": 2, "max_num_candidates": 2, "min_n": 1, "max_n": 100}, num_train=40)
    example = next(ex for ex in task.train if "." in ex.answer)
    a = example.answer
    for answer in (f"{a}.", f"The answer is {a}.", f"**{a}**", f" {a} "):
        assert correctness(answer, example) == 1.0, answer
        for tagged in (f"<answer>{answer}</answer>", f"<ANSWER>{answer}</Answer>", f"Let me see.\n<answer>{answer}</answer>"):
            assert correctness(tagged, example) == 1.0, tagged
    spell = _task("spell_backward").train[0]
    for tagged in (f"<answer>{spell.answer}.</answer>", f"<answer>The answer is: '{spell.answer}'</answer>"):
        assert rg_grading.extract(tagged, spell.answer) == spell.answer
    assert correctness(f"<answer>{float(a) + 1}</answer>", example) == 0.0  # another number stays wrong


def test_partial_credit_is_the_datasets_on_the_extracted_answer():
    example = _positive(_task("chain_sum"))
    a = example.answer
    # reasoning-gym's default: len(reference) / len(answer) when the answer holds the reference.
    assert correctness(f"The answer is {a}0.", example) == pytest.approx(len(a) / len(a + "0"))
    assert correctness(_tagged(f"{a}0"), example) == pytest.approx(len(a) / len(a + "0"))  # a tag's content: the same
    spell = _task("spell_backward").train[0]
    b = spell.answer
    assert correctness(f"The answer is: {b[:-1]}#.", spell) == pytest.approx((len(b) - 1) / len(b))
    binary = _task("chain_sum", partial_credit=False)
    assert correctness(f"The answer is {binary.train[0].answer}.", binary.train[0]) == 1.0


def test_a_score_just_under_full_credit_stays_under_it_in_float32():
    """spell_backward adds 1/L L times for every letter in place and more after them: 0.9999999999999999
    for "ycnamorihcx" against "ycnamorihc" (issue 57), which float32 (where training keeps rewards)
    rounded to full credit."""
    import dataclasses

    import torch

    from podsrl.grading.graders import BELOW_ONE, is_right

    spell = _task("spell_backward").train[0]
    entry = {**spell.data["entry"], "answer": "ycnamorihc"}
    example = dataclasses.replace(spell, answer="ycnamorihc", data={**spell.data, "entry": entry})
    raw = rg_grading.score("ycnamorihcx", example)
    assert 1.0 - 1e-15 < raw < 1.0  # reasoning-gym's own score: not full credit, but within float error of it
    reward = correctness("ycnamorihcx", example)
    assert reward == BELOW_ONE and torch.tensor([reward], dtype=torch.float32).item() < 1.0
    assert not is_right("ycnamorihcx", example)
    assert torch.tensor([correctness("ycnamorihc", example)], dtype=torch.float32).item() == 1.0  # the answer itself


def test_held_out_accuracy_reads_the_sentence_too():
    from tests.test_graders import _Answering
    from podsrl.train.evaluate import evaluate

    task = _task("gcd", num_train=5, num_eval=4)
    answers = [f"The GCD is {ex.answer}." if i < 3 else f"The GCD is {int(ex.answer) + 1}." for i, ex in enumerate(task.eval)]
    assert evaluate(_Answering(answers), [[i] for i in range(4)], task.eval).accuracy == 0.75


@pytest.mark.slow
def test_every_datasets_reference_in_a_sentence_is_graded_right():
    """Across reasoning-gym's datasets (default settings, a few problems each; 11 s), the reference
    written alone, after "The answer is: ", and as a tag's content gets full credit from the dataset's
    checker, and text that is no answer gets a grade (a checker's exception is a 0.0)."""
    failures = []
    for name in rg_task.dataset_names():
        try:
            task = _task(name, num_train=3, num_eval=1)
        except ConfigError:
            continue  # a dataset that needs data or settings not given here
        for ex in task.train:
            if not ex.answer or "\n" in ex.answer.strip():
                continue
            for completion in (ex.answer, _tagged(ex.answer), f"The answer is: {ex.answer}"):
                if grade(completion, ex) < 1.0:
                    failures.append((name, ex.answer, completion))
            assert 0.0 <= grade("I do not know.", ex) <= 1.0, name  # (game_of_life_halting's checker: 1.0, bool("False"))
    assert not failures, failures


def test_a_checker_that_raises_on_an_answer_scores_it_zero():
    """prime_factorization's checker calls int() on each factor, so an answer that is a sentence
    raised ValueError inside the reward."""
    example = _task("prime_factorization", num_train=2, num_eval=1).train[0]
    assert correctness("I do not know.", example) == 0.0
    assert correctness(f"The answer is: {example.answer}", example) == 1.0


def test_operators_without_their_weights_get_even_weights():
    """simple_equations' default operators_weights has 3 entries (for + - *): operators ["+", "-"] alone
    crashed when its items were generated (random.choices: weights and population differ)."""
    task = _task("simple_equations", config={"operators": ["+", "-"], "min_terms": 2, "max_terms": 2})
    assert task.train[0].data["config"]["operators_weights"] == [0.5, 0.5]
    assert all("*" not in ex.data["entry"]["metadata"]["equation"] for ex in task.train)
    kept = _task("simple_equations", config={"operators": ["+", "-", "*"]})  # the defaults fit: kept as they are
    assert "operators_weights" not in kept.train[0].data["config"]
    complex_ = _task("complex_arithmetic", config={"operations": ["+", "*"]})
    assert complex_.train[0].data["config"]["operations_weights"] == [0.5, 0.5]


def test_an_item_reasoning_gym_cannot_generate_is_a_config_error():
    with pytest.raises(ConfigError, match=r"could not generate simple_equations's item 0.*weights.*task.options.config: simple_equations's operators has 2 entries and operators_weights 3"):
        _task("simple_equations", config={"operators": ["+", "-"], "operators_weights": [0.4, 0.4, 0.2]})
