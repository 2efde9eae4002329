"""GSM8K grade-school maths (Cobbe et al., 2021): train on its train split, evaluate on test.

Options: `path`, `num_train` (None = all 7473), `num_eval` (None = all 1319), `seed`,
`hub_config`.

`path` is either a local directory holding `train.jsonl` and `test.jsonl` (fields `question` and
`answer`, the answer ending in "#### <number>") or, when no such directory exists and `path`
looks like "owner/name", a Hugging Face hub id loaded with the optional `datasets` package
(config `hub_config`, "main" for openai/gsm8k). The reference answer is the number after "####"
with thousands commas removed. Subsets are drawn with the seed and kept in file order.
"""

import random
from pathlib import Path

from podsrl.errors import ConfigError
from podsrl.tasks.types import Example, Task, check_count
from podsrl.tasks.jsonl import HUB_ID, load_dataset, read_examples, reference_answer, subsample

INSTRUCTION = "Think step by step, then end with the final number."


def load(
    *,
    path: str = "openai/gsm8k",
    num_train: int | None = None,
    num_eval: int | None = None,
    seed: int = 0,
    hub_config: str = "main",
) -> Task:
    """GSM8K from a local directory or the hub; see the module docstring."""
    check_count("gsm8k", "num_train", num_train, allow_none=True)
    check_count("gsm8k", "num_eval", num_eval, allow_none=True)
    check_count("gsm8k", "seed", seed)
    directory = Path(path).expanduser()
    if directory.exists() or not HUB_ID.fullmatch(path):
        train, test = _load_directory(directory)
    else:
        train, test = _load_hub(path, hub_config)
    rng = random.Random(f"gsm8k-{seed}")
    return Task(
        name="gsm8k",
        train=subsample(train, num_train, rng, option="task 'gsm8k': num_train", source=path),
        eval=subsample(test, num_eval, rng, option="task 'gsm8k': num_eval", source=path),
        system_prompt=None,
        instruction=INSTRUCTION,
    )


def _load_directory(directory: Path) -> tuple[list[Example], list[Example]]:
    expected = "expected a directory containing train.jsonl and test.jsonl (GSM8K's files)"
    if not directory.is_dir():
        raise ConfigError(f"task 'gsm8k': path {str(directory)!r} is not a directory; {expected}")
    splits = []
    for name in ("train.jsonl", "test.jsonl"):
        file = directory / name
        if not file.is_file():
            raise ConfigError(f"task 'gsm8k': {file} does not exist; {expected}")
        splits.append(read_examples(file, question_field="question", answer_field="answer"))
    return splits[0], splits[1]


def _load_hub(hub_id: str, hub_config: str) -> tuple[list[Example], list[Example]]:
    dataset = load_dataset("gsm8k", hub_id, hub_config, what="a local directory",
                           instead="pass path= a directory containing train.jsonl and test.jsonl")  # fmt: skip

    def examples(split: str) -> list[Example]:
        # Same ids as the local files ("train.jsonl:1"), so runs on either source line up.
        return [
            Example(f"{split}.jsonl:{i}", row["question"], reference_answer(row["answer"]))
            for i, row in enumerate(dataset[split], start=1)
        ]

    return examples("train"), examples("test")
