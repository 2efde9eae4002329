"""The training loop: sample -> score -> downsample -> update -> log, one screen per step.

One step (``train_step``) of B prompts:
  1-2. take the next B prompts of the run's prompt stream (shuffled epochs; with prompt selection,
     passing over those predicted silent: :mod:`podsrl.train.prompts`), sample n rollouts per
     prompt with the engine (current weights) and score them with the reward functions -> B
     groups, rewards [B, n] (:mod:`podsrl.train.sampling`, one record of groups); with
     rollout.early_stop = "exact" in rounds, a group stopping once more rollouts could not change
     the law of what it trains on (:mod:`podsrl.core.early_stop`; NaN marks the rollouts never
     sampled); with rollout.dynamic_sampling, further batches of prompts until B groups have a
     signal;
  3. downsample (:func:`podsrl.core.downsample.downsample`, the call every trainer makes): keep
     B*m rollouts by the selection rule, m from its schedule (the selection sampling decided, when
     it tested the groups for a signal), and compute their advantages over the kept subset (PODS)
     or the full group (GRPO, D3S);
  4. one optimizer step on the kept rollouts only (:mod:`podsrl.train.update`), D3S token selection
     inside, then push the new weights to the engine;
  5. log the step's metrics.
Evaluation runs every k steps and/or every T seconds of *training* time; its own time is recorded
but kept off the training clock, which is what budgets and wall-clock plots measure.

Every random number of step s comes from generators seeded by (seed, s), and the prompt stream's
by (seed, epoch) (one registry: :mod:`podsrl.core.seeds`): the sampling seed, tie-breaking in
selection, dropout, the epochs' orders and prompt selection's draws. A resumed run therefore
continues exactly as an uninterrupted one would, given the checkpointed weights, optimizer state
and prompt stream (its position and, with prompt selection, each prompt's history).

Under torchrun every rank runs this same loop on its B / world prompts (``run.dist``, see
:mod:`podsrl.train.distributed`): rewards are gathered so that selection, advantages and metrics
are the global ones, each rank updates on its own kept rows (any number, none included), the
update sums the ranks' gradients, and only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from podsrl import hostmem
from podsrl.config import Config, RolloutConfig
from podsrl.core.downsample import Selection, downsample, has_signal
from podsrl.core.seeds import Stream, step_seed
from podsrl.core.early_stop import why_not_exact
from podsrl.core.schedules import training_progress
from podsrl.engines import Engine, choose_engine, make_engine
from podsrl.errors import ConfigError, EngineError, RewardError, RunWriteError
from podsrl.grading.pool import RewardPool
from podsrl.grading.graders import ungraded_note
from podsrl.grading.rewards import Declared, RewardSpec, resolve_specs, task_values, timeout_totals_undeclared, total_values
from podsrl.models import Policy, check_training_dtype, load_policy
from podsrl.run import checkpoint as ckpt
from podsrl.run import export, preemption, rundir
from podsrl.tasks import Example, Task, chat_messages
from podsrl.tasks.build import build_task, held_out_problems
from podsrl.run.metrics import NullLogger, RunLogger, read_jsonl
from podsrl.train.distributed import Dist, fsdp_wrap, rank_device
from podsrl.train.distributed import init as init_distributed
from podsrl.train.evaluate import EvalResult, EvalSettings, calls, evaluate
from podsrl.train.heartbeat import Heartbeat
from podsrl.train.precision import MixedPrecision, resolve_mixed_precision
from podsrl.train.prompts import PromptStream, repeats_warning
from podsrl.train.sampling import Groups, StepSample, sample_metrics, sample_step
from podsrl.train.update import UpdateBatch, UpdateSettings, measure_sampler_gap, run_update


@dataclass
class Setup:
    """Everything a run holds besides its mutable training state."""

    cfg: Config
    task: Task
    policy: Policy
    engine: Engine
    rewards: list[RewardSpec]
    train_prompts: list[list[int]]  # token ids, aligned with task.train
    eval_prompts: list[list[int]]
    eval_examples: list[Example]
    reference: torch.nn.Module | None
    prompts: PromptStream  # the training prompts in epochs (and prompt selection): a checkpointed position
    dist: Dist = field(default_factory=Dist)  # this process's rank and world (world 1: alone)
    reward_pool: RewardPool | None = None  # user rewards in worker processes (reward.timeout_seconds)
    reward_values: tuple[float, ...] | None = None  # every value the total reward can take; None: undeclared
    declared: Declared | None = None  # the values the task declares for reward functions (correctness: its grader's)
    grading_note: str | None = None  # held-out answers the task's grader cannot grade right (warned at start-up)
    precision: MixedPrecision = MixedPrecision("none", False, "as set")  # what model.mixed_precision resolved to on the model's device (setup)

    def close(self) -> None:
        self.engine.close()
        if self.reward_pool is not None:
            self.reward_pool.close()


def prompt_ids(tokenizer, task: Task, examples: list[Example]) -> list[list[int]]:
    """Chat-template each question (:func:`podsrl.tasks.chat_messages`: the task's instruction and optional system prompt)."""
    out = []
    for ex in examples:
        messages = chat_messages(ex, task)
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # base models without a template: plain text
            text = "\n\n".join(m["content"] for m in messages) + "\n"
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def setup(cfg: Config, dist: Dist | None = None) -> Setup:
    dist = dist or Dist()
    torch.manual_seed(cfg.train.seed)
    task = build_task(cfg)
    rewards, reward_values = preflight(cfg, task)
    policy = load_policy(cfg.model, device=rank_device(cfg.model.device, dist.local_rank, dist.world) if dist.active else None)
    weights = next(policy.model.parameters())
    precision = resolve_mixed_precision(cfg.model.mixed_precision, weights.device, weights.dtype)
    if dist.active:
        if dist.sharded:
            fsdp_wrap(policy.model, mixed_precision=precision.enabled)
        else:
            dist.broadcast_params(policy.model)  # identical start on every rank (LoRA's random A)
    threads = torch.get_num_threads()
    engine = make_engine(cfg.rollout, policy)
    torch.set_num_threads(threads)  # an in-process engine (vLLM) may lower it for itself
    if dist.sharded:
        engine.synced_gpus = True
    eval_examples = held_out_problems(cfg, task)
    reference = None
    if cfg.loss.beta > 0 and not policy.lora:
        reference = copy.deepcopy(policy.model).eval().requires_grad_(False)
    return Setup(
        cfg=cfg,
        task=task,
        policy=policy,
        engine=engine,
        rewards=rewards,
        train_prompts=prompt_ids(policy.tokenizer, task, task.train),
        eval_prompts=prompt_ids(policy.tokenizer, task, eval_examples),
        eval_examples=eval_examples,
        reference=reference,
        prompts=PromptStream(len(task.train), cfg.train.seed, cfg.prompts),
        dist=dist,
        reward_pool=RewardPool.from_config(cfg.reward, cfg.reward.names),
        reward_values=reward_values,
        declared=task_values(task),
        grading_note=ungraded_note(eval_examples),
        precision=precision,
    )


def check_trainable(cfg: Config) -> None:
    """The refusals that training alone makes, each a ConfigError naming the field: the training dtype
    (:func:`podsrl.models.check_training_dtype`: no AdamW on bfloat16 weights, no float16 without loss
    scaling) and settings under which no step could learn (:meth:`podsrl.core.downsample.DownsampleSpec.check_signal`:
    n = 1, m = 1 over the kept subset). Not part of the config's own validation, nor of :func:`setup`:
    evaluation and export update nothing, so a run directory whose config.toml fails them (trained
    before a check existed) and an exported model in bfloat16 still load for ``podsrl eval --run``,
    ``eval --model`` and ``podsrl export``. ``podsrl train`` runs it before the model loads, ``podsrl
    compare`` for every method before the first run trains (:func:`podsrl.compare.plan.check_setup`)."""
    check_training_dtype(cfg)
    cfg.select.check_signal(cfg.rollout.n, "rollout.n")


def preflight(cfg: Config, task: Task | None = None) -> tuple[list[RewardSpec], tuple[float, ...] | None]:
    """The set-up decisions that need no model, each refusal a ConfigError: the task (``task``, else
    built here) and its grader, the reward functions (loaded) and the values their total can take,
    checked against early stopping (``_reward_values``). ``setup`` starts with it (evaluation too:
    what only training refuses is :func:`check_trainable`); ``podsrl compare`` runs both for every
    method before the first run trains (:func:`podsrl.compare.plan.check_setup`)."""
    task = task if task is not None else build_task(cfg)
    rewards = resolve_specs(list(zip(cfg.reward.names, cfg.reward.weights)))
    return rewards, _reward_values(cfg, rewards, task_values(task))


def _reward_values(cfg: Config, rewards: list[RewardSpec], declared: Declared | None = None) -> tuple[float, ...] | None:
    """The declared values of the total reward (reward.values, else the functions' declarations, and
    the task's: ``declared``; a user function's timed-out call scores reward.timeout_score: ``total_values``); with
    rollout.early_stop = "exact", a ConfigError when the run's rule and rewards have no exact
    stopping criterion, naming reward.timeout_score when a timed-out call's score is what breaks it."""
    values = total_values(rewards, cfg.reward, declared=declared)
    if cfg.rollout.early_stop != "exact":
        return values
    sel, score = cfg.select, f"reward.timeout_score = {cfg.reward.timeout_score:g}"
    why = lambda v: why_not_exact(sel.rule, values=v, advantages_over_group=sel.advantages_over_group, filter_zero_variance=sel.filter_zero_variance)  # noqa: E731
    if stray := timeout_totals_undeclared(rewards, cfg.reward, declared):
        raise ConfigError(
            f"{score}: a reward call that times out (reward.timeout_seconds) scores it, which gives the total rewards "
            f"{stray} that reward.values {list(values)} leaves out, and rollout.early_stop = 'exact' relies on reward.values; "
            "set reward.timeout_score to a value the reward can take, or add those totals to reward.values"
        )
    reason = why(values)
    if reason is not None and why(total_values(rewards, cfg.reward, timeouts=False, declared=declared)) is None:
        raise ConfigError(
            f"{score}: a reward call that times out (reward.timeout_seconds) scores it, which adds it to the reward's "
            f"values, and rollout.early_stop = 'exact' then fails: {reason}; set reward.timeout_score to one of the "
            "functions' declared values (`reward_values`), or rollout.early_stop = \"off\""
        )
    if reason is not None:
        fix = " or declare the reward's values (reward.values, or `reward_values` on each function)" if "declared" in reason else ""
        raise ConfigError(f"rollout.early_stop = 'exact': {reason}; set rollout.early_stop = \"off\"{fix}")
    return values


def decays(name: str, module: torch.nn.Module) -> bool:
    """Whether weight decay applies to the parameter ``name`` (its full dotted name) of ``module``
    (the module that holds it): transformers' convention (``Trainer.get_decay_parameter_names``,
    which TRL uses), no decay on biases and on the weights of normalisation layers."""
    path = name.lower().split(".")
    return "bias" not in path[-1] and "norm" not in type(module).__name__.lower() and not any("norm" in part for part in path[:-1])


def make_optimizer(cfg: Config, model: torch.nn.Module):
    """AdamW (decoupled weight decay, spared on biases and norm weights: :func:`decays`) and the
    learning-rate schedule, both per optimizer step."""
    check_training_dtype(cfg)  # no AdamW on bfloat16 weights, no float16 without loss scaling
    held, seen = [], set()  # (name, module, parameter) of each trainable parameter, once (tied weights are one)
    for prefix, module in model.named_modules():
        for n, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                held.append((f"{prefix}.{n}" if prefix else n, module, p))
    params = [p for _, _, p in held]
    wd = cfg.optim.weight_decay
    groups = [{"params": params}] if not wd else [  # one group without decay: the state dict of runs before the split
        {"params": [p for name, module, p in held if decays(name, module)], "weight_decay": wd},
        {"params": [p for name, module, p in held if not decays(name, module)], "weight_decay": 0.0},
    ]
    # The fused kernel (one pass over every parameter; same update rule) where torch has it
    # (bench/zero_signal.py measures it). Not on FSDP's sharded DTensor parameters, which keep torch's default.
    fused = cfg.distributed.parallel != "fsdp" and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    opt = torch.optim.AdamW(groups, lr=cfg.optim.lr, weight_decay=wd, betas=(cfg.optim.beta1, cfg.optim.beta2), fused=fused or None)
    total = (cfg.train.max_steps or 0) * cfg.loss.policy_iterations
    warmup = cfg.optim.warmup_steps * cfg.loss.policy_iterations

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / (warmup + 1)
        if cfg.optim.lr_schedule == "cosine" and total > warmup:
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - warmup) / (total - warmup))))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def progress(cfg: Config, state: ckpt.TrainState) -> float:
    """Training progress in [0, 1] of the step about to be taken (``state.step``): the core's rule
    (:func:`podsrl.core.schedules.training_progress`), the first step 0 and the last one 1, so the
    schedules of m and of the token fraction reach ``select.m_final`` and ``token_fraction_final``.
    A pure function of the step and the training clock, both in every checkpoint, so a resumed run
    follows the uninterrupted run's schedule. (A run resumed from a checkpoint of podsrl before
    issue 32, which used step / N, moves at the same step onto this one: by at most 1/N.)"""
    return training_progress(state.step, cfg.train.max_steps, seconds=state.train_seconds, max_seconds=cfg.train.max_seconds)


