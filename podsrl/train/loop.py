"""The training loop: prompts -> rollouts -> rewards -> selection -> advantages -> update -> eval.

One step (``train_step``) of B prompts:
  1. sample n rollouts per prompt with the engine (current weights);
  2. score them with the reward functions -> rewards [B, n];
  3. keep B*m of them with the selection rule (PODS / D3S sample level), m from its schedule;
  4. advantages over the kept subset (PODS) or the full group (GRPO, D3S);
  5. one optimizer step on the kept rollouts only (``podsrl.train.update``), D3S token selection inside;
  6. push the new weights to the engine.
Evaluation runs every k steps and/or every T seconds of *training* time; its own time is recorded
but kept off the training clock, which is what budgets and wall-clock plots measure.

Every random number of step s comes from generators seeded by (seed, s): which prompts, the
sampling seed, tie-breaking in selection, dropout. A resumed run therefore continues exactly as an
uninterrupted one would, given the checkpointed weights and optimizer state.

Under torchrun every rank runs this same loop on its B / world prompts (``s.dist``, see
:mod:`podsrl.train.distributed`): rewards are gathered so that selection, advantages and metrics are the
global ones, the update sums the ranks' gradients, and only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from podsrl.run import checkpoint as ckpt
from podsrl.run import rundir
from podsrl.core.advantages import group_advantages
from podsrl.config import Config
from podsrl.train.distributed import Dist, fsdp_wrap, rank_device
from podsrl.errors import ConfigError
from podsrl.engines import Engine, Sampling, make_engine, resolve_engine
from podsrl.train.evaluate import EvalResult, evaluate
from podsrl.models import Policy, load_policy
from podsrl.grading.rewards import RewardSpec, compute_rewards, resolve_specs
from podsrl.core.schedules import schedule_value, scheduled_m
from podsrl.core.selection import drop_zero_variance_groups, get_rule
from podsrl.tasks import Example, Task, format_user_message, load_task
from podsrl.train.update import UpdateBatch, run_update


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
    dist: Dist = field(default_factory=Dist)  # this process's rank and world (world 1: alone)


def build_task(cfg: Config) -> Task:
    import dataclasses

    options = dict(cfg.task.options)
    if "seed" in _loader_params(cfg.task.name):
        options.setdefault("seed", cfg.train.seed)
    task = load_task(cfg.task.name, **options)
    if cfg.task.instruction is not None:
        task = dataclasses.replace(task, instruction=cfg.task.instruction)
    if cfg.task.system_prompt is not None:
        task = dataclasses.replace(task, system_prompt=cfg.task.system_prompt)
    return task


def _loader_params(name: str) -> set[str]:
    import inspect

    from podsrl.tasks import TASKS

    return set(inspect.signature(TASKS[name]).parameters)


def prompt_ids(tokenizer, task: Task, examples: list[Example]) -> list[list[int]]:
    """Chat-template each question (with the task's instruction and optional system prompt)."""
    out = []
    for ex in examples:
        messages = [{"role": "user", "content": format_user_message(ex, task)}]
        if task.system_prompt:
            messages.insert(0, {"role": "system", "content": task.system_prompt})
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
    rewards = resolve_specs(list(zip(cfg.reward.names, cfg.reward.weights)))
    policy = load_policy(cfg.model, device=rank_device(cfg.model.device, dist.local_rank, dist.world) if dist.active else None)
    if dist.active:
        if dist.sharded:
            on_gpu = next(policy.model.parameters()).device.type == "cuda"
            mp = cfg.distributed.mixed_precision
            fsdp_wrap(policy.model, mixed_precision=mp == "bf16" or (mp == "auto" and on_gpu))
        else:
            dist.broadcast_params(policy.model)  # identical start on every rank (LoRA's random A)
    threads = torch.get_num_threads()
    engine = make_engine(cfg.rollout, policy)
    torch.set_num_threads(threads)  # an in-process engine (vLLM) may lower it for itself
    if dist.sharded:
        engine.synced_gpus = True
    eval_examples = task.eval[: cfg.eval.max_problems] if cfg.eval.max_problems else task.eval
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
        dist=dist,
    )


def make_optimizer(cfg: Config, model: torch.nn.Module):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, betas=(cfg.optim.beta1, cfg.optim.beta2)
    )
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
    """Training progress in [0, 1]: the further of the step and the wall-clock budgets."""
    parts = []
    if cfg.train.max_steps:
        parts.append(state.step / cfg.train.max_steps)
    if cfg.train.max_seconds:
        parts.append(state.train_seconds / cfg.train.max_seconds)
    return min(1.0, max(parts))


