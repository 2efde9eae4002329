"""The run layout of a comparison: where a method x seed's run lives, which files say what about it,
and whether it may be reused. Read by the runner (:mod:`podsrl.compare.runs`) and the report
(:mod:`podsrl.compare.report`); it imports neither.

    OUT/runs/<method>/seed<k>/     an ordinary ``podsrl train`` run directory (config.toml,
                                   metrics.jsonl, eval.jsonl, checkpoints/) plus
        done.json                  {"max_seconds": ..., "max_steps": ...}: trained to this budget
        launch.jsonl               one line per launch: device, parallel, runs_on_device, exit_code, commit
        trainer.json, trl/         a TRL arm's (podsrl.compare.trl_arm): its trainer and TRL's
                                   checkpoints (no checkpoints/; removed once the run has finished)
        train.log                  the run's output when runs go in parallel

A run is finished when its ``done.json`` names the plan's budget, or when its last evaluation is at
the budget (a periodic evaluation never happens at or past it, so that one is the final one; this
also recognises a run trained by ``podsrl train`` itself). Neither needs a checkpoint: a results
directory holding only the small files reports like the original.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from podsrl import config as config_mod
from podsrl.compare.arms import PODSRL, latest_checkpoint, read_trainer
from podsrl.config import Config
from podsrl.envinfo import source_commit
from podsrl.errors import ConfigError
from podsrl.run.metrics import read_jsonl
from podsrl.run.rundir import BUDGET, config_differences, write_text_atomic

DONE_FILE = "done.json"
LAUNCH_FILE = "launch.jsonl"
LOG_FILE = "train.log"  # a child's output when runs go in parallel (one run at a time: passed through)
# Settings in which a run directory's config may differ from the plan's: the budget (raising it
# extends a comparison; is_finished then says the run is not finished) and what does not change the
# training (the progress bar, naming, what is exported at the end).
EXPORT = ("train.export_model", "train.export_checkpoints", "train.export_dtype", "train.export_merged", "train.push_to_hub")
MAY_DIFFER = frozenset({*BUDGET, "train.progress", "train.out_dir", *EXPORT})


def run_dir(out: Path, method: str, seed: int) -> Path:
    return Path(out) / "runs" / method / f"seed{seed}"


def run_status(path: Path, cfg: Config, trainer: str = PODSRL) -> str:
    """"new", "done", "resume" (has a checkpoint: podsrl's, or for a TRL arm TRL's) or "restart"
    (started, no checkpoint). ``trainer``: what the plan trains it with (a run made by another is refused)."""
    path = Path(path)
    if not (path / "config.toml").is_file():
        return "new"
    check_same_config(path, cfg)
    check_same_trainer(path, trainer)
    if is_finished(path, cfg):
        return "done"
    return "resume" if latest_checkpoint(path, trainer) is not None else "restart"


def check_same_trainer(path: Path, trainer: str) -> None:
    """Refuse a run directory trained by another trainer than ``trainer`` (its trainer.json)."""
    made_by = read_trainer(path)
    if made_by != trainer:
        raise ConfigError(
            f"{path} was trained with trainer = {made_by!r}, the plan's method has trainer = {trainer!r}; "
            "use another --out for a changed comparison, or delete that run directory"
        )


def is_finished(path: Path, cfg: Config) -> bool:
    """Trained to ``cfg``'s budget: our done marker for that budget, or an evaluation at the budget."""
    done = Path(path) / DONE_FILE
    if done.is_file() and json.loads(done.read_text()) == budget(cfg):
        return True
    evals = read_jsonl(Path(path) / "eval.jsonl")
    if not evals:
        return False
    last, t = evals[-1], cfg.train
    return bool((t.max_seconds and last["train_seconds"] >= t.max_seconds) or (t.max_steps and last["step"] >= t.max_steps))


def budget(cfg: Config) -> dict[str, Any]:
    """What ``done.json`` records: the budget the run was trained to."""
    return {"max_seconds": cfg.train.max_seconds, "max_steps": cfg.train.max_steps}


def mark_done(path: Path, cfg: Config) -> None:
    """Write the run's ``done.json`` for ``cfg``'s budget."""
    write_text_atomic(Path(path) / DONE_FILE, json.dumps(budget(cfg)))


def check_same_config(path: Path, cfg: Config) -> None:
    """Refuse a run directory trained with another config than ``cfg`` (other than MAY_DIFFER)."""
    try:
        existing = config_mod.load(Path(path) / "config.toml")
    except ConfigError as err:
        raise ConfigError(f"{path}: its config.toml does not load ({err}); use another --out or delete that run") from None
    differ = {name: values for name, values in config_differences(existing, cfg).items() if name not in MAY_DIFFER}
    if differ:
        shown = ", ".join(f"{name} ({old!r} in the run, {new!r} in the plan)" for name, (old, new) in sorted(differ.items()))
        raise ConfigError(
            f"{path} was trained with a different config ({shown}); "
            "use another --out for a changed comparison, or delete that run directory"
        )


def write_launch(path: Path, **record: Any) -> None:
    """Append one launch record; the podsrl source commit that trained it, the time it ended (UTC) and
    the machine (CPU model, cores, the vector extensions that change kernels) are added, so that runs
    of one comparison trained in several sessions can be told apart."""
    import datetime

    Path(path).mkdir(parents=True, exist_ok=True)
    record["commit"] = source_commit()  # None outside a git checkout
    record["ended"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record["machine"] = machine()
    with open(Path(path) / LAUNCH_FILE, "a") as f:
        f.write(json.dumps(record) + "\n")


_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def machine() -> dict[str, Any]:
    """The CPU's model name, its cores and which of the vector extensions that pick PyTorch's kernels
    it has (/proc/cpuinfo; on other systems the platform's processor string)."""
    import os
    import platform

    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": model or platform.processor() or None, "cores": os.cpu_count(), "flags": [f for f in _CPU_FLAGS if f in flags]}


def read_launches(path: Path) -> list[dict]:
    """The run's launch records, oldest first ([] for a run made before they were kept)."""
    return read_jsonl(Path(path) / LAUNCH_FILE)