def schedule_line(cfg: Config) -> str | None:
    """A start-up line when a schedule moves (m, the token fraction): from what to what, and what
    drives its progress (:func:`progress`): the steps, the training time, or with both budgets set
    the further of the two, so a slow step can end a schedule before train.max_steps (issue 45: m
    reached its end at step 2 of 4). None when nothing moves."""
    sel, n = cfg.select, cfg.rollout.n
    moving = []
    if sel.m_at(n, 0.0) != sel.m_at(n, 1.0):
        moving.append(f"select.m {sel.m_at(n, 0.0)} -> {sel.m_at(n, 1.0)} ({sel.m_schedule})")
    if sel.token_fraction_at(0.0) != sel.token_fraction_at(1.0):
        moving.append(f"token fraction {sel.token_fraction_at(0.0):g} -> {sel.token_fraction_at(1.0):g} ({sel.token_schedule})")
    if not moving:
        return None
    steps, seconds = cfg.train.max_steps, cfg.train.max_seconds
    if steps and seconds:
        driver = (
            f"the further of the steps (of train.max_steps = {steps}) and the training time (of train.max_seconds = {seconds:g} s): "
            f"time can end the schedule before step {steps}; train.max_seconds = \"none\" for steps alone"
        )
    elif steps:
        driver = f"the steps: its end at step {steps} (train.max_steps)"
    else:
        driver = f"the training time: its end at train.max_seconds = {seconds:g} s (evaluation excluded)"
    return f"podsrl: schedule: {', '.join(moving)}; progress follows {driver}"


