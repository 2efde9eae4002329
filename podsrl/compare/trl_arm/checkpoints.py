"""A TRL arm's checkpoints: TRL's own (``RUN/trl/checkpoint-N``: weights, optimizer, scheduler, RNG),
each with the run's training clock beside it (``podsrl_clock.json``), saved at podsrl's evaluation
times and scored right after (:mod:`podsrl.compare.trl_arm.clock`). A resume needs the newest one
(:func:`latest_checkpoint`); once the run has finished, its checkpoints have been scored and serve
nothing the report or ``podsrl`` reads (``podsrl eval --run`` and ``podsrl export`` read podsrl's
checkpoints), so ``podsrl compare`` removes them (:func:`remove_checkpoints`): a finished TRL arm
keeps its small files only, and a comparison extended later trains it again from its start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from podsrl.run.rundir import TRL_DIR, write_text_atomic

CLOCK_FILE = "podsrl_clock.json"  # in each TRL checkpoint: the training clock at that step


def _numbered(path: Path) -> list[tuple[int, Path]]:
    return [(int(p.name.rpartition("-")[2]), p) for p in (Path(path) / TRL_DIR).glob("checkpoint-*") if p.name.rpartition("-")[2].isdigit()]


def latest_checkpoint(path: Path) -> Path | None:
    """The newest TRL checkpoint of the run in ``path`` that has its training clock."""
    found = [(step, p) for step, p in _numbered(path) if (p / CLOCK_FILE).is_file()]
    return max(found)[1] if found else None


def read_clock(checkpoint: Path) -> dict[str, Any]:
    """The training clock saved with ``checkpoint``: step, train_seconds, last_eval_seconds, eval_seconds, evaluate, step_seconds (since issue 68)."""
    return json.loads((Path(checkpoint) / CLOCK_FILE).read_text())


def write_clock(checkpoint: Path, clock: dict[str, Any]) -> None:
    write_text_atomic(Path(checkpoint) / CLOCK_FILE, json.dumps(clock) + "\n")


def remove_checkpoints(path: Path) -> int:
    """Delete the TRL checkpoints of the finished run in ``path``; returns how many there were."""
    found = _numbered(path)
    for _, checkpoint in found:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return len(found)
