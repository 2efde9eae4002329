"""A run that another trainer trains (a TRL arm of ``podsrl compare``, :mod:`podsrl.compare.trl_arm`):
podsrl's side of it, and the one interface such a trainer uses.

podsrl sets the run up as ``podsrl train`` does (:func:`podsrl.train.loop.setup`: the task, the
held-out problems, the reward functions, the policy and its tokenizer, the evaluation engine), so
both tools start from the same weights and are scored alike; it claims and writes the run directory
(:mod:`podsrl.run.rundir`: ``config.toml`` and the trainer's record, ``trainer.json``;
``metrics.jsonl`` and ``eval.jsonl`` through :class:`podsrl.run.metrics.RunLogger`) and keeps the
training clock (:class:`podsrl.run.checkpoint.TrainState`). The other trainer trains
``run.policy.model``, sets ``run.state`` (step, training seconds) as it goes, reports each step
(:meth:`ExternalRun.log_step`) and asks for the held-out evaluations (:meth:`ExternalRun.evaluate`,
kept off the training clock as in ``podsrl train``).

    with ExternalRun(cfg, run_dir, resume=False) as run:
        run.start("trl", {"trl": trl.__version__, "args": args})   # trainer.json, config.toml, the loggers
        run.evaluate("base model")
        ...  # the other trainer's steps: run.state.step, run.state.train_seconds, run.log_step(row)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from podsrl.config import Config
from podsrl.run import checkpoint as ckpt
from podsrl.run import rundir
from podsrl.run.metrics import RunLogger
from podsrl.train import loop


class ExternalRun:
    """podsrl's set-up, run directory and training clock around another trainer's loop (the module docstring)."""

    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool = False, log=print):
        self.cfg, self.log = cfg, log
        self.state = ckpt.TrainState()
        self.logger: RunLogger | None = None
        self._setup: loop.Setup | None = None
        self._claim = rundir.prepare(run_dir, cfg, resume=resume)  # refused before the model loads
        try:
            self._setup = loop.setup(cfg)
            self.path: Path = self._claim.open()
        except BaseException:
            self.close()
            raise

    @property
    def policy(self):
        """The policy (``.model``, ``.tokenizer``) podsrl loaded: the other trainer trains ``policy.model``."""
        return self._setup.policy

    @property
    def task(self):
        return self._setup.task

    @property
    def device(self) -> str:
        """Where the policy is: "cpu" or "cuda"."""
        return next(self._setup.policy.model.parameters()).device.type

    def start(self, trainer: str, record: dict[str, Any]) -> None:
        """Write ``trainer.json`` ({"trainer": ``trainer``, **``record``}) and then ``config.toml`` (a
        directory with a config names its trainer, even if the process dies between the two), and
        open the run's loggers from ``state.step`` (a resumed run's later rows are dropped)."""
        text = json.dumps({"trainer": trainer, **record}, indent=1) + "\n"
        rundir.write_text_atomic(self.path / rundir.TRAINER_FILE, text)
        self._claim.write_config(self.cfg, step=self.state.step, log=self.log)
        self.logger = RunLogger(self.path, self.cfg, start_step=self.state.step, grader=self._setup.task.grader)

    def evaluate(self, label: str | None = None) -> None:
        """Score the held-out set with the policy's current weights (:func:`podsrl.train.loop.run_eval`:
        eval.jsonl, off the training clock); the policy's train/eval mode is left as it was."""
        run, model = self._setup, self._setup.policy.model
        run.engine.sync_weights(model)  # the vLLM engine's copy; the transformers engine's is the model
        was_training = model.training
        loop.run_eval(run, self.state, self.logger, self.log, label=label)
        model.train(was_training)

    def log_step(self, row: dict[str, Any]) -> None:
        """One step's row of metrics.jsonl, at ``state``'s step and training clock."""
        self.logger.log_step(row, self.state)

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
        if self._setup is not None:
            self._setup.close()
        self._claim.close()

    def __enter__(self) -> ExternalRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