def train_step(run: Setup, model, optimizer, scheduler, state: ckpt.TrainState) -> dict:
    """One step of B prompts (B / world on each rank); returns its metrics (one line of metrics.jsonl)."""
    cfg, dist, timer = run.cfg, run.dist, _Timer()
    dist.reset_counters()
    with _abandonable(run):  # up to the optimizer step (dist.commit in the update), a stop signal abandons the step
        torch.manual_seed(step_seed(cfg.train.seed, state.step, Stream.TORCH))  # dropout, HF sampling
        p = progress(cfg, state)
        sample = sample_step(run, state.step, p, timer)  # the step's B groups [B, n], scored, every rank's numbers
        state.prompts = run.prompts.state_dict()  # where the stream stands after this step's batches
        with timer("select"):
            selection = select(cfg, state, sample.groups.reward, keep=sample.keep)
        lr = scheduler.get_last_lr()[0]  # the rate this step's (first) optimizer step uses; after it, the next one's
        with timer("update"):
            stats = _update_on_kept(run, model, optimizer, scheduler, sample.groups, selection)
    with timer("sync"):
        run.engine.sync_weights(model)  # the next step samples from the new weights
    return _step_metrics(run, state, lr, sample, selection, stats, timer)


def _abandonable(run: Setup):
    """While training (``run.dist.stop``, the run's podsrl.run.preemption.StopSignals), a region a
    stop signal abandons; otherwise (``podsrl eval``, a test's step) nothing."""
    stop = run.dist.stop
    return stop.region(run.dist) if stop is not None else contextlib.nullcontext()


