"""The mapping of a run's podsrl config onto TRL's ``GRPOConfig`` (``trainer = "trl"``) or
``PODSConfig`` (``"trl-pods"``), in one place: every setting that means the same in both tools
(docs/trl.md, "TRL arms in podsrl compare", tables each one and every TRL default left as it is),
and the refusal of a setting TRL has no equivalent for (:func:`check_arm`, when the plan loads).
Pure: no TRL import, so a plan loads and a report builds without TRL.

**The loss.** ``loss.aggregation`` maps onto TRL's ``loss_type`` (:data:`LOSS_TYPES`): "sequence"
-> "grpo" (each completion's token mean, then the mean over completions), "token" -> "dapo" (the
sum over the generation batch's tokens divided by their count, ``num_items_in_batch``, whatever the
micro-batching: podsrl's "token" divides by the step's tokens, ``BatchCounts.tokens``; TRL's "bnpo"
divides each micro-batch by its own tokens and averages the micro-batches, the same only with one
micro-batch), "constant" -> "dr_grpo" (the sum over tokens divided by rows x
``max_completion_length`` = ``rollout.max_new_tokens``, per micro-batch then averaged over the
equal micro-batches: the step's rows x L, podsrl's ``total_sequences x max_completion_len``). A
comparison that does not set ``loss.aggregation`` trains a TRL arm with TRL's own default loss
(:data:`TRL_DEFAULT_LOSS_TYPE`, "dapo": :data:`TRL_DEFAULTS` gives its podsrl name, "token", which
the arm's config.toml records) and a podsrl arm with podsrl's: each tool as its users run it; set
it in the base config to compare like with like (:func:`podsrl.compare.plan.resolve`).

**Steps.** TRL counts ``max_steps``, warm-up and ``global_step`` in optimizer steps, podsrl in
generation steps of ``loss.policy_iterations`` optimizer steps each: with more than one iteration
the two would mean different budgets and schedules, so ``policy_iterations > 1`` is refused.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from podsrl.config import Config
from podsrl.errors import ConfigError
from podsrl.models import DTYPES
from podsrl.train.precision import resolve_mixed_precision

TRL_TRAINERS = {"trl": "TRL GRPOTrainer", "trl-pods": "TRL PODSTrainer"}
# loss.aggregation -> TRL's loss_type (the module docstring says why each pair is the same loss)
LOSS_TYPES = {"sequence": "grpo", "token": "dapo", "constant": "dr_grpo"}
TRL_DEFAULT_LOSS_TYPE = "dapo"  # TRL 1.16's GRPOConfig.loss_type (tests/test_compare_trl.py checks it)
# What a TRL arm trains with where the comparison's config does not set it: TRL's own defaults, in podsrl's names.
TRL_DEFAULTS = {"loss.aggregation": {v: k for k, v in LOSS_TYPES.items()}[TRL_DEFAULT_LOSS_TYPE]}
BIG_MAX_STEPS = 10**9  # TRL's max_steps when the budget is training time alone (the clock stops the run)


def check_arm(cfg: Config, trainer: str) -> None:
    """ConfigError for a setting a TRL arm (``trainer``: "trl" or "trl-pods") cannot honour, naming it."""
    r, s = cfg.rollout, cfg.select

    def refuse(setting: str, why: str) -> None:
        raise ConfigError(f"{setting}: {why}; a trainer = {trainer!r} arm (TRL) cannot; drop it from this method or the base")

    if r.early_stop != "off":
        refuse("rollout.early_stop", "podsrl's exact early stopping samples in rounds")
    if r.dynamic_sampling:
        refuse("rollout.dynamic_sampling", "podsrl's dynamic sampling samples further batches")
    if cfg.prompts.skip_silent:
        refuse("prompts.skip_silent", "podsrl's prompt selection skips prompts")
    if cfg.loss.policy_iterations > 1:
        refuse(f"loss.policy_iterations = {cfg.loss.policy_iterations}", "podsrl counts a step, its budget and its warm-up in "
               "generations, TRL (num_iterations) in optimizer steps, so the budgets and schedules would differ")  # fmt: skip
    if trainer == "trl":
        m = s.m_start(r.n)
        if s.rule != "all" or m != r.n or s.m_final not in (None, r.n):
            raise ConfigError(f"select.rule = {s.rule!r}, m = {m}: TRL's GRPOTrainer trains on every rollout (rule 'all', "
                              "m = n); use trainer = \"trl-pods\" (PODSTrainer) to down-sample")  # fmt: skip
        if s.filter_zero_variance or s.uses_token_selection:
            raise ConfigError("select.filter_zero_variance / select.token_fraction: TRL's GRPOTrainer has neither; "
                              "use trainer = \"trl-pods\" (PODSTrainer)")  # fmt: skip
    if cfg.optim.micro_batch_tokens:
        refuse(f"optim.micro_batch_tokens = {cfg.optim.micro_batch_tokens}", "TRL cuts its micro-batches by rows (per_device_train_batch_size)")
    if cfg.optim.lr_schedule == "cosine" and not cfg.train.max_steps:
        refuse("optim.lr_schedule = 'cosine'", "a cosine schedule needs train.max_steps")


def micro_steps(rows: int, micro: int) -> int:
    """Micro-batches per optimizer step: the fewest g such that ceil(rows / g) <= ``micro``."""
    return max(1, math.ceil(rows / max(1, micro)))


def grpo_config(cfg: Config, trainer: str, output_dir: Path, *, device: str) -> dict[str, Any]:
    """The GRPOConfig (``trainer = "trl"``) or PODSConfig (``"trl-pods"``) arguments of a run of
    ``cfg`` (docs/trl.md has the table). ``device``: "cpu" or "cuda"."""
    args = {"output_dir": str(output_dir), **_batch(cfg, trainer), **_sampling(cfg), **_loss(cfg), **_optimizer(cfg),
            **_run(cfg, device)}  # fmt: skip
    if trainer == "trl-pods":
        args.update(_selection(cfg))
    return args


def _batch(cfg: Config, trainer: str) -> dict[str, Any]:
    """B prompts x n per optimizer step, one generation per step, its rows trained in micro-batches of
    at most optim.micro_batch_size (PODSTrainer: the kept B x m; TRL counts the sampled B x n)."""
    B, n, s = cfg.train.prompts_per_step, cfg.rollout.n, cfg.select
    m = max(s.m_start(n), s.m_final or 0) if trainer == "trl-pods" else n
    g = micro_steps(B * m, cfg.optim.micro_batch_size)
    while (B * n) % g:
        g += 1
    return {"num_generations": n, "per_device_train_batch_size": B * n // g, "gradient_accumulation_steps": g}


def _sampling(cfg: Config) -> dict[str, Any]:
    """TRL's own engine, transformers generate, at podsrl's sampling settings."""
    r = cfg.rollout
    return {"use_vllm": False, "max_completion_length": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p, "top_k": 0}


def _loss(cfg: Config) -> dict[str, Any]:
    """Advantages and loss (the module docstring: ``loss_type``)."""
    s, loss = cfg.select, cfg.loss
    return {
        "scale_rewards": "none" if not s.scale_std else ("batch" if s.std_over == "batch" else "group"),
        "loss_type": LOSS_TYPES[loss.aggregation],
        "epsilon": loss.eps_low,
        "epsilon_high": loss.eps_high if loss.eps_high is not None else loss.eps_low,
        "beta": loss.beta,
        "num_iterations": loss.policy_iterations,
        "reward_weights": list(cfg.reward.weights),
    }


def _optimizer(cfg: Config) -> dict[str, Any]:
    """AdamW and its schedule; weight decay spares biases and norm weights in both tools
    (:func:`podsrl.train.loop.make_optimizer` follows transformers' convention)."""
    o = cfg.optim
    schedule = {"constant": "constant_with_warmup" if o.warmup_steps else "constant", "cosine": "cosine"}[o.lr_schedule]
    return {"learning_rate": o.lr, "weight_decay": o.weight_decay, "adam_beta1": o.beta1, "adam_beta2": o.beta2,
            "max_grad_norm": o.grad_clip, "lr_scheduler_type": schedule, "warmup_steps": o.warmup_steps,
            "gradient_checkpointing": cfg.model.gradient_checkpointing}  # fmt: skip


def _run(cfg: Config, device: str) -> dict[str, Any]:
    """The budget (read on the training clock: max_steps as TRL needs one), the seed, the machine and
    precision (the policy podsrl loaded, in model.dtype; bf16 autocast where podsrl's update takes it,
    model.mixed_precision), and what TRL writes."""
    t = cfg.train
    return {
        "max_steps": t.max_steps or BIG_MAX_STEPS,
        "seed": t.seed,
        "use_cpu": device == "cpu",
        "bf16": resolve_mixed_precision(cfg.model.mixed_precision, torch.device(device), DTYPES[cfg.model.dtype]).enabled,
        "fp16": False,
        "logging_steps": 1,
        "save_strategy": "no",  # saves come from the training clock, at podsrl's evaluation times
        "save_total_limit": max(1, t.keep_checkpoints),
        "report_to": "none",
        "disable_tqdm": True,  # podsrl's own bar (train.progress) counts the steps; TRL's would count to max_steps
        "log_completions": False,
    }


def _selection(cfg: Config) -> dict[str, Any]:
    """PODSTrainer's ``pods_<name>``: the [select] spec, the selection seed, skipping zero advantages."""
    from podsrl.core.downsample import DownsampleSpec

    spec = {f.name for f in dataclasses.fields(DownsampleSpec)} - {"scale_std", "std_over"}
    out: dict[str, Any] = {f"pods_{name}": getattr(cfg.select, name) for name in sorted(spec)}
    out.update(pods_seed=cfg.train.seed, pods_skip_zero_advantage=cfg.optim.skip_zero_advantage)
    return out
