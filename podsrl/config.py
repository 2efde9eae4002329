"""All configuration, typed and validated in one place.

A run is described by :class:`Config`, a tree of frozen dataclasses. It is built from defaults, then
an optional TOML file, then ``--section.key=value`` overrides (``load``). Every field is checked in
``__post_init__``; a bad value raises :class:`~podsrl.errors.ConfigError` naming the field and the
fix, and the CLI prints that message without a traceback. The resolved config is saved as
``config.toml`` in every run directory, and ``podsrl train that/config.toml`` reproduces the run.
Paths that name local data are resolved when a config is built: a relative task ``path`` /
``eval_path``, user reward file or model directory that exists (against the working directory) is
made absolute, so a run's config.toml works from any directory (docs/run-directory.md).

The defaults are the embedded demo: SmolLM2-135M-Instruct, full fine-tuning, one-digit arithmetic,
PODS max-variance with n=16 rollouts per prompt and m=4 kept for the update, 4 minutes of
training on a CPU (held-out accuracy saturates at about 82-86% from the third minute on: docs/results.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import tomllib
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from podsrl.core.downsample import DownsampleSpec
from podsrl.core.importance import MODES, ImportanceSettings
from podsrl.errors import ConfigError


def _check(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


def _one_of(value: object, valid: typing.Iterable[str], name: str) -> None:
    valid = sorted(valid)
    _check(value in valid, name, f"unknown value {value!r}; valid values: {', '.join(map(str, valid))}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "smollm2-135m-instruct"  # hub id, local directory, or an embedded model's name
    dtype: str = "float32"  # "float32" | "bfloat16" | "float16": the policy's weights; training takes float32, or bfloat16 with LoRA
    mixed_precision: str = "auto"  # the update's arithmetic, every path (one process, DDP, FSDP): "auto" (bf16 where the model's device computes bfloat16 natively: a GPU with native bf16, a CPU with avx512_bf16/amx_bf16/bf16 in /proc/cpuinfo; else none; the start-up line says which and why) | "bf16" (bfloat16 autocast over float32 weights, gradients and AdamW state; log-probs, loss and ratios stay float32) | "none" (the weights' dtype); podsrl/train/precision.py
    lora: bool = False  # False: full fine-tuning
    lora_rank: int = 64  # LoRA rank r (with lora = true)
    lora_alpha: int = 64  # LoRA scale numerator: the adapter's update is scaled by lora_alpha / lora_rank
    lora_dropout: float = 0.0  # dropout on the LoRA branch, in [0, 1)
    lora_target_modules: str | list[str] = "all-linear"  # "all-linear" or a list of module names that get LoRA adapters
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, more compute
    device: str = "auto"  # "auto" (the GPU when torch sees one, else the CPU), "cpu", "cuda", "cuda:N"

    def __post_init__(self) -> None:
        _one_of(self.dtype, ("float32", "bfloat16", "float16"), "model.dtype")
        _one_of(self.mixed_precision, ("auto", "bf16", "none"), "model.mixed_precision")
        _check(
            self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device) is not None,
            "model.device",
            f"unknown value {self.device!r}; valid values: auto, cpu, cuda, cuda:N (N the GPU's index)",
        )
        from podsrl.models import EMBEDDED

        path = Path(self.name).expanduser()
        if self.name not in EMBEDDED and not path.is_absolute() and path.is_dir():  # a local model directory
            object.__setattr__(self, "name", str(path.absolute()))  # the saved config.toml works from anywhere
        _check(self.lora_rank >= 1, "model.lora_rank", "must be >= 1")
        _check(self.lora_alpha > 0, "model.lora_alpha", "must be > 0")
        _check(0 <= self.lora_dropout < 1, "model.lora_dropout", "must be in [0, 1)")


# The demo's options for the default task. Options given for a task are merged over its entry here
# (so `--task.options.max_digits=3` keeps the rest); other tasks start from their loaders' defaults.
DEFAULT_TASK_OPTIONS: dict[str, dict[str, Any]] = {
    # One-digit +, - and x: 300 problems, 200 held out, the other 100 to train on. SmolLM2-135M gets
    # about 16% of them right when sampling at temperature 1 and rambles past the answer; two-digit
    # addition (3% greedy) is too hard for it to show learning within minutes on a CPU.
    "arithmetic": {"ops": ["+", "-", "*"], "min_digits": 1, "max_digits": 1, "num_train": 100, "num_eval": 200},
}


@dataclass(frozen=True)
class TaskConfig:
    name: str = "arithmetic"  # arithmetic | gsm8k | jsonl | math | reasoning_gym (podsrl.tasks)
    # Passed to the task's loader (see podsrl.tasks); names it does not take are rejected here (check_option_names).
    options: dict[str, Any] = field(default_factory=dict)  # the task loader's options, over DEFAULT_TASK_OPTIONS[name]
    # Each task's own prompt and instruction agree (arithmetic asks for the number alone; gsm8k, jsonl
    # and math ask to think step by step): a default here would contradict some task's instruction.
    system_prompt: str | None = None  # replaces the task's system prompt; None: the task's own (arithmetic: "Answer with only the final number."; the others: none)
    instruction: str | None = None  # None: the task's own, appended to each question (arithmetic: "Give only the final number."; jsonl: "Think step by step, ...")
    grader: str | None = None  # how held-out accuracy and the correctness reward judge answers: auto (numbers as numbers, words as text, LaTeX by math-verify) | numeric | text | math | reasoning_gym | reasoning_gym_binary | module:function (podsrl/grading/graders.py); None: the task's own (reasoning_gym: its dataset's checker; the others: auto)

    def __post_init__(self) -> None:
        from podsrl.grading.graders import check_grader
        from podsrl.tasks import TASKS, absolute_paths, canonical_options, check_option_names

        _one_of(self.name, TASKS, "task.name")
        if self.grader is not None:
            check_grader(self.grader)
        options = canonical_options(self.name, {**DEFAULT_TASK_OPTIONS.get(self.name, {}), **self.options})
        check_option_names(self.name, options)  # a misspelt option fails here, before any data or model loads
        object.__setattr__(self, "options", absolute_paths(options))  # the saved config.toml works from anywhere


@dataclass(frozen=True)
class RewardConfig:
    names: list[str] = field(default_factory=lambda: ["correctness"])  # built-in names or module:function
    weights: list[float] = field(default_factory=lambda: [1.0])  # one per name; the reward is the weighted sum (a negative weight is a penalty)
    # A user reward (a verifier, a sandbox, a remote grader) may hang on one completion; with a
    # limit, user rewards run in worker processes that are killed at the limit (a thread cannot be).
    timeout_seconds: float | None = None  # stop a user reward's call after this long and score it timeout_score (runs user rewards in worker processes); None: no limit
    timeout_score: float = 0.0  # the value of a call that timed out (with timeout_seconds)
    max_timeout_fraction: float = 0.25  # stop the run when one reward function times out on more than this fraction of a step's completions
    workers: int = 1  # worker processes scoring user rewards in parallel (with timeout_seconds)
    # Read by rollout.early_stop only, and then checked on every reward (podsrl/core/early_stop.py).
    values: list[float] | None = None  # every value the total reward can take, e.g. [0, 1]; None: from the functions' `reward_values` (built-ins: 0 or 1)

    def __post_init__(self) -> None:
        _check(len(self.names) > 0, "reward.names", "give at least one reward function")
        _check(
            self.values is None or (len(self.values) > 0 and all(math.isfinite(v) for v in self.values)),
            "reward.values",
            f"must be a non-empty list of finite numbers (or none), got {self.values!r}",
        )
        _check(
            self.timeout_seconds is None or self.timeout_seconds > 0,
            "reward.timeout_seconds",
            f"must be > 0 seconds (or none: no limit), got {self.timeout_seconds!r}",
        )
        _check(
            0 <= self.max_timeout_fraction <= 1,
            "reward.max_timeout_fraction",
            f"must be in [0, 1] (the share of a step's completions that may time out), got {self.max_timeout_fraction!r}",
        )
        _check(self.workers >= 1, "reward.workers", f"must be >= 1, got {self.workers!r}")
        _check(
            len(self.names) == len(self.weights),
            "reward.weights",
            f"has {len(self.weights)} entries but reward.names has {len(self.names)}; give one weight per name",
        )
        # A total reward that cannot vary gives every rollout advantage 0: no step would learn.
        _check(
            any(w != 0 for w in self.weights),
            "reward.weights",
            "every weight is 0, so every completion's reward is 0 and nothing would be learned; give a reward a nonzero weight",
        )
        if self.values is not None and len(set(self.values)) < 2:
            raise ConfigError(
                f"reward.values = {self.values!r} holds one value: a reward that takes one value is the same for every "
                "completion, so nothing would be learned; list every value the total reward can take"
            )
        from podsrl.grading.rewards import REWARDS

        for name in self.names:  # user functions ("module:function") are imported when the run starts
            _check(
                ":" in name or name in REWARDS,
                "reward.names",
                f"unknown reward {name!r}; valid names: {', '.join(sorted(REWARDS))}, "
                "or a user function as 'module:function' or 'path/to/file.py:function'",
            )
        object.__setattr__(self, "names", [_absolute_reward_file(name) for name in self.names])


def _absolute_reward_file(name: str) -> str:
    """A user reward given by a relative file path ("my_rewards.py:fn") that exists, with the path
    made absolute; any other name as given. A name is a file, not a module, as
    :func:`podsrl.grading.user.load_user_reward` decides: it ends in .py or holds a path separator."""
    module, sep, function = name.rpartition(":")
    if not sep or not (module.endswith(".py") or "/" in module or "\\" in module):
        return name
    path = Path(module).expanduser()
    return f"{path.absolute()}:{function}" if not path.is_absolute() and path.is_file() else name


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "auto"  # "transformers" (samples with the policy itself) | "transformers-static" (a sampler of its own in rollout.sampler_dtype, static KV cache, compiled decoding on a GPU, returns log-probs: docs/engines.md) | "vllm" | "auto" (vLLM when installed; else transformers-static on a GPU, transformers on a CPU; the start-up line says which and why)
    n: int = 16  # rollouts sampled per prompt
    temperature: float = 1.0  # sampling temperature of the rollouts (> 0)
    top_p: float = 1.0  # nucleus sampling: the smallest token set with this probability; 1: off
    max_new_tokens: int = 16  # completion length limit in tokens; longer completions are cut off
    generation_batch_size: int = 128  # sequences per transformers `generate` call (transformers; transformers-static on a CPU: on a GPU it takes as many as fit in memory)
    # vLLM only
    gpu_memory_utilization: float = 0.3  # GPU: fraction of its memory vLLM may take
    enable_sleep_mode: bool = False  # GPU only: free vLLM's memory during the update
    kv_cache_gib: float | None = None  # vLLM KV cache; None: GPU from gpu_memory_utilization, CPU 2 GiB
    enforce_eager: bool = True  # vLLM without torch.compile: starts in seconds (docs/vllm.md)
    sampler_dtype: str = "fast"  # the sampler's weights (vllm, transformers-static): "fast" (bfloat16 where the GPU or CPU has native bfloat16, else model.dtype; the start-up line says which) | "auto" (model.dtype) | "bfloat16" | "float16" | "float32"; bfloat16 samples faster and slightly off-policy, which the importance correction corrects (docs/vllm.md: why "fast" is the default); evaluations sample with the same engine; the transformers engine samples with the policy itself and refuses a named dtype
    max_model_len: int = 1024  # vLLM: longest prompt + completion, in tokens
    # Importance correction of the sampler's gap (podsrl/core/importance.py, docs/vllm.md): TRL's
    # vllm_importance_sampling_* (verl: rollout_is, rollout_rs), applied where the engine returns its
    # log-probs (vllm, transformers-static); the transformers engine samples with the trainer itself and needs none.
    importance_sampling_correction: bool = True  # weight each token's loss by pi_trainer / pi_sampler (at the weights that sampled), truncated or masked; false: no correction (the gap is still logged)
    importance_sampling_mode: str = ImportanceSettings.mode  # "token_truncate" (TIS, the default: its weight does not shrink with the completion's length; docs/vllm.md, "Long completions") | "token_mask" | "sequence_truncate" | "sequence_mask" | "geometric_truncate" | "geometric_mask" | "token_reject" | "sequence_reject" | "geometric_reject": a ratio per token, one per sequence (the product of its tokens'), or one per sequence as the geometric mean of its tokens'; clipped into [clip_min, clip_max] (truncate), weight 0 outside and the ratio inside (mask, TRL's), or 0 outside and 1 inside (reject: verl's rollout_rs, lower bound 1 / clip_max by default) (podsrl/core/importance.py)
    importance_sampling_clip_max: float = ImportanceSettings.clip_max  # the ratio's upper bound C_max (>= 1)
    importance_sampling_clip_min: float | None = ImportanceSettings.clip_min  # the ratio's lower bound C_min (<= 1); none: no lower bound (the reject modes: 1 / clip_max)
    # Exact early stopping (podsrl/core/early_stop.py): a group stops once more rollouts could not
    # change the law of what it trains on; rules or rewards without such a criterion are refused.
    early_stop: str = "off"  # "off": n rollouts per prompt | "exact": sample in rounds, stop each group as soon as it is exact
    round_size: int | None = None  # with early_stop: rollouts per prompt per round; None: the step's m
    # Dynamic sampling (DAPO, arXiv 2503.14476 Sec. 3.2; podsrl/train/sampling.py): groups without a
    # signal teach nothing, so sample further batches of prompts in their place.
    dynamic_sampling: bool = False  # sample further batches of B prompts until B groups have a signal (kept rollouts with a nonzero advantage); silent groups and the surplus are dropped
    max_gen_batches: int = 4  # with dynamic_sampling: the most batches of B prompts a step samples; at the cap it trains on the groups with a signal it has

    def __post_init__(self) -> None:
        _one_of(self.early_stop, ("off", "exact"), "rollout.early_stop")
        _check(self.round_size is None or self.round_size >= 1, "rollout.round_size", f"must be >= 1 (or none: the step's m), got {self.round_size!r}")
        _check(self.max_gen_batches >= 1, "rollout.max_gen_batches", f"must be >= 1 (the first batch included), got {self.max_gen_batches!r}")
        from podsrl.engines import ENGINE_CHOICES

        _one_of(self.engine, ENGINE_CHOICES, "rollout.engine")
        _check(self.n >= 1, "rollout.n", "must be >= 1")
        _check(self.temperature > 0, "rollout.temperature", "must be > 0 for RL sampling (use eval.temperature=0 for greedy evaluation)")
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
        _check(self.generation_batch_size >= 1, "rollout.generation_batch_size", "must be >= 1")
        _check(0 < self.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization", "must be in (0, 1]")
        _check(self.kv_cache_gib is None or self.kv_cache_gib > 0, "rollout.kv_cache_gib", "must be > 0 (or none)")
        _one_of(self.sampler_dtype, ("auto", "fast", "bfloat16", "float16", "float32"), "rollout.sampler_dtype")
        _one_of(self.importance_sampling_mode, MODES, "rollout.importance_sampling_mode")
        _check(
            self.importance_sampling_clip_max >= 1,
            "rollout.importance_sampling_clip_max",
            f"must be >= 1 (a token the sampler and the trainer agree on, ratio 1, is never corrected), got {self.importance_sampling_clip_max!r}",
        )
        _check(
            self.importance_sampling_clip_min is None or 0 <= self.importance_sampling_clip_min <= 1,
            "rollout.importance_sampling_clip_min",
            f"must be in [0, 1] (a ratio of 1 is never corrected) or none (no lower bound), got {self.importance_sampling_clip_min!r}",
        )


@dataclass(frozen=True)
class PromptsConfig:
    """``[prompts]``: the order the training prompts are sampled in, and prompt selection before
    sampling (podsrl/train/prompts.py, podsrl/core/prompt_selection.py; GRESO, arXiv 2506.02177)."""

    shuffle: bool = True  # each epoch a new order of the training prompts, seeded by (train.seed, epoch); false: the task's order every epoch
    skip_silent: bool = False  # prompt selection: skip, before sampling, prompts whose recent visits were silent (no kept rollout with a nonzero advantage), with a probability the exploration rate sets
    target_silent: float = 0.25  # with skip_silent: the share of sampled groups without a signal that the exploration rate steers toward (GRESO's target_zero_variance)
    explore: float = 0.5  # with skip_silent: the exploration rate p at the start; a prompt silent k visits in a row is sampled with probability p**k (GRESO's p_easy, p_hard)
    explore_step: float = 0.01  # with skip_silent: how far the exploration rate moves after each step, from the second epoch on
    explore_min: float = 0.05  # with skip_silent: the lowest exploration rate
    explore_max: float = 0.95  # with skip_silent: the highest exploration rate
    min_sample_probability: float = 0.01  # with skip_silent: a prompt however long silent is still sampled with at least this probability

    def __post_init__(self) -> None:
        for name in ("target_silent", "explore", "explore_min", "explore_max", "min_sample_probability"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and 0 <= value <= 1, f"prompts.{name}", f"must be in [0, 1], got {value!r}")
        _check(0 < self.explore_step <= 1, "prompts.explore_step", f"must be in (0, 1], got {self.explore_step!r}")
        _check(self.explore_min <= self.explore_max, "prompts.explore_min",
               f"= {self.explore_min:g} is above prompts.explore_max = {self.explore_max:g}; lower it or raise explore_max")  # fmt: skip
        _check(self.explore_min <= self.explore <= self.explore_max, "prompts.explore",
               f"= {self.explore:g} is outside [prompts.explore_min, prompts.explore_max] = [{self.explore_min:g}, {self.explore_max:g}]")  # fmt: skip
        _check(self.min_sample_probability > 0, "prompts.min_sample_probability",
               "must be > 0: a prompt that is never sampled again can never show that it has become useful")  # fmt: skip


@dataclass(frozen=True)
class SelectConfig(DownsampleSpec):
    """``[select]``: the down-sampling spec (:class:`podsrl.core.downsample.DownsampleSpec`, where the
    fields, their defaults and their validation live, shared with the TRL integration's PODSConfig)."""

    FIELD_PREFIX: ClassVar[str] = "select."


@dataclass(frozen=True)
class LossConfig:
    eps_low: float = 0.2  # clip the probability ratio below at 1 - eps_low (PPO/GRPO clipping)
    eps_high: float | None = None  # None: same as eps_low; e.g. 0.28 for DAPO clip-higher
    aggregation: str = "token"  # "token" (DAPO; TRL's and verl's default) | "sequence" (GRPO) | "constant" (Dr. GRPO); issue 67
    beta: float = 0.0  # weight of the k3 KL to the initial policy; 0 = no reference model
    policy_iterations: int = 1  # optimizer steps per batch of rollouts

    def __post_init__(self) -> None:
        from podsrl.core.loss import AGGREGATIONS

        _check(
            0 <= self.eps_low < 1,
            "loss.eps_low",
            f"must be in [0, 1) (the ratio is clipped below at 1 - eps_low, which must stay > 0), got {self.eps_low!r}",
        )
        _check(self.eps_high is None or self.eps_high >= 0, "loss.eps_high", "must be >= 0")
        _one_of(self.aggregation, AGGREGATIONS, "loss.aggregation")
        _check(self.beta >= 0, "loss.beta", "must be >= 0")
        _check(self.policy_iterations >= 1, "loss.policy_iterations", "must be >= 1")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5  # AdamW learning rate (peak, after warm-up)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.99  # AdamW second-moment decay
    warmup_steps: int = 0  # linear learning-rate warm-up over this many steps (below train.max_steps); 0: none
    lr_schedule: str = "constant"  # "constant" | "cosine" (to 0 at train.max_steps, which it needs and --resume may not change)
    grad_clip: float = 1.0  # max gradient norm; 0 disables clipping
    micro_batch_size: int = 16  # sequences per forward/backward; gradients are accumulated
    # A micro-batch costs a fixed number of operator calls whatever its rows: on a GPU at short answers
    # that, not the arithmetic, is the update's time (docs/results.md, the methods on a GPU). A token
    # budget cuts fewer, larger micro-batches there; the gradient is the same (exact).
    micro_batch_tokens: int = 0  # > 0: micro-batches of as many rows as fit this many padded tokens (rows x longest), micro_batch_size ignored; 0: by rows
    # Run each distinct prompt of a micro-batch once and the completions on its repeated KV cache
    # (exact; see podsrl/train/sequences.py). Off: every rollout runs its whole [prompt; completion].
    share_prompts: bool = True  # forward each prompt once per micro-batch (exact); false: every rollout runs its prompt
    # Without a KL term a kept rollout whose advantage is exactly 0 adds exactly 0 to the gradient
    # (podsrl/train/update.py): it takes no forward or backward pass, the normalisers stay the batch's.
    skip_zero_advantage: bool = True  # skip zero-advantage rows in the update (exact); false: every kept row runs

    def __post_init__(self) -> None:
        _check(math.isfinite(self.lr) and self.lr > 0, "optim.lr", f"must be > 0 and finite, got {self.lr!r}")
        _check(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        for name in ("beta1", "beta2"):  # AdamW refuses others with a traceback
            _check(0 <= getattr(self, name) < 1, f"optim.{name}", f"must be in [0, 1) (a moment's decay rate), got {getattr(self, name)!r}")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _one_of(self.lr_schedule, ("constant", "cosine"), "optim.lr_schedule")
        _check(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)")
        _check(self.micro_batch_size >= 1, "optim.micro_batch_size", "must be >= 1")
        _check(self.micro_batch_tokens >= 0, "optim.micro_batch_tokens", "must be >= 0 (0: micro-batches of optim.micro_batch_size rows)")


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 0  # 0: never by step count
    every_seconds: float = 0.0  # of training wall-clock; 0: never by time
    at_start: bool = True  # evaluate the initial model before the first step
    at_end: bool = True  # evaluate after the last step
    # The demo measures the policy RL trains: samples at temperature 1, 4 per problem (mean
    # per-sample accuracy = pass@1). Set temperature = 0 and samples = 1 for greedy accuracy.
    temperature: float = 1.0  # sampling temperature; 0: greedy (with samples = 1)
    samples: int = 4  # completions per problem (pass@k for k <= samples)
    max_new_tokens: int | None = None  # None: rollout.max_new_tokens
    max_problems: int | None = None  # None: the whole held-out set

    def __post_init__(self) -> None:
        _check(self.every_steps >= 0, "eval.every_steps", "must be >= 0")
        _check(self.every_seconds >= 0, "eval.every_seconds", "must be >= 0")
        _check(self.temperature >= 0, "eval.temperature", "must be >= 0")
        _check(self.samples >= 1, "eval.samples", "must be >= 1")
        _check(self.temperature > 0 or self.samples == 1, "eval.samples", "greedy evaluation (temperature 0) takes samples = 1")
        _check(
            self.max_problems is None or self.max_problems >= 1,
            "eval.max_problems",
            "must be >= 1 (or none: the whole held-out set)",
        )


def catchable_signal(name: str):
    """The ``signal.Signals`` a ``train.stop_signals`` entry names ("SIGTERM", "term", "USR1"), or
    None when it names none a handler can catch (SIGKILL and SIGSTOP cannot be)."""
    import signal

    upper = name.upper()
    sig = getattr(signal, upper if upper.startswith("SIG") else f"SIG{upper}", None)
    if not isinstance(sig, signal.Signals) or sig in (signal.SIGKILL, signal.SIGSTOP):
        return None
    return sig


@dataclass(frozen=True)
class TrainConfig:
    prompts_per_step: int = 8  # B
    max_steps: int | None = None  # training-step budget; None: none (then max_seconds must be set). With max_seconds too, the first budget reached ends the run
    max_seconds: float | None = 240.0  # training wall-clock budget (evaluation excluded); the demo's: make demo in about 5 minutes. No step starts that is predicted not to fit: 1.25 x the longest of the last 5 steps (docs/run-directory.md, "The budget"). Set, it also drives the schedules (select.m_schedule, token_schedule) when it is further along than the steps; "none" for steps alone
    seed: int = 0  # seeds the task's split, sampling, selection and initialisation
    out_dir: str = "runs/{time}-{rule}"  # {time}, {rule} and {seed} are filled in
    checkpoint_every: int = 20  # steps; 0: only at the end
    keep_checkpoints: int = 1  # how many of the latest checkpoints to keep on disk
    progress: bool = True  # show progress bars: the training steps, and `podsrl eval`'s problems
    tensorboard: bool = False  # also log metrics to TensorBoard (when installed)
    wandb: bool = False  # also log metrics to Weights & Biases (when installed)
    wandb_project: str = "podsrl"  # the Weights & Biases project
    # What the run leaves to use (podsrl/run/export.py, docs/run-directory.md).
    export_model: bool = True  # at the end, write the policy as a Hugging Face model directory: RUN/model
    export_checkpoints: bool = False  # also write one into every checkpoint: checkpoints/step-N/model
    export_dtype: str = "auto"  # the exported weights: "auto" (model.dtype) | "float32" | "bfloat16" | "float16"
    export_merged: bool = True  # LoRA: export the merged model (the adapter in adapter/); false: the adapter alone
    push_to_hub: str | None = None  # a Hub repo id ("user/name"): push RUN/model there at the end (token: HF_TOKEN or `hf auth login`)
    # Surviving the cluster (podsrl/run/preemption.py, docs/distributed.md).
    resume: str = "no"  # "auto": resume the run in the output directory when it has a checkpoint, else start it there (torchrun --max-restarts, SLURM --requeue); "no": never
    stop_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])  # on these, abandon the step (or finish it, past its optimizer step), checkpoint the last completed step and exit with code 75 within seconds (SLURM's --signal; docs/distributed.md); [] : none
    checkpoint_failure: str = "stop"  # a checkpoint that cannot be written (disk full, I/O error): "stop" the run, or "retry" at the next checkpoint

    def __post_init__(self) -> None:
        _one_of(self.resume, ("no", "auto"), "train.resume")
        _one_of(self.checkpoint_failure, ("stop", "retry"), "train.checkpoint_failure")
        for name in self.stop_signals:
            _check(
                catchable_signal(name) is not None,
                "train.stop_signals",
                f"{name!r} is not a signal a process can catch; give names such as SIGTERM, SIGUSR1 (or [] for none)",
            )
        _check(self.prompts_per_step >= 1, "train.prompts_per_step", "must be >= 1")
        _check(self.max_steps is None or self.max_steps >= 1, "train.max_steps", "must be >= 1")
        _check(self.max_seconds is None or self.max_seconds > 0, "train.max_seconds", "must be > 0")
        _check(
            self.max_steps is not None or self.max_seconds is not None,
            "train.max_steps",
            "give a budget: train.max_steps and/or train.max_seconds",
        )
        _check(self.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0")
        _check(self.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")
        _one_of(self.export_dtype, ("auto", "float32", "bfloat16", "float16"), "train.export_dtype")
        if self.push_to_hub is not None:
            _check(
                re.fullmatch(r"([\w.-]+/)?[\w.-]{1,96}", self.push_to_hub) is not None,
                "train.push_to_hub",
                f"{self.push_to_hub!r} is not a Hub repo id; write it as \"user/name\" (or \"name\" for your own namespace)",
            )
            _check(
                self.export_model,
                "train.push_to_hub",
                "pushes the exported RUN/model, which train.export_model = false turns off; set it to true",
            )
        try:
            self.out_dir.format(time="", rule="", seed=0)
        except (KeyError, IndexError, ValueError) as err:
            raise ConfigError(
                f"train.out_dir: cannot fill in {self.out_dir!r} ({type(err).__name__}: {err}); "
                "only {time}, {rule} and {seed} are filled in (write {{ and }} for literal braces)"
            ) from None


@dataclass(frozen=True)
class DistributedConfig:
    """Several processes under torchrun (docs/distributed.md); ignored in a single process."""

    parallel: str = "ddp"  # "ddp" (whole model per rank, gradients all-reduced) | "fsdp" (FSDP2, full fine-tuning)
    backend: str = "auto"  # "auto" (nccl on GPUs, gloo on CPUs) | "gloo" | "nccl"
    timeout_minutes: float = 30.0  # how long a collective waits for the other ranks before failing
    hang_seconds: float | None = 600.0  # stop every rank when one keeps the others waiting this long, naming it and its phase (a heartbeat); None: only timeout_minutes

    def __post_init__(self) -> None:
        from podsrl.train.distributed import BACKENDS, PARALLEL

        _one_of(self.parallel, PARALLEL, "distributed.parallel")
        _one_of(self.backend, BACKENDS, "distributed.backend")
        _check(self.timeout_minutes > 0, "distributed.timeout_minutes", "must be > 0")
        if self.hang_seconds is not None:
            _check(self.hang_seconds > 0, "distributed.hang_seconds", f"must be > 0 (or none), got {self.hang_seconds!r}")
            _check(
                self.hang_seconds < 60 * self.timeout_minutes,
                "distributed.hang_seconds",
                f"= {self.hang_seconds:g} s is not below distributed.timeout_minutes = {self.timeout_minutes:g} min: the "
                "collective timeout would fire first, without naming the stuck rank; lower it or raise timeout_minutes",
            )


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self) -> None:
        self.select.check_n(self.rollout.n, "rollout.n")
        # Settings under which no step could learn (select.check_signal) are refused where training
        # starts (podsrl.train.loop.check_trainable), not here: a run directory trained with them
        # before the check existed still loads for `podsrl eval --run` and `podsrl export`.
        self._check_sampling()
        if self.rollout.early_stop != "off":
            _check(
                self.distributed.parallel != "fsdp",
                "rollout.early_stop",
                "sampling in rounds is not supported with distributed.parallel = 'fsdp' (generation is a collective "
                "there, and ranks stop after different numbers of rounds); use 'ddp' or rollout.early_stop = \"off\"",
            )
        if self.optim.lr_schedule == "cosine":  # decays over train.max_steps: a time budget alone would leave it constant
            _check(
                self.train.max_steps is not None,
                "optim.lr_schedule",
                "'cosine' decays the rate to 0 at train.max_steps, which is not set (a train.max_seconds budget alone "
                "has no step count to decay over); set train.max_steps, or use optim.lr_schedule = \"constant\"",
            )
            _check(
                self.train.max_steps > self.optim.warmup_steps,
                "optim.lr_schedule",
                f"'cosine' decays over the steps after the warm-up, and optim.warmup_steps = {self.optim.warmup_steps} is not "
                f"below train.max_steps = {self.train.max_steps}: no step is left to decay over; lower optim.warmup_steps "
                "or raise train.max_steps",
            )
        if self.train.max_steps is not None:  # step warmup_steps + 1 is the first at optim.lr (either schedule)
            _check(
                self.train.max_steps > self.optim.warmup_steps,
                "optim.warmup_steps",
                f"= {self.optim.warmup_steps} is not below train.max_steps = {self.train.max_steps}: the rate would still be "
                f"rising at the last step and never reach optim.lr = {self.optim.lr:g}; lower optim.warmup_steps or raise "
                "train.max_steps",
            )
        if self.distributed.parallel == "fsdp":
            _check(
                not self.model.lora,
                "distributed.parallel",
                "'fsdp' shards full fine-tuning; a LoRA adapter is small enough to train with 'ddp' "
                "(set distributed.parallel = \"ddp\" or model.lora = false)",
            )
            _check(
                self.loss.beta == 0,
                "loss.beta",
                "a KL term needs a reference model, which 'fsdp' does not shard yet; use loss.beta = 0 or distributed.parallel = \"ddp\"",
            )

    def _check_sampling(self) -> None:
        """Early stopping's round size and dynamic sampling against the rest (podsrl/train/sampling.py)."""
        r, sel = self.rollout, self.select
        if r.early_stop != "off" and r.round_size is not None:
            _check(
                r.round_size < r.n,
                "rollout.round_size",
                f"= {r.round_size} is not below rollout.n = {r.n}: the first round would sample all n rollouts of every "
                f"group and none could stop early; lower it (e.g. {max(1, r.n // 4)}), leave it unset (the step's m) or "
                'set rollout.early_stop = "off"',
            )
        if not r.dynamic_sampling:
            return
        _check(
            not sel.filter_zero_variance,
            "select.filter_zero_variance",
            "rollout.dynamic_sampling already drops every group without a signal (a group whose rewards are all "
            "equal has none) and samples others in its place, so the filter would change nothing; set it to false",
        )
        # m = 1 with advantages over the kept subset (no group could have a signal) is refused for
        # every run that trains, by select.check_signal (podsrl.train.loop.check_trainable).

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Loading: defaults <- TOML file <- --section.key=value overrides


def load(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Build a validated Config from an optional TOML file and ``section.key=value`` overrides."""
    data: dict[str, Any] = {}
    parsed = parse_overrides(overrides)  # first: in "--select.m 3", "3" is not the config file to blame
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"config file {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); save it as UTF-8"
            ) from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {path}: invalid TOML: {err}") from err
    for key, raw in parsed:
        set_dotted(data, key, raw, from_text=True)
    return from_dict(data)


def from_dict(data: dict[str, Any]) -> Config:
    data = _moved_settings(data)
    sections = {}
    hints = _type_hints(Config)
    for name, value in data.items():
        if name not in hints:
            raise ConfigError(f"unknown config section [{name}]; valid sections: {', '.join(hints)}")
        if not isinstance(value, dict):
            raise ConfigError(f"[{name}] must be a table of settings, got {value!r}")
        sections[name] = _build(hints[name], value, name)
    return Config(**sections)


# Settings that moved: old name -> new name. A file that holds the old name still loads (every run's
# config.toml holds every setting of its day); the command line takes the new name only.
MOVED = {"distributed.mixed_precision": "model.mixed_precision"}
_MIXED_PRECISION_NOTE = (
    "distributed.mixed_precision (FSDP's compute dtype before issue 66) is read as model.mixed_precision, which now "
    "sets every training path: as written under distributed.parallel = 'fsdp', 'none' otherwise (no other path computed "
    "in bfloat16 then); write model.mixed_precision instead, or leave both out for the default 'auto' (bfloat16 where "
    "the hardware computes it natively)"
)


def _moved_settings(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``distributed.mixed_precision`` read as ``model.mixed_precision`` (a copy when
    it holds it). The old setting chose FSDP's compute dtype and nothing else: one process and "ddp"
    computed in float32 whatever it said. So it means what it did: its value under "fsdp", "none"
    otherwise, and a run's config.toml written before issue 66 (each holds the old default "auto")
    reproduces the float32 update it trained with, on any machine. Both given: the new one, unless
    the old one names another value than its default "auto" (a ConfigError naming both)."""
    old_section = data.get("distributed")
    if not isinstance(old_section, dict) or "mixed_precision" not in old_section:
        return data
    old_section = dict(old_section)
    old = old_section.pop("mixed_precision")
    _one_of(old, ("auto", "bf16", "none"), "distributed.mixed_precision")
    model = data.get("model", {})
    if not isinstance(model, dict):
        return {**data, "distributed": old_section}  # from_dict names the bad [model]
    if "mixed_precision" in model:
        _check(
            old in ("auto", model["mixed_precision"]),
            "distributed.mixed_precision",
            f"= {old!r} disagrees with model.mixed_precision = {model['mixed_precision']!r}: it is the old name of "
            "model.mixed_precision (FSDP's alone before issue 66, now every path's); delete distributed.mixed_precision",
        )
    else:
        model = {**model, "mixed_precision": old if old_section.get("parallel") == "fsdp" else "none"}
    warnings.warn(_MIXED_PRECISION_NOTE, FutureWarning, stacklevel=3)
    return {**data, "distributed": old_section, "model": model}


def _build(cls: type, values: dict[str, Any], section: str):
    hints = _field_hints(cls)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"unknown setting {section}.{key}; valid settings in [{section}]: {', '.join(hints)}")
        values[key] = _coerce(value, hints[key], f"{section}.{key}", from_text=False)
    return cls(**values)


@functools.cache
def _type_hints(cls: type) -> types.MappingProxyType:
    """``typing.get_type_hints(cls)``, read-only and resolved once per class: resolving a dataclass's
    string annotations costs about 0.5 ms, and a comparison's plan builds thousands of sections."""
    return types.MappingProxyType(typing.get_type_hints(cls))


@functools.cache
def _field_hints(cls: type) -> types.MappingProxyType:
    """A config dataclass's settings and their types (class variables such as FIELD_PREFIX are not
    settings), read-only and once per class."""
    names = {f.name for f in dataclasses.fields(cls)}
    return types.MappingProxyType({name: hint for name, hint in _type_hints(cls).items() if name in names})


def parse_overrides(items: typing.Sequence[str]) -> list[tuple[str, str]]:
    """``--section.key=value`` items -> (dotted key, raw text) pairs; a malformed item is a ConfigError."""
    parsed = []
    for item in items:
        key, sep, raw = item.removeprefix("--").partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"override {item!r}: write it as --section.key=value, e.g. --select.m=8")
        parsed.append((key, raw))
    return parsed