def select(cfg: Config, state: ckpt.TrainState, rewards: Tensor, keep: Tensor | None = None) -> Selection:
    """The step's down-sampling of rewards [B, n] (every rank passes the gathered batch): the core's
    one call (:func:`podsrl.core.downsample.downsample`), as every other trainer makes it; ``keep``
    [B, n]: the selection sampling already decided (its signal test read it), used as it is."""
    missing = cfg.rollout.early_stop != "off"  # NaN: a rollout never sampled (podsrl.core.early_stop)
    return downsample(rewards, cfg.select, progress=progress(cfg, state), step=state.step, seed=cfg.train.seed, allow_missing=missing,
                      keep=keep)  # fmt: skip


def _update_on_kept(run: Setup, model, optimizer, scheduler, groups: Groups, selection: Selection):
    """The optimizer step on this rank's kept rollouts, its metrics; when no rollout was kept (the DAPO
    filter, or dynamic sampling's cap with no signal: no step), only the sampler gap's, measured on a
    sample of the sampled rollouts. Every rank joins the update, with its rows or with none."""
    settings = UpdateSettings.from_config(run.cfg, pad_id=run.policy.tokenizer.pad_token_id, token_fraction=selection.token_fraction,
                                          mixed_precision=run.precision.enabled)  # fmt: skip
    mine = (groups.rank == run.dist.rank)[:, None]
    if not selection.keep.any():  # no update; the sampler's gap is still measured, on the sampled rollouts
        return measure_sampler_gap(model, _batch(run, groups, mine & ~groups.reward.isnan(), None), settings, dist=run.dist)
    keep = selection.keep & mine  # [G, n]: this rank's kept rollouts
    batch = _batch(run, groups, keep, selection.advantages[keep])
    return run_update(model, optimizer, scheduler, batch, settings, reference=run.reference, dist=run.dist).metrics()


def _batch(run: Setup, groups: Groups, rows: Tensor, advantages: Tensor | None) -> UpdateBatch:
    """The rollouts of ``rows`` [G, n] (this rank's), group-major, as an UpdateBatch."""
    where = rows.nonzero().tolist()  # (group, rollout), group-major
    completions = [groups.completions[g][i] for g, i in where]
    return UpdateBatch(
        prompt_ids=[run.train_prompts[int(groups.prompt[g])] for g, _ in where],
        completion_ids=[c.ids for c in completions],
        advantages=advantages if advantages is not None else torch.zeros(len(where)),
        sampler_logprobs=None if any(c.logprobs is None for c in completions) else [c.logprobs for c in completions],
    )


