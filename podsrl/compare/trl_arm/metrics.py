"""What a TRL arm's step trained on, in metrics.jsonl's names: :func:`timed` wraps TRL's trainer
class so that its generation round is timed and recorded (nothing else changes), and
:func:`round_metrics` reads the round's output.

Per optimizer step (the clock adds ``train_seconds``, ``time/step`` and ``time/update``, the step
less ``time/generate``): ``time/generate`` (TRL's ``_generate_and_score_completions``: generation,
rewards, advantages, and the old-policy log-probs when TRL needs them), ``kept`` (rows the update
trained on: B x n for GRPOTrainer), ``rows_run`` (rows that ran the update's forward and backward:
all of them for GRPOTrainer; for PODSTrainer the kept rows less those of advantage 0 it skips),
``groups_with_signal``, ``zero_variance_groups``, ``rollouts_generated`` (B x n),
``prompts_sampled`` (B), ``reward_mean`` (TRL's ``reward``, over all n), ``completion_len``,
``kept_adv_var`` (GRPOTrainer: the population variance of its B x n advantages), and for
PODSTrainer the core's selection metrics; ``grad_norm`` and ``lr`` come from TRL's logs
(:mod:`podsrl.compare.trl_arm.clock`)."""

from __future__ import annotations

import time
from typing import Any

from podsrl.config import Config


def timed(base: type) -> type:
    """``base`` (GRPOTrainer or PODSTrainer) that times its generation round and records what the
    round trained on in ``podsrl_round``; nothing else changes."""

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
                self.podsrl_round = {"time/generate": round_seconds, **round_metrics(self, out)}
            return out

    Timed.__name__ = Timed.__qualname__ = f"Timed{base.__name__}"
    return Timed


def round_metrics(trainer, out: dict[str, Any]) -> dict[str, Any]:
    """What a generation round trained on (the module docstring), from its output ``out``."""
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