def set_dotted(data: dict[str, Any], dotted: str, value: Any, *, from_text: bool, where: str = "") -> None:
    """Set ``section.key`` (or ``section.key.sub`` inside a dict-valued field such as
    ``task.options``) in raw config data, in place. ``from_text``: ``value`` is command-line text,
    parsed and coerced to the field's type here; otherwise a TOML value, coerced by from_dict."""
    where = where or f"--{dotted}"
    section, _, rest = dotted.partition(".")
    key, _, sub = rest.partition(".")
    if not key:
        raise ConfigError(f'{where}: {dotted!r} is not a dotted setting; write it as section.key, e.g. select.m')
    hints = _type_hints(Config)
    if section not in hints:
        raise ConfigError(f"{where}: unknown config section [{section}]; valid sections: {', '.join(hints)}")
    if f"{section}.{key}" in MOVED:
        raise ConfigError(f"{where}: {section}.{key} is now {MOVED[f'{section}.{key}']} (issue 66); give that instead")
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [{section}] is not a table of settings")
    field_hints = _field_hints(hints[section])
    if key not in field_hints:
        raise ConfigError(f"{where}: unknown setting {section}.{key}; valid settings in [{section}]: {', '.join(field_hints)}")
    if sub:  # a dict-valued field such as task.options.max_digits (defaults are merged in later)
        table[key] = {**(table.get(key) or {}), sub: _parse_scalar(value) if from_text else value}
    elif from_text:
        table[key] = _coerce(value, field_hints[key], f"{section}.{key}", from_text=True)
    else:
        table[key] = value


