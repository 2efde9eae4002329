"""compare.json: the report rebuilt from the finished runs of a plan, on both axes (optimizer steps
and training wall-clock), with the robust summaries (AUC and final accuracy, each over seeds and
paired against the baseline by seed). It reads only the small run files (config.toml, eval.jsonl,
metrics.jsonl, launch.jsonl, done.json), never checkpoints. A screening (``compare.screening``: each
method its own task) has no baseline: no target, time fractions or paired differences, and per method its
task and its accuracy before training (``start_accuracy``) beside the summaries."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Any

from podsrl.compare.plan import Plan
from podsrl.compare.plots import plot_report
from podsrl.compare.layout import check_same_config, is_finished, read_launches, run_dir
from podsrl.compare.stats import (
    AXES, SIGNAL_START_STEPS, Curve, auc, final_accuracy, first_reach, fraction, mean_curve, paired_difference, peak, seed_first_reach,
    summarize, time_auc, within_budget,
)  # fmt: skip
from podsrl.config import Config
from podsrl.intervals import t_interval
from podsrl.run.metrics import comparable_reward, read_jsonl
from podsrl.run.rundir import trained_m, write_text_atomic

# Per axis, the report's key prefix: steps_to_target, time_to_target_seconds, ...
_TO_TARGET = {"step": "steps_to_target", "train_seconds": "time_to_target_seconds"}
_FRACTION = {"step": "step_fraction", "train_seconds": "time_fraction"}  # of the baseline's steps / time to the target
# The robust summaries: report key -> per-run function of its eval rows.
SUMMARIES = {"auc": auc, "final_accuracy": final_accuracy}
# ... and the one summary over a horizon the whole comparison shares (set in build_report).
SUMMARY_KEYS = (*SUMMARIES, "time_auc")
SCREENING_NOTE = ("a screening (compare.screening = true): every method trained on its own task, so there is no baseline, "
                  "target, time fraction or paired difference; compare each method's accuracy before and after training")  # fmt: skip

DEFINITIONS = {
    "peak": "max over evaluation points of the seed-mean accuracy curve (read on the axis evaluation is scheduled on: "
            "steps for eval.every_steps, else training time); 95% CI: Student-t over the seeds' accuracies at that point",
    "steps_to_target": "first optimizer step at which the seed-mean curve (accuracy against steps) reaches target_accuracy",
    "time_to_target_seconds": "first training time (evaluation excluded) at which the seed-mean curve (accuracy against "
                              "training seconds) reaches target_accuracy",
    "*_to_target_ci95": "Student-t 95% interval over the seeds' own first evaluations at or above the target "
                        "(*_to_target_per_seed); null unless every seed (at least two) reaches it",
    "time_fraction": "method time_to_target_seconds / baseline time_to_target_seconds: the time to the target as a fraction "
                     "of the baseline's (0.61: in 61% of its time); reports before issue 68 held its inverse, speedup",
    "step_fraction": "method steps_to_target / baseline steps_to_target: the steps to the target as a fraction of the "
                     "baseline's",
    "budget": "every number reads each run's evaluations at or before the budget (budget_seconds of training, budget_steps "
              "steps), so every arm is read at the same training time: an evaluation after it (a last step that ended past "
              "it) is left out (runs[].evaluations_past_budget: their training seconds), the final accuracy is the last "
              "evaluation at or before the budget and time_auc covers [0, budget]; with read_past_budget "
              "(compare.read_past_budget, the reading before issue 68) every evaluation is read and time_auc's horizon is "
              "the shortest run's training time",
    "targets": "compare.targets: more accuracies every method is timed to, beside the baseline's target: fraction x the "
               "named method's seed-mean peak (of = peak) or seed-mean accuracy at the budget (of = final); per method the "
               "first step / training time its seed-mean curve reaches it (an evaluation point: the time is reached at most "
               "then) and time_fraction / step_fraction = that as a fraction of the target method's own (reports before "
               "issue 68: speedup, its inverse, and time_ratio, the same)",
    "auc": "area under the accuracy-vs-step curve, as each seed's mean held-out accuracy over its evaluations after step 0 "
           "(with evaluations every k steps: the right-endpoint Riemann sum divided by the budget), averaged over seeds; "
           "auc_ci95: Student-t 95% interval over the seeds (mean +- t_{0.975,k-1} s / sqrt(k))",
    "final_accuracy": "each seed's held-out accuracy at its last evaluation at or before the budget, averaged over seeds; "
                      "final_accuracy_ci95: Student-t 95% interval over the seeds",
    "time_auc": "AUC per training minute: each seed's mean held-out accuracy over the first time_auc_horizon_seconds of "
                "training (evaluation excluded; linear between evaluations, the last one held), averaged over seeds, with "
                "its Student-t interval; the horizon is the budget (budget_seconds) when there is a time budget, else the "
                "shortest finished run's training time, so every run is read over the same minutes",
    "paired_vs_baseline": "per summary, method minus baseline for the same seed index (same training seed: same prompt order, "
                          "same evaluation problems), over the seeds both finished: mean difference, paired t 95% interval "
                          "(mean +- t_{0.975,k-1} s_d / sqrt(k)), and whether that interval excludes zero (null below 2 pairs)",
    "pairwise": "every pair of methods other than the baseline, in the plan's order (a before b): per summary, a minus b "
                "for the same seed index, as paired_vs_baseline; for orderings between methods (PODS's rules, D3S against PODS)",
    "alignment": "seeds aligned by evaluation index when their evaluations are the same points of training (time-based "
                 "evaluation with equal counts, or the same steps), else linearly interpolated onto the union of their x",
    "commits": "the podsrl source commits the reported runs were trained with (from their launch.jsonl; '+dirty': "
               "with uncommitted changes)",
    "signal": "what each step trained on, from metrics.jsonl: the mean over a run's steps, averaged over seeds (signal_per_seed: "
              "each seed's). reward: mean reward of the step's sampled rollouts on a fixed-n run's basis (the first B prompts, "
              "each group's first round: the same expectation with or without early stopping and dynamic sampling; steps of "
              "early-stopping runs logged before podsrl reported that basis pooled every sampled rollout, which is biased "
              "towards the groups that ran to n: they are left out, runs[].reward_steps_left_out counts them); "
              "completion_len: mean completion tokens of the step's sampled rollouts, completion_len_start the same over "
              f"the first {SIGNAL_START_STEPS} steps (a run whose answers shorten as it learns); truncated: the share of them "
              "cut at rollout.max_new_tokens; "
              "zero_variance_groups: share of the first B sampled groups whose "
              "rewards are all equal (zero advantage, no gradient); zero_variance_groups_start: the same over the run's "
              f"first {SIGNAL_START_STEPS} steps only (how silent the task is to the model as it starts); "
              "kept_adv_var: population variance of the advantages the "
              "update used (comparable between rules that normalise the same way: PODS re-normalises over the m kept, D3S "
              "keeps the full group's advantages, which are larger); tokens_in_loss: completion tokens of the kept rollouts "
              "that entered the loss, over all of theirs (below 1 with token selection); signal_tokens_kept: with token selection "
              "(D3S), the share of the signal rows' completion tokens (advantage != 0) its loss kept, over the steps where "
              "the selection was on (token_fraction < 1): sum tokens_kept / sum tokens_run (the signal rows' tokens, with "
              "optim.skip_zero_advantage; null without it or without token selection); grad_norm: before clipping; rollouts: "
              "rollouts sampled per step (below B x n with exact early stopping, above with dynamic sampling; runs older "
              "than that metric: null); prompts: prompts sampled per step (B, more with dynamic sampling); "
              "groups_with_signal: groups per step trained with a nonzero advantage (runs older than that metric: null); "
              "rows_run: the kept rollouts that ran the update's forward and backward, over all kept (skipped: advantage 0); "
              "rollouts_per_signal_group: every rollout sampled over every group trained with a signal (the run's sums: what a "
              "useful group cost); prompts_skipped: prompts passed over per step as predicted silent (prompts.skip_silent; "
              "runs without it: null); explored_silent: of the prompts sampled although predicted silent, the share that came "
              "back silent (the prediction's precision, the run's sums); revisits_silent: of the groups sampled in steps logged at "
              "epoch 1 or later (every prompt had a history), the share that came back silent (what prompt selection sets out "
              "to lower; runs older than epochs: null); rest_silent: of those, the ones not predicted silent (sampled, neither "
              "explored nor forced in): the share silent (prompt selection only; set against explored_silent it says how much the "
              "prediction tells apart); epochs: passes over the training prompts by the run's last step (runs older than "
              "epochs: null). Every one counts a step logged again after a resume once (its last row)",
    "sampler": "the rollout engine's sampler beside the trainer, from the run's config and metrics.jsonl: dtype "
               "(rollout.sampler_dtype as set: 'auto' resolves per machine), correction (rollout.importance_sampling_mode, "
               "null when rollout.importance_sampling_correction is off); sampler_logp_diff: mean |log pi_trainer - log "
               "pi_sampler| per token, sampler_kl: mean k3 estimate of KL(sampler || trainer) per token (the gap, logged with "
               "or without the correction); is_ratio_mean: mean ratio pi_trainer / pi_sampler at the weights that sampled, "
               "before truncation or masking; is_clip_frac: share of the tokens truncated or masked; each the mean over a "
               "run's steps, then over seeds; is_ratio_min / is_ratio_max: the smallest / largest over every step and seed. "
               "Null where no step logged it (the transformers engine samples with the trainer's own weights: no gap)",
    "screening": "true: a screening (compare.screening), each method trained on its own task (task: its name and "
                 "options; dataset: a reasoning-gym task's dataset); no baseline, target, time fraction or paired difference. "
                 "start_accuracy: held-out accuracy at the evaluation before training (step 0), averaged over seeds; "
                 "final_accuracy (at the budget) is the accuracy after",
    "trainer": "what trained the method: podsrl (podsrl train), trl (TRL's GRPOTrainer) or trl-pods (podsrl's PODSTrainer "
               "in TRL); a TRL arm's training clock, metrics and checkpoint evaluations: podsrl.compare.trl_arm, docs/trl.md",
    "device_sharing": "runs_per_device: the most runs that trained at once on one device (--parallel, --devices); above 1 "
                      "they shared its time, so wall-clock times are inflated by the sharing and the step axis is the fair one",
}  # fmt: skip


def primary_axis(cfg: Config) -> str:
    """The axis evaluations are scheduled on; the peak (and so the target) is read on it."""
    return "train_seconds" if cfg.eval.every_seconds and not cfg.eval.every_steps else "step"


def build_report(plan: Plan, out: Path) -> dict[str, Any]:
    """Rebuild the report from the finished runs of seeds 0..plan.seeds-1 in ``out``."""
    out = Path(out)
    names = [m.name for m in plan.methods]
    for name in [] if plan.screening else [plan.baseline, *(t.method for t in plan.targets)]:
        if name not in names:
            names.append(name)  # its finished runs, if any, set a target
    entries, rows, curves = _method_entries(plan, out, names)
    cfg = plan.config(plan.methods[0].name, 0)  # the budget and evaluation every method shares

    base = None if plan.screening else entries.get(plan.baseline)
    base_peak = base["peak_accuracy"] if base else None
    target = plan.target_fraction * base_peak if base_peak else None  # a peak of 0%: no target (below)
    base_at = {axis: first_reach(curves[plan.baseline][axis], target) if target is not None else None for axis in AXES}
    notes = []
    if plan.screening:
        notes.append(SCREENING_NOTE)
    elif base_peak is None:
        notes.append(f"no finished run of the baseline {plan.baseline!r}: no target, no steps, times or their fractions")
    elif base_peak == 0:  # every evaluation 0%: a target of 0 is "met" at step 0, which says nothing
        notes.append(
            f"the baseline {plan.baseline!r} never answered a held-out problem right (peak accuracy 0%): no target, no "
            "time fraction is measurable; if its completions look right, the task's grader may not read its answers "
            "(task.grader: 'text' for words; the run's start-up lines warn when it cannot)"
        )
    elif base_at["step"] == 0 or base_at["train_seconds"] == 0:
        notes.append("the untrained model already meets the target (step 0, time 0): no time fraction is measurable")
    for name, entry in entries.items():
        _add_to_target(entry, rows[name], curves[name], target, base_at)
    notes += _missing_seed_notes(plan, entries) + _reward_notes(entries) + _one_answer_notes(entries)
    horizon = _add_time_auc(entries, None if plan.read_past_budget else cfg.train.max_seconds)
    notes += _past_budget_notes(entries, cfg) + _loss_notes(entries)
    notes += _paired_differences(entries, None if plan.screening else plan.baseline)
    sharing = _device_sharing(entries)
    notes += _sharing_notes(sharing)
    return {
        "baseline": None if plan.screening else plan.baseline,
        "screening": plan.screening,
        "baseline_peak_accuracy": base_peak,
        "target_fraction": plan.target_fraction,
        "target_accuracy": target,
        "budget_seconds": cfg.train.max_seconds,
        "budget_steps": cfg.train.max_steps,
        "read_past_budget": plan.read_past_budget,  # compare.read_past_budget: evaluations after the budget read too
        "peak_axis": primary_axis(cfg),
        "eval_every": {"steps": cfg.eval.every_steps or None, "seconds": cfg.eval.every_seconds or None},
        "eval_problems": _eval_problems(entries),
        "eval_samples": cfg.eval.samples,  # per problem: which interval a one-seed run's band is
        "time_auc_horizon_seconds": horizon,
        "seeds": {name: plan.n_seeds(name) for name in entries},
        "paired_excluding_zero": [
            f"{name} {key}" for name, e in entries.items() for key, d in (e["paired_vs_baseline"] or {}).items() if d["excludes_zero"]
        ],
        "pairwise": [] if plan.screening else _pairwise(entries, plan.baseline),
        "targets": _more_targets(plan, entries, rows, curves),
        "device_sharing": sharing,
        "commits": sorted({c for entry in entries.values() for run in entry["runs"] for c in run["commits"]}),
        "definitions": DEFINITIONS,
        "notes": notes,
        "methods": entries,
    }


def _method_entries(plan: Plan, out: Path, names: list[str]) -> tuple[dict[str, dict], dict[str, list[list[dict]]], dict[str, dict[str, Curve]]]:
    """Per method of ``names``: its entry (:func:`_method_entry`), its runs' eval rows and its curves.
    A baseline or target method that is not one of the plan's methods gets an entry only when it has finished runs."""
    entries: dict[str, dict[str, Any]] = {}
    rows: dict[str, list[list[dict]]] = {}
    curves: dict[str, dict[str, Curve]] = {}
    for name in names:
        entry, rows[name], curves[name] = _method_entry(plan, out, name)
        sets_target = name == plan.baseline or any(t.method == name for t in plan.targets)
        if sets_target and name not in [m.name for m in plan.methods] and not entry["runs"]:
            continue
        entries[name] = entry
    return entries, rows, curves


