"""TRL arms of ``podsrl compare``: a method with ``trainer = "trl"`` trains with TRL's
``GRPOTrainer``, one with ``trainer = "trl-pods"`` with podsrl's ``PODSTrainer``
(:mod:`podsrl.integrations.trl`), beside podsrl's own arms (``trainer = "podsrl"``, the default),
from the same config, into a run directory the report reads like any other.

    [compare.methods]
    grpo_n8 = { "select.rule" = "all", "rollout.n" = 8, "select.m" = 8 }
    trl_grpo_n8 = { trainer = "trl", "select.rule" = "all", "rollout.n" = 8, "select.m" = 8 }
    trl_pods_n16_m4 = { trainer = "trl-pods", "select.rule" = "max_variance", "rollout.n" = 16, "select.m" = 4 }

**Settings.** :func:`grpo_config` maps the run's podsrl config onto TRL's ``GRPOConfig`` (or
``PODSConfig``) in one place; docs/trl.md, "TRL arms in podsrl compare", tables every mapped
setting and every TRL default left as it is. A setting TRL has no equivalent for is refused when
the plan loads (:func:`check_arm`), naming it. TRL samples with its own engine, transformers
``generate`` (``use_vllm=False``): what its users run on a CPU.

**One run** (:func:`train_trl`): podsrl's own set-up (:func:`podsrl.train.loop.setup`: the task,
the held-out problems, the reward functions, the policy loaded as ``podsrl train`` loads it, the
evaluation engine) hands its policy and tokenizer to the TRL trainer, so both tools start from the
same weights; the run directory gets podsrl's config.toml, metrics.jsonl and eval.jsonl (the rows
``podsrl train`` writes, the ones the report reads), ``trainer.json`` (which trainer, TRL's
version, the GRPOConfig it ran with) and TRL's checkpoints in ``trl/``.

**The training clock** (:class:`TrainingClock`, a ``TrainerCallback``): the seconds between
``on_step_begin`` and ``on_step_end`` of each optimizer step, summed. In transformers' loop that
span holds TRL's generation, the rewards, the loss's forward and backward passes and the optimizer
step; logging, saving and evaluation happen after ``on_step_end`` (``_maybe_log_save_evaluate``)
and before the next ``on_step_begin``, so they are off the clock, as podsrl's evaluation is. The
budget (``train.max_seconds``, ``train.max_steps``) is read on that clock at each ``on_step_end``.

**Held-out accuracy**: whenever a podsrl run would evaluate (``eval.every_seconds`` of training
time, or every ``eval.every_steps``, and at the budget), the callback asks TRL to save a checkpoint;
right after TRL writes it (``on_save``) the checkpoint's weights, which are the trained model's, are
scored by podsrl's evaluation (:func:`podsrl.train.loop.run_eval`: the same held-out problems,
samples, temperature, seed and engine as the podsrl arms) and the row goes to eval.jsonl with the
step and the training clock. The untrained model is scored first (``eval.at_start``), as in a
podsrl run.

**The step's numbers** (metrics.jsonl, one row per optimizer step): ``train_seconds``,
``time/step`` (the clock's span), ``time/generate`` (TRL's ``_generate_and_score_completions``:
generation, rewards, advantages, and the old-policy log-probs when TRL needs them) and
``time/update`` (the rest of the step: the loss's forward and backward passes and the optimizer
step), ``kept`` (rows the update trained on: B x n for GRPOTrainer), ``rows_run`` (rows that ran
the update's forward and backward: all of them for GRPOTrainer; for PODSTrainer the kept rows less
those of advantage 0 it skips), ``groups_with_signal``, ``zero_variance_groups``,
``rollouts_generated`` (B x n), ``prompts_sampled`` (B), ``reward_mean`` (TRL's ``reward``, over
all n), ``grad_norm`` and ``lr`` (TRL's logs), ``kept_adv_var`` (GRPOTrainer: the population
variance of its B x n advantages), and for PODSTrainer the core's selection metrics.

**Resume**: an interrupted TRL run continues from its newest checkpoint in ``trl/`` (TRL's
``resume_from_checkpoint``: weights, optimizer, scheduler, RNG) with the training clock saved beside
it (``podsrl_clock.json``); rows logged after that checkpoint are dropped, as podsrl's resume does.
A stop signal (``train.stop_signals``) ends the step, saves a checkpoint and exits with code 75, as
``podsrl train`` does (the checkpoint is evaluated only where an evaluation was due).

:func:`main` (``CONFIG --trainer trl --out RUN``, or ``--resume RUN``) is the child process
``podsrl compare`` starts for such a run (:func:`podsrl.compare.runs.train_command`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from podsrl.config import Config
from podsrl.errors import ConfigError

PODSRL = "podsrl"
TRAINERS = {PODSRL: "podsrl", "trl": "TRL GRPOTrainer", "trl-pods": "TRL PODSTrainer"}
TRL_DIR = "trl"  # TRL's output_dir (its checkpoints) inside the run directory
TRAINER_FILE = "trainer.json"
CLOCK_FILE = "podsrl_clock.json"  # in each TRL checkpoint: the training clock at that step
_BIG = 10**9  # TRL's max_steps when the budget is training time alone (the clock stops the run)


# ----------------------------------------------------------------------------------- the mapping


def check_arm(cfg: Config, trainer: str) -> None:
    """ConfigError for a setting a TRL arm cannot honour (TRL has no equivalent), naming it."""
    if trainer == PODSRL:
        return
    r, s, t = cfg.rollout, cfg.select, cfg.train

    def refuse(setting: str, why: str) -> None:
        raise ConfigError(f"{setting}: {why}; a trainer = {trainer!r} arm (TRL) cannot; drop it from this method or the base")

    if r.early_stop != "off":
        refuse("rollout.early_stop", "podsrl's exact early stopping samples in rounds")
    if r.dynamic_sampling:
        refuse("rollout.dynamic_sampling", "podsrl's dynamic sampling samples further batches")
    if cfg.prompts.skip_silent:
        refuse("prompts.skip_silent", "podsrl's prompt selection skips prompts")
    if trainer == "trl":
        m = s.m_start(r.n)
        if s.rule != "all" or m != r.n or s.m_final not in (None, r.n):
            raise ConfigError(f"select.rule = {s.rule!r}, m = {m}: TRL's GRPOTrainer trains on every rollout (rule 'all', "
                              "m = n); use trainer = \"trl-pods\" (PODSTrainer) to down-sample")  # fmt: skip
        if s.filter_zero_variance or s.uses_token_selection:
            raise ConfigError("select.filter_zero_variance / select.token_fraction: TRL's GRPOTrainer has neither; "
                              "use trainer = \"trl-pods\" (PODSTrainer)")  # fmt: skip
    if cfg.optim.lr_schedule == "cosine" and not t.max_steps:
        refuse("optim.lr_schedule = 'cosine'", "a cosine schedule needs train.max_steps")


def micro_steps(rows: int, micro: int) -> int:
    """Micro-batches per optimizer step: the fewest g such that ceil(rows / g) <= ``micro``."""
    return max(1, math.ceil(rows / max(1, micro)))


def grpo_config(cfg: Config, trainer: str, output_dir: Path, *, device: str) -> dict[str, Any]:
    """The GRPOConfig (``trainer = "trl"``) or PODSConfig (``"trl-pods"``) arguments of a run of
    ``cfg``: every setting that means the same in both tools, mapped here and nowhere else
    (docs/trl.md, "TRL arms in podsrl compare", has the table). ``device``: "cpu" or "cuda"."""
    from podsrl.core.downsample import DownsampleSpec
    import dataclasses

    r, s, loss, o, t = cfg.rollout, cfg.select, cfg.loss, cfg.optim, cfg.train
    B, n = t.prompts_per_step, r.n
    m = max(s.m_start(n), s.m_final or 0) if trainer == "trl-pods" else n
    # One generation of B x n completions per optimizer step, its rows trained in micro-batches of
    # at most optim.micro_batch_size (PODSTrainer: the kept B x m; TRL counts the sampled B x n).
    g = micro_steps(B * m, o.micro_batch_size)
    while (B * n) % g:
        g += 1
    schedule = {"constant": "constant_with_warmup" if o.warmup_steps else "constant", "cosine": "cosine"}[o.lr_schedule]
    args: dict[str, Any] = {
        "output_dir": str(output_dir),
        # the batch: B prompts x n per optimizer step, one generation per step
        "num_generations": n,
        "per_device_train_batch_size": B * n // g,
        "gradient_accumulation_steps": g,
        # sampling (TRL's own engine: transformers generate)
        "use_vllm": False,
        "max_completion_length": r.max_new_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": 0,
        # advantages and loss
        "scale_rewards": "none" if not s.scale_std else ("batch" if s.std_over == "batch" else "group"),
        "loss_type": {"sequence": "grpo", "token": "dapo", "constant": "dr_grpo"}[loss.aggregation],
        "epsilon": loss.eps_low,
        "epsilon_high": loss.eps_high if loss.eps_high is not None else loss.eps_low,
        "beta": loss.beta,
        "num_iterations": loss.policy_iterations,
        "reward_weights": list(cfg.reward.weights),
        # optimizer and schedule
        "learning_rate": o.lr,
        "weight_decay": o.weight_decay,
        "adam_beta1": o.beta1,
        "adam_beta2": o.beta2,
        "max_grad_norm": o.grad_clip,
        "lr_scheduler_type": schedule,
        "warmup_steps": o.warmup_steps,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        # the budget is read on the training clock (TrainingClock); max_steps as TRL needs one
        "max_steps": t.max_steps or _BIG,
        "seed": t.seed,
        # the machine, precision (the policy podsrl loaded, in model.dtype), and what TRL writes
        "use_cpu": device == "cpu",
        "bf16": False,
        "fp16": False,
        "logging_steps": 1,
        "save_strategy": "no",  # saves come from TrainingClock, at podsrl's evaluation times
        "save_total_limit": max(1, t.keep_checkpoints),
        "report_to": "none",
        "disable_tqdm": True,  # podsrl's own bar (train.progress) counts the steps; TRL's would count to max_steps
        "log_completions": False,
    }
    if trainer == "trl-pods":
        spec = {f.name for f in dataclasses.fields(DownsampleSpec)} - {"scale_std", "std_over"}
        args.update({f"pods_{name}": getattr(s, name) for name in sorted(spec)})
        args["pods_seed"] = t.seed
        args["pods_skip_zero_advantage"] = o.skip_zero_advantage
    return args


# ----------------------------------------------------------------------------------- one run


def read_trainer(path: Path) -> str:
    """Which trainer made the run in ``path``: its trainer.json's, "podsrl" without one."""
    file = Path(path) / TRAINER_FILE
    return json.loads(file.read_text())["trainer"] if file.is_file() else PODSRL