def _parse_scalar(raw: str) -> Any:
    """Text from the command line -> a TOML value when it parses as one, else the string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if "," in raw:
            return [_parse_scalar(part) for part in raw.split(",")]
        return raw


def _coerce(value: Any, hint: Any, name: str, *, from_text: bool) -> Any:
    if from_text:
        raw, value = value, _parse_scalar(value)
        accepted = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        takes_list = any(typing.get_origin(a) is list for a in accepted)
        if str in accepted and not isinstance(value, str) and not (takes_list and isinstance(value, list)):
            # A text field takes the text as written: "--task.system_prompt=Be brief, be right."
            # is not a list, "--task.instruction=42" is not a number.
            value = raw
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        # TOML has no null: "none" (any case) means None, in a file as on the command line.
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            if type(None) in args:
                return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, name, from_text=False)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{name}: bad value {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected a whole number, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # TOML and the command line both read inf and nan
                raise ConfigError(f"{name}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    if origin is list:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(v, args[0], name, from_text=False) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a table, got {value!r}")
        return dict(value)
    return value


def to_toml(cfg: Config, notes: dict[str, str] | None = None) -> str:
    """The resolved config as TOML; ``load`` reads it back to an equal Config.

    TOML has no null: a None that is also the field's default is written as a comment, any other
    None as the string "none" (which ``_coerce`` reads back as None). ``notes``: dotted name -> a
    comment written after that setting (what a machine-dependent setting such as
    ``rollout.sampler_dtype = "fast"`` resolved to on the machine that wrote it); ``load`` ignores it.
    """
    notes = {name: " ".join(str(note).split()) for name, note in (notes or {}).items()}  # one line each
    lines: list[str] = []
    for section, values in cfg.to_dict().items():
        lines.append(f"[{section}]")
        nested = []
        defaults = getattr(Config(), section)
        for key, value in values.items():
            if value is None and getattr(defaults, key) is None:
                lines.append(f"# {key} = (default: none)")
            elif value is None:  # not the default: "none" reads back as None (see _coerce)
                lines.append(f'{key} = "none"')
            elif isinstance(value, dict):
                nested.append((key, value))
            else:
                note = notes.get(f"{section}.{key}")
                lines.append(f"{key} = {_toml_value(value)}" + (f"  # {note}" if note else ""))
        for key, table in nested:
            lines.append(f"{key} = {{ {', '.join(f'{k} = {_toml_value(v)}' for k, v in table.items())} }}")
        lines.append("")
    return "\n".join(lines)


# A TOML basic string escapes backslash, quote and every control character but tab.
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
_TOML_ESCAPES.update({chr(c): f"\\u{c:04X}" for c in (*range(0x20), 0x7F) if chr(c) not in _TOML_ESCAPES and c != 0x09})


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_TOML_ESCAPES.get(c, c) for c in value) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")