def _step_metrics(run: Setup, state: ckpt.TrainState, lr: float, sample: StepSample, selection: Selection, stats, timer) -> dict:
    """The step's line of metrics.jsonl: selection (podsrl.core.downsample) over the groups trained
    on, what was sampled (podsrl.train.sampling.sample_metrics, on a fixed-n run's basis), update, times."""
    keep, dist = selection.keep, run.dist
    metrics = {
        "step": state.step + 1,
        **selection.metrics,
        **sample_metrics(sample, [spec.name for spec in run.rewards]),
        "lr": lr,
        "completion_len_kept": float(sample.groups.length[keep].mean()) if keep.any() else 0.0,
        "groups_with_signal": int(has_signal(selection).sum()),  # groups trained with a nonzero advantage
    }
    metrics.update(stats)
    metrics.update({f"time/{k}": v for k, v in timer.seconds.items()})
    metrics["time/step"] = sum(timer.seconds.values())
    if dist.active:  # per-rank phases (the step waits for the slowest) and this module's traffic
        comm_seconds, comm_bytes = dist.reset_counters()
        phases = {**timer.seconds, "comm": comm_seconds, "comm_bytes": comm_bytes}
        per_rank = dist.gather_objects(phases)
        metrics["world_size"] = dist.world
        for k in phases:
            metrics[f"rank_time/{k}" if k != "comm_bytes" else "comm_bytes"] = [r[k] for r in per_rank]
    return metrics


def run_eval(run: Setup, state: ckpt.TrainState, logger=None, log=None, label: str | None = None, *, progress: bool = False,
             keep_completions: bool = False, abandonable: bool = False) -> EvalResult:
    """Score the held-out set with the current weights. Inside a run (``logger``): the result goes
    to eval.jsonl and the loggers, its time is kept off the training clock, and ``log`` gets a line.
    ``progress``: a progress bar over the problems (``podsrl eval``; a run has its own bar);
    ``keep_completions``: the result holds the completions and their grades (``podsrl eval --completions``);
    ``abandonable``: a stop signal abandons the evaluation (not its record), while training."""
    cfg = run.cfg
    settings = EvalSettings(temperature=cfg.eval.temperature, samples=cfg.eval.samples, seed=cfg.train.seed,
                            max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, min_call=_min_call(run))  # fmt: skip
    with _abandonable(run) if abandonable else contextlib.nullcontext():
        result = evaluate(run.engine, run.eval_prompts, run.eval_examples, settings, dist=run.dist, progress=progress,
                          keep_completions=keep_completions)  # fmt: skip
    if logger is not None:
        state.eval_seconds += result.seconds
        state.last_eval_seconds = state.train_seconds
        logger.log_eval(result, state)
    if log is not None:
        log(f"podsrl: eval at step {state.step}{f' ({label})' if label else ''}: {result.summary()} ({result.seconds:.0f} s)")
    return result


LONG_ON_CPU = 256  # new tokens from which an evaluation on a CPU gets a caution


def _min_call(run: Setup) -> int:
    """The fewest completions an evaluation's engine call holds (:func:`podsrl.train.evaluate.calls`):
    256 on a GPU, where a call costs about the same for 1 and 256 rollouts; 64 on a CPU, where a
    call's own cost is about that of 32 rollouts of 16 tokens (podsrl.train.evaluate's docstring)."""
    return 256 if next(run.policy.model.parameters()).device.type == "cuda" else 64


