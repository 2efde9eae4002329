"""The printed tables. First, per method: the peak with its interval, the step and the training time
at which the seed mean first reaches the target (95% intervals over the seeds' own first points),
each as a fraction of the baseline's (the one ratio convention: "time to the target as a fraction of
the baseline's"; a compare.json made before issue 68 holds ``speedup``, its inverse, and is read so
too), and the cost of a step. Every number reads each run at or before the budget (the heads say so). Second, the robust summaries: AUC and final
accuracy with their intervals over seeds, and each method minus the baseline paired by seed with
the paired t-interval, starred where it excludes zero; then every other pair of methods the same
way. Third, the seed-mean held-out accuracy at each evaluation step, or at equal training minutes when
evaluation is time-based (read between each method's own evaluations). Fourth, what each method trained on (from metrics.jsonl). The report's notes follow.
A screening (each method its own task: no baseline) replaces the first two with one table: per
method its task, the accuracy before and after training, and how silent its first steps were."""

from __future__ import annotations

from typing import Any

from podsrl.compare.stats import SIGNAL_START_STEPS, value_at


def _format_phases(med: dict[str, float | None]) -> str:
    if med.get("step") is None:
        return "-"
    parts = ", ".join("-" if med.get(p) is None else f"{med[p]:.1f}" for p in ("generate", "update"))
    return f"{med['step']:.1f} ({parts})"


def _rule(e: dict[str, Any]) -> str:
    """The rule, and the trainer when it is TRL's: "all (trl)", "max_variance (trl-pods)"."""
    trainer = e.get("trainer", "podsrl")
    return e["rule"] if trainer == "podsrl" else f"{e['rule']} ({trainer})"


def _reach(value: float | None, ci: list[float] | None, per_seed: list, has_target: bool, fmt) -> str:
    """"40 [31, 49]", "40 (2/3 seeds)" when not every seed reaches it, "never", or "-" (no target)."""
    if not has_target:
        return "-"
    if value is None:
        return "never"
    text = fmt(value)
    if ci:
        return f"{text} [{fmt(max(0.0, ci[0]))}, {fmt(ci[1])}]"
    reached = sum(v is not None for v in per_seed)
    return f"{text} ({reached}/{len(per_seed)} seeds)" if reached < len(per_seed) else text


def fraction_of(d: dict[str, Any], axis: str) -> float | None:
    """A method's steps (``axis`` "step") or time ("time") to a target as a fraction of the reference's,
    from a compare.json entry of any age: ``time_fraction`` / ``step_fraction``, or before issue 68
    the inverse of ``speedup`` / ``step_speedup`` (``time_ratio`` in a target's)."""
    if f"{axis}_fraction" in d:
        return d[f"{axis}_fraction"]
    if axis == "time" and d.get("time_ratio") is not None:
        return d["time_ratio"]
    old = d.get("speedup" if axis == "time" else "step_speedup")
    return 1 / old if old else None


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(report: dict[str, Any]) -> str:
    if report.get("screening"):
        sections = [*_screening_table(report), "", *_curve_table(report), *_signal_table(report)]
        return "\n".join(sections + [f"note: {n}" for n in report["notes"]])
    pct, base = f"{100 * report['target_fraction']:.0f}%", report["baseline"]
    rows = [("method", "rule", "n", "m", "peak acc (95% CI)", f"step to {pct} {base} peak", f"steps, fraction of {base}'s",
             f"min to {pct} {base} peak", f"time, fraction of {base}'s", "steps", "s/step (generate, update)")]  # fmt: skip
    has_target = report["target_accuracy"] is not None
    for name, e in report["methods"].items():
        m = f"{e['m']}->{e['m_final']}" if e["m_final"] else str(e["m"])
        if e["peak_accuracy"] is None:
            acc = "no finished run"
        elif e["peak_ci95"]:
            low, high = (100 * min(1.0, max(0.0, v)) for v in e["peak_ci95"])  # a t-interval can leave [0, 1]
            acc = f"{100 * e['peak_accuracy']:.1f}% [{low:.1f}, {high:.1f}]"
        else:
            acc = f"{100 * e['peak_accuracy']:.1f}% (1 seed, no CI)"
        steps = _reach(e["steps_to_target"], e["steps_to_target_ci95"], e["steps_to_target_per_seed"], has_target, lambda v: f"{v:.0f}")
        minutes = _reach(e["time_to_target_seconds"], e["time_to_target_seconds_ci95"], e["time_to_target_seconds_per_seed"],
                         has_target, lambda v: f"{v / 60:.1f}")  # fmt: skip
        rows.append((
            name, _rule(e), str(e["n"]), m, acc,
            steps, _times(fraction_of(e, "step")),
            minutes, _times(fraction_of(e, "time")),
            ", ".join(map(str, e["steps"])) or "-",
            _format_phases(e.get("median_seconds") or {}),
        ))  # fmt: skip
    lines = _grid(rows)
    head = []
    budget = _budget(report)
    if has_target:
        head.append(
            f"target: {pct} of {report['baseline']}'s peak {100 * report['baseline_peak_accuracy']:.1f}% = "
            f"{100 * report['target_accuracy']:.1f}% held-out accuracy; budget {budget} per run"
        )
    head.append("step/min to target: first evaluation of the seed mean at the target [95% t-interval over the seeds' own "
                f"first evaluations at it]; fraction of {base}'s: the time (steps) to the target as a fraction of {base}'s "
                "(below 1: sooner)" + (f"; {_reading(report)}" if _reading(report) else ""))  # fmt: skip
    sections = [*_targets_table(report), *_summary_table(report), "", *_pairwise_table(report), *_curve_table(report),
                *_signal_table(report), *_sampler_table(report)]
    return "\n".join(head + lines + [""] + sections + [f"note: {n}" for n in report["notes"]])