def _reach(curves: dict[str, Curve], rows: list[list[dict]], accuracy: float | None, axis: str) -> tuple[float | None, list[float | None]]:
    """On ``axis``: where a method's seed-mean curve first reaches ``accuracy`` and each seed's first
    evaluation at or above it (None where never; (None, []) when there is no target)."""
    if accuracy is None:
        return None, []
    return first_reach(curves[axis], accuracy), [seed_first_reach(r, accuracy, axis) for r in rows]


def _add_to_target(entry: dict[str, Any], rows: list[list[dict]], curves: dict[str, Curve], target: float | None,
                   base_at: dict[str, float | None]) -> None:  # fmt: skip
    """A method's numbers at the target, on both axes: where its seed-mean curve first reaches it, each
    seed's first evaluation at or above it (with their interval when every seed, at least two, reached
    it) and that as a fraction of the baseline's."""
    for axis in AXES:
        key = _TO_TARGET[axis]
        at, per_seed = _reach(curves, rows, target, axis)
        reached = [v for v in per_seed if v is not None]
        entry[key] = at
        entry[f"{key}_per_seed"] = per_seed
        entry[f"{key}_ci95"] = list(t_interval(reached)) if per_seed and len(reached) == len(per_seed) and len(reached) >= 2 else None
        entry[_FRACTION[axis]] = fraction(at, base_at[axis])
    if entry["steps_to_target"] == 0:
        entry["note"] = "the target is met at step 0 (before training): no time fraction"


