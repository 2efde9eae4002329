"""Shared fixtures: a tiny randomly initialised causal LM (no download) and small configs for it.

The tiny model is a 2-layer Llama with hidden size 32 and the embedded SmolLM2 tokenizer (49152
tokens, with a chat template), so prompts, chat formatting, EOS handling and decoding are the real
ones while a training step takes well under a second. A random model emits random tokens, so the
correctness reward is almost always 0; the trainer tests therefore use `length_reward` below
(written to a file and named as "path.py:function"), whose value varies within every group, so the
advantages are non-zero and an update really moves the weights.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from podsrl.figures import load_script


@contextmanager
def script_module(path: Path, name: str | None = None) -> Iterator[ModuleType]:
    """A script that is no package's module (bench/*.py, results/*/tables.py, examples/*.py) loaded
    as module ``name`` (default: its file's stem): its folder on ``sys.path`` while it loads (bench
    scripts import ``_isolated`` beside them), itself in ``sys.modules`` while in use (a dataclass
    looks its module up there), both undone after."""
    name = name or path.stem
    try:
        yield load_script(path, name)  # podsrl.figures: the same loader the pages' renderer uses
    finally:
        sys.modules.pop(name, None)


def committed_tables_in_page(script: str, render: str, results: str, page: str) -> int:
    """Every committed run of ``bench/<script>.py`` (``results/<results>/*.json``) appears in
    ``docs/<page>`` exactly as the script's ``render`` function prints it (what its ``--table FILE``
    prints); the number of runs checked."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / page).read_text()
    runs = sorted((root / "results" / results).glob("*.json"))
    with script_module(root / "bench" / f"{script}.py") as bench:
        for path in runs:
            table = getattr(bench, render)(json.loads(path.read_text()))
            assert table in text, f"docs/{page} lacks {path.name}'s table: paste `python bench/{script}.py --table {path.relative_to(root)}`"
    return len(runs)


REWARD_SOURCE = '''
"""Rewards for tests: a random model's completions differ in length, so these give signal."""


def length_reward(completion, example):
    return len(completion) / 40.0


def half_silent_reward(completion, example):
    """Signal only on problems with an odd answer: the other groups have advantage 0 everywhere."""
    return len(completion) / 40.0 if int(example.answer) % 2 else 0.0


def raising_reward(completion, example):
    raise ValueError("boom from the test reward")


def nan_reward(completion, example):
    return float("nan")
'''


# pytest-xdist (``make test`` runs ``pytest -n 2 --dist loadfile``: two workers, one a core; tests/README.md
# "Time"). A work unit is a test file, except that files sharing an expensive session fixture are one
# unit, so that it is computed once (a session fixture is computed once per worker that uses it).
XDIST_UNITS = {
    "tests/test_distributed.py": "distributed",  # dist_steps, two_rank_sampling_run
    "tests/test_dynamic_sampling.py": "distributed",
    "tests/test_prompts.py": "distributed",  # two_rank_sampling_run
    "tests/test_trl.py": "trl",  # trl_two_processes
    "tests/test_trl_compat.py": "trl",
}
# The units that take longest (seconds under -n 2 on the 2-core EPYC, 2026-11-30), handed out first so
# that no long one starts last while the other worker idles; the rest follow in file order.
XDIST_LONGEST_FIRST = ("distributed", "tests/test_faults.py", "trl", "tests/test_vllm.py", "tests/test_docs.py",
                       "tests/test_quiet_output.py", "tests/test_compare.py", "tests/test_gpu_check.py",
                       "tests/test_security.py", "tests/test_reliability.py")


def xdist_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return XDIST_UNITS.get(path, path)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown to pytest without it
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``loadfile`` over :func:`xdist_unit` s, in collection order (which
    ``pytest_collection_modifyitems`` makes longest first); other ``--dist`` modes are xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Units(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    config.option.loadscopereorder = False  # xdist would order the units by their number of tests
    return Units(config, log)


def pytest_configure(config):
    """Under pytest-xdist each worker's torch and the processes its tests start compute on one
    thread, so two workers do not ask for four threads on a 2-core machine (OpenMP's waits then cost
    more than the second thread gives: see ``one_thread``)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a GPU that torch sees: skipped without one (``make gpu-check``,
    bench/gpu_check.py, runs them where there is one: ``pytest -m gpu``). Under pytest-xdist the
    longest units come first (:data:`XDIST_LONGEST_FIRST`); every worker sorts alike, as xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {unit: i for i, unit in enumerate(XDIST_LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(xdist_unit(item.nodeid), len(rank)))  # stable: file order within
    needs_gpu = [item for item in items if item.get_closest_marker("gpu")]
    if needs_gpu:
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs a GPU that torch can see (make gpu-check runs these on one)")
            for item in needs_gpu:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread():
    """Run torch on one thread for the test. The tiny model's matrices are so small that OpenMP's
    synchronisation dominates, and on a loaded machine every parallel region can wait a scheduler
    time slice for its second thread (15 ms per 32x32 matmul measured, against 0.02 ms)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A seeded 2-layer Llama with the SmolLM2 tokenizer, saved with ``save_pretrained``. Where the
    embedded model is not installed (the lent GPU machine), with tests/offline_tokenizer.py's."""
    from offline_tokenizer import embedded_or_built

    tokenizer, _ = embedded_or_built()
    assert tokenizer.chat_template, "the embedded tokenizer should carry a chat template"
    return _tiny_llama(tokenizer, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def small_vocab_model_dir(tmp_path_factory) -> Path:
    """The tiny model with tests/offline_tokenizer.py's ChatML tokenizer (686 tokens) instead of
    SmolLM2's (49152): for tests whose subject is not the tokenizer, where the logits over the
    vocabulary were most of the time (the TRL tests: issue 45)."""
    from offline_tokenizer import build

    return _tiny_llama(build(), tmp_path_factory.mktemp("tiny-llama-small-vocab"))


def _tiny_llama(tokenizer, path: Path) -> Path:
    """Save a seeded 2-layer Llama of hidden size 32 for ``tokenizer``, and the tokenizer, to ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def reward_file(write_module) -> Path:
    return write_module("test_rewards", REWARD_SOURCE)


@pytest.fixture(scope="session")
def write_module(tmp_path_factory):
    """``write_module(stem, source)`` -> the path of a new ``stem.py`` holding ``source``, in a
    directory of its own (reward functions for a test, named as "path.py:function")."""

    def write(stem: str, source: str) -> Path:
        path = tmp_path_factory.mktemp(stem) / f"{stem}.py"
        path.write_text(source)
        return path

    return write


def function_refs(path: Path):
    """``ref(name)`` -> ``"path.py:name"``: how a config names function ``name`` of the module at ``path``."""
    return lambda name: f"{path}:{name}"


def exit_without_teardown() -> None:
    """The last call of a process that a multi-process test launched (torchrun, accelerate launch),
    once it has done and checked its work: leave without the interpreter's teardown. On this CPU
    torch's gloo teardown at exit now and then aborts a process that had finished ("terminate called
    without an active exception", SIGABRT, after its output was written and checked: seen in CI on
    test_trl's two-process run and the sharded evaluation, with or without destroy_process_group).
    The tests check podsrl's results, not how torch tears down; an assertion that fails still
    raises before this and exits non-zero."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------- one optimizer step, on 1 process and on 2

DIST_STEP_CASES: dict[str, dict] = {}


def dist_step_cases(cases: dict[str, dict]) -> dict[str, dict]:
    """Add ``cases`` (name -> a tests/dist_worker.py case) to those the session's ``dist_steps`` runs,
    and return them. A test module calls it at import, so the cases of every collected module are
    known before the first test runs. A name starting with "fsdp" gets its world-1 reference from
    torchrun with 1 process (FSDP needs a launcher), the others from one plain process."""
    clash = [name for name in cases.keys() & DIST_STEP_CASES.keys() if cases[name] != DIST_STEP_CASES[name]]
    assert not clash, f"two test modules define different tests/dist_worker.py cases named {sorted(clash)}"
    DIST_STEP_CASES.update(cases)
    return cases


@pytest.fixture(scope="session")
def dist_steps(tmp_path_factory, small_vocab_model_dir, reward_file) -> Path:
    """The directory where tests/dist_worker.py wrote ``<case>-w1`` and ``<case>-w2`` (the weights
    after the step and its metrics) for every case of :func:`dist_step_cases`. Three launches for
    the whole session (one plain process and torchrun with 1 process for FSDP's references, both at
    once on one thread each, then torchrun with 2), whichever modules' cases they run: each launch
    costs seconds of start-up on a CPU, about 10 s for torchrun's two ranks, and the cases of
    test_distributed.py and test_dynamic_sampling.py each paid for three (issue 45); the first two
    in turn took 52 s with the third, at once 37 s (2026-11-30). On the tiny model with a 686-token
    tokenizer: one step is one step at any vocabulary, and a step over SmolLM2's 49152 logits took
    ten times as long."""
    import subprocess

    from test_distributed import WORKER, _env, _torchrun, worker_spec

    out = tmp_path_factory.mktemp("dist-steps")
    cases = dict(DIST_STEP_CASES)
    single = {k: v for k, v in cases.items() if not k.startswith("fsdp")}
    fsdp = {k: v for k, v in cases.items() if k.startswith("fsdp")}
    # The two one-process launches write different files: at once, on the machine's two cores.
    log = out / "alone.log"
    with log.open("w") as sink:
        alone = subprocess.Popen([sys.executable, str(WORKER), str(worker_spec(out / "spec1.json", small_vocab_model_dir, reward_file, out, single))],
                                 env=_env(), stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            one = _torchrun(str(WORKER), str(worker_spec(out / "spec_fsdp1.json", small_vocab_model_dir, reward_file, out, fsdp)), nproc=1)
            alone.wait(timeout=300)
        finally:
            if alone.poll() is None:  # the torchrun launch failed or timed out
                alone.kill()
    assert alone.returncode == 0, log.read_text()[-3000:]
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun(str(WORKER), str(worker_spec(out / "spec.json", small_vocab_model_dir, reward_file, out, cases)), nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    return out


# ------------------------------------------ podsrl train on 2 ranks: sampling and prompt decisions

# A binary reward that leaves every problem with an even answer silent (0 on each rollout).
PARITY_SOURCE = "def parity(completion, example):\n    return 0.0 if int(example.answer) % 2 == 0 else float(len(completion) % 2)\n\n\nparity.reward_values = (0.0, 1.0)\n"
# The run's settings: 12 training prompts (so several epochs), steps that sample further batches until 4
# groups have a signal (at most 3), each group stopped early in rounds of 2 of its 8 rollouts, and the
# prompts that were silent skipped.
SAMPLING_RUN = {
    "task.options": {"ops": ["+"], "min_digits": 1, "max_digits": 1, "num_train": 12, "num_eval": 4},
    "train.prompts_per_step": 4, "train.max_steps": 6, "rollout.n": 8, "rollout.early_stop": "exact", "rollout.round_size": 2,
    "rollout.dynamic_sampling": True, "rollout.max_gen_batches": 3, "select.rule": "max_variance", "select.m": 2,
    "optim.micro_batch_size": 2, "prompts.skip_silent": True, "prompts.explore": 0.2, "prompts.explore_min": 0.05,
    "eval.at_start": False, "eval.at_end": False, "train.export_model": False,
}  # fmt: skip


@pytest.fixture(scope="session")
def two_rank_sampling_run(tmp_path_factory, small_vocab_model_dir, reward_file, write_module) -> Path:
    """A directory holding ``run`` (``podsrl train`` of :data:`SAMPLING_RUN` with the parity reward,
    on 2 gloo ranks under torchrun) and ``ranks`` (``rank0.jsonl``, ``rank1.jsonl``: what each rank's
    sample_step decided every step, tests/record_ranks.py). One run for the session serves
    test_dynamic_sampling.py (the ranks take the same sampling decisions) and test_prompts.py (the
    same prompt decisions): each launched its own run, ~14 s apiece on a quiet 2-core CPU (issue 45).
    On the tiny model with a 686-token tokenizer, as ``dist_steps``."""
    from podsrl.config import from_dict, to_toml
    from test_distributed import _torchrun

    out = tmp_path_factory.mktemp("two-rank-sampling")
    parity = write_module("parity", PARITY_SOURCE)
    config = out / "run.toml"
    config.write_text(to_toml(from_dict(tiny_config_dict(small_vocab_model_dir, reward_file, **SAMPLING_RUN, **{"reward.names": [f"{parity}:parity"]}))))
    (out / "ranks").mkdir()
    script = Path(__file__).parent / "record_ranks.py"
    done = _torchrun(str(script), str(out / "ranks"), "train", str(config), "--out", str(out / "run"), "--no-plot")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


# ------------------------------------------------------- PODSTrainer on two processes (accelerate)

TRL_TWO_PROCESS_SCRIPTS: dict[str, tuple[str, str]] = {}


def trl_two_process_script(name: str, source: str, model: str = "small_vocab_model_dir") -> str:
    """Add the script ``source`` (a check of PODSTrainer on two processes: its arguments are the
    model, the tests folder and an output folder; it checks its results on the main process) to those
    the session's ``trl_two_processes`` launch runs, as ``name``, on the model of the fixture
    ``model``; returns ``name``. A test module calls it at import, as with :func:`dist_step_cases`."""
    assert TRL_TWO_PROCESS_SCRIPTS.get(name, (source, model)) == (source, model), f"two TRL two-process scripts named {name}"
    TRL_TWO_PROCESS_SCRIPTS[name] = (source, model)
    return name


@pytest.fixture(scope="session")
def trl_two_processes(request, tmp_path_factory) -> str:
    """The output of one ``accelerate launch`` on 2 gloo processes that runs every script of
    :func:`trl_two_process_script` in turn (tests/trl_parts.py); ``trl_part_passed`` reads a
    script's verdict from it. One launch for test_trl.py's and test_trl_compat.py's scripts, which
    launched one each (18-25 s apiece on a quiet 2-core CPU, issue 45)."""
    from test_trl import launch_two_processes

    folder = tmp_path_factory.mktemp("trl-two-processes")
    args = []
    for name, (source, model) in TRL_TWO_PROCESS_SCRIPTS.items():
        (folder / f"{name}.py").write_text(source)
        args += [folder / f"{name}.py", request.getfixturevalue(model)]
    return launch_two_processes([Path(__file__).parent / "trl_parts.py", folder / "out", *args], timeout=600)


def trl_part_passed(output: str, name: str) -> None:
    """Fail with the script's traceback unless the script ``name`` of ``trl_two_processes`` ran to
    its end on both processes. Its checks run on the main process (rank 0), after gathering the
    other's results: passed on rank 0 means they held."""
    failed = output.find(f"{name}: FAILED")
    assert failed < 0, output[failed : failed + 5000]
    for rank in (0, 1):
        assert f"{name}: passed on rank {rank}" in output, output[-5000:]


def tiny_config_dict(model_dir: Path, reward_file: Path, **overrides: Any) -> dict:
    """The nested dict of a small, fast run of the tiny model; ``overrides`` use "section.key"
    names (``**{"select.m": 3}``) and replace or add single settings."""
    data: dict[str, dict[str, Any]] = {
        "model": {"name": str(model_dir), "lora": False},
        "task": {
            "name": "arithmetic",
            "options": {"ops": ["+"], "min_digits": 1, "max_digits": 1, "num_train": 50, "num_eval": 10},
        },
        "reward": {"names": [f"{reward_file}:length_reward"], "weights": [1.0]},
        "rollout": {"engine": "transformers", "n": 4, "max_new_tokens": 8},
        "select": {"m": 2},
        "optim": {"lr": 1e-3},
        "eval": {"max_problems": 4, "max_new_tokens": 4, "temperature": 0.0, "samples": 1},
        "train": {"prompts_per_step": 2, "max_steps": 2, "progress": False, "checkpoint_every": 1},
    }
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = value
    return data


@pytest.fixture(scope="session")
def make_config(tiny_model_dir, reward_file):
    """``make_config(**{"section.key": value})`` -> a validated Config of the tiny run."""
    from podsrl.config import from_dict

    def make(**overrides: Any):
        return from_dict(tiny_config_dict(tiny_model_dir, reward_file, **overrides))

    return make


@pytest.fixture(scope="session")
def make_small_vocab_config(small_vocab_model_dir, reward_file):
    """``make_config`` of the tiny model with a 686-token tokenizer (``small_vocab_model_dir``): a
    step's logits over SmolLM2's 49152 tokens are most of the tiny model's time (4 steps: 2.8 s, and
    0.28 s with 686 tokens, measured on this project's 2-core CPU). A module whose tests do not test
    the tokenizer overrides ``make_config`` with it (issue 45)."""
    from podsrl.config import from_dict

    def make(**overrides: Any):
        return from_dict(tiny_config_dict(small_vocab_model_dir, reward_file, **overrides))

    return make


@pytest.fixture(scope="session")
def reward_spec(reward_file):
    """``reward_spec("nan_reward")`` -> the "path.py:function" name of a test reward."""
    return lambda name: f"{reward_file}:{name}"


_LOSS_FIELDS = {"eps_low", "eps_high", "aggregation", "beta", "max_completion_len"}


def update_settings(**options: Any):
    """podsrl.train.update.UpdateSettings from flat keyword arguments (the loss's go to its LossSettings)."""
    from podsrl.core.loss import LossSettings
    from podsrl.train.update import UpdateSettings

    loss = LossSettings(**{k: v for k, v in options.items() if k in _LOSS_FIELDS})
    return UpdateSettings(loss=loss, **{k: v for k, v in options.items() if k not in _LOSS_FIELDS})


def ten_rollouts(tokenizer, zeros: list[int], *, max_id: int = 5000):
    """An UpdateBatch of 10 rollouts of 3 prompts (groups of 4, 3, 3) of different lengths (2-8
    completion tokens, ids in [100, ``max_id``)), with seeded random advantages and 0 at ``zeros``
    (test_zero_signal.py and test_importance.py's steps)."""
    import torch

    from podsrl.train.update import UpdateBatch

    g = torch.Generator().manual_seed(3)
    prompts = [tokenizer(f"What is {i} + {i * 7}?{' Please.' * i}")["input_ids"] for i in range(3)]
    groups = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    advantages = torch.randn(len(groups), generator=g)
    advantages[zeros] = 0.0
    return UpdateBatch(
        prompt_ids=[prompts[p] for p in groups],
        completion_ids=[torch.randint(100, max_id, (2 + (3 * i) % 7,), generator=g).tolist() for i in range(len(groups))],
        advantages=advantages,
    )