def _reading(report: dict[str, Any]) -> str:
    """Which evaluations every number reads: those at or before the budget, or (compare.read_past_budget)
    all of them; "" for a report made before issue 68, which read all of them and did not say so."""
    if "read_past_budget" not in report:
        return ""
    if report["read_past_budget"]:
        return "every number reads every evaluation, those after the budget too (compare.read_past_budget)"
    return f"every number reads each run's evaluations at or before the budget ({_budget(report)})"


def _targets_table(report: dict[str, Any]) -> list[str]:
    """compare.targets (compare.json ``targets``): per method, the training minutes its seed mean takes to
    each target and that time as a fraction of the target method's own."""
    targets = report.get("targets") or []
    if not targets:
        return []
    header = ["method"] + [f"min to {t['label']}" + ("" if t["target_accuracy"] is None else f" ({100 * t['target_accuracy']:.1f}%)")
                           for t in targets]  # fmt: skip
    rows = [tuple(header)]
    for name in report["methods"]:
        cells = []
        for t in targets:
            d = t["methods"].get(name) or {}
            if t["target_accuracy"] is None:
                cells.append("-")
            elif d.get("time_to_target_seconds") is None:
                cells.append("never")
            else:
                ratio = "" if fraction_of(d, "time") is None else f" ({fraction_of(d, 'time'):.2f}x its time)"
                cells.append(f"{d['time_to_target_seconds'] / 60:.1f}{ratio}")
        rows.append((name, *cells))
    every = (report.get("eval_every") or {}).get("seconds")
    grain = f" (evaluations every {every / 60:g} min: a time is when it was first seen, an upper bound)" if every else ""
    head = [f"more targets (compare.targets): training minutes to the first evaluation of the seed mean at each{grain}; "
            "(r x its time): that as a fraction of the target method's own time to it"]  # fmt: skip
    return head + _grid(rows) + [""]


def _screening_table(report: dict[str, Any]) -> list[str]:
    """A screening's methods (tasks): accuracy before and after training, the change, the peak, and
    the share of silent groups over the first steps and over the run (compare.json)."""
    rows = [("method", "task", "seeds", "acc before %", "acc after %", "change, points", "peak %", "silent groups, first steps",
             "silent groups, all steps", "train reward", "completion tokens, first steps / all", "cut at the limit", "steps",
             "one answer scores")]  # fmt: skip
    for name, e in report["methods"].items():
        before, after = e.get("start_accuracy"), e["final_accuracy"]
        sig = e.get("signal") or {}
        rows.append((
            name, e.get("dataset") or e["task"]["name"], str(len(e["runs"])), _fmt(before and 100 * before, "{:.1f}"),
            _mean_ci(after, e["final_accuracy_ci95"]) if after is not None else "-",
            "-" if before is None or after is None else f"{100 * (after - before):+.1f}",
            _fmt(e["peak_accuracy"] and 100 * e["peak_accuracy"], "{:.1f}"),
            _fmt(sig.get("zero_variance_groups_start"), "{:.0%}"), _fmt(sig.get("zero_variance_groups"), "{:.0%}"),
            _fmt(sig.get("reward"), "{:.3f}"), _tokens(sig), _fmt(sig.get("truncated"), "{:.0%}"),
            ", ".join(map(str, e["steps"])) or "-", _one_answer(e.get("one_answer")),
        ))  # fmt: skip
    head = [f"screening: each method trained on its own task for {_budget(report)}; held-out accuracy before training (step 0) and after "
            f"(at the budget), mean over seeds; silent groups: share of sampled groups with all rewards equal (no gradient), "
            f"over the first {SIGNAL_START_STEPS} steps and over the run; one answer scores: the share of the held-out problems "
            f"scored whose answer is the most common one (that answer), what giving it to every problem scores"]  # fmt: skip
    return head + _grid(rows)