def _more_targets(plan: Plan, entries: dict[str, dict], rows: dict[str, list[list[dict]]],
                  curves: dict[str, dict[str, Curve]]) -> list[dict[str, Any]]:  # fmt: skip
    """compare.targets: per target, its accuracy (``fraction`` x the method's seed-mean peak or final
    accuracy) and per method the step and training time at which its seed mean first reaches it (each
    seed's too), and that as a fraction of the target method's own (``time_fraction``, ``step_fraction``).
    None where a method never reaches it."""
    out = []
    for t in plan.targets:
        e = entries.get(t.method)
        level = None if e is None else (e["peak_accuracy"] if t.of == "peak" else e["final_accuracy"])
        accuracy = t.fraction * level if level else None  # 0% (never right) sets no target, as for the baseline
        ref = {axis: _reach(curves[t.method], rows[t.method], accuracy, axis)[0] for axis in AXES}
        per_method = {}
        for name in entries:
            at = {axis: _reach(curves[name], rows[name], accuracy, axis) for axis in AXES}
            per_method[name] = {
                "steps_to_target": at["step"][0],
                "time_to_target_seconds": at["train_seconds"][0],
                "time_to_target_seconds_per_seed": at["train_seconds"][1],
                "time_fraction": fraction(at["train_seconds"][0], ref["train_seconds"]),
                "step_fraction": fraction(at["step"][0], ref["step"]),
            }  # fmt: skip
        out.append({"method": t.method, "of": t.of, "fraction": t.fraction, "label": t.label, "level": level,
                    "target_accuracy": accuracy, "methods": per_method})  # fmt: skip
    return out