def _step_seed(seed: int, step: int, stream: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**31 - 1)


def train_step(s: Setup, model, optimizer, scheduler, state: ckpt.TrainState) -> dict:
    """One step of B prompts (B / world on each rank); returns its metrics (one line of metrics.jsonl)."""
    cfg, n, dist = s.cfg, s.cfg.rollout.n, s.dist
    B = cfg.train.prompts_per_step  # global
    p = progress(cfg, state)
    m = scheduled_m(n, cfg.select.m, cfg.select.m_final or cfg.select.m, cfg.select.m_schedule, p)
    token_fraction = schedule_value(
        cfg.select.token_schedule, cfg.select.token_fraction, cfg.select.token_fraction_final or cfg.select.token_fraction, p
    )
    rng = random.Random(_step_seed(cfg.train.seed, state.step, 0))
    selection_gen = torch.Generator().manual_seed(_step_seed(cfg.train.seed, state.step, 1))
    torch.manual_seed(_step_seed(cfg.train.seed, state.step, 2))  # dropout, HF sampling
    timer = _Timer()
    dist.reset_counters()

    # 1. Rollouts: B prompts x n samples, group-major; this rank samples its block of whole groups.
    idx = rng.sample(range(len(s.task.train)), B) if B <= len(s.task.train) else rng.choices(range(len(s.task.train)), k=B)
    idx = dist.shard(idx)
    examples = [s.task.train[i] for i in idx]
    with timer("generate"):
        ro = s.engine.generate(
            [s.train_prompts[i] for i in idx],
            Sampling(
                n=n,
                temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p,
                max_new_tokens=cfg.rollout.max_new_tokens,
                seed=_step_seed(cfg.train.seed, state.step, 3 + 100 * dist.rank),
            ),
        )
    # 2. Rewards [b, n] of this rank's groups; with them, what the metrics need, gathered to [B, n].
    with timer("reward"):
        scored = compute_rewards(ro.texts, [ex for ex in examples for _ in range(n)], s.rewards)
        local = torch.tensor(
            [scored.total, [len(c) for c in ro.completion_ids], ro.truncated, *scored.per_reward.values()],
            dtype=torch.float32,
        ).T.reshape(len(idx), n, -1)  # [b, n, 3 + rewards]: total, length, truncated, each reward
        table = dist.gather_rows(local)  # [B, n, 3 + rewards]
        rewards = table[..., 0]  # [B, n]
    # 3-4. Selection and advantages, on the global batch (identical on every rank).
    with timer("select"):
        keep = get_rule(cfg.select.rule)(rewards, m, generator=selection_gen)  # [B, n] bool
        if cfg.select.filter_zero_variance:
            keep = drop_zero_variance_groups(keep, rewards)
        if cfg.select.advantages_over_group:
            adv = group_advantages(rewards, None, scale_std=cfg.select.scale_std) * keep
        else:
            adv = group_advantages(rewards, keep, scale_std=cfg.select.scale_std)
        kept = dist.local_rows(keep).flatten().nonzero().flatten().tolist()  # this rank's rows
    # 5. Update on the kept rollouts only.
    with timer("update"):
        prompts_flat = [s.train_prompts[i] for i in idx for _ in range(n)]
        stats = None
        if keep.any():  # every rank joins, with its rows or with none
            stats = run_update(
                model,
                optimizer,
                scheduler,
                UpdateBatch(
                    prompt_ids=[prompts_flat[i] for i in kept],
                    completion_ids=[ro.completion_ids[i] for i in kept],
                    advantages=dist.local_rows(adv).flatten()[kept],
                ),
                pad_id=s.policy.tokenizer.pad_token_id,
                micro_batch_size=cfg.optim.micro_batch_size,
                temperature=cfg.rollout.temperature,
                eps_low=cfg.loss.eps_low,
                eps_high=cfg.loss.eps_high,
                aggregation=cfg.loss.aggregation,
                max_completion_len=cfg.rollout.max_new_tokens,
                grad_clip=cfg.optim.grad_clip,
                policy_iterations=cfg.loss.policy_iterations,
                token_fraction=token_fraction if cfg.select.uses_token_selection else 1.0,
                token_score=cfg.select.token_score,
                beta=cfg.loss.beta,
                share_prompts=cfg.optim.share_prompts,
                reference=s.reference,
                dist=dist,
            )
        # else: every group was filtered out; no signal, so no optimizer step this time.
    # 6. The engine samples from the new weights next step.
    with timer("sync"):
        s.engine.sync_weights(model)

    lengths = table[..., 1].flatten()  # [B*n]
    kept_r = rewards[keep]
    kept_adv = adv[keep]
    metrics = {
        "step": state.step + 1,
        "m": m,
        "token_fraction": token_fraction,
        "lr": scheduler.get_last_lr()[0],
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "reward_kept_mean": float(kept_r.mean()) if kept_r.numel() else float("nan"),
        "reward_kept_std": float(kept_r.std()) if kept_r.numel() > 1 else 0.0,
        "zero_variance_groups": float((rewards.amax(1) == rewards.amin(1)).float().mean()),
        "kept_adv_var": float(kept_adv.var(unbiased=False)) if kept_adv.numel() else 0.0,
        "kept": int(keep.sum()),
        "completion_len": float(lengths.mean()),
        "completion_len_kept": float(lengths[keep.flatten()].mean()) if keep.any() else 0.0,
        "truncated": float(table[..., 2].mean()),
        **{f"reward/{k}": float(table[..., 3 + j].mean()) for j, k in enumerate(scored.per_reward)},
    }
    if stats is not None:
        metrics.update(
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            clip_frac_low=stats.clip_frac_low,
            clip_frac_high=stats.clip_frac_high,
            ratio_mean=stats.ratio_mean,
            entropy=stats.entropy,
            tokens_total=stats.tokens_total,
            tokens_kept=stats.tokens_kept,
            **({"kl": stats.kl} if stats.kl is not None else {}),
        )
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


