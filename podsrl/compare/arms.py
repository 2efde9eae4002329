"""The trainers of a comparison's runs, as the rest of ``podsrl compare`` sees them: the one module
that knows them (plan -> runs -> report meet the trainers here and nowhere else).

- ``podsrl`` (the default): ``podsrl train`` (:func:`podsrl.train.loop.train`);
- ``trl``, ``trl-pods``: TRL's ``GRPOTrainer`` and podsrl's ``PODSTrainer`` in TRL
  (:mod:`podsrl.compare.trl_arm`).

Per trainer: its config's own checks (:func:`check_config`, when the plan loads) and defaults
(:func:`defaults`: a TRL arm trains with TRL's own loss where the comparison does not set one), the
set-up checks before any run trains (:func:`check_setup`), the checkpoint a run resumes from
(:func:`latest_checkpoint`), what a finished run keeps (:func:`finish`), and how one run trains: in
this process (:func:`train`) or as a child process (:func:`command`). What a run directory holds is
:mod:`podsrl.run.rundir`'s (``trainer.json`` names a run's trainer: :func:`read_trainer`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from podsrl.compare.trl_arm.mapping import TRL_DEFAULTS, TRL_TRAINERS, check_arm
from podsrl.config import Config
from podsrl.errors import ConfigError
from podsrl.run.rundir import PODSRL, read_trainer

__all__ = ["PODSRL", "TRAINERS", "check_config", "check_setup", "check_trainer", "check_trainer_name", "command", "defaults",
           "finish", "latest_checkpoint", "read_trainer", "train"]  # fmt: skip

TRAINERS = {PODSRL: "podsrl", **TRL_TRAINERS}


def check_config(cfg: Config, trainer: str) -> None:
    """ConfigError for a setting ``trainer`` cannot honour (a TRL arm: :func:`podsrl.compare.trl_arm.mapping.check_arm`)."""
    if trainer != PODSRL:
        check_arm(cfg, trainer)


def defaults(trainer: str) -> dict[str, Any]:
    """Dotted settings ``trainer`` trains with where the comparison's config leaves them unset (its
    own defaults, in podsrl's names): a TRL arm's loss is TRL's default (:data:`TRL_DEFAULTS`)."""
    return {} if trainer == PODSRL else dict(TRL_DEFAULTS)


def check_setup(cfg: Config) -> None:
    """The refusals a run of ``cfg`` meets before its model loads (:func:`podsrl.train.loop.check_trainable`,
    :func:`podsrl.train.loop.preflight`: the training dtype, settings under which nothing could be
    learned, the reward functions loaded and early stopping against their declared values)."""
    from podsrl.train.loop import check_trainable, preflight

    check_trainable(cfg)
    preflight(cfg)


def check_trainer(trainer: str) -> None:
    """ImportError unless ``trainer`` can run here (a TRL arm: TRL installed, in the supported range)."""
    if trainer != PODSRL:
        import podsrl.integrations.trl  # noqa: F401


def latest_checkpoint(path: Path, trainer: str) -> Path | None:
    """The checkpoint a resume of the run in ``path`` would start from: podsrl's newest, or a TRL arm's (TRL's)."""
    if trainer == PODSRL:
        from podsrl.run.checkpoint import latest

        return latest(path)
    from podsrl.compare.trl_arm.checkpoints import latest_checkpoint as trl_latest

    return trl_latest(path)


def finish(path: Path, trainer: str) -> None:
    """What a finished run keeps: everything, for a podsrl run (its checkpoint serves ``podsrl eval
    --run``, ``podsrl export`` and an extended budget); for a TRL arm its small files only, its TRL
    checkpoints removed (:mod:`podsrl.compare.trl_arm.checkpoints`)."""
    if trainer != PODSRL:
        from podsrl.compare.trl_arm.checkpoints import remove_checkpoints

        remove_checkpoints(path)


def train(cfg: Config, trainer: str, *, run_dir: Path, resume: bool, log=print) -> Path:
    """Train one run in this process."""
    if trainer == PODSRL:
        from podsrl.train.loop import train as podsrl_train

        return podsrl_train(cfg, run_dir=run_dir, resume=resume, log=log)
    from podsrl.compare.trl_arm.run import train_trl

    return train_trl(cfg, trainer, run_dir=run_dir, resume=resume, log=log)


def command(config: Path, path: Path, *, resume: bool, trainer: str = PODSRL) -> list[str]:
    """The child process of one run: ``podsrl train`` with this interpreter, or ``python -m
    podsrl.compare.trl_arm`` for a TRL arm."""
    where = ["--resume", str(path)] if resume else ["--out", str(path)]
    if trainer != PODSRL:
        return [sys.executable, "-m", "podsrl.compare.trl_arm", str(config), "--trainer", trainer, *where]
    return [sys.executable, "-m", "podsrl.cli", "train", str(config), *where, "--no-plot"]


def check_trainer_name(trainer: Any, where: str) -> str:
    """``trainer`` if it names one of :data:`TRAINERS`, else a ConfigError at ``where``."""
    if trainer not in TRAINERS:
        raise ConfigError(f"{where}: {trainer!r} is not a trainer; valid: {', '.join(repr(t) for t in TRAINERS)} "
                          "(podsrl's, TRL's GRPOTrainer, podsrl's PODSTrainer in TRL)")  # fmt: skip
    return trainer