def _missing_seed_notes(plan: Plan, entries: dict[str, dict]) -> list[str]:
    """A note per method with some of its seeds unfinished: its row is over the others."""
    return [
        f"{name}: {len(entry['runs'])} of {plan.n_seeds(name)} seeds finished (not seed "
        f"{', '.join(map(str, entry['seeds_missing']))}); its row is over those"
        for name, entry in entries.items() if entry["seeds_missing"] and entry["runs"]
    ]  # fmt: skip


def _reward_notes(entries: dict[str, dict]) -> list[str]:
    """A note per method whose training reward leaves steps out (logged before the fixed-n basis)."""
    notes = []
    for name, entry in entries.items():
        left_out = sum(run["reward_steps_left_out"] for run in entry["runs"])
        if left_out:
            notes.append(f"{name}: the training reward of {left_out} step{'s' * (left_out != 1)} is left out of its signal: logged before podsrl "
                         "reported it on a fixed-n basis, it pools every rollout sampled with early stopping (biased towards "
                         "the groups that ran to n); retrain to compare it")  # fmt: skip
    return notes


def _past_budget_notes(entries: dict[str, dict], cfg: Config) -> list[str]:
    """A note per method with evaluations after the budget: left out, so every arm is read at the same time."""
    notes = []
    for name, entry in entries.items():
        past = [(run["seed"], t) for run in entry["runs"] for t in run["evaluations_past_budget"]]
        if past:
            shown = ", ".join(f"seed {seed} at {t / 60:.2f} min" for seed, t in past)
            notes.append(f"{name}: {len(past)} evaluation{'s' * (len(past) != 1)} after the budget ({_budget_text(cfg)}) left out, "
                         f"every number reads each run at or before it ({shown}: a last step that ended past the budget)")  # fmt: skip
    return notes


def _loss_notes(entries: dict[str, dict]) -> list[str]:
    """A note when the methods train with different losses (loss.aggregation): a comparison that does
    not set it trains a TRL arm with TRL's default loss and a podsrl arm with podsrl's."""
    kinds = {e["aggregation"] for e in entries.values()}
    if len(kinds) < 2:
        return []
    shown = ", ".join(f"{name} {e['aggregation']!r}" for name, e in entries.items())
    return [f"the methods train with different losses (loss.aggregation: {shown}; a TRL arm takes TRL's default where the "
            "comparison sets none): set loss.aggregation in the base config to compare them on one loss"]  # fmt: skip


def _budget_text(cfg: Config) -> str:
    t = cfg.train
    return " or ".join(([f"{t.max_steps} steps"] if t.max_steps else []) + ([f"{t.max_seconds / 60:g} min of training"] if t.max_seconds else []))


def _sharing_notes(sharing: dict[str, Any]) -> list[str]:
    """A note when runs shared a device: their wall-clocks are inflated."""
    if sharing["runs_per_device"] > 1:
        return [
            f"up to {sharing['runs_per_device']} runs trained at once on one device and shared its time: their training "
            "wall-clocks are inflated by the sharing, so compare the methods on the step axis"
        ]
    return []


