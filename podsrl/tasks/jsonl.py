"""Any JSON-lines file of questions and answers.

Options: `path` (required: the file to train on; `train_path`, its older name, is still accepted),
`eval_path` (optional), `question_field="question"`, `answer_field="answer"`, `num_train`,
`num_eval`, `seed`.

Each non-blank line is one JSON object. The answer may be a string or a number; if it contains
"####" (GSM8K style) the reference is the text after the last "####" with thousands commas
removed, otherwise the whole answer stripped. Without `eval_path`, `num_eval` rows are held out
of the training file with the seed (disjoint by row, so duplicated rows in the file can still
leak); then `num_eval` is required. `num_train`/`num_eval` of None mean all rows; a number picks
that many rows at random with the seed, kept in file order; asking for more rows than the file
has is a ConfigError. Example ids are "<file name>:<line>".

The reading helpers here are shared with the gsm8k and math tasks.
"""

import json
import random
import re
from pathlib import Path

from podsrl.errors import ConfigError
from podsrl.tasks.types import Example, Task, check_count

INSTRUCTION = "Think step by step, then end with the final answer."
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # a dataset id ("openai/gsm8k") rather than a local path


def load(
    *,
    path: str,
    eval_path: str | None = None,
    question_field: str = "question",
    answer_field: str = "answer",
    num_train: int | None = None,
    num_eval: int | None = None,
    seed: int = 0,
) -> Task:
    """Examples from `path` (and `eval_path`); see the module docstring."""
    check_count("jsonl", "num_train", num_train, allow_none=True)
    check_count("jsonl", "num_eval", num_eval, allow_none=True)
    check_count("jsonl", "seed", seed)
    fields = {"question_field": question_field, "answer_field": answer_field}
    train = read_examples(existing_file(path, "path"), **fields)
    rng = random.Random(f"jsonl-{seed}")
    if eval_path is not None:
        eval_ = read_examples(existing_file(eval_path, "eval_path"), **fields)
    else:
        train, eval_ = hold_out(train, num_eval, rng, task="jsonl", source=path)
        num_eval = None  # already exactly num_eval rows
    return Task(
        name="jsonl",
        train=subsample(train, num_train, rng, option="task 'jsonl': num_train", source=path),
        eval=subsample(eval_, num_eval, rng, option="task 'jsonl': num_eval", source=eval_path),
        system_prompt=None,
        instruction=INSTRUCTION,
    )


def read_examples(path: Path, *, question_field: str, answer_field: str) -> list[Example]:
    """Examples from a JSON-lines file; any malformed line is a ConfigError naming file:line."""
    examples = []
    for number, row in read_rows(path):
        where = f"{path}:{number}"
        question = _field(row, question_field, "question_field", where)
        answer = _field(row, answer_field, "answer_field", where)
        if not isinstance(question, str):
            raise ConfigError(f"{where}: field {question_field!r} must be a string")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ConfigError(f"{where}: field {answer_field!r} must be a string or a number")
        reference = reference_answer(str(answer))
        if not reference:
            raise ConfigError(f"{where}: field {answer_field!r} has no final answer")
        examples.append(Example(f"{path.name}:{number}", question, reference))
    return examples


def read_rows(path: Path) -> list[tuple[int, dict]]:
    """(line number, JSON object) for each non-blank line; a malformed line, or a file without
    rows, is a ConfigError naming file:line."""
    rows = []
    with path.open("rb") as lines:  # decoded line by line, so that bad bytes are found with their line
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{where}: not UTF-8 text (byte {raw[exc.start]:#04x}); save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object"
                ) from None
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
            rows.append((number, row))
    if not rows:
        raise ConfigError(f"{path} has no rows; expected one JSON object per line")
    return rows


def reference_answer(raw: str) -> str:
    """The final answer: the text after the last "####" without thousands commas, else `raw`."""
    if "####" in raw:
        return raw.rsplit("####", 1)[1].strip().replace(",", "")
    return raw.strip()


def hold_out(
    examples: list[Example], num_eval: int | None, rng: random.Random, *, task: str, source: str
) -> tuple[list[Example], list[Example]]:
    """(train, eval): `num_eval` rows drawn with `rng` for evaluation, the rest to train on, both
    in file order. For a file given without a separate eval file."""
    if num_eval is None:
        raise ConfigError(
            f"task {task!r}: no eval_path, so set num_eval to how many rows of "
            f"{source} to hold out for evaluation (or pass eval_path)"
        )
    if num_eval >= len(examples):
        raise ConfigError(
            f"task {task!r}: num_eval={num_eval} would hold out all {len(examples)} rows of "
            f"{source}; lower num_eval or pass eval_path"
        )
    held_out = set(rng.sample(range(len(examples)), num_eval))
    eval_ = [ex for i, ex in enumerate(examples) if i in held_out]
    train = [ex for i, ex in enumerate(examples) if i not in held_out]
    return train, eval_


def subsample(
    examples: list[Example], k: int | None, rng: random.Random, *, option: str, source: object
) -> list[Example]:
    """`k` examples chosen with `rng`, in their original order; all of them when `k` is None."""
    if k is None:
        return examples
    if k > len(examples):
        raise ConfigError(
            f"{option}={k} but {source} has only {len(examples)} rows; "
            "lower it, or set it to None to use all rows"
        )
    keep = sorted(rng.sample(range(len(examples)), k))
    return [examples[i] for i in keep]


def load_dataset(task: str, name: str, config: str | None, *, what: str, instead: str):
    """``datasets.load_dataset(name, config)`` for task ``task``, every failure a ConfigError that
    says ``name`` is not ``what`` (a local file, a directory) and how to pass one ``instead``."""
    try:
        import datasets  # optional, heavy: imported only for dataset ids
    except ImportError:
        raise ConfigError(
            f"task {task!r}: {name!r} is not {what}, and loading it as a dataset needs the datasets "
            f"package: pip install 'podsrl[datasets]' (or {instead})"
        ) from None
    try:
        return datasets.load_dataset(name, config)
    except Exception as exc:  # network, missing dataset, bad config: all fixed by the user
        raise ConfigError(
            f"task {task!r}: {name!r} is not {what}, and loading it as a dataset failed "
            f"({type(exc).__name__}: {exc}); {instead}"
        ) from exc


def existing_file(path: str, option: str, *, task: str = "jsonl", holding: str = "one {question, answer} object per line") -> Path:
    """``path`` as a Path when it is a file; else a ConfigError naming the task's option and what
    the file should hold."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"task {task!r}: {option} {path!r} is not a file; expected a JSON-lines file with {holding}")
    return file


def _field(row: dict, field: str, option: str, where: str) -> object:
    if field not in row:
        present = ", ".join(map(repr, row)) or "(none)"
        raise ConfigError(
            f"{where}: no field {field!r} (fields present: {present}); "
            f"set {option} to one of them"
        )
    return row[field]
