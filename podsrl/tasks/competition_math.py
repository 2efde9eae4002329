"""MATH-style problems with LaTeX answers (Hendrycks et al., 2021), graded with math-verify.

Options: `path` (required), `eval_path`, `question_field="problem"`, `answer_field="answer"`,
`solution_field="solution"`, `num_train`, `num_eval`, `seed`, `hub_config`, `train_split`,
`eval_split`.

`path` is one of
  - a JSON-lines file: the problems to train on; evaluation is on `eval_path`, or, without one,
    on `num_eval` rows held out of the file with the seed (as the `jsonl` task does);
  - a directory holding `train.jsonl` and `test.jsonl`;
  - a dataset the optional `datasets` package loads (`datasets.load_dataset(path, hub_config)`),
    such as a hub id, when no such file or directory exists: `train_split` to train on and
    `eval_split` to evaluate on (None: hold `num_eval` rows out of `train_split`, for datasets
    with one split such as HuggingFaceH4/MATH-500).

The reference of a row is its `answer_field` when the row has one (MATH-500, DeepScaleR), else the
content of the last `\\boxed{...}` in its `solution_field` (the original MATH files), stripped of
"$" around it. `correctness` compares it with the completion's final answer by value with
math-verify ("\\frac{\\sqrt{3}}{2}", intervals, sets, expressions), and exactly when both are plain
numbers (see `podsrl.grading.rewards`). Example ids are "<file name>:<line>", or "<split>:<row>" for a
dataset. `num_train`/`num_eval` of None mean all rows; a number picks that many with the seed,
kept in order.

The instruction asks for the answer in a box; the task has no system prompt.
"""

import random
from dataclasses import dataclass
from pathlib import Path

from podsrl.errors import ConfigError
from podsrl.grading.answers import last_boxed
from podsrl.tasks.types import Example, Task, check_count
from podsrl.tasks.jsonl import HUB_ID, existing_file, hold_out, load_dataset, read_rows, subsample

INSTRUCTION = "Think step by step, then put the final answer in \\boxed{}."


def load(
    *,
    path: str,
    eval_path: str | None = None,
    question_field: str = "problem",
    answer_field: str = "answer",
    solution_field: str = "solution",
    num_train: int | None = None,
    num_eval: int | None = None,
    seed: int = 0,
    hub_config: str | None = None,
    train_split: str = "train",
    eval_split: str | None = "test",
) -> Task:
    """MATH-style problems from a JSON-lines file, a directory or a dataset; see the module
    docstring. The keyword arguments are the task's options, as written in ``task.options`` and
    listed by ``podsrl config task --task.name=math`` (both read this signature), so they stay one
    flat list here; they are grouped at once: the fields of a row (:class:`_Fields`) and where the
    problems come from (:class:`_Source`)."""
    check_count("math", "num_train", num_train, allow_none=True)
    check_count("math", "num_eval", num_eval, allow_none=True)
    check_count("math", "seed", seed)
    # TOML has no null: "none" from a config file or the command line means None.
    hub_config, eval_split, eval_path = (
        None if _is_none(v) else v for v in (hub_config, eval_split, eval_path)
    )
    source = _Source(path, eval_path, hub_config, train_split, eval_split)
    rng = random.Random(f"math-{seed}")
    train, eval_, held_out = source.examples(_Fields(question_field, answer_field, solution_field), rng, num_eval)
    return Task(
        name="math",
        train=subsample(train, num_train, rng, option="task 'math': num_train", source=path),
        eval=subsample(eval_, None if held_out else num_eval, rng, option="task 'math': num_eval", source=eval_path or path),
        system_prompt=None,
        instruction=INSTRUCTION,
    )


@dataclass(frozen=True)
class _Fields:
    """Which fields of a row hold the problem, the final answer and the worked solution."""

    question: str
    answer: str
    solution: str

    def example(self, row: dict, example_id: str, where: str) -> Example:
        """The Example of one row; any problem with the row is a ConfigError naming `where`."""
        if self.question not in row:
            raise ConfigError(
                f"{where}: no field {self.question!r} ({_present(row)}); set question_field "
                "to the one holding the problem"
            )
        question = row[self.question]
        if not isinstance(question, str):
            raise ConfigError(f"{where}: field {self.question!r} must be a string")
        return Example(example_id, question, self._reference(row, where))

    def _reference(self, row: dict, where: str) -> str:
        answer = row.get(self.answer)
        if answer is not None and not isinstance(answer, bool) and str(answer).strip():
            if not isinstance(answer, (str, int, float)):
                raise ConfigError(f"{where}: field {self.answer!r} must be a string or a number")
            text = str(answer).strip()
            return _unwrap(last_boxed(text) or text)
        if self.solution in row:
            solution = row[self.solution]
            boxed = last_boxed(solution) if isinstance(solution, str) else None
            if boxed is None or not _unwrap(boxed):
                raise ConfigError(
                    f"{where}: field {self.solution!r} has no \\boxed{{...}} final answer, and "
                    f"the row has no {self.answer!r} field; give the answer in one of them"
                )
            return _unwrap(boxed)
        raise ConfigError(
            f"{where}: no field {self.answer!r} or {self.solution!r} ({_present(row)}); set "
            "answer_field (the final answer) or solution_field (a solution ending in \\boxed{...})"
        )