def describe_eval(run: Setup) -> list[str]:
    """What ``podsrl eval`` is about to do, said before it starts: where the model runs and with
    which engine, how many problems x samples of how many tokens, and on a CPU with long completions
    a caution (the progress bar then estimates the time left)."""
    cfg = run.cfg
    problems, samples = len(run.eval_examples), cfg.eval.samples
    tokens = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    how = "greedy" if cfg.eval.temperature == 0 else f"temperature {cfg.eval.temperature:g}"
    lines = [
        f"{_device_line(run, run.policy.model)}; {problems} problems x {samples} sample{'s' if samples > 1 else ''} "
        f"of up to {tokens} new tokens ({how})"
    ]  # fmt: skip
    if next(run.policy.model.parameters()).device.type == "cpu" and tokens >= LONG_ON_CPU:
        shard = -(-problems // run.dist.world)
        first = min(problems, len(calls(shard, samples, _min_call(run))[0]) * run.dist.world) if problems else 0  # every rank's first call
        lines.append(
            f"podsrl: note: on a CPU, completions of up to {tokens} tokens are slow: the progress bar estimates the time "
            f"left once its first call of {first} problem{'s' if first != 1 else ''} is done; --eval.max_problems=N "
            "scores the first N problems only"
        )
    return lines


def resolve_run_dir(cfg: Config) -> Path:
    name = cfg.train.out_dir.format(time=time.strftime("%Y%m%d-%H%M%S"), rule=cfg.select.rule, seed=cfg.train.seed)
    return Path(name)


def train(cfg: Config, *, run_dir: Path | None = None, resume: bool = False, overwrite: bool = False, log=print) -> Path:
    """Train per ``cfg`` into ``run_dir`` (default: a new directory named by ``train.out_dir``);
    ``resume`` continues it from its newest complete checkpoint, ``overwrite`` replaces the run it
    holds. A directory holding another run, or in use, is refused: see :mod:`podsrl.run.rundir`."""
    dist = init_distributed(cfg)  # a process group under torchrun; otherwise world 1, no group
    finished = False
    try:
        with Heartbeat(dist, cfg.distributed.hang_seconds):  # a hung or lost rank stops every rank
            run_dir = _train(cfg, dist, run_dir=run_dir, resume=resume, overwrite=overwrite, log=log if dist.is_main else _quiet)
        finished = True
        return run_dir
    finally:
        dist.close(barrier=finished)


def _train(cfg: Config, dist: Dist, *, run_dir: Path | None, resume: bool, overwrite: bool, log) -> Path:
    if cfg.train.resume == "auto" and not (resume or overwrite):  # the same command starts and restarts
        run_dir, resume, overwrite = dist.from_main(lambda: preemption.auto_resume(run_dir, cfg))
        log(f"podsrl: train.resume = 'auto': {'resuming' if resume else 'restarting' if overwrite else 'starting'} {run_dir}")
    cfg, note = _trained_m(cfg, dist, run_dir if resume else None)
    if note is not None:
        log(note)
    try:
        check_trainable(cfg)  # before the model loads
    except ConfigError as err:
        if note is None:
            raise
        raise ConfigError(f"{err}. The run in {run_dir} was trained so and a resumed run keeps its settings: start a new run with --out") from None
    claim = _check_run_dir(cfg, dist, run_dir, resume=resume, overwrite=overwrite)
    run = setup(cfg, dist)
    model = run.policy.model
    model.train()
    optimizer, scheduler = make_optimizer(cfg, model)
    state = ckpt.TrainState(world_size=dist.world)
    try:
        return _run(run, claim, model, optimizer, scheduler, state, resume=resume, log=log)
    except KeyboardInterrupt as err:  # name the run and how to go on (the CLI prints it)
        raise rundir.RunInterrupted(claim.path, ckpt.latest(claim.path)) from err
    except (EngineError, RunWriteError, RewardError) as err:  # fix what failed, then resume
        raise type(err)(f"{err}{rundir.resume_advice(claim.path, ckpt.latest(claim.path))}") from err
    finally:
        run.close()
        claim.close()


def _trained_m(cfg: Config, dist: Dist, resumed: Path | None) -> tuple[Config, str | None]:
    """``cfg`` with ``select.m`` resolved, as config.toml saves it: an unset m is today's default for a
    new run, and the m the run trained with for a resumed one (:func:`podsrl.run.rundir.trained_m`,
    with a line to log when that is not today's default). An m that is set is left to the resume's
    check against the run's own."""
    if resumed is None or cfg.select.m is not None or not (Path(resumed) / "config.toml").is_file():
        return rundir.resolved_m(cfg), None
    m, note = dist.from_main(lambda: rundir.trained_m(resumed))
    return rundir.with_m(cfg, m), note


def _check_run_dir(cfg: Config, dist: Dist, run_dir: Path | None, *, resume: bool, overwrite: bool) -> rundir.RunDir:
    """Checks only, creating nothing (the directory is made once the task, rewards and model have
    loaded). Rank 0 alone checks, and every rank gets its answer or its error: another rank probing
    the lock could find it taken by rank 0 of this very job, which under FSDP (no collective while
    the model is set up) may already have opened the directory."""
    return dist.from_main(  # the default name holds the time: rank 0's clock names it
        lambda: rundir.prepare(run_dir or resolve_run_dir(cfg), cfg, resume=resume, overwrite=overwrite, unique=run_dir is None)
    )


def _open_run_dir(claim: rundir.RunDir, dist: Dist) -> Path:
    """Rank 0 creates and locks the run directory; every rank gets its path, or its error."""
    return dist.from_main(claim.open)


def _run(run: Setup, claim: rundir.RunDir, model, optimizer, scheduler, state: ckpt.TrainState, *, resume: bool, log) -> Path:
    cfg, dist = run.cfg, run.dist
    run_dir = _open_run_dir(claim, dist)
    log(f"podsrl: run directory {run_dir}")
    if resume:
        state = _resume(run, run_dir, model, optimizer, scheduler, log)
        if state.done(cfg):  # nothing to add: no second final evaluation or checkpoint
            why = f" ({note})" if (note := state.overrun_note(cfg)) is not None else ""
            log(f"podsrl: the run has already reached its budget{why}; raise train.max_steps or train.max_seconds to go on")
            return run_dir
    if dist.is_main:
        claim.write_config(cfg, step=state.step, log=log, notes=_config_notes(run))  # atomic; on resume, records what changed
    log(_describe(run, model))
    if (line := schedule_line(cfg)) is not None:
        log(line)
    if run.grading_note is not None:
        log(f"podsrl: warning: {run.grading_note}")
    if (note := repeats_warning(len(run.task.train), cfg)) is not None:
        log(f"podsrl: warning: {note}")
    logger = RunLogger(run_dir, cfg, start_step=state.step, grader=run.task.grader) if dist.is_main else NullLogger()
    save = lambda on_failure="stop": ckpt.save(  # noqa: E731
        run_dir, model, optimizer, scheduler, state, policy=ckpt.SavePolicy(cfg.train.keep_checkpoints, on_failure, log), dist=dist
    )
    # A signal abandons the step or evaluation in progress (or, past the step's optimizer step, ends
    # the step), the checkpoint of the last completed step is written, exit 75 (podsrl.run.preemption).
    stop = preemption.StopSignals(cfg.train.stop_signals, immediate=not dist.sharded).install()
    dist.stop = stop if stop.installed else None  # no stop checks when no signal can come
    doing, start_of_step = None, None  # what a stop signal would abandon; the state of the step's start
    try:
        if state.step == 0 and cfg.eval.at_start:
            doing = "the base model's evaluation"
            run_eval(run, state, logger, log, label="base model", abandonable=True)
        elif resume and _evaluation_missing(run, run_dir, state):
            doing = f"the evaluation at step {state.step}"
            run_eval(run, state, logger, log, abandonable=True)  # due at the checkpoint's step, not done before the stop
        if sig := stop.agreed(dist):  # a signal before the first step: nothing new to save
            raise preemption.Preempted(run_dir, ckpt.latest(run_dir), sig, state.step)
        capped = False  # dynamic sampling's cap was hit (warned once)
        while not state.done(cfg):
            doing, start_of_step = f"step {state.step + 1}", preemption.StepStart.take(state)
            start = time.perf_counter()
            metrics = train_step(run, model, optimizer, scheduler, state)
            start_of_step = None
            state.step += 1
            # Budgets and evaluation times are decided on rank 0's clock, the same on every rank.
            state.record_step(dist.broadcast_object(time.perf_counter() - start))
            metrics["train_seconds"] = state.train_seconds
            logger.log_step(metrics, state)
            capped = _warn_at_the_cap(cfg, metrics, log, capped)
            if sig := stop.agreed(dist):  # one rank's signal is enough: every rank stops after this step
                raise preemption.Preempted(run_dir, save(), sig, state.step)
            if state.eval_due(cfg) and not state.done(cfg):
                doing = f"the evaluation at step {state.step}"
                run_eval(run, state, logger, log, abandonable=True)
            if cfg.train.checkpoint_every and state.step % cfg.train.checkpoint_every == 0:
                path = save(cfg.train.checkpoint_failure)  # "retry": a full disk is a warning until the final save
                if path is not None:
                    export.after_checkpoint(cfg, run_dir, path, dist, final=False, log=log)
        if (note := state.overrun_note(cfg)) is not None:
            log(f"podsrl: stopping after step {state.step}: {note}")
        if cfg.eval.at_end:  # not abandonable, nor what follows: the run has reached its budget and is finishing
            run_eval(run, state, logger, log, label="trained policy")
        export.after_checkpoint(cfg, run_dir, save(), dist, final=True, log=log)
    except preemption.StepAbandoned as abandoned:
        stop.tell(dist, abandoned)  # a rank that stopped on its own signal: the others learn it at their next stop check
        if start_of_step is not None:
            start_of_step.restore(state)  # the prompt stream's position and the RNG states of the last completed step
        raise preemption.Preempted(run_dir, _last_checkpoint(run_dir, state, save, dist), abandoned.signal, state.step, abandoned=doing) from None
    finally:
        stop.restore()
        dist.stop = None
        logger.close()
    return run_dir


def _last_checkpoint(run_dir: Path, state: ckpt.TrainState, save, dist: Dist) -> Path | None:
    """The checkpoint of ``state.step``, the last completed step, after a stop signal abandoned what
    followed it: the one it has (a periodic checkpoint is not written again), else a new one; before
    the first step, the newest there is (none for a new run)."""
    newest = dist.from_main(lambda: ckpt.latest(run_dir))
    if state.step == 0 or (newest is not None and newest.name == f"step-{state.step:06d}"):
        return newest
    return save()


def _evaluation_missing(run: Setup, run_dir: Path, state: ckpt.TrainState) -> bool:
    """A resumed run's checkpoint step had an evaluation due that eval.jsonl lacks: a stop signal
    abandoned it, or came right after the step (the checkpoint comes first). Rank 0 reads the file."""
    if not state.eval_due(run.cfg):
        return False
    return run.dist.from_main(lambda: not any(r.get("step") == state.step for r in read_jsonl(run_dir / "eval.jsonl")))


def _warn_at_the_cap(cfg: Config, metrics: dict, log, warned: bool) -> bool:
    """Warn, the first time only, when dynamic sampling stopped at its cap without B groups that
    passed its signal test (metrics.jsonl has gen_batches and groups_passed for every step); returns
    whether warned. (``groups_with_signal`` counts the groups the step's selection trained with a
    signal, which ``d3s_cross``'s pooled selection may leave below the groups that passed.)"""
    B, cap = cfg.train.prompts_per_step, cfg.rollout.max_gen_batches
    if warned or not cfg.rollout.dynamic_sampling or metrics["gen_batches"] < cap or metrics["groups_passed"] >= B:
        return warned
    log(
        f"podsrl: warning: step {metrics['step']}: {metrics['groups_passed']} of {B} groups had a signal after "
        f"rollout.max_gen_batches = {cap} batches of {B} prompts; the step trained on those (warned once; metrics.jsonl "
        "logs gen_batches and groups_passed every step). Raise rollout.max_gen_batches, or sample more per prompt "
        "(rollout.n) where the task is too easy or too hard for the policy"
    )
    return True


def _resume(run: Setup, run_dir: Path, model, optimizer, scheduler, log) -> ckpt.TrainState:
    """Load the newest complete checkpoint into the model and optimizer; the engine follows."""
    _, state = ckpt.load_newest(run_dir, model, optimizer, scheduler, log=log, dist=run.dist)
    run.engine.sync_weights(model)
    log(f"podsrl: resumed {run_dir} at step {state.step} ({state.train_seconds:.0f} s of training)")
    if (why := run.prompts.load_state_dict(state.prompts)) is not None:
        log(f"podsrl: prompt stream: {why}")
    if state.world_size != run.dist.world:
        log(
            f"podsrl: the run was trained on {state.world_size} process(es), now {run.dist.world}: the global batch "
            "and the weights carry over; the rollouts differ from an uninterrupted run's (seeds are per rank)"
        )
        state.world_size = run.dist.world
    return state


def _device_line(run: Setup, model) -> str:
    """Where the model runs, with which rollout engine and why (for an engine with a sampler of its
    own, vLLM or transformers-static: in which dtype it samples and why, and whether its decoding is
    compiled), on how many processes."""
    cfg, dist = run.cfg, run.dist
    device = next(model.parameters()).device
    sampler = getattr(run.engine, "sampler_dtype", None)  # vLLM's and transformers-static's; the transformers engine samples with the policy
    engine = choose_engine(cfg.rollout.engine, device.type == "cuda")
    return (
        f"podsrl: model on {device}" + (" (model.device='auto')" if cfg.model.device == "auto" else "")
        + f", rollout engine {engine.name}" + (f" (rollout.engine='auto': {engine.reason})" if cfg.rollout.engine == "auto" else "")
        + (f", sampler {sampler.describe()}, {_correction(cfg.rollout)}" if sampler is not None else "")
        + (", decoding compiled (torch.compile, CUDA graphs)" if getattr(run.engine, "compiled", False) else "")
        + (f", {dist.world} processes ({dist.backend}, {cfg.distributed.parallel})" if dist.active else "")
    )  # fmt: skip


def _correction(rollout: RolloutConfig) -> str:
    """The importance correction of the sampler's gap, for the start-up line (docs/vllm.md)."""
    if not rollout.importance_sampling_correction:
        return "no importance correction (rollout.importance_sampling_correction = false)"
    bounds = f"clip_max {rollout.importance_sampling_clip_max:g}" + (
        f", clip_min {rollout.importance_sampling_clip_min:g}" if rollout.importance_sampling_clip_min is not None else ""
    )
    return f"importance correction {rollout.importance_sampling_mode} ({bounds}; rollout.importance_sampling_mode)"


def _config_notes(run: Setup) -> dict[str, str]:
    """Comments for config.toml: what the machine-dependent ``rollout.sampler_dtype`` ("auto",
    "fast") and ``model.mixed_precision = "auto"`` resolved to where the run (re)started, so the run
    directory records the dtype it sampled in and the arithmetic of its update (the settings
    themselves stay as given: trained again elsewhere, they resolve there)."""
    notes = {}
    if run.precision.setting == "auto":
        notes["model.mixed_precision"] = f"{run.precision.name} where the run last started: {run.precision.reason}"
    sampler = getattr(run.engine, "sampler_dtype", None)
    if sampler is not None and sampler.setting != sampler.name:
        notes["rollout.sampler_dtype"] = f"{sampler.name} where the run last started: {sampler.reason}"
    return notes


def _describe(run: Setup, model) -> str:
    cfg = run.cfg
    return (
        _device_line(run, model)
        + f", {run.precision.describe()}"
        + (f", {hostmem.describe()}" if next(model.parameters()).device.type == "cpu" else "")
        + (f", exact early stopping in rounds of {cfg.rollout.round_size or 'm'} (reward values {list(run.reward_values or [])})"
           if cfg.rollout.early_stop == "exact" else "")
        + (f", dynamic sampling (up to {cfg.rollout.max_gen_batches} batches of {cfg.train.prompts_per_step} prompts a step)"
           if cfg.rollout.dynamic_sampling else "")
    )  # fmt: skip


def _quiet(*args, **kwargs) -> None:
    """``log`` on ranks other than 0."""


class _Timer:
    """``with timer("phase"):`` adds the block's wall-clock seconds to ``timer.seconds["phase"]``."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