def latest_checkpoint(path: Path) -> Path | None:
    """The newest TRL checkpoint of the run in ``path`` that has its training clock."""
    found = [(int(p.name.rpartition("-")[2]), p) for p in (Path(path) / TRL_DIR).glob("checkpoint-*")
             if p.name.rpartition("-")[2].isdigit() and (p / CLOCK_FILE).is_file()]  # fmt: skip
    return max(found)[1] if found else None


def train_trl(cfg: Config, trainer: str, *, run_dir: Path, resume: bool = False, log=print) -> Path:
    """Train ``cfg`` with TRL (``trainer``: "trl" or "trl-pods") into ``run_dir`` (the module docstring)."""
    import torch

    from podsrl.run import checkpoint as ckpt
    from podsrl.run import preemption, rundir
    from podsrl.run.metrics import RunLogger, read_jsonl
    from podsrl.train.loop import run_eval, setup

    check_arm(cfg, trainer)
    claim = rundir.prepare(run_dir, cfg, resume=resume)
    run = setup(cfg)
    logger = None
    stop = preemption.StopSignals(cfg.train.stop_signals).install()  # finish the step, checkpoint, exit 75 (as podsrl train)
    try:
        path = claim.open()
        state = ckpt.TrainState()
        checkpoint = latest_checkpoint(path) if resume else None
        clock: dict[str, Any] = {}
        if checkpoint is not None:
            clock = json.loads((checkpoint / CLOCK_FILE).read_text())
            state.step, state.train_seconds = clock["step"], clock["train_seconds"]
            state.last_eval_seconds, state.eval_seconds = clock["last_eval_seconds"], clock["eval_seconds"]
            log(f"podsrl: resuming the TRL run {path} from {checkpoint.name} ({state.train_seconds:.0f} s of training)")
        device = next(run.policy.model.parameters()).device.type
        args = grpo_config(cfg, trainer, path / TRL_DIR, device=device)
        import trl

        # trainer.json before config.toml: a directory with a config names its trainer, even if the run dies between the two
        rundir.write_text_atomic(path / TRAINER_FILE, json.dumps({"trainer": trainer, "trl": trl.__version__, "args": args}, indent=1) + "\n")
        claim.write_config(cfg, step=state.step, log=log)
        logger = RunLogger(path, cfg, start_step=state.step, grader=run.task.grader)

        def evaluate(label: str | None = None) -> None:
            run.engine.sync_weights(run.policy.model)  # the vLLM engine's copy; the transformers engine's is the model
            was_training = run.policy.model.training
            run_eval(run, state, logger, log, label=label)
            run.policy.model.train(was_training)

        if state.step == 0 and cfg.eval.at_start:
            evaluate("base model")
        elif checkpoint is not None and clock.get("evaluate", True) and not any(r["step"] == state.step for r in read_jsonl(path / "eval.jsonl")):
            evaluate()  # interrupted between the checkpoint and its evaluation
        if checkpoint is not None and state.done(cfg):
            return path
        threads = torch.get_num_threads()
        hf = _make_trainer(cfg, trainer, run, args)
        torch.set_num_threads(threads)
        from transformers.trainer_callback import PrinterCallback

        hf.remove_callback(PrinterCallback)  # TRL's logs go to metrics.jsonl, not to the terminal every step
        hf.add_callback(training_clock(cfg, state, logger, evaluate, hf, stop))
        hf.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
        if stop.received is not None and not state.done(cfg):
            raise preemption.Preempted(path, latest_checkpoint(path), stop.received, state.step)
        return path
    finally:
        stop.restore()
        if logger is not None:
            logger.close()
        run.close()
        claim.close()


