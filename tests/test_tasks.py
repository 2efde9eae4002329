"""Tasks: the arithmetic split, the GSM8K files, the JSON-lines loader and its error messages."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from podsrl.errors import ConfigError
from podsrl.tasks import TASKS, Example, format_user_message, load_task

GSM8K_DIR = Path("/work/shared/data/gsm8k")


# --- registry -------------------------------------------------------------------------------


def test_unknown_task_lists_valid_names():
    with pytest.raises(ConfigError, match="unknown task 'gsm9k'.*arithmetic, gsm8k, jsonl"):
        load_task("gsm9k")
    assert set(TASKS) == {"arithmetic", "gsm8k", "jsonl", "math", "reasoning_gym"}


def test_unknown_option_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError, match="no option 'num_digits'.*min_digits, max_digits"):
        load_task("arithmetic", num_train=10, num_digits=2)


def test_an_option_named_like_load_tasks_own_argument_is_an_unknown_option():
    # load_task(name, **options): an option `name` was a TypeError ("multiple values"), issue 57.
    with pytest.raises(ConfigError, match="task.options.name: task 'reasoning_gym' has no option 'name'.*task.options.dataset"):
        load_task("reasoning_gym", name="chain_sum")


def test_missing_required_option_is_named():
    with pytest.raises(ConfigError, match="needs option 'path'"):
        load_task("jsonl")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ops": ("/",)}, r"unknown operator\(s\) \['/'\]"),
        ({"ops": "+"}, "ops='\\+' must be a non-empty list"),
        ({"min_digits": 2, "max_digits": 1}, "min_digits=2 is larger than max_digits=1"),
        ({"max_digits": 0}, "max_digits=0 must be an int >= 1"),
        ({"num_eval": -1}, "num_eval=-1 must be a whole number"),
        ({"num_eval": 2.5}, "num_eval=2.5 must be a whole number"),
    ],
)
def test_bad_arithmetic_option_values(options, message):
    with pytest.raises(ConfigError, match=message):
        load_task("arithmetic", **{"num_train": 10, "num_eval": 5, **options})


def test_format_user_message_appends_the_instruction():
    task = load_task("arithmetic", num_train=1, num_eval=1)
    example = Example("1+1", "What is 1 + 1?", "2")
    assert format_user_message(example, task) == "What is 1 + 1?\nGive only the final number."
    bare = dataclasses.replace(task, instruction="")
    assert format_user_message(example, bare) == "What is 1 + 1?"


# --- arithmetic -----------------------------------------------------------------------------


def _arith(**options):
    return load_task("arithmetic", **{"num_train": 300, "num_eval": 50, **options})


def test_arithmetic_is_deterministic_by_seed():
    assert _arith(seed=3) == _arith(seed=3)
    assert _arith(seed=3).train != _arith(seed=4).train
    assert _arith(seed=3).eval != _arith(seed=4).eval


def test_arithmetic_op_order_does_not_matter():
    assert _arith(ops=["*", "+"]) == _arith(ops=("+", "*"))


def test_arithmetic_eval_does_not_depend_on_num_train():
    assert _arith(num_train=10).eval == _arith(num_train=5000).eval


@pytest.mark.parametrize(
    "options",
    [
        {},  # 100 problems: train (300) must repeat
        {"ops": ("+", "-", "*"), "max_digits": 2, "num_eval": 200, "num_train": 2000},
        {"ops": ("*",), "min_digits": 3, "max_digits": 4, "num_train": 1000},
    ],
)
def test_arithmetic_train_and_eval_are_disjoint_and_correct(options):
    task = _arith(**options)
    lo = 0 if options.get("min_digits", 1) == 1 else 10 ** (options.get("min_digits", 1) - 1)
    hi = 10 ** options.get("max_digits", 1) - 1
    eval_ids = {ex.id for ex in task.eval}
    assert len(eval_ids) == len(task.eval)  # eval has no repeats
    assert not eval_ids & {ex.id for ex in task.train}
    assert len(task.train) == options.get("num_train", 300)
    for ex in task.train + task.eval:
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", ex.question).groups()
        assert op in options.get("ops", ("+",))
        assert lo <= int(a) <= hi and lo <= int(b) <= hi
        assert ex.id == f"{a}{op}{b}"
        assert int(ex.answer) == eval(f"{a} {op} {b}")  # noqa: S307 (digits and one operator)


def test_arithmetic_train_is_distinct_when_enough_problems_exist():
    task = _arith(max_digits=2, num_train=5000, num_eval=100)  # 10,000 problems
    assert len({ex.id for ex in task.train}) == 5000


def test_arithmetic_small_space_uses_every_train_problem_with_replacement():
    task = _arith(num_train=1000, num_eval=20)  # 80 train problems left
    assert len({ex.id for ex in task.train}) == 80


def test_arithmetic_too_many_eval_problems_says_how_many_exist():
    too_many = r"num_eval=200 .* only 100 distinct problems.*max_digits"
    with pytest.raises(ConfigError, match=too_many):
        _arith(num_eval=200)
    with pytest.raises(ConfigError, match="only 200 distinct problems"):
        _arith(ops=("+", "*"), num_eval=200)
    assert len(_arith(num_eval=99).eval) == 99


# --- gsm8k ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gsm8k_task():
    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"GSM8K files not found in {GSM8K_DIR}")
    return load_task("gsm8k", path=str(GSM8K_DIR))


def test_gsm8k_reads_the_local_files(gsm8k_task):
    assert (len(gsm8k_task.train), len(gsm8k_task.eval)) == (7473, 1319)
    first = gsm8k_task.train[0]
    assert first.question.startswith("Natalia sold clips to 48 of her friends")
    assert first.answer == "72"
    assert first.id == "train.jsonl:1"
    numeric = re.compile(r"-?\d+(\.\d+)?")
    assert all(numeric.fullmatch(ex.answer) for ex in gsm8k_task.train + gsm8k_task.eval)


def test_gsm8k_subsets_are_seeded():
    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"GSM8K files not found in {GSM8K_DIR}")
    a = load_task("gsm8k", path=str(GSM8K_DIR), num_train=50, num_eval=20, seed=1)
    assert a == load_task("gsm8k", path=str(GSM8K_DIR), num_train=50, num_eval=20, seed=1)
    assert (len(a.train), len(a.eval)) == (50, 20)
    with pytest.raises(ConfigError, match="num_train=8000 but .* only 7473 rows"):
        load_task("gsm8k", path=str(GSM8K_DIR), num_train=8000)


def test_gsm8k_commas_are_removed_from_the_reference(tmp_path):
    row = {"question": "How much?", "answer": "Lots of steps.\n#### 1,234"}
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text(json.dumps(row) + "\n")
    assert load_task("gsm8k", path=str(tmp_path)).train[0].answer == "1234"


def test_gsm8k_missing_directory_or_file(tmp_path):
    expected = "'/no/such/dir' is not a directory.*train.jsonl and test.jsonl"
    with pytest.raises(ConfigError, match=expected):
        load_task("gsm8k", path="/no/such/dir")
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(ConfigError, match=r"test\.jsonl does not exist"):
        load_task("gsm8k", path=str(tmp_path))


def test_gsm8k_hub_id_without_datasets_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ConfigError, match=r"pip install 'podsrl\[datasets\]'"):
        load_task("gsm8k", path="openai/gsm8k")


# --- jsonl ----------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_split_off_eval_is_seeded_and_disjoint(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"Because.\n#### {i},000"} for i in range(1, 41)]
    train_path = _write_jsonl(tmp_path / "data.jsonl", rows)
    task = load_task("jsonl", train_path=train_path, num_eval=10, seed=2)
    assert task == load_task("jsonl", train_path=train_path, num_eval=10, seed=2)
    assert (len(task.train), len(task.eval)) == (30, 10)
    assert not {ex.id for ex in task.train} & {ex.id for ex in task.eval}
    first = next(ex for ex in task.train + task.eval if ex.id == "data.jsonl:1")
    assert (first.question, first.answer) == ("q1", "1000")  # "####" extracted, commas dropped


def test_jsonl_with_eval_file_custom_fields_and_numbers(tmp_path):
    rows = [{"problem": "2+2?", "solution": 4}, "", {"problem": "x", "solution": " 0.5 "}]
    train = _write_jsonl(tmp_path / "t.jsonl", rows)  # a blank line is skipped
    evals = _write_jsonl(tmp_path / "e.jsonl", [{"problem": "1+1?", "solution": "2"}])
    options = {
        "train_path": train,
        "eval_path": evals,
        "question_field": "problem",
        "answer_field": "solution",
    }
    task = load_task("jsonl", **options)
    assert task.train == [Example("t.jsonl:1", "2+2?", "4"), Example("t.jsonl:3", "x", "0.5")]
    assert task.eval == [Example("e.jsonl:1", "1+1?", "2")]
    assert len(load_task("jsonl", **options, num_train=1).train) == 1


def test_jsonl_error_messages(tmp_path):
    good = _write_jsonl(tmp_path / "good.jsonl", [{"question": "q", "answer": "1"}] * 3)
    with pytest.raises(ConfigError, match="path '/no/file.jsonl' is not a file"):
        load_task("jsonl", train_path="/no/file.jsonl", num_eval=1)
    with pytest.raises(ConfigError, match="eval_path '/no/eval.jsonl' is not a file"):
        load_task("jsonl", train_path=good, eval_path="/no/eval.jsonl")
    with pytest.raises(ConfigError, match="no eval_path, so set num_eval"):
        load_task("jsonl", train_path=good)
    with pytest.raises(ConfigError, match="num_eval=3 would hold out all 3 rows"):
        load_task("jsonl", train_path=good, num_eval=3)

    bad_json = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "1"}, "{oops"])
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: not valid JSON"):
        load_task("jsonl", train_path=bad_json, num_eval=0)

    missing = _write_jsonl(tmp_path / "missing.jsonl", [{"prompt": "q", "answer": "1"}])
    with pytest.raises(
        ConfigError,
        match=r"missing\.jsonl:1: no field 'question' \(fields present: 'prompt', 'answer'\); "
        "set question_field",
    ):
        load_task("jsonl", train_path=missing, num_eval=0)

    not_object = _write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])
    with pytest.raises(ConfigError, match=r"list\.jsonl:1: expected a JSON object"):
        load_task("jsonl", train_path=not_object, num_eval=0)

    empty = _write_jsonl(tmp_path / "empty.jsonl", [""])
    with pytest.raises(ConfigError, match="has no rows"):
        load_task("jsonl", train_path=empty, num_eval=0)


# --- math -----------------------------------------------------------------------------------

MATH_ROWS = [
    # The original MATH files: the answer is the last box of the solution.
    {"problem": "Compute $\\sin 60^\\circ$.", "solution": "It is $\\boxed{\\frac{\\sqrt{3}}{2}}$."},
    {"problem": "Solve $x^2 < 9$.", "solution": "First \\boxed{3}, then $x \\in \\boxed{(-3, 3)}$."},
    # MATH-500 style: an answer field wins over the solution; "$" around it is dropped.
    {"problem": "What is $2^{10}$?", "solution": "\\boxed{1000}", "answer": "$1024$"},
    {"problem": "Simplify $\\frac{4}{6}$.", "answer": "\\frac{2}{3}"},
    {"problem": "Which is largest?", "answer": "\\text{(C)}", "level": "Level 1"},
]


def test_math_reads_answers_from_the_answer_field_or_the_last_box(tmp_path):
    train = _write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    evals = _write_jsonl(tmp_path / "test.jsonl", [{"problem": "1+1?", "answer": 2}])
    task = load_task("math", path=train, eval_path=evals)
    assert [ex.answer for ex in task.train] == [
        "\\frac{\\sqrt{3}}{2}", "(-3, 3)", "1024", "\\frac{2}{3}", "\\text{(C)}"
    ]
    assert [ex.id for ex in task.train] == [f"math.jsonl:{i}" for i in range(1, 6)]
    assert task.train[0].question == "Compute $\\sin 60^\\circ$."
    assert task.eval == [Example("test.jsonl:1", "1+1?", "2")]
    assert task.name == "math" and task.system_prompt is None and "\\boxed{}" in task.instruction


def test_math_is_graded_with_math_verify(tmp_path):
    pytest.importorskip("math_verify")
    from podsrl.grading.rewards import correctness

    task = load_task("math", path=_write_jsonl(tmp_path / "m.jsonl", MATH_ROWS), num_eval=1)
    answers = {ex.question: ex for ex in task.train + task.eval}
    right = {
        "Compute $\\sin 60^\\circ$.": "So \\boxed{\\dfrac{\\sqrt 3}{2}}.",
        "Solve $x^2 < 9$.": "\\boxed{(-3,3)}",
        "What is $2^{10}$?": "\\boxed{2^{10}}",
        "Simplify $\\frac{4}{6}$.": "\\boxed{\\frac{4}{6}}",
        "Which is largest?": "\\boxed{C}",
    }
    wrong = {
        "Compute $\\sin 60^\\circ$.": "\\boxed{\\frac{\\sqrt 2}{2}}",
        "Solve $x^2 < 9$.": "\\boxed{[-3,3]}",
        "What is $2^{10}$?": "\\boxed{1000}",
        "Simplify $\\frac{4}{6}$.": "\\boxed{0.67}",
        "Which is largest?": "\\boxed{B}",
    }
    for question, example in answers.items():
        assert correctness(right[question], example) == 1.0, question
        assert correctness(wrong[question], example) == 0.0, question


def test_math_directory_holdout_and_subsets_are_seeded(tmp_path):
    rows = [{"problem": f"p{i}", "solution": f"\\boxed{{{i}}}"} for i in range(20)]
    (tmp_path / "d").mkdir()
    _write_jsonl(tmp_path / "d" / "train.jsonl", rows)
    _write_jsonl(tmp_path / "d" / "test.jsonl", rows[:5])
    task = load_task("math", path=str(tmp_path / "d"), num_train=8, num_eval=3, seed=1)
    assert len(task.train) == 8 and len(task.eval) == 3
    assert task == load_task("math", path=str(tmp_path / "d"), num_train=8, num_eval=3, seed=1)

    file = _write_jsonl(tmp_path / "all.jsonl", rows)
    split = load_task("math", path=file, num_eval=5, seed=3)
    assert len(split.train) == 15 and len(split.eval) == 5
    assert not {ex.id for ex in split.train} & {ex.id for ex in split.eval}
    assert split == load_task("math", path=file, num_eval=5, seed=3)
    assert split != load_task("math", path=file, num_eval=5, seed=4)


def test_math_custom_fields(tmp_path):
    rows = [{"question": "q", "final": "\\pi", "worked": "no box here"}]
    file = _write_jsonl(tmp_path / "c.jsonl", rows)
    task = load_task(
        "math", path=file, eval_path=file, question_field="question", answer_field="final"
    )
    assert task.train[0].answer == "\\pi"


def test_math_error_messages_name_the_file_line_and_field(tmp_path):
    with pytest.raises(ConfigError, match="path '/no/such.jsonl' is not a file or directory"):
        load_task("math", path="/no/such.jsonl")
    good = _write_jsonl(tmp_path / "good.jsonl", [{"problem": "p", "answer": "1"}] * 2)
    with pytest.raises(ConfigError, match="no eval_path, so set num_eval"):
        load_task("math", path=good)
    with pytest.raises(ConfigError, match="eval_path '/no/eval.jsonl' is not a file"):
        load_task("math", path=good, eval_path="/no/eval.jsonl")
    with pytest.raises(ConfigError, match="train.jsonl does not exist; a directory path must"):
        load_task("math", path=str(tmp_path))
    with pytest.raises(ConfigError, match="eval_path is for a path that is one JSON-lines file"):
        load_task("math", path=str(tmp_path), eval_path=good)

    no_box = _write_jsonl(tmp_path / "nobox.jsonl", [{"problem": "p", "solution": "It is 4."}])
    with pytest.raises(
        ConfigError, match=r"nobox\.jsonl:1: field 'solution' has no \\boxed\{\.\.\.\} final answer"
    ):
        load_task("math", path=no_box, eval_path=good)

    neither = _write_jsonl(tmp_path / "neither.jsonl", ["", {"problem": "p", "final": "4"}])
    with pytest.raises(
        ConfigError,
        match=r"neither\.jsonl:2: no field 'answer' or 'solution' \(fields present: 'problem', "
        r"'final'\); set answer_field",
    ):
        load_task("math", path=neither, eval_path=good)

    no_problem = _write_jsonl(tmp_path / "np.jsonl", [{"question": "p", "answer": "4"}])
    with pytest.raises(ConfigError, match=r"np\.jsonl:1: no field 'problem'.*set question_field"):
        load_task("math", path=no_problem, eval_path=good)

    bad_json = _write_jsonl(tmp_path / "bad.jsonl", ["{oops"])
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1: not valid JSON"):
        load_task("math", path=bad_json, eval_path=good)


def test_math_dataset_needs_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ConfigError, match=r"pip install 'podsrl\[datasets\]'"):
        load_task("math", path="HuggingFaceH4/MATH-500")


def test_math_dataset_splits(monkeypatch):
    # A stand-in for `datasets`: load_dataset returns {split: rows}, as a DatasetDict indexes.
    rows = [{"problem": f"p{i}", "answer": f"\\sqrt{{{i}}}", "level": 1} for i in range(10)]
    fake = type(sys)("datasets")
    fake.load_dataset = lambda name, config: {"test": rows}
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ConfigError, match=r"has no split 'train' \(its splits: test\); set train_split"):
        load_task("math", path="HuggingFaceH4/MATH-500")
    task = load_task(
        "math", path="HuggingFaceH4/MATH-500", train_split="test", eval_split="none", num_eval=4
    )
    assert len(task.train) == 6 and len(task.eval) == 4
    assert task.train[0].id.startswith("test:") and task.train[0].answer.startswith("\\sqrt")
    fake.load_dataset = lambda name, config: {"train": rows[:7], "test": rows[7:]}
    task = load_task("math", path="someone/math", num_train=5)
    assert len(task.train) == 5 and [ex.id for ex in task.eval] == ["test:1", "test:2", "test:3"]


# --- the same option names and prompts that agree (issue 38) -----------------------------------


def test_every_task_calls_its_training_data_path_and_jsonl_keeps_train_path(tmp_path):
    from podsrl.config import load

    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]
    data = _write_jsonl(tmp_path / "data.jsonl", rows)
    for name in ("jsonl", "gsm8k", "math"):
        assert "path" in __import__("inspect").signature(TASKS[name]).parameters
    assert load_task("jsonl", path=data, num_eval=2) == load_task("jsonl", train_path=data, num_eval=2)
    with pytest.raises(ConfigError, match="'train_path' is the older name of 'path'.*give only 'path'"):
        load_task("jsonl", path=data, train_path=data, num_eval=2)
    with pytest.raises(ConfigError, match=r"valid options: path \(or train_path, its older name\)"):
        load_task("jsonl", num_eval=2)
    # A config (or a run's saved config.toml) written with the older name loads as the new one.
    cfg = load(None, ["task.name=jsonl", f"task.options.train_path={data}", "task.options.num_eval=2"])
    assert cfg.task.options == {"path": data, "num_eval": 2}


@pytest.mark.parametrize("name", ["arithmetic", "gsm8k", "jsonl", "math"])
def test_each_tasks_default_prompt_agrees_with_its_instruction(name, tmp_path):
    """The config's default system prompt ("Answer with only the final number.", made for the
    arithmetic demo) replaced every task's, contradicting jsonl's "Think step by step"."""
    from podsrl.config import load
    from podsrl.tasks.build import build_task

    data = _write_jsonl(tmp_path / "data.jsonl", [{"question": "q", "problem": "q", "answer": "1"}] * 4)
    options = {"arithmetic": [], "gsm8k": [f"task.options.path={GSM8K_DIR}", "task.options.num_train=2", "task.options.num_eval=2"],
               "jsonl": [f"task.options.path={data}", "task.options.num_eval=1"],
               "math": [f"task.options.path={data}", "task.options.num_eval=1"]}[name]  # fmt: skip
    if name == "gsm8k" and not GSM8K_DIR.is_dir():
        pytest.skip("no GSM8K files")
    task = build_task(load(None, [f"task.name={name}", *options]))
    prompt = f"{task.system_prompt or ''} {task.instruction}".lower()
    asks_for_the_number_alone = "only the final number" in prompt
    asks_for_reasoning = "step by step" in prompt
    assert asks_for_the_number_alone != asks_for_reasoning, (task.system_prompt, task.instruction)
    assert asks_for_the_number_alone == (name == "arithmetic")


def test_a_data_path_from_another_worktree_is_the_same_setting(tmp_path, monkeypatch):
    """``../data/x.jsonl`` from two worktrees side by side is one file: saved without "..", and a run
    saved before that (its path with "..") loads without it, equal to the plan (a comparison's
    --report-only or resume from the other worktree found a "different config": issue 59's screening)."""
    from podsrl.config import load
    from podsrl.run.rundir import config_differences

    data = tmp_path / "data" / "mytask.jsonl"
    data.parent.mkdir()
    _write_jsonl(data, [{"question": "q", "answer": "1"}] * 4)
    configs = []
    for worktree in ("a", "b"):
        (tmp_path / worktree).mkdir()
        monkeypatch.chdir(tmp_path / worktree)
        configs.append(load(None, ["task.name=jsonl", "task.options.path=../data/mytask.jsonl", "task.options.num_eval=1"]))
    assert [c.task.options["path"] for c in configs] == [str(data)] * 2
    old = load(None, ["task.name=jsonl", f"task.options.path={tmp_path / 'a' / '..' / 'data' / 'mytask.jsonl'}", "task.options.num_eval=1"])
    assert old.task.options["path"] == str(data) and config_differences(old, configs[1]) == {}
    other = load(None, ["task.name=jsonl", f"task.options.path={tmp_path / 'a' / 'mytask.jsonl'}", "task.options.num_eval=1"])
    assert set(config_differences(other, configs[1])) == {"task.options"}


def test_relative_data_paths_are_made_absolute_when_the_config_is_built(tmp_path, monkeypatch):
    from podsrl.config import load, to_toml

    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "mytask.jsonl", [{"question": "q", "answer": "1"}] * 4)
    (tmp_path / "my_rewards.py").write_text("def fn(completion, example):\n    return 0.0\n")
    (tmp_path / "my-model").mkdir()
    cfg = load(None, ["task.name=jsonl", "task.options.path=mytask.jsonl", "task.options.num_eval=1",
                      "reward.names=my_rewards.py:fn,correctness", "reward.weights=1,1", "model.name=my-model"])  # fmt: skip
    assert cfg.task.options["path"] == str(tmp_path / "mytask.jsonl")
    assert cfg.reward.names == [f"{tmp_path / 'my_rewards.py'}:fn", "correctness"]
    assert cfg.model.name == str(tmp_path / "my-model")
    assert str(tmp_path / "mytask.jsonl") in to_toml(cfg)
    # What does not exist here (a dataset id, a missing file, the embedded model, a module) stays as given.
    cfg = load(None, ["task.name=math", "task.options.path=HuggingFaceH4/MATH-500", "reward.names=my_module:fn",
                      "model.name=smollm2-135m-instruct"])  # fmt: skip
    assert cfg.task.options["path"] == "HuggingFaceH4/MATH-500" and cfg.reward.names == ["my_module:fn"]
    assert cfg.model.name == "smollm2-135m-instruct"