def _method_entry(plan: Plan, out: Path, name: str) -> tuple[dict[str, Any], list[list[dict]], dict[str, Curve]]:
    """A method's report entry (without its target numbers), its runs' eval rows and its curves."""
    cfg0 = plan.config(name, 0)
    runs, rows_per_run, missing, all_metrics, trained = [], [], [], [], []
    for seed in range(plan.n_seeds(name)):
        cfg = plan.config(name, seed)
        path = run_dir(out, name, seed)
        if not (path / "config.toml").is_file() or not is_finished(path, cfg):
            missing.append(seed)
            continue
        check_same_config(path, cfg)
        trained.append(trained_m(path)[0])  # what an unset m meant when the run trained (its config.toml)
        run, evals, metrics = _run_record(path, cfg, seed, read_past_budget=plan.read_past_budget)
        runs.append(run)
        rows_per_run.append(evals)
        all_metrics += metrics
    e = cfg0.eval
    time_based = bool(e.every_seconds) and not e.every_steps
    curves = {axis: mean_curve(rows_per_run, time_based_eval=time_based, axis=axis) for axis in AXES}
    top, ci, ci_note, peak_at = _peak(curves, primary_axis(cfg0), len(runs))
    sel = cfg0.select
    m = trained[0] if trained else sel.m_start(cfg0.rollout.n)
    entry = {
        "overrides": plan.all_methods[name].overrides,
        "trainer": plan.trainer(name),  # podsrl, trl (GRPOTrainer) or trl-pods (PODSTrainer)
        "rule": sel.rule,
        "aggregation": cfg0.loss.aggregation,  # a TRL arm's default is TRL's (podsrl.compare.arms.defaults)
        "n": cfg0.rollout.n,
        "m": m,
        "m_final": sel.m_final if sel.m_final not in (None, m) else None,
        "token_fraction": [sel.token_fraction, sel.token_fraction_final or sel.token_fraction] if sel.uses_token_selection else None,
        "seeds_done": [r["seed"] for r in runs],
        "seeds_missing": missing,
        "peak_accuracy": top[1] if top else None,
        "peak_ci95": list(ci) if ci else None,
        "peak_step": peak_at["step"],
        "peak_train_seconds": peak_at["train_seconds"],
        "peak_per_seed": [r["peak_accuracy"] for r in runs],
        **_summaries(runs),
        "steps": [r["steps"] for r in runs],
        "median_seconds": _median_phase_seconds(all_metrics),
        "signal": _mean_over_seeds([r["signal"] for r in runs]),
        "signal_per_seed": [r["signal"] for r in runs],
        "sampler": _sampler_over_seeds(cfg0, [r["sampler"] for r in runs]),
        "curves": {
            axis: {"x": c.x, "accuracy": c.accuracy, "band_low": c.band_low, "band_high": c.band_high, "aligned_by": c.aligned_by}
            for axis, c in curves.items()
        },
        "runs": runs,
    }
    if ci_note:
        entry["peak_ci_note"] = ci_note
    if plan.screening:
        starts = [r["accuracy"][0] for r in runs if r["step"] and r["step"][0] == 0]  # the evaluation before training
        entry = {"task": {"name": cfg0.task.name, "options": cfg0.task.options}, "dataset": _dataset(cfg0),
                 "start_accuracy": statistics.fmean(starts) if starts else None, **entry}  # fmt: skip
    entry["one_answer"] = one_answer(cfg0)
    return entry, rows_per_run, curves


def one_answer(cfg: Config) -> dict[str, Any] | None:
    """The most common reference answer among the held-out problems a run of ``cfg`` scores, and its
    share of them: what a policy that gives that one answer to every problem scores, a shortcut the
    reward may teach instead of the task (letter_counting at 1-2 words: "1", 83%). None when the task
    cannot be loaded here (a missing file or extra) or has no reference answers."""
    from collections import Counter

    from podsrl.errors import ConfigError
    from podsrl.tasks.build import build_task, held_out_problems

    try:
        task = build_task(cfg)
    except (ConfigError, OSError):
        return None
    problems = held_out_problems(cfg, task)
    answers = [str(ex.answer).strip() for ex in problems if ex.answer is not None and str(ex.answer).strip()]
    if not answers:
        return None
    answer, count = Counter(answers).most_common(1)[0]
    return {"answer": answer, "share": count / len(problems), "problems": len(problems)}


def _one_answer_notes(entries: dict[str, dict], threshold: float = 0.25) -> list[str]:
    """A note per held-out set where one answer is the reference of at least ``threshold`` of the
    problems scored (the same set for every method of a comparison: one note)."""
    seen, notes = set(), []
    for name, entry in entries.items():
        one = entry.get("one_answer")
        if not one or one["share"] < threshold or (one["answer"], one["share"]) in seen:
            continue
        seen.add((one["answer"], one["share"]))
        notes.append(
            f"{name}: {one['share']:.0%} of the {one['problems']} held-out problems scored have the answer {one['answer']!r}, so a "
            "policy that gives it to every problem scores that much; accuracy near it may be that shortcut, not the task"
        )
    return notes