def _make_trainer(cfg: Config, trainer: str, run, args: dict[str, Any]):
    """TRL's trainer on podsrl's policy, tokenizer, training prompts (chat messages, as podsrl
    formats them) and reward functions (:func:`podsrl.integrations.rewards.as_trl_reward`)."""
    from datasets import Dataset

    from podsrl.integrations.rewards import as_trl_reward
    from podsrl.integrations.trl import PODSConfig, PODSTrainer
    from podsrl.tasks import format_user_message
    from trl import GRPOConfig, GRPOTrainer

    task = run.task

    def messages(ex) -> list[dict[str, str]]:
        user = [{"role": "user", "content": format_user_message(ex, task)}]
        return ([{"role": "system", "content": task.system_prompt}] if task.system_prompt else []) + user

    rows = Dataset.from_list([{"prompt": messages(ex), "id": ex.id} for ex in task.train])
    rewards = [as_trl_reward(name, examples=task.train) for name in cfg.reward.names]
    base, config = (GRPOTrainer, GRPOConfig) if trainer == "trl" else (PODSTrainer, PODSConfig)
    return _timed(base)(model=run.policy.model, reward_funcs=rewards, args=config(**args), train_dataset=rows,
                        processing_class=run.policy.tokenizer, podsrl_cfg=cfg)  # fmt: skip


