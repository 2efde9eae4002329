"""One run of a TRL arm (:func:`train_trl`): podsrl's side of the run
(:class:`podsrl.train.external.ExternalRun`: the set-up ``podsrl train`` makes, the run directory,
the training clock) hands its policy, tokenizer, training prompts (:func:`podsrl.tasks.chat_messages`,
as podsrl's arms build them) and reward functions to TRL's trainer, configured by
:func:`podsrl.compare.trl_arm.mapping.grpo_config`; the training clock
(:mod:`podsrl.compare.trl_arm.clock`) reads the budget, has TRL save a checkpoint at each evaluation
time and scores it. TRL samples with its own engine, transformers ``generate``.

**Resume**: an interrupted TRL run continues from its newest checkpoint in ``trl/`` (TRL's
``resume_from_checkpoint``: weights, optimizer, scheduler, RNG) with the training clock saved
beside it (:mod:`podsrl.compare.trl_arm.checkpoints`); rows logged after that checkpoint are
dropped, as podsrl's resume does. A stop signal (``train.stop_signals``) ends the step, saves a
checkpoint and exits with code 75, as ``podsrl train`` does (the checkpoint is evaluated only where
an evaluation was due).

What transformers prints that says nothing to act on stays out of the run's output
(:func:`quiet_transformers`)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from podsrl.compare.trl_arm.checkpoints import latest_checkpoint, read_clock
from podsrl.compare.trl_arm.clock import training_clock
from podsrl.compare.trl_arm.mapping import check_arm, grpo_config
from podsrl.compare.trl_arm.metrics import timed
from podsrl.config import Config
from podsrl.run.rundir import TRL_DIR

# transformers warns so when a process group exists (podsrl's vLLM evaluation engine makes a
# one-process one) and the trainer is not launched for DDP: a TRL arm trains in one process, as meant.
_NOT_DISTRIBUTED = "parallel_mode != ParallelMode.DISTRIBUTED"


def train_trl(cfg: Config, trainer: str, *, run_dir: Path, resume: bool = False, log=print) -> Path:
    """Train ``cfg`` with TRL (``trainer``: "trl" or "trl-pods") into ``run_dir`` (the module docstring)."""
    from podsrl.run import preemption
    from podsrl.train.external import ExternalRun

    check_arm(cfg, trainer)
    with quiet_transformers(), ExternalRun(cfg, run_dir, resume=resume, log=log) as run:
        stop = preemption.StopSignals(cfg.train.stop_signals).install()  # finish the step, checkpoint, exit 75 (as podsrl train)
        try:
            checkpoint = _restore(run, log) if resume else None
            args = grpo_config(cfg, trainer, run.path / TRL_DIR, device=run.device)
            import trl

            run.start(trainer, {"trl": trl.__version__, "args": args})
            _evaluate_first(run, checkpoint)
            if checkpoint is not None and run.state.done(cfg):
                return run.path
            hf = _make_trainer(cfg, trainer, run, args)
            hf.add_callback(training_clock(run, hf, stop))
            hf.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
            if stop.received is not None and not run.state.done(cfg):
                raise preemption.Preempted(run.path, latest_checkpoint(run.path), stop.received, run.state.step)
            return run.path
        finally:
            stop.restore()


def _restore(run, log) -> Path | None:
    """The newest checkpoint to resume from, its training clock set on ``run.state``; None without one."""
    checkpoint = latest_checkpoint(run.path)
    if checkpoint is not None:
        clock = read_clock(checkpoint)
        state = run.state
        state.step, state.train_seconds = clock["step"], clock["train_seconds"]
        state.last_eval_seconds, state.eval_seconds = clock["last_eval_seconds"], clock["eval_seconds"]
        state.step_seconds = clock.get("step_seconds", [])  # absent: written before issue 68
        log(f"podsrl: resuming the TRL run {run.path} from {checkpoint.name} ({state.train_seconds:.0f} s of training)")
    return checkpoint


def _evaluate_first(run, checkpoint: Path | None) -> None:
    """The untrained model (eval.at_start) in a new run; in a resumed one, the checkpoint's evaluation
    when the run was interrupted between saving it and scoring it."""
    from podsrl.run.metrics import read_jsonl

    if run.state.step == 0 and run.cfg.eval.at_start:
        run.evaluate("base model")
    elif checkpoint is not None and read_clock(checkpoint).get("evaluate", True):
        if not any(r["step"] == run.state.step for r in read_jsonl(run.path / "eval.jsonl")):
            run.evaluate()


def _make_trainer(cfg: Config, trainer: str, run, args: dict[str, Any]):
    """TRL's trainer on podsrl's policy, tokenizer, training prompts (:func:`podsrl.tasks.chat_messages`)
    and reward functions (:func:`podsrl.integrations.rewards.as_trl_reward`); TRL's per-step printing
    removed (its logs go to metrics.jsonl)."""
    import torch
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from podsrl.integrations.rewards import as_trl_reward
    from podsrl.integrations.trl import PODSConfig, PODSTrainer
    from podsrl.tasks import chat_messages

    task = run.task
    rows = Dataset.from_list([{"prompt": chat_messages(ex, task), "id": ex.id} for ex in task.train])
    rewards = [as_trl_reward(name, examples=task.train) for name in cfg.reward.names]
    base, config = (GRPOTrainer, GRPOConfig) if trainer == "trl" else (PODSTrainer, PODSConfig)
    threads = torch.get_num_threads()
    hf = timed(base)(model=run.policy.model, reward_funcs=rewards, args=config(**args), train_dataset=rows,
                     processing_class=run.policy.tokenizer, podsrl_cfg=cfg)  # fmt: skip
    torch.set_num_threads(threads)
    hf.remove_callback(PrinterCallback)
    return hf


@contextlib.contextmanager
def quiet_transformers():
    """Inside: transformers' "... parallel_mode != ParallelMode.DISTRIBUTED" warning (not an error
    here: :data:`_NOT_DISTRIBUTED`) is dropped, and its progress bars (the "Writing model shards" bar
    of every checkpoint TRL saves) are off; both as they were after."""
    from transformers.utils import logging as hf_logging

    class Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return _NOT_DISTRIBUTED not in record.getMessage()

    logger, drop = logging.getLogger("transformers.training_args"), Drop()
    logger.addFilter(drop)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.removeFilter(drop)
        if bars:
            hf_logging.enable_progress_bar()