def _tokens(sig: dict[str, Any]) -> str:
    """"142 / 97": mean completion tokens over the first steps and over the run; "-" without them."""
    if sig.get("completion_len") is None:
        return "-"
    return f"{_fmt(sig.get('completion_len_start'), '{:.0f}')} / {sig['completion_len']:.0f}"


def _one_answer(one: dict[str, Any] | None) -> str:
    """"83% ('1')", or "-" when unknown."""
    if not one:
        return "-"
    answer = one["answer"] if len(one["answer"]) <= 12 else one["answer"][:11] + "…"
    return f"{one['share']:.0%} ({answer!r})"


def _budget(report: dict[str, Any]) -> str:
    """"80 steps", "10.0 min of training", or both joined by "or"."""
    return " or ".join(
        ([f"{report['budget_steps']} steps"] if report.get("budget_steps") else [])
        + ([f"{report['budget_seconds'] / 60:.1f} min of training"] if report.get("budget_seconds") else [])
    )


def _grid(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns, a rule under the header row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _summary_table(report: dict[str, Any]) -> list[str]:
    base = report["baseline"]
    minutes = (report.get("time_auc_horizon_seconds") or 0) / 60
    rows = [("method", "seeds", "AUC % [95% CI]", "final acc % [95% CI]", f"AUC - {base}, points [paired 95% CI]",
             f"final - {base}, points [paired 95% CI]", f"AUC, first {minutes:.1f} training min % [95% CI]",
             f"that - {base}, points [paired 95% CI]")]  # fmt: skip
    for name, e in report["methods"].items():
        paired = e.get("paired_vs_baseline") or {}
        rows.append((
            name, str(len(e["runs"])),
            _mean_ci(e["auc"], e["auc_ci95"]), _mean_ci(e["final_accuracy"], e["final_accuracy_ci95"]),
            difference(paired.get("auc"), baseline=name == base), difference(paired.get("final_accuracy"), baseline=name == base),
            _mean_ci(e.get("time_auc"), e.get("time_auc_ci95")), difference(paired.get("time_auc"), baseline=name == base),
        ))  # fmt: skip
    strict = not report.get("read_past_budget", True)
    horizon = "[0, the budget]" if strict and report.get("budget_seconds") else "(the shortest run's)"
    final = "the last evaluation at or before the budget" if strict else "the last evaluation"
    reading = f" ({_reading(report)})" if _reading(report) else ""
    head = [f"robust summaries{reading}: AUC = mean accuracy over the evaluations after step 0; final = {final}; "
            f"AUC per training minute = mean accuracy over the first {minutes:.1f} minutes of training {horizon}, each run's "
            f"last evaluation held to its end; differences: method - {base} for the same seed (* = the paired interval excludes zero)"]  # fmt: skip
    return head + _grid(rows)


def _pairwise_table(report: dict[str, Any]) -> list[str]:
    """Every pair of non-baseline methods, a - b paired by seed (compare.json ``pairwise``)."""
    pairs = [p for p in report.get("pairwise", []) if p["auc"]["mean"] is not None]
    if not pairs:
        return []
    rows = [("a - b", "AUC, points [paired 95% CI]", "final, points [paired 95% CI]")]
    rows += [(f"{p['a']} - {p['b']}", difference(p["auc"]), difference(p["final_accuracy"])) for p in pairs]
    return ["between methods: a - b for the same seed (* = the paired interval excludes zero)"] + _grid(rows) + [""]


def _mean_ci(mean: float | None, ci: list[float] | None) -> str:
    """"40.9 [35.2, 46.6]" (percent, the interval clipped to [0, 100]), "40.9 (1 seed)", or "-"."""
    if mean is None:
        return "-"
    if not ci:
        return f"{100 * mean:.1f} (1 seed)"
    low, high = (100 * min(1.0, max(0.0, v)) for v in ci)
    return f"{100 * mean:.1f} [{low:.1f}, {high:.1f}]"


def difference(d: dict[str, Any] | None, *, baseline: bool = False, count: bool = True) -> str:
    """A paired difference as compare.json keeps it (:meth:`podsrl.compare.stats.Summary.to_json`),
    in points: "+5.1 [+1.2, +9.0]* (5)" (* = the interval excludes zero; the number of pairs unless
    ``count`` is False), "+5.1 (1 pair, no CI)", "(baseline)" or "-"."""
    if baseline:
        return "(baseline)"
    if not d or d.get("mean") is None:
        return "-"
    k = len(d.get("seeds") or [])
    if not d.get("ci95"):
        return f"{100 * d['mean']:+.1f} ({k} pair, no CI)"
    low, high = (100 * v for v in d["ci95"])
    return f"{100 * d['mean']:+.1f} [{low:+.1f}, {high:+.1f}]{'*' if d.get('excludes_zero') else ''}" + (f" ({k})" if count else "")


def _curve_table(report: dict[str, Any]) -> list[str]:
    """Each method's seed-mean accuracy at each evaluation, on the axis evaluation is scheduled on.
    Time-based evaluation: at equal training minutes (:func:`_minutes_table`). Step-based: only when
    every method's seeds are aligned by evaluation index and all have as many points (else the figure
    shows the curves)."""
    axis = report.get("peak_axis", "step")
    curves = {name: e["curves"][axis] for name, e in report["methods"].items() if e["runs"]}
    every = (report.get("eval_every") or {}).get("seconds")
    if axis == "train_seconds" and every and curves:
        return _minutes_table(report, curves, every)
    counts = {len(c["x"]) for c in curves.values()}
    if not curves or len(counts) != 1 or {c["aligned_by"] for c in curves.values()} != {"index"}:
        return []
    points = counts.pop()
    if axis == "train_seconds":
        xs = [sum(c["x"][i] for c in curves.values()) / len(curves) / 60 for i in range(points)]
        header, what = [f"{x:.1f} min" for x in xs], "at each evaluation, by training minutes (the methods' mean time of each)"
    else:
        header, what = [f"step {x:g}" for x in next(iter(curves.values()))["x"]], "at each evaluation step"
    rows = [("method", "seeds", *header)]
    rows += [(name, str(len(report["methods"][name]["runs"])), *(f"{100 * a:.1f}" for a in c["accuracy"])) for name, c in curves.items()]
    return [f"held-out accuracy % {what}: mean over seeds (95% bands in compare.json curves)"] + _grid(rows) + [""]


def _minutes_table(report: dict[str, Any], curves: dict[str, dict], every: float) -> list[str]:
    """Seed-mean held-out accuracy at equal training minutes: at every ``eval.every_seconds``, each
    method's mean curve read linearly between its own evaluations, and at the budget its final accuracy
    (each seed's last evaluation at or before the budget, averaged: a run trains no more than the
    budget). A run evaluates at the first step end after each interval, so its points fall up to a
    step late (a TRL arm's steps of half a minute: up to half a minute), and methods' points differ;
    read at the same minutes they compare. "-" past a method's last evaluation. With compare.read_past_budget
    the budget is read on the curve like the other minutes (the report before issue 68)."""
    end = report.get("budget_seconds") or max(c["x"][-1] for c in curves.values())
    budget = end if report.get("budget_seconds") and not report.get("read_past_budget", True) else None  # a column of its own
    marks = [k * every for k in range(int(end // every + 1e-9) + 1) if not budget or k * every < budget - 1e-6]
    if not budget and end - marks[-1] > 1e-6:
        marks.append(end)
    head_cells = [f"{m / 60:.1f} min" for m in marks] + ([f"{budget / 60:.1f} min (at the budget)"] if budget else [])
    rows = [("method", "seeds", *head_cells)]
    for name, c in curves.items():
        values = [value_at(c["x"], c["accuracy"], m) for m in marks] + ([report["methods"][name]["final_accuracy"]] if budget else [])
        rows.append((name, str(len(report["methods"][name]["runs"])), *("-" if v is None else f"{100 * v:.1f}" for v in values)))
    head = ["held-out accuracy % at equal training minutes: mean over seeds, each method's curve linear between its own "
            "evaluations (which come at the first step end after each interval: up to a step late; the points themselves are "
            "compare.json's curves)" + ("; at the budget: the last evaluation at or before it" if budget else "")]  # fmt: skip
    return head + _grid(rows) + [""]


def _signal_table(report: dict[str, Any]) -> list[str]:
    """What each method trained on (compare.json ``signal``; DEFINITIONS["signal"])."""
    rows = [("method", "train reward", "zero-variance groups", "completion tokens, first steps / all", "cut at the limit",
             "kept adv variance", "tokens in loss", "signal tokens kept", "grad norm",
             "rollouts / step", "prompts / step", "groups with signal", "kept rows run", "rollouts / signal group",
             "prompts skipped / step", "explored came back silent", "silent from epoch 1", "of the rest", "epochs")]  # fmt: skip
    for name, e in report["methods"].items():
        sig = e.get("signal") or {}
        cells = [_fmt(sig.get("reward"), "{:.3f}"), _fmt(sig.get("zero_variance_groups"), "{:.0%}"), _tokens(sig),
                 _fmt(sig.get("truncated"), "{:.0%}"),
                 _fmt(sig.get("kept_adv_var"), "{:.3f}"), _fmt(sig.get("tokens_in_loss"), "{:.0%}"),
                 _fmt(sig.get("signal_tokens_kept"), "{:.0%}"),
                 _fmt(sig.get("grad_norm"), "{:.2f}"), _fmt(sig.get("rollouts"), "{:.0f}"), _fmt(sig.get("prompts"), "{:.1f}"),
                 _fmt(sig.get("groups_with_signal"), "{:.1f}"), _fmt(sig.get("rows_run"), "{:.0%}"),
                 _fmt(sig.get("rollouts_per_signal_group"), "{:.1f}"), _fmt(sig.get("prompts_skipped"), "{:.1f}"),
                 _fmt(sig.get("explored_silent"), "{:.0%}"), _fmt(sig.get("revisits_silent"), "{:.0%}"),
                 _fmt(sig.get("rest_silent"), "{:.0%}"), _fmt(sig.get("epochs"), "{:.1f}")]  # fmt: skip
        rows.append((name, *cells))
    head = ["training signal (metrics.jsonl): mean over each run's steps, then over seeds; train reward and zero-variance "
            "groups: of the first B prompts sampled (each group's first round: a fixed-n run's basis); signal tokens kept: "
            "with token selection, the signal rows' tokens its loss kept while it was on; kept adv variance: "
            "of the advantages the update used (D3S keeps the full group's, PODS re-normalises over the m kept: compare "
            "like with like)"]  # fmt: skip
    return head + _grid(rows)


def _sampler_table(report: dict[str, Any]) -> list[str]:
    """The sampler's gap and the importance correction per method (compare.json ``sampler``;
    DEFINITIONS["sampler"]); nothing when no run logged a gap (the transformers engine)."""
    keys = ("sampler_logp_diff", "sampler_kl", "is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_clip_frac")
    samplers = {name: e.get("sampler") or {} for name, e in report["methods"].items()}
    if not any(s.get(k) is not None for s in samplers.values() for k in keys):
        return []
    rows = [("method", "sampler", "correction", "|log-prob gap| / token", "KL(sampler || trainer) / token",
             "ratio mean", "ratio min", "ratio max", "tokens truncated or masked")]  # fmt: skip
    for name, s in samplers.items():
        rows.append((name, str(s.get("dtype") or "-"), str(s.get("correction") or "off"),
                     _fmt(s.get("sampler_logp_diff"), "{:.2e}"), _fmt(s.get("sampler_kl"), "{:.2e}"),
                     _fmt(s.get("is_ratio_mean"), "{:.4f}"), _fmt(s.get("is_ratio_min"), "{:.4f}"),
                     _fmt(s.get("is_ratio_max"), "{:.4f}"), _fmt(s.get("is_clip_frac"), "{:.2%}")))  # fmt: skip
    head = ["", "sampler gap (metrics.jsonl): the rollout engine's sampling log-probs against the trainer's at the weights that "
            "sampled; ratio: pi_trainer / pi_sampler before truncation or masking (mean over steps, then seeds; min / max over "
            "every step and seed); correction: rollout.importance_sampling_mode, or off"]  # fmt: skip
    return head + _grid(rows)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)