def _run_record(path: Path, cfg: Config, seed: int, *, read_past_budget: bool = False) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """A finished run's record in its method's entry (``runs[]``), with its eval rows at or before the
    budget (by training time: what every number reads, :func:`podsrl.compare.stats.within_budget`; every
    row with ``read_past_budget``) and its metrics rows."""
    evals = sorted(read_jsonl(path / "eval.jsonl"), key=lambda r: r["train_seconds"])
    evals, past = (evals, []) if read_past_budget else within_budget(evals, cfg.train.max_seconds, cfg.train.max_steps)
    metrics = _last_row_per_step(read_jsonl(path / "metrics.jsonl"))
    steps = max([r["step"] for r in metrics] + [r["step"] for r in evals] + [0])
    launches = read_launches(path)
    record = {
        "seed": seed,
        "train_seed": cfg.train.seed,
        "dir": str(path),
        "steps": steps,
        "train_seconds": [r["train_seconds"] for r in evals],
        "step": [r["step"] for r in evals],
        "accuracy": [r["accuracy"] for r in evals],
        "evaluations_past_budget": [r["train_seconds"] for r in past],  # left out of every number
        "problems": evals[-1]["problems"] if evals else None,
        "peak_accuracy": max((r["accuracy"] for r in evals), default=None),
        **{key: f(evals) for key, f in SUMMARIES.items()},
        "median_seconds": _median_phase_seconds(metrics),
        "signal": _signal(metrics, cfg),
        "sampler": _sampler(metrics),
        "reward_steps_left_out": _reward_left_out(metrics, cfg),
        "device": launches[-1].get("device") if launches else None,
        "runs_per_device": max((int(r.get("runs_on_device", 1)) for r in launches), default=None),
        "commits": sorted({r["commit"] for r in launches if r.get("commit")}),
    }  # fmt: skip
    return record, evals, metrics


def _last_row_per_step(metrics: list[dict]) -> list[dict]:
    """metrics.jsonl's rows with a step logged again after a resume counted once: its last row (what
    the resumed run trained on from its checkpoint). Rows without a step are kept as they are."""
    last = {r["step"]: i for i, r in enumerate(metrics) if isinstance(r.get("step"), int)}
    return [r for i, r in enumerate(metrics) if not isinstance(r.get("step"), int) or last[r["step"]] == i]


def _peak(curves: dict[str, Curve], axis: str, seeds: int) -> tuple[tuple | None, tuple | None, str | None, dict[str, float | None]]:
    """The peak of the seed-mean curve on ``axis`` (the one evaluation is scheduled on): its index and
    accuracy, its Student-t interval over the seeds (and a note when there is one seed), and where
    it is on both axes (on the other one only when both share the points)."""
    main = curves[axis]
    top = peak(main)
    ci, ci_note = None, None
    if top is not None:
        ci = t_interval([seed_acc[top[0]] for seed_acc in main.per_seed])
        if seeds == 1:
            ci_note = "1 seed: no confidence interval over seeds"
    same_points = main.aligned_by == "index"  # then both axes share the points and the peak's index
    peak_at = {a: (curves[a].x[top[0]] if top and (a == main.axis or same_points) else None) for a in AXES}
    return top, ci, ci_note, peak_at


def _dataset(cfg: Config) -> str | None:
    """A reasoning-gym task's dataset (a mix: its names joined by '+'); None for other tasks."""
    options = cfg.task.options
    if cfg.task.name != "reasoning_gym":
        return None
    if options.get("dataset"):
        return str(options["dataset"])
    return "+".join(str(d.get("name")) for d in options.get("datasets") or [])


def _summaries(runs: list[dict]) -> dict[str, Any]:
    """auc, auc_ci95, auc_per_seed, final_accuracy, ... of a method's entry."""
    out = {}
    for key in SUMMARIES:
        summary = summarize({run["seed"]: run[key] for run in runs})
        out[key] = summary.mean
        out[f"{key}_ci95"] = list(summary.ci95) if summary.ci95 else None
        out[f"{key}_per_seed"] = [run[key] for run in runs]
    return out


def _add_time_auc(entries: dict[str, dict], budget_seconds: float | None) -> float | None:
    """Every run's and method's ``time_auc`` over the comparison's horizon (the budget; without a time
    budget the shortest finished run's training time); returns the horizon (None without runs)."""
    ends = [run["train_seconds"][-1] for e in entries.values() for run in e["runs"] if run["train_seconds"]]
    horizon = (budget_seconds or min(ends)) if ends else None
    for entry in entries.values():
        for run in entry["runs"]:
            run["time_auc"] = time_auc(run["train_seconds"], run["accuracy"], horizon) if horizon else None
        summary = summarize({run["seed"]: run["time_auc"] for run in entry["runs"]})
        entry["time_auc"], entry["time_auc_ci95"] = summary.mean, list(summary.ci95) if summary.ci95 else None
        entry["time_auc_per_seed"] = [run["time_auc"] for run in entry["runs"]]
    return horizon


def _paired_differences(entries: dict[str, dict], baseline: str) -> list[str]:
    """Set every method's ``paired_vs_baseline`` (None for the baseline itself); the notes saying
    which differences exclude zero and which do not."""
    base = entries.get(baseline)
    excluding, including, notes = [], [], []
    for name, entry in entries.items():
        entry["paired_vs_baseline"] = None
        if name == baseline or base is None:
            continue
        paired = {}
        for key in SUMMARY_KEYS:
            d = paired_difference(_by_seed(entry, key), _by_seed(base, key))
            paired[key] = d.to_json()
            if d.mean is None:
                continue
            text = f"{name} {key} {_points(d.mean)}" + (f" [{_points(d.ci95[0])}, {_points(d.ci95[1])}]" if d.ci95 else "")
            text += f" ({len(d.seeds)} pair{'s' * (len(d.seeds) != 1)})"
            if d.excludes_zero():
                excluding.append(text)
            elif d.ci95 is not None:
                including.append(text)
        entry["paired_vs_baseline"] = paired
    if excluding:
        notes.append(f"paired differences vs {baseline} (points) whose 95% interval excludes zero: {'; '.join(excluding)}")
    if including:
        notes.append(f"paired differences vs {baseline} (points) whose 95% interval includes zero (not resolved): "
                     f"{'; '.join(including)}")  # fmt: skip
    return notes


