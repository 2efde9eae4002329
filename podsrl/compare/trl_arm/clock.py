"""A TRL arm's training clock (:class:`TrainingClock`, a transformers ``TrainerCallback``): the
seconds between ``on_step_begin`` and ``on_step_end`` of each optimizer step, summed. In
transformers' loop that span holds TRL's generation, the rewards, the loss's forward and backward
passes and the optimizer step; logging, saving and evaluation happen after ``on_step_end``
(``_maybe_log_save_evaluate``) and before the next ``on_step_begin``, so they are off the clock, as
podsrl's evaluation is. The budget (``train.max_seconds``, ``train.max_steps``) is read on that
clock at each ``on_step_end`` (``TrainState.done``, as podsrl's loop reads it: no step starts that
the recent steps predict will not fit, docs/run-directory.md "The budget"), and so are podsrl's evaluation times
(``TrainState.eval_due``): the callback then has TRL save a checkpoint, and right after TRL writes
it (``on_save``) the model, whose weights are the checkpoint's, is scored
(:meth:`podsrl.train.external.ExternalRun.evaluate`). Each step's row goes to metrics.jsonl once
TRL's logs for it (grad_norm, lr) have arrived."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from podsrl.compare.trl_arm.checkpoints import write_clock


def training_clock(run, trainer, stop=None):
    """A :class:`TrainingClock` that is a transformers ``TrainerCallback`` (imported here, not when
    the plan loads). ``run``: the :class:`podsrl.train.external.ExternalRun`; ``trainer``: the TRL
    trainer (its ``podsrl_round``: :mod:`podsrl.compare.trl_arm.metrics`); ``stop``: the run's
    :class:`podsrl.run.preemption.StopSignals`."""
    from transformers import TrainerCallback

    return type("TrainingClock", (TrainingClock, TrainerCallback), {})(run, trainer, stop)


class TrainingClock:
    """The TRL run's training clock, budget, metrics rows and checkpoint evaluations (the module
    docstring). A ``TrainerCallback`` through :func:`training_clock`."""

    def __init__(self, run, trainer, stop=None):
        self.run, self.cfg, self.state, self.trainer = run, run.cfg, run.state, trainer
        self.stop = stop  # a stop signal saves a checkpoint and ends the run
        self.due = False  # this step's checkpoint is an evaluation point
        self.started: float | None = None
        self.pending: dict[str, Any] | None = None  # the step's row, until TRL's logs for it arrive

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self.started
        self._flush()
        self.state.step = state.global_step
        self.state.record_step(seconds)  # the clock, and the recent steps that predict whether the next one fits
        round_ = self.trainer.podsrl_round
        generate = round_.get("time/generate")
        self.pending = {"step": state.global_step, **round_, "time/step": seconds,
                        "time/update": None if generate is None else seconds - generate,
                        "train_seconds": self.state.train_seconds}  # fmt: skip
        self.trainer.podsrl_round = {}
        done = self.state.done(self.cfg)
        self.due = done or self.state.eval_due(self.cfg)
        stopped = self.stop is not None and self.stop.received is not None
        if done or stopped:
            control.should_training_stop = True
        if self.due or stopped:
            control.should_save = True  # saved, then evaluated (on_save): after this, off the clock
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.pending is not None and logs and "loss" in logs:
            if "grad_norm" in logs:
                self.pending["grad_norm"] = float(logs["grad_norm"])
            if "learning_rate" in logs:
                self.pending["lr"] = float(logs["learning_rate"])
            self._flush()

    def on_save(self, args, state, control, **kwargs):
        self._flush()
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        last_eval = self.state.train_seconds if self.due else self.state.last_eval_seconds
        if checkpoint.is_dir():
            write_clock(checkpoint, {"step": self.state.step, "train_seconds": self.state.train_seconds, "last_eval_seconds": last_eval,
                                     "eval_seconds": self.state.eval_seconds, "evaluate": self.due,
                                     "step_seconds": self.state.step_seconds})  # fmt: skip
        last = self.state.done(self.cfg)
        if not self.due or (last and not self.cfg.eval.at_end):
            return control  # a checkpoint for a stop signal only, or the end without eval.at_end
        self.run.evaluate("trained policy" if last else None)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()

    def _flush(self) -> None:
        if self.pending is not None:
            self.run.log_step({k: v for k, v in self.pending.items() if v is not None})
            self.pending = None