@dataclass(frozen=True)
class _Source:
    """Where the problems come from: ``path`` (a file, a directory or a dataset id), the file to
    evaluate on (``eval_path``, with a file) and, for a dataset, its config and splits."""

    path: str
    eval_path: str | None
    hub_config: str | None
    train_split: str
    eval_split: str | None

    def examples(self, fields: _Fields, rng: random.Random, num_eval: int | None) -> tuple[list[Example], list[Example], bool]:
        """(training examples, held-out examples, whether the held-out ones are num_eval rows held out
        of the training ones with ``rng``, so that no further draw is needed)."""
        path, local = self.path, Path(self.path).expanduser()
        if self.eval_path is not None and not local.is_file():
            raise ConfigError(
                f"task 'math': eval_path is for a path that is one JSON-lines file, and {path!r} is "
                "not (a directory gives test.jsonl, a dataset eval_split); drop eval_path"
            )
        if local.is_dir():
            return (*_load_directory(local, fields), False)
        if local.is_file():
            train = _read_file(local, fields)
            if self.eval_path is None:
                return (*hold_out(train, num_eval, rng, task="math", source=path), True)
            holding = "{problem, solution or answer} objects"
            return train, _read_file(existing_file(self.eval_path, "eval_path", task="math", holding=holding), fields), False
        if HUB_ID.fullmatch(path):
            train, eval_ = _load_dataset(path, self.hub_config, self.train_split, self.eval_split, fields)
            if self.eval_split is None:
                return (*hold_out(train, num_eval, rng, task="math", source=path), True)
            return train, eval_, False
        raise ConfigError(
            f"task 'math': path {path!r} is not a file or directory; expected a JSON-lines file "
            "of {problem, solution or answer} objects, a directory with train.jsonl and "
            "test.jsonl, or a dataset id such as 'HuggingFaceH4/MATH-500'"
        )


def _read_file(path: Path, fields: _Fields) -> list[Example]:
    return [fields.example(row, f"{path.name}:{n}", f"{path}:{n}") for n, row in read_rows(path)]


def _load_directory(directory: Path, fields: _Fields) -> tuple[list[Example], list[Example]]:
    splits = []
    for name in ("train.jsonl", "test.jsonl"):
        file = directory / name
        if not file.is_file():
            raise ConfigError(
                f"task 'math': {file} does not exist; a directory path must contain train.jsonl "
                "and test.jsonl (or pass path= a JSON-lines file)"
            )
        splits.append(_read_file(file, fields))
    return splits[0], splits[1]


def _load_dataset(
    name: str, config: str | None, train_split: str, eval_split: str | None, fields: _Fields
) -> tuple[list[Example], list[Example]]:
    dataset = load_dataset("math", name, config, what="a local file or directory", instead="pass path= a JSON-lines file")
    wanted = [("train_split", train_split)] + ([("eval_split", eval_split)] if eval_split else [])
    for option, split in wanted:
        if split not in dataset:
            raise ConfigError(
                f"task 'math': dataset {name!r} has no split {split!r} (its splits: "
                f"{', '.join(dataset)}); set {option}"
                + (", or eval_split='none' to hold num_eval rows out" if option == "eval_split" else "")
            )

    def examples(split: str) -> list[Example]:
        return [
            fields.example(dict(row), f"{split}:{i}", f"{name} [{split}] row {i}")
            for i, row in enumerate(dataset[split], start=1)
        ]

    return examples(train_split), examples(eval_split) if eval_split else []


def _unwrap(answer: str) -> str:
    """An answer without the "$...$" around it ("$\\frac{1}{2}$" -> "\\frac{1}{2}")."""
    return answer.strip().strip("$").strip()


def _is_none(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.lower() == "none")


def _present(row: dict) -> str:
    return "fields present: " + (", ".join(map(repr, row)) or "(none)")