def _pairwise(entries: dict[str, dict], baseline: str) -> list[dict[str, Any]]:
    """compare.json ``pairwise``: a minus b, paired by seed, for every pair of non-baseline methods."""
    names = [name for name in entries if name != baseline]
    return [
        {"a": a, "b": b, **{key: paired_difference(_by_seed(entries[a], key), _by_seed(entries[b], key)).to_json() for key in SUMMARY_KEYS}}
        for i, a in enumerate(names) for b in names[i + 1:]
    ]  # fmt: skip


def _by_seed(entry: dict[str, Any], key: str) -> dict[int, float | None]:
    return {run["seed"]: run[key] for run in entry["runs"]}


def _points(x: float) -> str:
    """An accuracy difference in percentage points, signed: "+5.1"."""
    return f"{100 * x:+.1f}"


def _device_sharing(entries: dict[str, dict]) -> dict[str, Any]:
    """The most runs that trained at once on one device, over every reported run (1 for runs
    without a launch record: a comparison made before they were kept ran one run at a time)."""
    per_run = [run.get("runs_per_device") or 1 for entry in entries.values() for run in entry["runs"]]
    devices = sorted({str(run["device"]) for entry in entries.values() for run in entry["runs"] if run.get("device") is not None})
    most = max(per_run, default=1)
    return {"runs_per_device": most, "devices": devices, "fair_axes": ["step", "train_seconds"] if most <= 1 else ["step"]}


PHASES = ("step", "generate", "update")


def _median_phase_seconds(metrics: list[dict]) -> dict[str, float | None]:
    """Median seconds per training step of the whole step and of its generate and update phases
    (``time/<phase>`` in metrics.jsonl, over every logged step): what explains a speedup."""
    out = {}
    for phase in PHASES:
        values = [r[f"time/{phase}"] for r in metrics if isinstance(r.get(f"time/{phase}"), (int, float))]
        out[phase] = statistics.median(values) if values else None
    return out


SIGNAL = ("reward", "zero_variance_groups", "zero_variance_groups_start", "kept_adv_var", "tokens_in_loss", "signal_tokens_kept", "grad_norm", "rollouts",
          "prompts", "groups_with_signal", "rows_run", "rollouts_per_signal_group", "prompts_skipped", "explored_silent",
          "revisits_silent", "rest_silent", "epochs", "completion_len", "completion_len_start", "truncated")  # fmt: skip
_SIGNAL_KEYS = {"zero_variance_groups": "zero_variance_groups", "kept_adv_var": "kept_adv_var", "grad_norm": "grad_norm",
                "rollouts": "rollouts_generated", "groups_with_signal": "groups_with_signal", "prompts_skipped": "prompts_skipped",
                "completion_len": "completion_len", "truncated": "truncated"}  # fmt: skip


def _numbers(metrics: list[dict], key: str) -> list[float]:
    """The values of ``key`` in the metrics rows that log a number for it (NaN left out)."""
    return [float(r[key]) for r in metrics if isinstance(r.get(key), (int, float)) and r[key] == r[key]]


def _signal(metrics: list[dict], cfg: Config) -> dict[str, float | None]:
    """A run's means over its steps of what it trained on (DEFINITIONS["signal"]); None where
    metrics.jsonl has no such value. ``metrics`` holds one row per step (_last_row_per_step)."""
    values = functools.partial(_numbers, metrics)

    out: dict[str, float | None] = {name: statistics.fmean(v) if (v := values(key)) else None for name, key in _SIGNAL_KEYS.items()}
    rewards = [v for r in metrics if (v := _reward(r, cfg)) is not None]
    out["reward"] = statistics.fmean(rewards) if rewards else None
    for key in ("zero_variance_groups", "completion_len"):
        start = [float(v) for r in metrics if isinstance(r.get("step"), int) and r["step"] <= SIGNAL_START_STEPS
                 and isinstance(v := r.get(key), (int, float)) and v == v]  # fmt: skip
        out[f"{key}_start"] = statistics.fmean(start) if start else None
    B = cfg.train.prompts_per_step  # a row older than prompts_sampled sampled B prompts (no dynamic sampling then)
    prompts = [float(r.get("prompts_sampled", B)) for r in metrics if "step" in r]
    out["prompts"] = statistics.fmean(prompts) if prompts else None
    kept, total = sum(values("tokens_kept")), sum(values("tokens_total"))
    out["tokens_in_loss"] = kept / total if total else None
    out["signal_tokens_kept"] = _signal_tokens_kept(metrics, cfg)
    both = [r for r in metrics if isinstance(r.get("rows_run"), int) and isinstance(r.get("kept"), (int, float))]  # older runs lack rows_run
    ran, kept_rows = sum(r["rows_run"] for r in both), sum(r["kept"] for r in both)
    out["rows_run"] = ran / kept_rows if kept_rows else None
    useful = sum(values("groups_with_signal"))
    out["rollouts_per_signal_group"] = sum(values("rollouts_generated")) / useful if useful else None
    explored = sum(values("prompts_explored"))
    out["explored_silent"] = sum(values("prompts_explored_silent")) / explored if explored else None
    out["revisits_silent"], out["rest_silent"] = _revisits_silent(metrics)
    # the passes by each step: epoch_end since issue 57 (epoch is now the passes when the step began), epoch before it
    ends = [float(v) for r in metrics if isinstance(v := r.get("epoch_end", r.get("epoch")), (int, float)) and v == v]
    out["epochs"] = ends[-1] if ends else None
    return {name: out[name] for name in SIGNAL}