def run_eval(s: Setup, state: ckpt.TrainState, run_dir: Path | None = None) -> EvalResult:
    cfg = s.cfg
    result = evaluate(
        s.engine,
        s.eval_prompts,
        s.eval_examples,
        temperature=cfg.eval.temperature,
        samples=cfg.eval.samples,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
        seed=cfg.train.seed,
        dist=s.dist,
    )
    if run_dir is not None and s.dist.is_main:
        row = {"step": state.step, "train_seconds": state.train_seconds, **result.to_dict()}
        with open(run_dir / "eval.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    return result


def _eval_due(cfg: Config, state: ckpt.TrainState) -> bool:
    e = cfg.eval
    by_step = e.every_steps and state.step % e.every_steps == 0
    by_time = e.every_seconds and state.train_seconds - state.last_eval_seconds >= e.every_seconds
    return bool(by_step or by_time)


def _done(cfg: Config, state: ckpt.TrainState) -> bool:
    t = cfg.train
    return bool((t.max_steps and state.step >= t.max_steps) or (t.max_seconds and state.train_seconds >= t.max_seconds))


def resolve_run_dir(cfg: Config) -> Path:
    name = cfg.train.out_dir.format(time=time.strftime("%Y%m%d-%H%M%S"), rule=cfg.select.rule, seed=cfg.train.seed)
    return Path(name)


def train(cfg: Config, *, run_dir: Path | None = None, resume: bool = False, overwrite: bool = False, log=print) -> Path:
    """Train per ``cfg`` into ``run_dir`` (default: a new directory named by ``train.out_dir``);
    ``resume`` continues it from its newest complete checkpoint, ``overwrite`` replaces the run it
    holds. A directory holding another run, or in use, is refused: see :mod:`podsrl.run.rundir`."""
    from podsrl.train import distributed

    dist = distributed.init(cfg)  # a process group under torchrun; otherwise world 1, no group
    try:
        return _train(cfg, dist, run_dir=run_dir, resume=resume, overwrite=overwrite, log=log if dist.is_main else _quiet)
    finally:
        dist.close()


def _train(cfg: Config, dist: Dist, *, run_dir: Path | None, resume: bool, overwrite: bool, log) -> Path:
    # Checks only (every rank): the directory is made once the task, rewards and model have loaded.
    claim = rundir.prepare(
        run_dir if run_dir is not None else resolve_run_dir(cfg), cfg, resume=resume, overwrite=overwrite, unique=run_dir is None
    )
    s = setup(cfg, dist)
    model = s.policy.model
    model.train()
    optimizer, scheduler = make_optimizer(cfg, model)
    state = ckpt.TrainState(world_size=dist.world)
    try:
        return _run(s, claim, model, optimizer, scheduler, state, resume=resume, log=log)
    except KeyboardInterrupt as err:  # name the run and how to go on (the CLI prints it)
        raise rundir.RunInterrupted(claim.path, ckpt.latest(claim.path)) from err
    finally:
        s.engine.close()
        claim.close()


def _open_run_dir(claim: rundir.RunDir, dist: Dist) -> Path:
    """Rank 0 creates and locks the run directory; every rank gets its path, or its error."""
    opened: str | ConfigError | None = None
    if dist.is_main:
        try:
            opened = str(claim.open())
        except ConfigError as err:
            opened = err
    opened = dist.broadcast_object(opened)
    if isinstance(opened, ConfigError):
        raise opened
    return Path(opened)


def _run(s: Setup, claim: rundir.RunDir, model, optimizer, scheduler, state: ckpt.TrainState, *, resume: bool, log) -> Path:
    from podsrl.run.metrics import NullLogger, RunLogger

    cfg, dist = s.cfg, s.dist
    run_dir = _open_run_dir(claim, dist)
    log(f"podsrl: run directory {run_dir}")
    if resume:
        _, state = ckpt.load_newest(run_dir, model, optimizer, scheduler, log=log, dist=dist)
        s.engine.sync_weights(model)
        log(f"podsrl: resumed {run_dir} at step {state.step} ({state.train_seconds:.0f} s of training)")
        if state.world_size != dist.world:
            log(
                f"podsrl: the run was trained on {state.world_size} process(es), now {dist.world}: the global batch "
                "and the weights carry over; the rollouts differ from an uninterrupted run's (seeds are per rank)"
            )
            state.world_size = dist.world
        if _done(cfg, state):  # nothing to add: no second final evaluation or checkpoint
            log("podsrl: the run has already reached its budget; raise train.max_steps or train.max_seconds to go on")
            return run_dir
    if dist.is_main:
        claim.write_config(cfg, step=state.step, log=log)  # atomic; on resume, records what changed
    device = next(model.parameters()).device
    log(
        f"podsrl: model on {device}" + (" (model.device='auto')" if cfg.model.device == "auto" else "")
        + f", rollout engine {resolve_engine(cfg.rollout.engine)}" + (" (rollout.engine='auto')" if cfg.rollout.engine == "auto" else "")
        + (f", {dist.world} processes ({dist.backend}, {cfg.distributed.parallel})" if dist.active else "")
    )  # fmt: skip
    logger = RunLogger(run_dir, cfg, start_step=state.step) if dist.is_main else NullLogger()
    try:
        if state.step == 0 and cfg.eval.at_start:
            _timed_eval(s, state, run_dir, logger, log, label="base model")
        while not _done(cfg, state):
            start = time.perf_counter()
            metrics = train_step(s, model, optimizer, scheduler, state)
            state.step += 1
            # Budgets and evaluation times are decided on rank 0's clock, the same on every rank.
            state.train_seconds = dist.broadcast_object(state.train_seconds + time.perf_counter() - start)
            metrics["train_seconds"] = state.train_seconds
            logger.log_step(metrics, state)
            if _eval_due(cfg, state) and not _done(cfg, state):
                _timed_eval(s, state, run_dir, logger, log)
            if cfg.train.checkpoint_every and state.step % cfg.train.checkpoint_every == 0:
                ckpt.save(run_dir, model, optimizer, scheduler, state, keep=cfg.train.keep_checkpoints, dist=dist)
        if cfg.eval.at_end:
            _timed_eval(s, state, run_dir, logger, log, label="trained policy")
        ckpt.save(run_dir, model, optimizer, scheduler, state, keep=cfg.train.keep_checkpoints, dist=dist)
    finally:
        logger.close()
    return run_dir


def _quiet(*args, **kwargs) -> None:
    """``log`` on ranks other than 0."""


def _timed_eval(s: Setup, state: ckpt.TrainState, run_dir: Path, logger, log, label: str | None = None) -> None:
    result = run_eval(s, state, run_dir)
    state.eval_seconds += result.seconds
    state.last_eval_seconds = state.train_seconds
    logger.log_eval(result, state)
    log(f"podsrl: eval at step {state.step}{f' ({label})' if label else ''}: {result.summary()} ({result.seconds:.0f} s)")


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