def _timed(base: type) -> type:
    """``base`` (GRPOTrainer or PODSTrainer) that times its generation round and records what the
    round trained on (the module docstring, "The step's numbers"); nothing else changes."""

    class Timed(base):
        def __init__(self, *args: Any, podsrl_cfg: Config, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.podsrl_cfg = podsrl_cfg
            self.podsrl_round: dict[str, Any] = {}

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            round_seconds = time.perf_counter() - start
            if self.model.training:
                self.podsrl_round = {"time/generate": round_seconds, **_round_metrics(self, out)}
            return out

    Timed.__name__ = Timed.__qualname__ = f"Timed{base.__name__}"
    return Timed


def _round_metrics(trainer, out: dict[str, Any]) -> dict[str, Any]:
    """What a generation round trained on, in metrics.jsonl's names."""
    from podsrl.core.downsample import has_signal

    cfg = trainer.podsrl_cfg
    B, n = cfg.train.prompts_per_step, cfg.rollout.n
    advantages = out["advantages"].detach().float().cpu()
    row: dict[str, Any] = {"rollouts_generated": B * n, "prompts_sampled": B}
    selection = getattr(trainer, "last_selection", None)
    if selection is not None:  # PODSTrainer: the core's selection of the round
        sel = selection.selection
        row.update({k: float(v) for k, v in sel.metrics.items()})
        row["kept"] = int(sel.keep.sum())
        row["groups_with_signal"] = int(has_signal(sel).sum())
        skip = vars(trainer).get("_pods_skip", False)
        row["rows_run"] = int((advantages != 0).sum()) if skip else int(advantages.numel())
    else:  # GRPOTrainer: every rollout, in groups of n
        signal = int((advantages.view(-1, n) != 0).any(dim=1).sum())
        row.update(kept=int(advantages.numel()), rows_run=int(advantages.numel()), groups_with_signal=signal,
                   zero_variance_groups=1.0 - signal / max(1, advantages.numel() // n),
                   kept_adv_var=float(advantages.var(unbiased=False)) if advantages.numel() else 0.0)  # fmt: skip
    logged = trainer._metrics["train"]
    if logged.get("reward"):
        row["reward_mean"] = float(logged["reward"][-1])
    if logged.get("completions/mean_length"):
        row["completion_len"] = float(logged["completions/mean_length"][-1])
    return row


def training_clock(cfg: Config, state, logger, evaluate, trainer, stop=None):
    """A :class:`TrainingClock` that is a transformers ``TrainerCallback`` (imported here, not when
    the plan loads)."""
    from transformers import TrainerCallback

    return type("TrainingClock", (TrainingClock, TrainerCallback), {})(cfg, state, logger, evaluate, trainer, stop)


class TrainingClock:
    """The TRL run's training clock, budget, metrics rows and checkpoint evaluations (the module
    docstring): the sum over optimizer steps of ``on_step_end`` - ``on_step_begin``. A
    ``TrainerCallback`` through :func:`training_clock`."""

    def __init__(self, cfg: Config, state, logger, evaluate, trainer, stop=None):
        self.cfg, self.state, self.logger, self.evaluate, self.trainer = cfg, state, logger, evaluate, trainer
        self.stop = stop  # podsrl.run.preemption.StopSignals: a stop signal saves a checkpoint and ends the run
        self.due = False  # this step's checkpoint is an evaluation point
        self.started: float | None = None
        self.pending: dict[str, Any] | None = None  # the step's row, until TRL's logs for it arrive

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self.started
        self._flush()
        self.state.step = state.global_step
        self.state.train_seconds += seconds
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
        clock = {"step": self.state.step, "train_seconds": self.state.train_seconds, "last_eval_seconds": last_eval,
                 "eval_seconds": self.state.eval_seconds, "evaluate": self.due}  # fmt: skip
        if checkpoint.is_dir():
            from podsrl.run.rundir import write_text_atomic

            write_text_atomic(checkpoint / CLOCK_FILE, json.dumps(clock) + "\n")
        last = self.state.done(self.cfg)
        if not self.due or (last and not self.cfg.eval.at_end):
            return control  # a checkpoint for a stop signal only, or the end without eval.at_end
        self.evaluate("trained policy" if last else None)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()

    def _flush(self) -> None:
        if self.pending is not None:
            self.logger.log_step({k: v for k, v in self.pending.items() if v is not None}, self.state)
            self.pending = None


def main(argv: list[str] | None = None) -> int:
    """The child process of one TRL run of ``podsrl compare``."""
    from podsrl import config as config_mod

    parser = argparse.ArgumentParser(prog="podsrl.compare.trl_arm", description="one TRL run of podsrl compare")
    parser.add_argument("config")
    parser.add_argument("--trainer", required=True, choices=[k for k in TRAINERS if k != PODSRL])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out")
    where.add_argument("--resume")
    args = parser.parse_args(argv)
    from podsrl.errors import EXIT_PREEMPTED
    from podsrl.run.preemption import Preempted

    try:
        cfg = config_mod.load(args.config)
        train_trl(cfg, args.trainer, run_dir=Path(args.resume or args.out), resume=args.resume is not None)
    except ConfigError as err:
        print(f"podsrl: error: {err}", file=sys.stderr)
        return 2
    except Preempted as err:
        print(f"podsrl: {err.advice()}", file=sys.stderr)
        return EXIT_PREEMPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