def _signal_tokens_kept(metrics: list[dict], cfg: Config) -> float | None:
    """The share of the signal rows' completion tokens (advantage != 0) that token selection kept in the
    loss, over the steps where it was on (token_fraction < 1) and a row ran: sum tokens_kept / sum
    tokens_run. With optim.skip_zero_advantage (the default) the rows that ran are the signal rows;
    without it they include the rows of advantage 0, so there is no such share (None), nor without
    token selection."""
    if not cfg.select.uses_token_selection or not cfg.optim.skip_zero_advantage:
        return None
    on = [r for r in metrics if isinstance(r.get("token_fraction"), (int, float)) and r["token_fraction"] < 1
          and isinstance(r.get("tokens_run"), (int, float)) and r["tokens_run"] > 0 and isinstance(r.get("tokens_kept"), (int, float))]  # fmt: skip
    run = sum(r["tokens_run"] for r in on)
    return sum(r["tokens_kept"] for r in on) / run if run else None


SAMPLER_MEANS = ("sampler_logp_diff", "sampler_kl", "is_ratio_mean", "is_clip_frac")


def _sampler(metrics: list[dict]) -> dict[str, float | None]:
    """A run's sampler gap and importance-correction statistics (DEFINITIONS["sampler"]): the mean over
    its steps of each step's value, the smallest is_ratio_min and the largest is_ratio_max; None where
    metrics.jsonl has no such value (the transformers engine samples with the trainer: no gap)."""
    values = functools.partial(_numbers, metrics)

    out: dict[str, float | None] = {key: statistics.fmean(v) if (v := values(key)) else None for key in SAMPLER_MEANS}
    out["is_ratio_min"] = min(v) if (v := values("is_ratio_min")) else None
    out["is_ratio_max"] = max(v) if (v := values("is_ratio_max")) else None
    return out


def _sampler_over_seeds(cfg: Config, runs: list[dict[str, float | None]]) -> dict[str, Any]:
    """A method's sampler (its dtype and correction setting) and its runs' statistics over seeds: the
    mean of the means, the smallest minimum, the largest maximum."""
    r = cfg.rollout
    out: dict[str, Any] = {"dtype": r.sampler_dtype,
                           "correction": r.importance_sampling_mode if r.importance_sampling_correction else None}  # fmt: skip
    for key in SAMPLER_MEANS:
        out[key] = statistics.fmean(v) if (v := [s[key] for s in runs if s.get(key) is not None]) else None
    out["is_ratio_min"] = min(v) if (v := [s["is_ratio_min"] for s in runs if s.get("is_ratio_min") is not None]) else None
    out["is_ratio_max"] = max(v) if (v := [s["is_ratio_max"] for s in runs if s.get("is_ratio_max") is not None]) else None
    return out


def _revisits_silent(metrics: list[dict]) -> tuple[float | None, float | None]:
    """Of the groups sampled in the steps logged at epoch >= 1: the share silent, and the share silent
    among those not predicted silent (sampled without a silent streak: neither explored nor forced
    in; rows before issue 57 counted the forced as explored; None without prompt selection)."""
    rows = [r for r in metrics if isinstance(r.get("epoch"), (int, float)) and r["epoch"] >= 1
            and isinstance(r.get("groups_silent"), int) and isinstance(r.get("prompts_sampled"), int)]  # fmt: skip
    sampled = sum(r["prompts_sampled"] for r in rows)
    if not sampled:
        return None, None
    silent = sum(r["groups_silent"] for r in rows)
    if not any("prompts_explored" in r for r in rows):
        return silent / sampled, None
    predicted = sum(r.get("prompts_explored", 0) + r.get("prompts_forced", 0) for r in rows)
    rest = sampled - predicted
    rest_silent = silent - sum(r.get("prompts_explored_silent", 0) + r.get("prompts_forced_silent", 0) for r in rows)
    return silent / sampled, (rest_silent / rest if rest else None)


def _reward(row: dict, cfg: Config) -> float | None:
    """The row's reward_mean where it is comparable with a fixed-n run's (podsrl.run.metrics.comparable_reward)."""
    early_stop = cfg.rollout.early_stop != "off"
    return comparable_reward(row, early_stop=early_stop, rollouts=cfg.train.prompts_per_step * cfg.rollout.n)


def _reward_left_out(metrics: list[dict], cfg: Config) -> int:
    """Steps whose reward_mean is left out of ``signal`` (pooled over early-stopped rollouts, older runs)."""
    return sum(1 for r in metrics if isinstance(r.get("reward_mean"), (int, float)) and _reward(r, cfg) is None)


def _mean_over_seeds(signals: list[dict[str, float | None]]) -> dict[str, float | None]:
    return {name: statistics.fmean(v) if (v := [s[name] for s in signals if s[name] is not None]) else None for name in SIGNAL}


def _eval_problems(entries: dict[str, dict]) -> int | None:
    for entry in entries.values():
        for run in entry["runs"]:
            if run["problems"]:
                return run["problems"]
    return None


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "compare.json"
    write_text_atomic(json_path, json.dumps(report, indent=2, allow_nan=False) + "\n")
    return json_path, plot_report(report, out / "compare.png")
