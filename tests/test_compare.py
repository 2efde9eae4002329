"""``podsrl compare``: the report math on hand-written run directories (peak, time to the baseline's
99% peak, speedup, never-reached, intervals, alignment; AUC, final accuracy and paired differences
against the baseline with hand-computed t-intervals), the resume logic (finished runs skipped,
interrupted ones resumed, new seeds added, per-method seed counts), config validation naming the
method or the seed setting, the shared interval module, and one tiny end-to-end comparison on the
random 2-layer model from conftest.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path

import pytest

from podsrl import compare
from podsrl import config as config_mod
from podsrl.config import LossConfig, _toml_value, to_toml
from podsrl.errors import ConfigError
from podsrl.intervals import t975

ROOT = Path(__file__).resolve().parents[1]


def _toml(data: dict) -> str:
    """Nested dict -> TOML text (sections, then [compare], [compare.methods])."""
    lines = []
    for section, values in data.items():
        if section == "compare":
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value('none' if v is None else v)}" for k, v in values.items()]
    table = data.get("compare", {})
    lines.append("[compare]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if k != "methods"]
    if "methods" in table:
        lines.append("[compare.methods]")
        for name, over in table["methods"].items():
            lines.append(f"{name} = {{ {', '.join(f'{json.dumps(k)} = {_toml_value(v)}' for k, v in over.items())} }}")
    return "\n".join(lines) + "\n"


METHODS = {
    "grpo": {"select.rule": "all", "rollout.n": 4, "select.m": 4},
    "pods": {"select.rule": "max_variance", "rollout.n": 16, "select.m": 4},
    "never": {"select.rule": "max_reward", "rollout.n": 16, "select.m": 4},
}


def _plan(tmp_path: Path, *, seeds: int = 2, table: dict | None = None, base: dict | None = None, extra: dict | None = None,
          **kw) -> compare.Plan:  # fmt: skip
    data = {
        "train": {"max_steps": None, "max_seconds": 300.0},
        "eval": {"every_seconds": 100.0},
        **(base or {}),
        "compare": {"seeds": seeds, **(extra or {}), "methods": table or METHODS},
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "cmp.toml"
    path.write_text(_toml(data))
    return compare.load_plan(path, **kw)


def _write_run(out: Path, plan: compare.Plan, method: str, seed: int, points, *, done: bool = True) -> Path:
    """A finished run directory: config.toml, eval.jsonl with (train_seconds, accuracy) points."""
    path = compare.run_dir(out, method, seed)
    path.mkdir(parents=True)
    cfg = plan.config(method, seed)
    (path / "config.toml").write_text(to_toml(cfg))
    rows = [
        {"step": 10 * i, "train_seconds": t, "accuracy": a, "ci_low": max(0, a - 0.1), "ci_high": min(1, a + 0.1), "problems": 200}
        for i, (t, a) in enumerate(points)
    ]
    (path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = [{"step": s, "time/step": 3.0 + s % 2, "time/generate": 1.0, "time/update": 2.0 + s % 2} for s in range(1, rows[-1]["step"])]
    steps.append({"step": rows[-1]["step"], "train_seconds": rows[-1]["train_seconds"]})  # a row without timings is skipped
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    if done:
        compare.mark_done(path, cfg)
    return path


# ----------------------------------------------------------------------------------- report math


# Evaluations come at the first step end after each interval (101, 202, 303 s): a budget of 310 s
# holds the last one (the report reads every run at or before the budget).
_LATE_LAST = {"train": {"max_steps": None, "max_seconds": 310.0}}


def test_report_peak_time_to_target_fraction_and_never(tmp_path):
    plan = _plan(tmp_path, base=_LATE_LAST)
    out = tmp_path / "out"
    # GRPO: seed means 0.2, 0.55, 0.70, 0.80 at mean times 0, 101, 202, 303 -> peak 0.80 at 303 s.
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.8), (300, 0.7)])
    _write_run(out, plan, "grpo", 1, [(0, 0.2), (102, 0.6), (204, 0.6), (306, 0.9)])
    # PODS: mean 0.2, 0.80 (>= 0.99 x 0.80 = 0.792) at 101 s -> in a third of the time; peak 0.875 at 303 s.
    _write_run(out, plan, "pods", 0, [(0, 0.2), (100, 0.79), (200, 0.85), (300, 0.8)])
    _write_run(out, plan, "pods", 1, [(0, 0.2), (102, 0.81), (204, 0.85), (306, 0.95)])
    # Never reaches 0.792.
    _write_run(out, plan, "never", 0, [(0, 0.2), (100, 0.3), (200, 0.5), (300, 0.4)])
    _write_run(out, plan, "never", 1, [(0, 0.2), (100, 0.3), (200, 0.5), (300, 0.4)])

    report = compare.build_report(plan, out)
    g, p, nv = (report["methods"][k] for k in ("grpo", "pods", "never"))
    assert report["baseline_peak_accuracy"] == pytest.approx(0.8)
    assert report["target_accuracy"] == pytest.approx(0.792)
    assert g["peak_train_seconds"] == pytest.approx(303)
    assert g["time_to_target_seconds"] == pytest.approx(303) and g["time_fraction"] == pytest.approx(1.0)
    assert p["time_to_target_seconds"] == pytest.approx(101)
    assert p["time_fraction"] == pytest.approx(1 / 3)  # the time to the target as a fraction of the baseline's
    assert p["peak_accuracy"] == pytest.approx(0.875) and p["peak_train_seconds"] == pytest.approx(303)
    assert nv["time_to_target_seconds"] is None and nv["time_fraction"] is None
    assert nv["peak_accuracy"] == pytest.approx(0.5)
    # t-interval over the seeds at GRPO's peak point (0.7, 0.9): 0.8 +- 12.706 * 0.1414 / sqrt(2).
    half = 12.706 * math.sqrt(0.02) / math.sqrt(2)
    assert g["peak_ci95"] == pytest.approx([0.8 - half, 0.8 + half])
    assert g["peak_per_seed"] == [0.8, 0.9] and g["steps"] == [30, 30]
    assert g["curves"]["train_seconds"]["aligned_by"] == "index" and g["runs"][1]["accuracy"] == [0.2, 0.6, 0.6, 0.9]
    # The step axis (evaluations at steps 0, 10, 20, 30 in every seed): the same points.
    assert g["curves"]["step"]["x"] == [0, 10, 20, 30] and g["curves"]["step"]["accuracy"] == pytest.approx([0.2, 0.55, 0.7, 0.8])
    assert g["peak_step"] == 30 and g["steps_to_target"] == 30 and p["steps_to_target"] == 10
    assert p["step_fraction"] == pytest.approx(1 / 3) and g["step_fraction"] == pytest.approx(1.0)
    assert nv["steps_to_target"] is None and nv["step_fraction"] is None
    # Intervals over the seeds' own first evaluations at >= 0.792: GRPO at steps 20 and 30 (200 s, 306 s),
    # PODS at 20 (its 0.79 at step 10 is short) and 10; none when a seed never gets there.
    assert g["steps_to_target_per_seed"] == [20, 30] and g["time_to_target_seconds_per_seed"] == [200, 306]
    half = 12.706 * math.sqrt(50) / math.sqrt(2)
    assert g["steps_to_target_ci95"] == pytest.approx([25 - half, 25 + half])
    assert p["steps_to_target_per_seed"] == [20, 10] and p["time_to_target_seconds_ci95"] is not None
    assert nv["steps_to_target_per_seed"] == [None, None] and nv["steps_to_target_ci95"] is None
    assert report["device_sharing"]["runs_per_device"] == 1 and report["peak_axis"] == "train_seconds"
    assert [r["train_seed"] for r in g["runs"]] == [0, 1]
    # Steps 1..29 of each seed: time/step 4, 3, 4, ... (15 x 4.0, 14 x 3.0) -> median 4.0.
    assert g["median_seconds"] == {"step": 4.0, "generate": 1.0, "update": 3.0}
    assert g["runs"][0]["median_seconds"] == {"step": 4.0, "generate": 1.0, "update": 3.0}

    json_path, png_path = compare.write_report(report, out)
    assert json.loads(json_path.read_text())["methods"]["pods"]["time_fraction"] == pytest.approx(1 / 3)
    assert png_path.stat().st_size > 0
    table = compare.format_table(report)
    assert "0.33x" in table and "never" in table and "79.2%" in table and "4.0 (1.0, 3.0)" in table
    assert "time, fraction of grpo's" in table and "speedup" not in table
    # Accuracy at equal training minutes (every 100 s, and at the 310 s budget the last evaluation at or before
    # it): grpo's and pods's seed means are at 0, 101, 202, 303 s, read linearly at 100, 200, 300 s (grpo: 0.2 +
    # 0.35 x 100/101 = 54.7% ...), at the budget the mean of the seeds' last (grpo: 0.7 and 0.9).
    curve = table.split("held-out accuracy % at equal training minutes")[1].splitlines()
    assert curve[1].split() == ["method", "seeds", "0.0", "min", "1.7", "min", "3.3", "min", "5.0", "min", "5.2", "min", "(at", "the", "budget)"]
    assert curve[3].split() == ["grpo", "2", "20.0", "54.7", "69.7", "79.7", "80.0"]
    assert curve[4].split() == ["pods", "2", "20.0", "79.4", "84.9", "87.4", "87.5"]
    assert curve[5].split() == ["never", "2", "20.0", "30.0", "50.0", "40.0", "40.0"]  # its evaluations at 0, 100, 200, 300 s


def test_more_targets_time_every_method_to_another_methods_peak_or_final_accuracy(tmp_path):
    targets = [{"method": "pods"}, {"method": "never", "of": "final"}, {"method": "never", "of": "final", "fraction": 0.5}]
    plan = _plan(tmp_path, base=_LATE_LAST, extra={"targets": targets})
    assert [t.label for t in plan.targets] == ["99% of pods's peak", "never's final accuracy", "50% of never's final accuracy"]
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.8), (300, 0.7)])  # mean 0.2, 0.55, 0.7, 0.8
    _write_run(out, plan, "grpo", 1, [(0, 0.2), (102, 0.6), (204, 0.6), (306, 0.9)])
    _write_run(out, plan, "pods", 0, [(0, 0.2), (100, 0.79), (200, 0.85), (300, 0.8)])  # mean 0.2, 0.8, 0.85, 0.875
    _write_run(out, plan, "pods", 1, [(0, 0.2), (102, 0.81), (204, 0.85), (306, 0.95)])
    _write_run(out, plan, "never", 0, [(0, 0.2), (100, 0.3), (200, 0.5), (300, 0.4)])  # mean 0.2, 0.3, 0.5, 0.4
    _write_run(out, plan, "never", 1, [(0, 0.2), (100, 0.3), (200, 0.5), (300, 0.4)])
    report = compare.build_report(plan, out)
    peak, final, half = report["targets"]
    # 99% of PODS's peak 0.875: only PODS gets there (303 s), its own time is the reference.
    assert peak["target_accuracy"] == pytest.approx(0.99 * 0.875) and peak["level"] == pytest.approx(0.875)
    assert peak["methods"]["pods"]["time_to_target_seconds"] == pytest.approx(303)
    assert peak["methods"]["pods"]["time_fraction"] == pytest.approx(1.0) and peak["methods"]["pods"]["steps_to_target"] == 30
    assert peak["methods"]["grpo"]["time_to_target_seconds"] is None and peak["methods"]["grpo"]["time_fraction"] is None
    # never's accuracy at the budget, 0.4: never itself reaches it at 200 s, GRPO and PODS at 101 s (half its time).
    assert final["target_accuracy"] == pytest.approx(0.4) and final["methods"]["never"]["time_to_target_seconds"] == 200
    assert final["methods"]["grpo"]["time_fraction"] == pytest.approx(101 / 200)
    assert final["methods"]["grpo"]["step_fraction"] == pytest.approx(10 / 20)
    assert final["methods"]["pods"]["time_to_target_seconds_per_seed"] == [100, 102]
    # Half of it (0.2) is met before training by everyone: time 0, no fraction.
    assert half["methods"]["grpo"]["time_to_target_seconds"] == 0 and half["methods"]["grpo"]["time_fraction"] is None
    table = compare.format_table(report)
    assert "min to 99% of pods's peak (86.6%)" in table and "min to never's final accuracy (40.0%)" in table
    assert "1.7 (0.51x its time)" in table  # GRPO to never's final: 101 s, 0.505 of never's 200 s
    assert report["definitions"]["targets"]
    # The baseline's target and table are unchanged by the extra ones.
    assert report["target_accuracy"] == pytest.approx(0.792)


@pytest.mark.parametrize("targets, message", [
    ("grpo", "compare.targets: must be a list of tables"),
    ([{"of": "peak"}], r"compare.targets\[0\]: must be a table with a method"),
    ([{"method": "gpro"}], r"compare.targets\[0\].method: 'gpro' is not a method; methods: grpo, pods, never"),
    ([{"method": "grpo", "at": "final"}], r"compare.targets\[0\].at: unknown; a target has fraction, method, of"),
    ([{"method": "grpo", "of": "last"}], r"compare.targets\[0\].of: 'last'; valid: 'peak'"),
    ([{"method": "grpo", "fraction": 1.5}], r"compare.targets\[0\].fraction: must be in \(0, 1\], got 1.5"),
])
def test_bad_targets_are_config_errors_naming_the_entry(tmp_path, targets, message):
    with pytest.raises(ConfigError, match=message):
        compare.load_plan(_write_plan_file(tmp_path, targets=targets))


def test_a_screening_refuses_targets(tmp_path):
    with pytest.raises(ConfigError, match="compare.targets: a screening"):
        compare.load_plan(_write_plan_file(tmp_path, screening=True, targets=[{"method": "grpo"}]))


def test_accuracy_by_evaluation_needs_the_same_points_in_every_method(tmp_path):
    """A method with fewer evaluations than another: no per-evaluation table (the figure shows the
    curves); the same with evaluations every k steps prints the steps."""
    plan = _plan(tmp_path, seeds=1)
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.6)])
    _write_run(out, plan, "pods", 0, [(0, 0.2), (100, 0.5)])
    table = compare.format_table(compare.build_report(plan, out))
    assert "at each evaluation" not in table
    # Time-based: both are read at equal minutes, "-" past the shorter one's last evaluation; at the budget
    # (5 min) each its last evaluation at or before it.
    curve = table.split("held-out accuracy % at equal training minutes")[1].splitlines()
    assert curve[4].split() == ["pods", "1", "20.0", "50.0", "-", "50.0"]
    plan = _plan(tmp_path / "steps", seeds=1, base={"train": {"max_steps": 20}, "eval": {"every_steps": 10}})
    out = tmp_path / "steps" / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.6)])
    table = compare.format_table(compare.build_report(plan, out))
    assert "held-out accuracy % at each evaluation step" in table
    assert "step 0  step 10  step 20" in table


def test_one_seed_has_no_interval_over_seeds_and_says_so(tmp_path):
    plan = _plan(tmp_path, seeds=1)
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.6)])
    report = compare.build_report(plan, out)
    g = report["methods"]["grpo"]
    assert g["peak_ci95"] is None and "1 seed" in g["peak_ci_note"]
    assert g["curves"]["train_seconds"]["band_low"] == pytest.approx([0.1, 0.4, 0.5])  # the run's own Wilson interval
    assert g["steps_to_target_ci95"] is None and g["steps_to_target_per_seed"] == [20]
    assert "1 seed, no CI" in compare.format_table(report)
    assert report["methods"]["pods"]["peak_accuracy"] is None  # not run: reported as missing
    assert report["methods"]["pods"]["seeds_missing"] == [0]
    assert report["methods"]["pods"]["paired_vs_baseline"]["auc"]["mean"] is None and report["paired_excluding_zero"] == []
    assert compare.write_report(report, out)[1].stat().st_size > 0  # nothing to pair: the lower panels say so


def test_unequal_evaluation_counts_are_interpolated_on_the_common_range():
    a = [{"step": 0, "train_seconds": 0, "accuracy": 0.0}, {"step": 10, "train_seconds": 100, "accuracy": 1.0},
         {"step": 20, "train_seconds": 200, "accuracy": 1.0}]  # fmt: skip
    b = [{"step": 0, "train_seconds": 0, "accuracy": 0.0}, {"step": 5, "train_seconds": 50, "accuracy": 0.5},
         {"step": 15, "train_seconds": 150, "accuracy": 0.5}, {"step": 18, "train_seconds": 180, "accuracy": 0.7}]  # fmt: skip
    c = compare.mean_curve([a, b], time_based_eval=True)
    assert c.aligned_by == "interpolation" and c.axis == "train_seconds"
    assert c.x == [0, 50, 100, 150, 180]  # union, clipped to [0, min(200, 180)]
    assert c.per_seed[0] == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0])
    assert c.per_seed[1] == pytest.approx([0.0, 0.5, 0.5, 0.5, 0.7])
    assert c.accuracy == pytest.approx([0.0, 0.5, 0.75, 0.75, 0.85])
    assert compare.first_reach(c, 0.75) == 100 and compare.first_reach(c, 0.8) == 180
    # The same on the step axis (here steps are seconds / 10).
    s = compare.mean_curve([a, b], time_based_eval=True, axis="step")
    assert s.x == [0, 5, 10, 15, 18] and s.accuracy == pytest.approx(c.accuracy) and compare.first_reach(s, 0.8) == 18
    # Step-based evaluation: aligned by index when the seeds evaluated at the same steps (times are
    # then averaged), else interpolated even with equal counts.
    a2 = [{**row, "train_seconds": row["train_seconds"] + 10} for row in a]
    same = compare.mean_curve([a, a2], time_based_eval=False)
    assert same.aligned_by == "index" and same.x == [5, 105, 205]
    shifted = [{**row, "step": row["step"] + 1} for row in a]
    assert compare.mean_curve([a, shifted], time_based_eval=False).aligned_by == "interpolation"


def test_every_arm_is_read_at_or_before_the_budget(tmp_path):
    """A run whose last step ended past the 300 s budget (its last evaluation at 330 s, 0.9) is read at
    or before the budget like the others: its final accuracy is its evaluation at 200 s, its peak
    and AUC leave 330 s out, and the AUC per training minute covers [0, 300 s], each run's last
    evaluation held to 300 s. Before, the 0.9 was its final accuracy and peak."""
    table = {k: METHODS[k] for k in ("grpo", "pods")}
    plan = _plan(tmp_path, seeds=1, table=table)
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.4), (200, 0.6), (300, 0.7)])  # at the budget: read
    _write_run(out, plan, "pods", 0, [(0, 0.2), (100, 0.4), (200, 0.6), (330, 0.9)])
    report = compare.build_report(plan, out)
    g, p = report["methods"]["grpo"], report["methods"]["pods"]
    assert (g["final_accuracy"], p["final_accuracy"]) == (0.7, 0.6) and p["peak_accuracy"] == 0.6
    assert p["auc"] == pytest.approx(0.5) and p["runs"][0]["step"] == [0, 10, 20]
    assert p["runs"][0]["evaluations_past_budget"] == [330] and g["runs"][0]["evaluations_past_budget"] == []
    assert report["time_auc_horizon_seconds"] == 300
    assert p["time_auc"] == pytest.approx((30 + 50 + 60) / 300) and g["time_auc"] == pytest.approx((30 + 50 + 65) / 300)
    assert p["paired_vs_baseline"]["final_accuracy"]["mean"] == pytest.approx(-0.1)
    assert any(n.startswith("pods: 1 evaluation after the budget (5 min of training) left out") for n in report["notes"])
    text = compare.format_table(report)
    assert "every number reads each run's evaluations at or before the budget (5.0 min of training)" in text
    assert "final = the last evaluation at or before the budget" in text and "[0, the budget]" in text
    assert "5.0 min (at the budget)" in text
    # compare.read_past_budget = true: the reading before issue 68 (every evaluation; the horizon the shortest run's)
    old = _plan(tmp_path / "old", seeds=1, table=table, extra={"read_past_budget": True})
    report = compare.build_report(old, out)
    assert report["methods"]["pods"]["final_accuracy"] == 0.9 and report["time_auc_horizon_seconds"] == 300
    assert report["methods"]["pods"]["runs"][0]["evaluations_past_budget"] == [] and "(compare.read_past_budget)" in compare.format_table(report)


@pytest.mark.parametrize("name", ["compare-vs-trl", "compare-long"])
def test_the_committed_comparisons_report_their_committed_numbers(name):
    """configs/<name>.toml over results/<name>'s runs gives the committed compare.json's numbers: a
    default that changes what a committed config means is pinned there (loss.aggregation for the TRL
    arms, compare.read_past_budget for runs that stopped past their budget)."""
    from podsrl.compare.table import fraction_of

    committed = json.loads((ROOT / "results" / name / "compare.json").read_text())
    report = compare.build_report(compare.load_plan(ROOT / "configs" / f"{name}.toml"), ROOT / "results" / name)
    keys = ("peak_accuracy", "final_accuracy", "auc", "time_auc", "steps_to_target", "time_to_target_seconds")
    for method, old in committed["methods"].items():
        new = report["methods"][method]
        assert {k: new[k] for k in keys} == pytest.approx({k: old[k] for k in keys}), method
        assert fraction_of(new, "time") == pytest.approx(fraction_of(old, "time")), method
        for key, d in (old["paired_vs_baseline"] or {}).items():
            assert new["paired_vs_baseline"][key]["mean"] == pytest.approx(d["mean"]), (method, key)
    for old, new in zip(committed["targets"], report["targets"], strict=True):
        for method, d in old["methods"].items():
            assert new["methods"][method]["time_to_target_seconds"] == pytest.approx(d["time_to_target_seconds"]), (old["label"], method)



def test_every_shipped_comparison_with_committed_runs_plans_the_loss_they_trained():
    """Since issue 67 loss.aggregation defaults to "token"; the runs committed before trained with
    "sequence", and each configs/<name>.toml with runs in results/<name> pins it, so that its plan
    still means what its runs did (the report refuses a run whose config differs from the plan)."""
    assert LossConfig().aggregation == "token"
    runs = sorted(ROOT.glob("results/*/runs/*/seed*/config.toml"))
    assert runs
    plans = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # distributed.mixed_precision in the older runs' files
        for path in runs:
            name, method, seed = path.parts[-5], path.parts[-3], int(path.parts[-2].removeprefix("seed"))
            if name not in plans:
                plans[name] = compare.load_plan(ROOT / "configs" / f"{name}.toml")
            plan = plans[name]
            trained = config_mod.load(path).loss.aggregation
            assert plan.config(method, seed).loss.aggregation == trained, (name, method, seed)

def test_the_table_reads_a_report_made_before_the_fraction_convention():
    """compare.json before issue 68 held speedup (the baseline's time over the method's) and, in its
    targets, time_ratio: the table prints them as fractions of the baseline's time, as it prints a new one."""
    report = json.loads((ROOT / "results" / "compare-vs-trl" / "compare.json").read_text())
    assert "speedup" in report["methods"]["pods_n16_m4"] and "time_fraction" not in report["methods"]["pods_n16_m4"]
    text = compare.format_table(report)
    row = next(line for line in text.splitlines() if line.startswith("pods_n16_m4 "))
    assert "0.61x" in row and "1.63x" not in row  # 6.2 min to GRPO(16)'s 10.1: 1 / 1.63
    assert "time, fraction of grpo_n16's" in text and "(0.63x its time)" in text  # PODSTrainer to GRPOTrainer(8)'s 10-min accuracy


def test_a_note_when_the_methods_train_with_different_losses(tmp_path):
    """A TRL arm takes TRL's default loss (token) where the comparison sets none, a podsrl arm podsrl's
    (token as well since issue 67: no note) or its own (here "sequence": the note)."""
    trl = {"trainer": "trl", "select.rule": "all", "rollout.n": 4, "select.m": 4}
    same = _plan(tmp_path / "same", seeds=1, table={"grpo": METHODS["grpo"], "trl_grpo": trl})
    for name in ("grpo", "trl_grpo"):
        _write_run(tmp_path / "same" / "out", same, name, 0, [(0, 0.2), (100, 0.4), (300, 0.6)])
    assert not any("different losses" in n for n in compare.build_report(same, tmp_path / "same" / "out")["notes"])
    plan = _plan(tmp_path, seeds=1, table={"grpo": {**METHODS["grpo"], "loss.aggregation": "sequence"}, "trl_grpo": trl})
    out = tmp_path / "out"
    for name in ("grpo", "trl_grpo"):
        _write_run(out, plan, name, 0, [(0, 0.2), (100, 0.4), (300, 0.6)])
    report = compare.build_report(plan, out)
    assert (report["methods"]["grpo"]["aggregation"], report["methods"]["trl_grpo"]["aggregation"]) == ("sequence", "token")
    assert any(n.startswith("the methods train with different losses (loss.aggregation: grpo 'sequence', trl_grpo 'token'")
               for n in report["notes"])  # fmt: skip
    pinned = _plan(tmp_path / "pinned", seeds=1, base={"loss": {"aggregation": "token"}}, table={"grpo": METHODS["grpo"], "trl_grpo": trl})
    for name in ("grpo", "trl_grpo"):
        _write_run(tmp_path / "pinned" / "out", pinned, name, 0, [(0, 0.2), (100, 0.4), (300, 0.6)])
    assert not any("different losses" in n for n in compare.build_report(pinned, tmp_path / "pinned" / "out")["notes"])


def test_target_met_before_training_gives_no_time_fraction(tmp_path):
    plan = _plan(tmp_path, seeds=1)
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.6), (100, 0.5), (200, 0.55)])
    _write_run(out, plan, "pods", 0, [(0, 0.6), (100, 0.7), (200, 0.7)])
    report = compare.build_report(plan, out)
    assert report["methods"]["pods"]["time_to_target_seconds"] == 0
    assert report["methods"]["pods"]["time_fraction"] is None
    assert any("time 0" in n for n in report["notes"])


def test_t_interval_and_quantiles():
    assert compare.t_interval([0.5]) is None
    lo, hi = compare.t_interval([1.0, 2.0, 3.0])
    assert (lo + hi) / 2 == pytest.approx(2.0) and hi - 2.0 == pytest.approx(4.303 / math.sqrt(3))
    assert t975(30) == pytest.approx(2.042)
    assert t975(60) == pytest.approx(2.000, abs=1e-3) and t975(120) == pytest.approx(1.980, abs=1e-3)


# ----------------------------------------------------------------------------------- resuming


def test_run_status_new_done_resume_restart(tmp_path):
    plan = _plan(tmp_path)
    out = tmp_path / "out"
    cfg = plan.config("grpo", 0)
    assert compare.run_status(compare.run_dir(out, "grpo", 0), cfg) == "new"
    assert compare.run_status(_write_run(out, plan, "grpo", 0, [(0, 0.1), (310, 0.2)]), cfg) == "done"
    # No marker, but an evaluation at the budget: finished (e.g. a run made by `podsrl train`).
    path = _write_run(out, plan, "grpo", 1, [(0, 0.1), (301, 0.2)], done=False)
    assert compare.run_status(path, plan.config("grpo", 1)) == "done"
    # Interrupted: an eval short of the budget; with a checkpoint -> resume, without -> restart.
    path = _write_run(out, plan, "pods", 0, [(0, 0.1), (100, 0.2)], done=False)
    assert compare.run_status(path, plan.config("pods", 0)) == "restart"
    step = path / "checkpoints" / "step-000010"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"")
    (step / "weights.safetensors").write_bytes(b"")
    (path / "checkpoints" / "latest").write_text("step-000010")
    assert compare.run_status(path, plan.config("pods", 0)) == "resume"
    # A raised budget (extending the comparison): no longer finished (no checkpoint here: restart).
    longer = _plan(tmp_path / "x", base={"train": {"max_steps": None, "max_seconds": 600.0}})
    assert compare.run_status(compare.run_dir(out, "grpo", 0), longer.config("grpo", 0)) == "restart"
    # Any other difference is an error, not a silent reuse.
    other = _plan(tmp_path / "y", base={"train": {"max_steps": None, "max_seconds": 300.0}, "optim": {"lr": 3e-5}})
    with pytest.raises(ConfigError, match=r"different config \(optim.lr"):
        compare.run_status(compare.run_dir(out, "grpo", 0), other.config("grpo", 0))


def test_run_all_skips_finished_runs_and_adds_only_new_seeds(tmp_path, monkeypatch):
    import podsrl.train.loop

    plan = _plan(tmp_path, seeds=2, table={k: METHODS[k] for k in ("grpo", "pods")})
    out = tmp_path / "out"
    for method in ("grpo", "pods"):
        _write_run(out, plan, method, 0, [(0, 0.1), (310, 0.5)])
    calls = []

    def fake_train(cfg, *, run_dir, resume, log=print):
        calls.append((run_dir.parent.name, run_dir.name, cfg.train.seed, resume))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(to_toml(cfg))
        rows = [{"step": 0, "train_seconds": 0.0, "accuracy": 0.1, "ci_low": 0, "ci_high": 0.2, "problems": 200},
                {"step": 9, "train_seconds": 305.0, "accuracy": 0.6, "ci_low": 0.5, "ci_high": 0.7, "problems": 200}]  # fmt: skip
        (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return run_dir

    monkeypatch.setattr(podsrl.train.loop, "train", fake_train)
    compare.run_all(plan, out, log=lambda *_: None, isolate=False)
    assert calls == [("grpo", "seed1", 1, False), ("pods", "seed1", 1, False)]
    assert (out / "compare.json").is_file()  # refreshed after each run
    calls.clear()
    compare.run_all(plan, out, log=lambda *_: None, isolate=False)  # everything finished: nothing trains
    assert calls == []
    # --seeds 3 --methods pods: only the new seed of the chosen method trains.
    compare.run_all(compare.load_plan(tmp_path / "cmp.toml", seeds=3, methods="pods"), out, log=lambda *_: None, isolate=False)
    assert calls == [("pods", "seed2", 2, False)]


# ----------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "override, message",
    [
        ({"select.rul": "random"}, r"compare.methods.bad: unknown setting select.rul"),
        ({"select.rule": "maxvar"}, r"compare.methods.bad: select.rule: unknown value 'maxvar'"),
        ({"select.m": 32}, r"compare.methods.bad: select.m = 32 exceeds rollout.n"),
        ({"rollout.n": "sixteen"}, r"compare.methods.bad: rollout.n: expected a whole number"),
        ({"selekt.m": 2}, r"compare.methods.bad: unknown config section \[selekt\]"),
        ({"task.name": "gsm8k"}, r"compare.methods.bad: 'task.name' must be the same for every method"),
        ({"train.seed": 3}, r"compare.methods.bad: 'train.seed' must be the same"),
    ],
)
def test_a_bad_method_fails_before_training_naming_method_and_field(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        _plan(tmp_path, table={**METHODS, "bad": {"rollout.n": 16, **override}}, methods="grpo")


@pytest.mark.parametrize(
    "refused, message",
    [
        ({"select.rule": "d3s_intra", "rollout.early_stop": "exact"}, r"compare.methods.refused: rollout.early_stop = 'exact': rule 'd3s_intra' has no exact"),
        ({"select.rule": "max_variance", "model.dtype": "bfloat16"}, r"compare.methods.refused: model.dtype = 'bfloat16' with full fine-tuning"),
    ],
)
def test_a_method_the_trainer_would_refuse_stops_the_comparison_before_any_run_trains(tmp_path, monkeypatch, refused, message):
    """Set-up decisions beyond the config's own checks (early stopping against the reward's declared
    values, the training dtype) are made for every method before the first run, not when its turn comes."""
    import podsrl.train.loop

    plan = _plan(tmp_path, seeds=1, table={**{k: METHODS[k] for k in ("grpo", "pods")}, "refused": {"rollout.n": 16, "select.m": 4, **refused}})
    calls = []
    monkeypatch.setattr(podsrl.train.loop, "train", lambda cfg, **kw: calls.append(cfg))
    with pytest.raises(ConfigError, match=message):
        compare.run_all(plan, tmp_path / "out", log=lambda *_: None, isolate=False)
    assert calls == [] and not (tmp_path / "out").exists()


def test_plan_validation_errors(tmp_path):
    # A step budget is a budget too (with step-based evaluation, the runs' points are the same steps).
    plan = _plan(tmp_path, base={"train": {"max_steps": 10, "max_seconds": None}, "eval": {"every_steps": 2}})
    assert plan.config("grpo", 1).train.max_steps == 10 and plan.config("grpo", 1).train.max_seconds is None
    with pytest.raises(ConfigError, match="eval.every_seconds: a comparison needs"):
        _plan(tmp_path, base={"eval": {"every_seconds": 0.0}})
    with pytest.raises(ConfigError, match="--methods: unknown method 'podz'; methods: grpo, pods, never"):
        compare.load_plan(_write_plan_file(tmp_path), methods="grpo,podz")
    with pytest.raises(ConfigError, match="compare.baseline: 'gpro' is not a method"):
        compare.load_plan(_write_plan_file(tmp_path, baseline="gpro"))
    with pytest.raises(ConfigError, match="unknown setting compare.seed;"):
        compare.load_plan(_write_plan_file(tmp_path, seed=2))
    with pytest.raises(ConfigError, match="--seeds: must be a whole number >= 1"):
        compare.load_plan(_write_plan_file(tmp_path), seeds=0)
    with pytest.raises(ConfigError, match="compare.seeds: must be a whole number >= 1"):
        compare.load_plan(_write_plan_file(tmp_path, seeds=0))
    with pytest.raises(ConfigError, match="the base config: optim.lr: must be > 0"):
        compare.load_plan(_write_plan_file(tmp_path), ["--optim.lr=0"])


def _write_plan_file(tmp_path: Path, **compare_table) -> Path:
    data = {"train": {"max_steps": None, "max_seconds": 300.0}, "eval": {"every_seconds": 100.0},
            "compare": {"methods": METHODS, **compare_table}}  # fmt: skip
    path = tmp_path / "plan.toml"
    path.write_text(_toml(data))
    return path


def test_seeds_vary_training_but_not_the_held_out_set(tmp_path):
    plan = _plan(tmp_path, base={"train": {"max_steps": None, "max_seconds": 300.0, "seed": 5}})
    a, b = plan.config("pods", 0), plan.config("pods", 1)
    assert (a.train.seed, b.train.seed) == (5, 6)
    assert a.task.options["seed"] == b.task.options["seed"] == 5
    assert a.select.rule == "max_variance" and a.rollout.n == 16 and a.select.m == 4
    # Command-line overrides change the base; methods still override it.
    plan = compare.load_plan(_write_plan_file(tmp_path), ["--rollout.n=8", "--optim.lr=3e-5"])
    assert plan.config("grpo", 0).rollout.n == 4 and plan.config("grpo", 0).optim.lr == 3e-5


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.toml")))
def test_every_shipped_comparison_loads(name, monkeypatch):
    """Every file in configs/ is a comparison whose every method's config builds (a typo in a preset
    that no other test names, such as compare-gpu.toml or compare-long.toml, fails here). From the
    repository root, where their relative data paths (../shared/data) resolve as their commands run them."""
    monkeypatch.chdir(ROOT)
    plan = compare.load_plan(ROOT / "configs" / name)
    assert plan.methods and all(plan.config(m.name, 0) for m in plan.methods)


def test_the_mixed_precision_comparison_changes_the_arithmetic_alone(monkeypatch):
    """configs/compare-mixed.toml (issue 66, item 5): each bf16 arm is its float32 arm with
    model.mixed_precision = "bf16" and nothing else, and the float32 arms are compare-vs-trl.toml's
    GRPO(8) and PODS(16, 4) but for the budget and the evaluation's schedule (equal steps: 60, every 15)."""
    monkeypatch.chdir(ROOT)
    plan = compare.load_plan(ROOT / "configs" / "compare-mixed.toml")
    vs_trl = compare.load_plan(ROOT / "configs" / "compare-vs-trl.toml")
    assert (plan.baseline, plan.seeds) == ("grpo_n8", 3) and list(plan.all_methods) == ["grpo_n8", "grpo_n8_bf16", "pods_n16_m4", "pods_n16_m4_bf16"]
    for name in ("grpo_n8", "pods_n16_m4"):
        for seed in range(plan.seeds):
            plain, mixed, theirs = plan.config(name, seed), plan.config(f"{name}_bf16", seed), vs_trl.config(name, seed)
            assert (plain.model.mixed_precision, mixed.model.mixed_precision) == ("none", "bf16")
            assert dataclasses.replace(mixed, model=plain.model) == plain
            assert dataclasses.replace(plain, train=theirs.train, eval=theirs.eval) == theirs
            assert (plain.train.max_steps, plain.train.max_seconds, plain.eval.every_steps, plain.eval.every_seconds) == (60, None, 15, 0.0)
            assert plain.eval.max_problems == theirs.eval.max_problems and plain.train.seed == theirs.train.seed


def test_the_default_jobs_mixed_precision_comparison_changes_the_arithmetic_alone(monkeypatch):
    """configs/compare-demo-mixed.toml (issue 66: what "auto" should choose on a CPU with native
    bfloat16): each arm is the default job (`podsrl train` with no arguments) but for the update's
    arithmetic, the evaluation's schedule and the export, 3 seeds at the default's 4 training minutes."""
    from podsrl.config import Config

    monkeypatch.chdir(ROOT)
    plan = compare.load_plan(ROOT / "configs" / "compare-demo-mixed.toml")
    assert (plan.baseline, plan.seeds) == ("demo_f32", 3) and list(plan.all_methods) == ["demo_f32", "demo_bf16"]
    default = Config()
    for seed in range(plan.seeds):
        plain, mixed = plan.config("demo_f32", seed), plan.config("demo_bf16", seed)
        assert (plain.model.mixed_precision, mixed.model.mixed_precision) == ("none", "bf16")
        assert dataclasses.replace(mixed, model=plain.model) == plain
        assert dataclasses.replace(plain.model, mixed_precision=default.model.mixed_precision) == default.model
        assert (plain.train.max_seconds, plain.train.max_steps, plain.eval.every_seconds) == (default.train.max_seconds, None, 60.0)
        assert plain.train.seed == seed
        for section in ("reward", "rollout", "prompts", "select", "loss", "optim", "distributed"):
            assert getattr(plain, section) == getattr(default, section), section
        assert {k: v for k, v in plain.task.options.items() if k != "seed"} == default.task.options
        assert (plain.task.name, plain.task.system_prompt, plain.task.instruction) == (default.task.name, default.task.system_prompt, default.task.instruction)
        assert dataclasses.replace(plain.eval, every_seconds=0.0) == default.eval


def test_default_comparison_matches_configs_compare_toml():
    from_file = compare.load_plan(ROOT / "configs" / "compare.toml")
    default = compare.load_plan()
    assert list(from_file.all_methods) == list(default.all_methods) == list(compare.DEFAULT_METHODS)
    for name in default.all_methods:
        for seed in range(default.seeds):
            assert from_file.config(name, seed) == default.config(name, seed), name
    assert (from_file.seeds, from_file.baseline, from_file.target_fraction) == (default.seeds, "grpo", 0.99)
    d3s = default.config("d3s_intra", 0).select
    assert (d3s.m, d3s.m_final, d3s.m_schedule, d3s.token_fraction, d3s.token_schedule) == (4, 8, "linear", 0.5, "linear")


# ----------------------------------------------------------------------------------- end to end


def _tiny_two_method_config(tmp_path, tiny_model_dir, reward_file):
    """A [compare] TOML on the tiny model: GRPO (n = m = 2) and PODS max-variance (n = 4, m = 2), one
    seed, 2 steps, evaluated after each."""
    from conftest import tiny_config_dict

    base = tiny_config_dict(tiny_model_dir, reward_file)
    base["train"].update(max_steps=2, max_seconds=None, checkpoint_every=0)
    base["eval"].update(every_steps=1)
    data = {**base, "compare": {"seeds": 1, "methods": {
        "grpo": {"select.rule": "all", "rollout.n": 2, "select.m": 2},
        "pods_max_variance": {"select.rule": "max_variance", "rollout.n": 4, "select.m": 2},
    }}}  # fmt: skip
    path = tmp_path / "tiny.toml"
    path.write_text(_toml(data))
    return path


@pytest.mark.usefixtures("one_thread")
def test_tiny_comparison_end_to_end_and_rerun_skips(tmp_path, tiny_model_dir, reward_file, capsys, monkeypatch):
    """Two real runs trained at once (``--parallel 2``: they share the machine's one device, so the
    peak is read on the step axis), the report and its figure; the same command again skips both,
    and ``--report-only`` rebuilds the report. One comparison serves both (it was two tests, one
    sequential and one parallel, each training both runs: issue 45); the sequential launcher runs
    real runs in test_a_failing_run_stops_the_comparison_with_its_exit_code and the docs' compare
    commands (tests/test_docs.py), fake ones in the concurrency tests below."""
    import podsrl.compare.report

    plotted = []
    plot = podsrl.compare.report.plot_report
    monkeypatch.setattr(podsrl.compare.report, "plot_report", lambda *a: plotted.append(a[1]) or plot(*a))
    path = _tiny_two_method_config(tmp_path, tiny_model_dir, reward_file)
    out = tmp_path / "cmp"
    args = argparse.Namespace(config=str(path), out=str(out), seeds=None, methods=None, report_only=False, parallel=2, devices=None)
    assert compare.main(args, []) == 0
    assert len(plotted) == 2  # once as each run finished; the last is the final report, not drawn again
    report = json.loads((out / "compare.json").read_text())
    assert report["device_sharing"]["runs_per_device"] == 2 and report["peak_axis"] == "step"
    for name in ("grpo", "pods_max_variance"):
        entry = report["methods"][name]
        assert entry["steps"] == [2] and entry["runs"][0]["step"] == [0, 1, 2] and len(entry["runs"][0]["accuracy"]) == 3  # at start, step 1, end
        assert entry["curves"]["step"]["x"] == [0, 1, 2]
        # A target exists only where the baseline scored (the tiny random model may not: a peak of 0%).
        assert (entry["steps_to_target"] is not None) == (report["baseline_peak_accuracy"] > 0)
        assert (out / "runs" / name / "seed0" / compare.DONE_FILE).is_file()
        assert (out / "runs" / name / "seed0" / "train.log").stat().st_size > 0
    assert (out / "compare.png").stat().st_size > 0
    capsys.readouterr()
    assert compare.main(args, []) == 0  # everything finished: skipped, report rebuilt
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2
    args.report_only = True
    assert compare.main(args, []) == 0
    assert len(plotted) == 4  # nothing trained: each command drew the report it printed


def test_a_failing_run_stops_the_comparison_with_its_exit_code(tmp_path, tiny_model_dir, reward_file, capsys):
    from conftest import tiny_config_dict

    base = tiny_config_dict(tiny_model_dir, reward_file)
    base["reward"]["names"] = [f"{reward_file}:raising_reward"]
    base["train"].update(max_steps=2, max_seconds=600.0, checkpoint_every=0)
    base["eval"].update(every_steps=1)
    data = {**base, "compare": {"seeds": 1, "methods": {"grpo": {"select.rule": "all", "rollout.n": 2, "select.m": 2}}}}
    path = tmp_path / "tiny.toml"
    path.write_text(_toml(data))
    out = tmp_path / "cmp"
    args = argparse.Namespace(config=str(path), out=str(out), seeds=None, methods=None, report_only=False)
    rc = compare.main(args, [])
    err = capsys.readouterr().err
    assert rc != 0
    assert "the run grpo seed 0" in err and f"exit code {rc}" in err and "run the same command again" in err
    assert not (out / "runs" / "grpo" / "seed0" / compare.DONE_FILE).exists()


# ----------------------------------------------------------------------------------- both axes, step budgets


def test_step_budget_and_step_based_evaluation_read_the_peak_on_steps(tmp_path):
    base = {"train": {"max_steps": 30, "max_seconds": None}, "eval": {"every_steps": 10}}
    plan = _plan(tmp_path, base=base)
    out = tmp_path / "out"
    # Evaluations at steps 0, 10, 20, 30 in every seed (_write_run), at different training times:
    # GRPO's seed 1 is slower per step, PODS's steps are slower still (more samples per prompt).
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.8), (300, 0.7)])
    _write_run(out, plan, "grpo", 1, [(0, 0.2), (120, 0.6), (240, 0.6), (360, 0.9)])
    _write_run(out, plan, "pods", 0, [(0, 0.2), (200, 0.79), (400, 0.85), (600, 0.8)])
    _write_run(out, plan, "pods", 1, [(0, 0.2), (200, 0.81), (400, 0.85), (600, 0.95)])
    report = compare.build_report(plan, out)
    g, p = report["methods"]["grpo"], report["methods"]["pods"]
    assert report["peak_axis"] == "step" and report["budget_steps"] == 30 and report["budget_seconds"] is None
    assert report["target_accuracy"] == pytest.approx(0.792)
    for entry in (g, p):  # the same steps in every seed: both axes aligned by index
        assert entry["curves"]["step"]["aligned_by"] == entry["curves"]["train_seconds"]["aligned_by"] == "index"
    assert g["curves"]["train_seconds"]["x"] == [0, 110, 220, 330] and g["peak_step"] == 30 and g["peak_train_seconds"] == 330
    # PODS reaches the target in a third of GRPO's steps, but its steps take longer: 0.61 of its time.
    assert (g["steps_to_target"], p["steps_to_target"]) == (30, 10) and p["step_fraction"] == pytest.approx(1 / 3)
    assert (g["time_to_target_seconds"], p["time_to_target_seconds"]) == (330, 200) and p["time_fraction"] == pytest.approx(200 / 330)
    table = compare.format_table(report)
    assert "budget 30 steps per run" in table and "0.33x" in table and "0.61x" in table
    assert "10 [-, " not in table and "30 [" in table  # GRPO's seeds reach it at steps 20 and 30: an interval
    _, png = compare.write_report(report, out)
    assert png.stat().st_size > 0


def test_reasoning_gym_presets_load_and_set_up():
    """configs/screen-reasoning-gym.toml (a screening: one dataset per method, PODS's defaults, 5
    training minutes) and configs/compare-reasoning-gym.toml (the methods on the chosen dataset; and
    the -letters file, on the dataset it replaced)
    resolve and pass the set-up checks every method gets before a comparison trains (issue 47)."""
    pytest.importorskip("reasoning_gym")
    screen = compare.load_plan(ROOT / "configs" / "screen-reasoning-gym.toml")
    compare.plan.check_setup(screen)  # every dataset's problems drawn: enough distinct held-out questions
    assert screen.screening and screen.seeds == 1 and len(screen.all_methods) == 10
    for name in screen.all_methods:
        cfg = screen.config(name, 0)
        assert cfg.task.name == "reasoning_gym" and name.startswith(cfg.task.options["dataset"]) and cfg.task.options["partial_credit"]
        assert cfg.task.options["answer_format"] == "plain" and cfg.rollout.max_new_tokens == 32  # the answer is read in a sentence
        assert (cfg.select.rule, cfg.rollout.n, cfg.select.m, cfg.train.max_seconds, cfg.eval.every_seconds) == ("max_variance", 16, 4, 300.0, 100.0)
    # The ordering's dataset, and letter_counting's, which it replaced (its answers are mostly "1").
    for file, dataset in (("compare-reasoning-gym.toml", "number_format"), ("compare-reasoning-gym-letters.toml", "letter_counting")):
        plan = compare.load_plan(ROOT / "configs" / file)
        compare.plan.check_setup(plan)
        assert not plan.screening and plan.seeds == 3 and plan.baseline == "grpo"
        shapes = {name: (plan.config(name, 0).select.rule, plan.config(name, 0).rollout.n, plan.config(name, 0).select.m) for name in plan.all_methods}
        assert shapes == {"grpo": ("all", 4, 4), "pods_max_variance": ("max_variance", 8, 4), "pods_max_reward": ("max_reward", 8, 4),
                          "d3s_intra": ("d3s_intra", 8, 4), "grpo_dynamic_skip": ("all", 4, 4)}  # fmt: skip
        skip = plan.config("grpo_dynamic_skip", 0)
        assert skip.prompts.skip_silent and skip.rollout.dynamic_sampling and skip.rollout.max_gen_batches == 4
        cfg = plan.config("d3s_intra", 2)
        assert (cfg.train.max_seconds, cfg.eval.every_seconds, cfg.eval.max_problems, cfg.select.token_fraction) == (600.0, 120.0, 100, 0.5)
        assert cfg.rollout.max_new_tokens == 32 and cfg.task.options["dataset"] == dataset  # the screening's tokens


def test_prompt_and_sampler_presets_share_their_float32_arms():
    """configs/compare-prompts.toml (issue 44) and configs/compare-sampler.toml (issue 46) resolve,
    pass the set-up checks, and give grpo and pods_n8 the same config in both, so those runs are
    trained once and copied into the sampler comparison (results/compare-sampler/README.md)."""
    prompts = compare.load_plan(ROOT / "configs" / "compare-prompts.toml")
    sampler = compare.load_plan(ROOT / "configs" / "compare-sampler.toml")
    for plan in (prompts, sampler):
        compare.plan.check_setup(plan)
        assert plan.seeds == 3 and plan.baseline == "grpo"
    assert list(prompts.all_methods) == ["grpo", "grpo_dynamic", "grpo_dynamic_skip", "pods_n8", "pods_n8_skip", "pods_n16_dynamic_skip",
                                         "grpo_dynamic_skip_fast"]  # fmt: skip
    fast, gresos = prompts.config("grpo_dynamic_skip_fast", 2), prompts.config("grpo_dynamic_skip", 2)
    assert fast.prompts.explore_step == 0.05 and gresos.prompts.explore_step == 0.01
    assert dataclasses.replace(fast, prompts=dataclasses.replace(fast.prompts, explore_step=0.01)) == gresos  # the one difference
    assert list(sampler.all_methods) == ["grpo", "grpo_bf16", "grpo_bf16_is", "pods_n8", "pods_n8_bf16", "pods_n8_bf16_is"]
    for name in ("grpo", "pods_n8"):
        for seed in range(3):
            assert prompts.config(name, seed) == sampler.config(name, seed)
    for name, correct in (("grpo_bf16", False), ("grpo_bf16_is", True), ("pods_n8_bf16", False), ("pods_n8_bf16_is", True)):
        cfg = sampler.config(name, 0)
        assert cfg.rollout.sampler_dtype == "bfloat16" and cfg.rollout.importance_sampling_correction is correct
        assert (cfg.train.max_seconds, cfg.eval.every_seconds, cfg.task.options["num_train"]) == (600.0, 120.0, 400)
    assert sampler.config("grpo", 0).rollout.sampler_dtype == "float32" and sampler.config("grpo", 0).rollout.importance_sampling_correction
    skip = prompts.config("pods_n16_dynamic_skip", 1)
    assert skip.prompts.skip_silent and skip.rollout.dynamic_sampling and (skip.rollout.n, skip.select.m) == (16, 4)
    assert not prompts.config("grpo_dynamic", 0).prompts.skip_silent


def test_two_digit_preset_has_headroom_settings():
    plan = compare.load_plan(ROOT / "configs" / "compare-2digit.toml")
    assert list(plan.all_methods) == ["grpo", "pods_max_variance", "pods_random", "pods_max_reward", "d3s_intra", "d3s_cross"]
    assert plan.seeds >= 3
    shapes = {name: (plan.config(name, 0).select.rule, plan.config(name, 0).rollout.n, plan.config(name, 0).select.m) for name in plan.all_methods}
    assert shapes == {"grpo": ("all", 4, 4), "pods_max_variance": ("max_variance", 16, 4), "pods_random": ("random", 16, 4),
                      "pods_max_reward": ("max_reward", 16, 4), "d3s_intra": ("d3s_intra", 16, 4),
                      "d3s_cross": ("d3s_cross", 16, 4)}  # fmt: skip
    cfg = plan.config("grpo", 2)
    assert (cfg.train.max_steps, cfg.train.max_seconds, cfg.eval.every_steps, cfg.eval.every_seconds) == (80, None, 10, 0.0)
    assert cfg.eval.max_problems == 100  # the README's published run: 100 of the 200 held-out problems
    assert not cfg.train.export_model  # a comparison writes no RUN/model per method x seed unless asked
    from podsrl.tasks import load_task

    task = load_task(cfg.task.name, **cfg.task.options)
    ops = {ex.question.split()[3] for ex in task.eval}
    assert ops == {"+", "-"} and len(task.eval) == 200
    for ex in task.eval:  # "What is 57 - 83?": two two-digit operands
        a, op, b = ex.question.removeprefix("What is ").removesuffix("?").split()
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and int(ex.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    assert any(ex.answer.startswith("-") for ex in task.eval)


# ----------------------------------------------------------------------------------- concurrency

_FAKE_RUN = '''
import json, os, shutil, sys, time
from pathlib import Path

job, _, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
shutil.copy(job, out / "config.toml")
(out / "env.txt").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
if out.parent.name == "fail":
    print("boom from the fake run")
    sys.exit(3)
if out.parent.name == "slow":  # stops like podsrl train on a stop signal
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
    (out / "started").touch()
    time.sleep(60)
time.sleep(1.0)
rows = [{"step": 0, "train_seconds": 0.0, "accuracy": 0.1, "problems": 10},
        {"step": 3, "train_seconds": 305.0, "accuracy": 0.5, "problems": 10}]
(out / "eval.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
'''


@pytest.fixture
def fake_runs(tmp_path, monkeypatch):
    """Replace ``podsrl train`` in the children with a script that records CUDA_VISIBLE_DEVICES,
    takes a second and writes a finished run (or exits 3 for a method named "fail"); and the
    report's figure, drawn as each run finishes (1-1.5 s a figure here, most of these tests' time),
    with an empty file: these tests read the launches and compare.json, the figure has its own tests
    (test_report_peak_time_to_target_fraction_and_never and the section "what compare.png says")."""
    import sys

    import podsrl.compare.report
    from podsrl.compare import arms

    script = tmp_path / "fake_run.py"
    script.write_text(_FAKE_RUN)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(arms, "command", lambda job, path, *, resume, **_: [sys.executable, str(script), str(job), "--out", str(path)])
    monkeypatch.setattr(podsrl.compare.report, "plot_report", lambda report, path: path.touch() or path)


def _device_of(out: Path, method: str, seed: int) -> str:
    return (compare.run_dir(out, method, seed) / "env.txt").read_text()


@pytest.mark.usefixtures("fake_runs")
def test_devices_pin_one_run_per_gpu(tmp_path, capsys):
    plan = _plan(tmp_path, table={k: METHODS[k] for k in ("grpo", "pods")})
    out = tmp_path / "out"
    args = argparse.Namespace(config=str(tmp_path / "cmp.toml"), out=str(out), seeds=None, methods=None, report_only=False,
                              devices="0,1", parallel=None)  # fmt: skip
    assert compare.main(args, []) == 0  # --devices alone: as many runs at once as devices
    # Seed-major launch order; each run goes to the least loaded device.
    assert (_device_of(out, "grpo", 0), _device_of(out, "pods", 0)) == ("0", "1")
    for method in ("grpo", "pods"):
        for seed in (0, 1):
            (launch,) = compare.read_launches(compare.run_dir(out, method, seed))
            commit = launch.pop("commit")  # the podsrl source that trained it: this checkout's
            assert commit is None or len(commit.removesuffix("+dirty")) == 40
            ended, machine = launch.pop("ended"), launch.pop("machine")  # when, and on what CPU
            assert ended.endswith("+00:00") and machine["cores"] == os.cpu_count() and set(machine) == {"cpu", "cores", "flags"}
            assert launch == {"device": _device_of(out, method, seed), "parallel": 2, "runs_on_device": 1, "exit_code": 0}
            assert "progress = false" in (compare.run_dir(out, method, seed) / "config.toml").read_text()
    report = json.loads((out / "compare.json").read_text())
    assert report["device_sharing"] == {"runs_per_device": 1, "devices": ["0", "1"], "fair_axes": ["step", "train_seconds"]}
    printed = capsys.readouterr().out
    assert "share its time" not in printed and "on device 1" in printed and "train.log" in printed


@pytest.mark.usefixtures("fake_runs")
def test_runs_sharing_a_device_are_reported_and_the_step_axis_is_the_fair_one(tmp_path):
    plan = _plan(tmp_path, table={k: METHODS[k] for k in ("grpo", "pods")})
    out, logged = tmp_path / "out", []
    compare.run_all(plan, out, log=logged.append, parallel=3, devices=["0", "1"])
    assert any("up to 2 runs train at once on each of the devices 0,1 and share its time" in line for line in logged)
    # grpo seed 0 (device 0), pods seed 0 (device 1), grpo seed 1 (device 0 again: shared).
    assert [_device_of(out, m, s) for m, s in (("grpo", 0), ("pods", 0), ("grpo", 1))] == ["0", "1", "0"]
    assert compare.read_launches(compare.run_dir(out, "grpo", 0))[0]["runs_on_device"] == 2
    report = compare.build_report(plan, out)
    assert report["device_sharing"]["runs_per_device"] == 2 and report["device_sharing"]["fair_axes"] == ["step"]
    assert any("compare the methods on the step axis" in n for n in report["notes"])
    assert "step axis" in compare.format_table(report)
    # No devices: K runs share the machine's one device.
    out2, logged = tmp_path / "out2", []
    compare.run_all(plan, out2, log=logged.append, parallel=2)
    assert _device_of(out2, "grpo", 0) == "unset"
    assert any("on one device (the machine's CPU or its one GPU)" in line for line in logged)
    assert compare.build_report(plan, out2)["device_sharing"]["runs_per_device"] == 2


@pytest.mark.usefixtures("fake_runs")
def test_a_failing_parallel_run_lets_the_others_finish_then_fails(tmp_path):
    plan = _plan(tmp_path, seeds=1, table={"grpo": METHODS["grpo"], "fail": METHODS["pods"]})
    out, logged = tmp_path / "out", []
    with pytest.raises(compare.RunFailed, match=r"the run fail seed 0 .* exit code 3 \(its output is in .*train.log\)") as err:
        compare.run_all(plan, out, log=logged.append, parallel=2)
    assert err.value.returncode == 3
    assert "boom from the fake run" in (compare.run_dir(out, "fail", 0) / "train.log").read_text()
    assert any("boom from the fake run" in line for line in logged)  # the log's tail is shown
    assert (compare.run_dir(out, "grpo", 0) / compare.DONE_FILE).is_file()  # the other run finished
    assert not (compare.run_dir(out, "fail", 0) / compare.DONE_FILE).exists()
    assert compare.read_launches(compare.run_dir(out, "fail", 0))[0]["exit_code"] == 3


@pytest.mark.usefixtures("fake_runs")
def test_a_stop_signal_is_passed_on_to_the_running_runs_and_exits_75(tmp_path, capsys):
    import os
    import signal
    import threading

    plan = _plan(tmp_path, seeds=2, table={"grpo": METHODS["grpo"], "slow": METHODS["pods"]})
    out = tmp_path / "out"
    started = compare.run_dir(out, "slow", 0) / "started"

    def scheduler():  # SIGTERM to podsrl compare alone, once the second run is training
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=scheduler, daemon=True).start()
    args = argparse.Namespace(config=str(tmp_path / "cmp.toml"), out=str(out), seeds=None, methods=None, report_only=False,
                              devices=None, parallel=None)  # fmt: skip
    t0 = time.monotonic()
    assert compare.main(args, []) == 75
    assert time.monotonic() - t0 < 30  # the child stopped at once instead of sleeping its 60 s out
    printed = capsys.readouterr()
    assert "SIGTERM: passed on to the 1 running run(s)" in printed.out
    assert "stopped by SIGTERM" in printed.err and "(3 run(s) left)" in printed.err and "run the same command again" in printed.err
    assert (compare.run_dir(out, "grpo", 0) / compare.DONE_FILE).is_file()
    assert compare.read_launches(compare.run_dir(out, "slow", 0))[0]["exit_code"] == 75
    # What it says of the stopped run is what its directory holds: a checkpoint to resume, or none.
    checkpointed = compare.run_status(compare.run_dir(out, "slow", 0), plan.config("slow", 0)) == "resume"
    assert ("slow seed 0: saved a checkpoint and stopped" in printed.out) == checkpointed
    assert ("slow seed 0: stopped before its first checkpoint" in printed.out) == (not checkpointed)
    assert not compare.run_dir(out, "grpo", 1).exists()  # no new run started after the signal
    assert signal.getsignal(signal.SIGTERM) == before


def test_concurrency_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="--devices: give distinct GPU indices"):
        compare.parse_devices("0,0")
    with pytest.raises(ConfigError, match="--devices: give distinct GPU indices"):
        compare.parse_devices("cuda:0")
    assert compare.parse_devices(" 0, 2") == ["0", "2"] and compare.parse_devices(None) is None
    plan = _plan(tmp_path, seeds=1)
    with pytest.raises(ConfigError, match="drop --in-process"):
        compare.run_all(plan, tmp_path / "out", isolate=False, parallel=2)
    with pytest.raises(ConfigError, match="--parallel: must be a whole number >= 1"):
        compare.run_all(plan, tmp_path / "out", parallel=0)
    pinned = _plan(tmp_path / "p", seeds=1, base={"train": {"max_steps": None, "max_seconds": 300.0}, "eval": {"every_seconds": 100.0},
                                                  "model": {"device": "cuda:1"}})  # fmt: skip
    with pytest.raises(ConfigError, match="model.device='cuda:1'.*set model.device to auto or cuda"):
        compare.run_all(pinned, tmp_path / "out", devices=["0"])


def test_a_method_with_unfinished_seeds_is_noted_under_the_table(tmp_path):
    plan = _plan(tmp_path, seeds=2)
    out = tmp_path / "out"
    for seed in (0, 1):
        _write_run(out, plan, "grpo", seed, [(0, 0.2), (100, 0.5), (200, 0.6)])
    _write_run(out, plan, "pods", 0, [(0, 0.2), (100, 0.6), (200, 0.7)])
    report = compare.build_report(plan, out)
    assert report["methods"]["pods"]["seeds_missing"] == [1]
    assert "note: pods: 1 of 2 seeds finished (not seed 1)" in compare.format_table(report)
    assert not any(n.startswith("grpo") for n in report["notes"])


# ----------------------------------------------------------------------------------- robust summaries, mixed seeds

# Evaluations at steps 0, 10, 20, 30 (_write_run); accuracies after step 0 chosen so that the
# summaries are easy by hand. GRPO, 4 seeds: AUC 0.5, 0.5, 0.6, 0.7; final 0.6, 0.7, 0.7, 0.8.
# PODS, 3 seeds: AUC 0.6, 0.7, 0.75; final 0.7, 0.6, 0.8.
_GRPO = [(0.4, 0.5, 0.6), (0.3, 0.5, 0.7), (0.5, 0.6, 0.7), (0.6, 0.7, 0.8)]
_PODS = [(0.5, 0.6, 0.7), (0.7, 0.8, 0.6), (0.7, 0.75, 0.8)]
_STEP_BASE = {"train": {"max_steps": 30, "max_seconds": None}, "eval": {"every_steps": 10}}


def _mixed_plan(tmp_path: Path, **kw) -> compare.Plan:
    """grpo 4 seeds, pods 3 (the default), never 2: a mixed plan in the file."""
    return _plan(tmp_path, seeds=3, base=_STEP_BASE, extra={"seeds_per_method": {"grpo": 4, "never": 2}}, **kw)


def _write_mixed_runs(out: Path, plan: compare.Plan) -> None:
    for method, runs in (("grpo", _GRPO), ("pods", _PODS)):
        for seed, accs in enumerate(runs):
            _write_run(out, plan, method, seed, [(0, 0.2)] + [(100 * (i + 1), a) for i, a in enumerate(accs)])


def test_auc_and_final_accuracy_of_one_run():
    rows = [{"step": s, "train_seconds": 10.0 * s, "accuracy": a} for s, a in ((0, 0.9), (10, 0.2), (20, 0.4), (30, 0.3))]
    assert compare.auc(rows) == pytest.approx(0.3)  # step 0 (the untrained model) left out
    assert compare.final_accuracy(rows) == 0.3 and compare.final_accuracy(list(reversed(rows))) == 0.3
    assert compare.auc(rows[:1]) is None and compare.final_accuracy([]) is None


def test_time_auc_is_mean_accuracy_per_training_second_up_to_the_horizon():
    t, acc = [0.0, 10.0, 20.0], [0.0, 0.5, 0.5]
    assert compare.time_auc(t, acc, 15.0) == pytest.approx((10 * 0.25 + 5 * 0.5) / 15)  # the piece cut at 15 s
    assert compare.time_auc(t, acc, 40.0) == pytest.approx((10 * 0.25 + 10 * 0.5 + 20 * 0.5) / 40)  # the last value held
    assert compare.time_auc([5.0, 10.0], [0.4, 0.6], 10.0) == pytest.approx((5 * 0.4 + 5 * 0.5) / 10)  # the first held back to 0
    assert compare.time_auc([], [], 10.0) is None and compare.time_auc(t, acc, 0.0) is None


def test_paired_t_interval_by_hand():
    # d = (0.1, 0.2, 0.15): mean 0.15, s_d = 0.05, half = t_{0.975,2} 0.05 / sqrt(3) = 4.303 x 0.028868.
    lo, hi = compare.paired_t_interval([0.6, 0.7, 0.75], [0.5, 0.5, 0.6])
    half = 4.303 * 0.05 / math.sqrt(3)
    assert (lo, hi) == pytest.approx((0.15 - half, 0.15 + half))
    assert compare.paired_t_interval([0.6], [0.5]) is None
    with pytest.raises(ValueError, match="give one b per a"):
        compare.paired_t_interval([0.6, 0.7], [0.5])
    # Pairing removes what the seeds share: the unpaired interval of the same data is wider.
    assert compare.t_interval([0.6, 0.7, 0.75])[1] - compare.t_interval([0.6, 0.7, 0.75])[0] > hi - lo
    d = compare.paired_difference({0: 0.6, 1: 0.7, 2: 0.75, 3: None}, {0: 0.5, 1: 0.5, 2: 0.6, 3: 0.7, 4: 0.1})
    assert d.seeds == [0, 1, 2] and d.per_seed == pytest.approx([0.1, 0.2, 0.15]) and d.excludes_zero() is True
    assert compare.paired_difference({0: 0.6}, {0: 0.5}).excludes_zero() is None  # one pair: no interval
    # As a table cell, in points: the count of pairs, the star, the baseline and the one-pair case.
    from podsrl.compare.table import difference

    lo, hi = (100 * v for v in d.ci95)
    assert difference(d.to_json()) == f"+15.0 [{lo:+.1f}, {hi:+.1f}]* (3)"
    assert difference(d.to_json(), count=False) == f"+15.0 [{lo:+.1f}, {hi:+.1f}]*"
    assert difference(compare.paired_difference({0: 0.6}, {0: 0.5}).to_json()) == "+10.0 (1 pair, no CI)"
    assert difference(d.to_json(), baseline=True) == "(baseline)" and difference(None) == "-"


def test_robust_summaries_and_paired_differences_in_the_report(tmp_path):
    plan = _mixed_plan(tmp_path)
    assert [plan.n_seeds(m) for m in ("grpo", "pods", "never")] == [4, 3, 2]
    out = tmp_path / "out"
    _write_mixed_runs(out, plan)
    report = compare.build_report(plan, out)
    g, p = report["methods"]["grpo"], report["methods"]["pods"]
    assert report["seeds"] == {"grpo": 4, "pods": 3, "never": 2}
    # GRPO over its 4 seeds: AUC mean 0.575, s = sqrt(0.0275 / 3), t_{0.975,3} = 3.182.
    assert g["auc_per_seed"] == pytest.approx([0.5, 0.5, 0.6, 0.7]) and g["auc"] == pytest.approx(0.575)
    half = 3.182 * math.sqrt(0.0275 / 3) / 2
    assert g["auc_ci95"] == pytest.approx([0.575 - half, 0.575 + half])
    assert g["final_accuracy_per_seed"] == [0.6, 0.7, 0.7, 0.8] and g["final_accuracy"] == pytest.approx(0.7)
    assert g["paired_vs_baseline"] is None
    # PODS over its 3 seeds: AUC 0.68333, s = sqrt(0.011667 / 2).
    assert p["auc"] == pytest.approx(0.6833333) and p["final_accuracy"] == pytest.approx(0.7)
    half = 4.303 * math.sqrt((0.0833333**2 + 0.0166667**2 + 0.0666667**2) / 2) / math.sqrt(3)
    assert p["auc_ci95"] == pytest.approx([0.6833333 - half, 0.6833333 + half], abs=1e-6)
    # Paired with GRPO's seeds 0-2 only (GRPO's seed 3 has no PODS partner):
    # AUC d = (0.1, 0.2, 0.15) -> 0.15 +- 0.1242, excludes zero;
    # final d = (0.1, -0.1, 0.1) -> 0.0333 +- 4.303 x 0.11547 / sqrt(3) = 0.2869, includes zero.
    d_auc, d_final = p["paired_vs_baseline"]["auc"], p["paired_vs_baseline"]["final_accuracy"]
    assert d_auc["seeds"] == [0, 1, 2] and d_auc["per_seed"] == pytest.approx([0.1, 0.2, 0.15])
    half = 4.303 * 0.05 / math.sqrt(3)
    assert d_auc["mean"] == pytest.approx(0.15) and d_auc["ci95"] == pytest.approx([0.15 - half, 0.15 + half])
    assert d_auc["excludes_zero"] is True
    half = 4.303 * math.sqrt(0.04 / 3) / math.sqrt(3)
    assert d_final["mean"] == pytest.approx(1 / 30) and d_final["ci95"] == pytest.approx([1 / 30 - half, 1 / 30 + half])
    assert d_final["excludes_zero"] is False
    # AUC per training minute over the shortest run's 300 s: GRPO seed 0 runs 0.2 -> 0.4 -> 0.5 -> 0.6
    # at 0, 100, 200, 300 s: (30 + 45 + 55) / 300. Paired like the other summaries.
    assert report["time_auc_horizon_seconds"] == 300
    assert g["time_auc_per_seed"][0] == pytest.approx(130 / 300) and p["paired_vs_baseline"]["time_auc"]["seeds"] == [0, 1, 2]
    assert p["paired_vs_baseline"]["time_auc"]["mean"] == pytest.approx(0.1444444)  # the evaluations are at the same times
    assert "time_auc" in report["definitions"] and "time_auc" in report["pairwise"][0]
    assert report["paired_excluding_zero"] == ["pods auc"]
    assert "auc" in report["definitions"] and "after step 0" in report["definitions"]["auc"]
    assert any("excludes zero: pods auc +15.0 [+2.6, +27.4] (3 pairs)" in n for n in report["notes"])
    assert any("includes zero (not resolved): pods final_accuracy +3.3" in n for n in report["notes"])
    # "never" has no finished run: listed, with no summaries and nothing paired.
    nv = report["methods"]["never"]
    assert nv["auc"] is None and nv["auc_ci95"] is None and nv["paired_vs_baseline"]["auc"]["mean"] is None
    assert nv["seeds_missing"] == [0, 1]

    table = compare.format_table(report)
    assert "57.5 [" in table and "68.3 [" in table  # AUC with intervals
    assert "+15.0 [+2.6, +27.4]* (3)" in table and "+3.3 [-25.4, +32.0] (3)" in table
    assert "(baseline)" in table and "step to 99% grpo peak" in table  # both tables
    assert "AUC, first 5.0 training min" in table
    json_path, png = compare.write_report(report, out)
    assert json.loads(json_path.read_text())["methods"]["pods"]["paired_vs_baseline"]["auc"]["excludes_zero"] is True
    import matplotlib.image

    height, width = matplotlib.image.imread(png).shape[:2]
    assert height > 900 and width > 1300  # four panels: curves on both axes, paired AUC and final differences


def test_pairwise_differences_between_methods_other_than_the_baseline(tmp_path):
    """compare.json ``pairwise``: a - b by seed for every pair of non-baseline methods (the
    orderings between rules), over the seeds both finished; printed as its own table."""
    plan = _mixed_plan(tmp_path)
    out = tmp_path / "out"
    _write_mixed_runs(out, plan)
    table = compare.format_table(compare.build_report(plan, out))
    assert "between methods" not in table  # "never" has no finished run yet: no pair to show
    for seed, accs in enumerate([(0.4, 0.5, 0.6), (0.5, 0.6, 0.4)]):  # AUC 0.5 and 0.5, final 0.6 and 0.4
        _write_run(out, plan, "never", seed, [(0, 0.2)] + [(100 * (i + 1), a) for i, a in enumerate(accs)])
    report = compare.build_report(plan, out)
    (pair,) = report["pairwise"]  # grpo is the baseline: only pods - never
    assert (pair["a"], pair["b"]) == ("pods", "never")
    # PODS seeds 0-1: AUC 0.6, 0.7; final 0.7, 0.6. d_auc = (0.1, 0.2), d_final = (0.1, 0.2): 0.15 +- 12.706 x 0.0707 / sqrt(2).
    half = 12.706 * math.sqrt(0.005) / math.sqrt(2)
    for key in ("auc", "final_accuracy"):
        assert pair[key]["seeds"] == [0, 1] and pair[key]["per_seed"] == pytest.approx([0.1, 0.2])
        assert pair[key]["ci95"] == pytest.approx([0.15 - half, 0.15 + half], abs=1e-3) and pair[key]["excludes_zero"] is False
    assert "pairwise" in report["definitions"]
    assert "pods - never  +15.0 [-48.5, +78.5] (2)" in compare.format_table(report)


def test_mixed_seed_plan_runs_and_reports_each_methods_own_seeds(tmp_path, monkeypatch):
    import podsrl.train.loop

    table = {k: METHODS[k] for k in ("grpo", "pods")}
    plan = _plan(tmp_path, seeds=1, table=table, extra={"seeds_per_method": {"pods": 3}})
    out, calls = tmp_path / "out", []

    def fake_train(cfg, *, run_dir, resume, log=print):
        calls.append((run_dir.parent.name, run_dir.name, cfg.train.seed))
        _write_run(out, plan, run_dir.parent.name, int(run_dir.name.removeprefix("seed")), [(0, 0.1), (300, 0.5)], done=False)

    monkeypatch.setattr(podsrl.train.loop, "train", fake_train)
    compare.run_all(plan, out, log=lambda *_: None, isolate=False)
    # Seed-major, each method up to its own count.
    assert calls == [("grpo", "seed0", 0), ("pods", "seed0", 0), ("pods", "seed1", 1), ("pods", "seed2", 2)]
    report = json.loads((out / "compare.json").read_text())
    assert report["seeds"] == {"grpo": 1, "pods": 3} and not any("seeds finished" in n for n in report["notes"])
    assert report["methods"]["pods"]["seeds_done"] == [0, 1, 2] and report["methods"]["grpo"]["seeds_missing"] == []
    # The pairs: pods' seed 0 only (grpo has one seed): a difference, no interval.
    assert report["methods"]["pods"]["paired_vs_baseline"]["auc"]["seeds"] == [0]
    # --seeds 2 on the command line gives every method 2 seeds: the file's per-method count is dropped.
    report = compare.build_report(compare.load_plan(tmp_path / "cmp.toml", seeds="2"), out)
    assert report["seeds"] == {"grpo": 2, "pods": 2} and report["methods"]["grpo"]["seeds_missing"] == [1]
    assert any(n.startswith("grpo: 1 of 2 seeds finished") for n in report["notes"])
    assert report["methods"]["pods"]["seeds_done"] == [0, 1]


def test_seed_plan_from_file_and_command_line(tmp_path):
    path = _write_plan_file(tmp_path, seeds=3, seeds_per_method={"grpo": 5, "pods": 5})
    plan = compare.load_plan(path)
    assert (plan.seeds, plan.seeds_per_method) == (3, {"grpo": 5, "pods": 5})
    assert [plan.n_seeds(m) for m in ("grpo", "pods", "never")] == [5, 5, 3]
    assert compare.load_plan(path, seeds=4).seeds_per_method == {}  # an int (the API) is every method's count
    plan = compare.load_plan(path, seeds="grpo=6")  # only grpo changes, over the file's plan
    assert [plan.n_seeds(m) for m in ("grpo", "pods", "never")] == [6, 5, 3]
    plan = compare.load_plan(path, seeds=" 2, never=4 ")
    assert [plan.n_seeds(m) for m in ("grpo", "pods", "never")] == [2, 2, 4]
    plan = compare.load_plan(path, seeds="pods=3")  # the default's count: no exception kept
    assert plan.seeds_per_method == {"grpo": 5}
    # The published preset: 5 seeds where the papers' claims rest, 3 elsewhere.
    preset = compare.load_plan(ROOT / "configs" / "compare-2digit.toml")
    assert {m: preset.n_seeds(m) for m in preset.all_methods} == {
        "grpo": 5, "pods_max_variance": 5, "pods_random": 3, "pods_max_reward": 3, "d3s_intra": 5, "d3s_cross": 3}


@pytest.mark.parametrize(
    "table, cli, message",
    [
        ({"seeds_per_method": {"gpro": 5}}, None, r"compare.seeds_per_method: 'gpro' is not a method; methods: grpo, pods, never"),
        ({"seeds_per_method": {"grpo": 0}}, None, r"compare.seeds_per_method.grpo: must be a whole number >= 1, got 0"),
        ({"seeds_per_method": {"grpo": 2.5}}, None, r"compare.seeds_per_method.grpo: must be a whole number >= 1"),
        ({"seeds_per_method": 5}, None, r"compare.seeds_per_method: give a table of method = number of seeds"),
        ({}, "3,gpro=5", r"--seeds: 'gpro' is not a method"),
        ({}, "3,4", r"--seeds: give a number of seeds for every method and/or METHOD=K"),
        ({}, "three", r"--seeds: give a number of seeds"),
        ({}, "grpo=", r"--seeds: give a number of seeds"),
        ({}, "=3", r"--seeds: give a number of seeds"),
        ({}, "grpo=2,grpo=3", r"--seeds: give a number of seeds"),
        ({}, "grpo=0", r"--seeds grpo: must be a whole number >= 1"),
    ],
)
def test_bad_seed_plans_are_config_errors(tmp_path, table, cli, message):
    with pytest.raises(ConfigError, match=message):
        compare.load_plan(_write_plan_file(tmp_path, **table), seeds=cli)


def test_report_only_reads_runs_without_checkpoints(tmp_path, capsys):
    """A results directory of small files (config.toml, eval.jsonl, metrics.jsonl, done.json, no
    checkpoints) reports through the command line's --report-only."""
    plan = _mixed_plan(tmp_path)
    out = tmp_path / "results"
    _write_mixed_runs(out, plan)
    args = argparse.Namespace(config=str(tmp_path / "cmp.toml"), out=str(out), seeds=None, methods=None, report_only=True)
    assert compare.main(args, []) == 0
    printed = capsys.readouterr().out
    assert "+15.0 [+2.6, +27.4]* (3)" in printed and "never: 0 of 2" not in printed
    assert not any(out.rglob("checkpoints")) and (out / "compare.png").stat().st_size > 0


def test_training_signal_from_metrics_is_averaged_over_steps_then_seeds(tmp_path):
    """compare.json ``signal``: each run's mean over its steps of what it trained on (a value a step
    lacks, or NaN, is skipped; tokens in the loss is a ratio of sums), then the mean over seeds;
    printed as a third table."""
    plan = _plan(tmp_path)
    out = tmp_path / "out"
    for seed, (zero, adv) in enumerate([((1.0, 0.5), (0.0, 0.4)), ((0.5, 0.5), (0.2, float("nan")))]):
        path = _write_run(out, plan, "grpo", seed, [(0, 0.1), (100, 0.3)])
        rows = [{"step": 1, "reward_mean": 0.25, "zero_variance_groups": zero[0], "kept_adv_var": adv[0], "grad_norm": 1.0,
                 "tokens_kept": 30, "tokens_total": 60, "rollouts_generated": 100, "rows_run": 2, "kept": 8},
                {"step": 2, "reward_mean": 0.75, "zero_variance_groups": zero[1], "kept_adv_var": adv[1], "tokens_kept": 10,
                 "tokens_total": 20, "rollouts_generated": 120, "rows_run": 4, "kept": 8}]  # fmt: skip
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = compare.build_report(plan, out)
    grpo = report["methods"]["grpo"]
    assert grpo["signal_per_seed"][0] == {"reward": 0.5, "zero_variance_groups": 0.75, "zero_variance_groups_start": 0.75,
                                          "kept_adv_var": 0.2, "tokens_in_loss": 0.5, "signal_tokens_kept": None,
                                          "grad_norm": 1.0, "rollouts": 110, "prompts": 8, "groups_with_signal": None,
                                          "rows_run": 6 / 16, "rollouts_per_signal_group": None, "prompts_skipped": None,
                                          "explored_silent": None, "revisits_silent": None, "rest_silent": None,
                                          "epochs": None, "completion_len": None, "completion_len_start": None,
                                          "truncated": None}  # fmt: skip
    assert grpo["signal_per_seed"][1]["kept_adv_var"] == pytest.approx(0.2)  # the NaN step is skipped
    assert grpo["signal"]["zero_variance_groups"] == pytest.approx(0.625)
    assert report["methods"]["pods"]["signal"] == dict.fromkeys(compare.report.SIGNAL)  # no finished run: no numbers
    table = compare.format_table(report)
    assert "training signal (metrics.jsonl)" in table and "62%" in table and "50%" in table and "38%" in table


def test_the_share_of_signal_tokens_token_selection_kept(tmp_path):
    """D3S: of the signal rows' tokens (tokens_run, with exact skipping), the share its loss kept, over
    the steps where token selection was on (token_fraction < 1) and a row ran."""
    plan = _plan(tmp_path, table={"grpo": METHODS["grpo"], "d3s": {"select.rule": "d3s_intra", "rollout.n": 16, "select.m": 4,
                                                                   "select.token_fraction": 0.5, "select.token_fraction_final": 1.0,
                                                                   "select.token_schedule": "linear"}})  # fmt: skip
    out = tmp_path / "out"
    path = _write_run(out, plan, "d3s", 0, [(0, 0.1), (100, 0.3)])
    rows = [{"step": 1, "token_fraction": 0.5, "tokens_run": 100, "tokens_kept": 50},
            {"step": 2, "token_fraction": 0.75, "tokens_run": 60, "tokens_kept": 46},
            {"step": 3, "token_fraction": 0.9, "tokens_run": 0, "tokens_kept": 0},  # no signal row: left out
            {"step": 4, "token_fraction": 1.0, "tokens_run": 80, "tokens_kept": 80}]  # selection off: left out
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _write_run(out, plan, "grpo", 0, [(0, 0.1), (100, 0.3)])
    report = compare.build_report(plan, out)
    assert report["methods"]["d3s"]["signal"]["signal_tokens_kept"] == pytest.approx(96 / 160)
    assert report["methods"]["grpo"]["signal"]["signal_tokens_kept"] is None  # no token selection
    assert "60%" in compare.format_table(report).split("training signal")[1]


def test_the_sampler_gap_and_the_correction_are_reported_per_method(tmp_path):
    """compare.json ``sampler``: each run's mean over its steps of the gap and of the ratio's mean and
    clipped share, the smallest ratio_min and largest ratio_max over steps, then over seeds the mean
    of the means, the min of the minima, the max of the maxima; the method's sampler dtype and
    correction from its config; printed as a table only when some run logged a gap (issue 46)."""
    plan = _plan(tmp_path, table={**METHODS, "pods": {**METHODS["pods"], "rollout.sampler_dtype": "bfloat16",
                                                      "rollout.importance_sampling_correction": False}})  # fmt: skip
    out = tmp_path / "out"
    for seed, (lo, hi) in enumerate([(0.5, 2.0), (0.25, 1.5)]):
        path = _write_run(out, plan, "grpo", seed, [(0, 0.1), (100, 0.3)])
        rows = [{"step": 1, "sampler_logp_diff": 0.01, "sampler_kl": 1e-4, "is_ratio_mean": 1.0, "is_ratio_min": lo,
                 "is_ratio_max": hi, "is_clip_frac": 0.0},
                {"step": 2, "sampler_logp_diff": 0.03 + seed, "sampler_kl": float("nan"), "is_ratio_mean": 1.02,
                 "is_ratio_min": 0.9, "is_ratio_max": 1.1, "is_clip_frac": 0.5}]  # fmt: skip
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _write_run(out, plan, "pods", 0, [(0, 0.1), (100, 0.3)])  # no gap logged
    report = compare.build_report(plan, out)
    grpo = report["methods"]["grpo"]
    assert grpo["runs"][0]["sampler"] == pytest.approx({"sampler_logp_diff": 0.02, "sampler_kl": 1e-4, "is_ratio_mean": 1.01,
                                                        "is_clip_frac": 0.25, "is_ratio_min": 0.5, "is_ratio_max": 2.0})  # fmt: skip
    assert grpo["sampler"] == pytest.approx({"dtype": "fast", "correction": "token_truncate", "sampler_logp_diff": (0.02 + 0.52) / 2,
                                             "sampler_kl": 1e-4, "is_ratio_mean": 1.01, "is_clip_frac": 0.25,
                                             "is_ratio_min": 0.25, "is_ratio_max": 2.0})  # fmt: skip
    pods = report["methods"]["pods"]["sampler"]
    assert (pods["dtype"], pods["correction"], pods["sampler_logp_diff"], pods["is_ratio_max"]) == ("bfloat16", None, None, None)
    table = compare.format_table(report)
    assert "sampler gap (metrics.jsonl)" in table and "token_truncate" in table and "2.70e-01" in table and "25.00%" in table
    for path in out.rglob("metrics.jsonl"):  # no run logged a gap (the transformers engine): no table
        path.write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    assert "sampler gap" not in compare.format_table(compare.build_report(plan, out))


_SCREEN = {  # a screening's methods: one task each
    "one_digit": {"task.options": {"ops": ["+"], "min_digits": 1, "max_digits": 1, "num_train": 40, "num_eval": 20}},
    "two_digit": {"task.options": {"ops": ["+", "-"], "min_digits": 2, "max_digits": 2, "num_train": 40, "num_eval": 20},
                  "rollout.max_new_tokens": 8},
}


def test_a_screening_trains_each_method_on_its_own_task_and_shares_the_rest(tmp_path):
    """compare.screening: methods may set task.* (which a comparison refuses), their own options
    kept and the held-out draw pinned to the base seed as for a comparison; the rest stays shared,
    and there is no baseline or target to set."""
    base = {"train": {"max_steps": None, "max_seconds": 300.0, "seed": 3}}
    plan = _plan(tmp_path, table=_SCREEN, extra={"screening": True}, base=base)
    assert plan.screening and plan.baseline == "one_digit"
    one, two, two_b = plan.config("one_digit", 0), plan.config("two_digit", 0), plan.config("two_digit", 1)
    assert (one.task.options["max_digits"], two.task.options["max_digits"], two.task.options["ops"]) == (1, 2, ["+", "-"])
    assert one.task.options["seed"] == two.task.options["seed"] == two_b.task.options["seed"] == 3  # the same held-out problems
    assert (two.train.seed, two_b.train.seed, two.rollout.max_new_tokens, one.rollout.max_new_tokens) == (3, 4, 8, 16)
    with pytest.raises(ConfigError, match=r"compare.methods.bad: 'eval.max_problems' must be the same for every method \(rewards"):
        _plan(tmp_path, table={**_SCREEN, "bad": {"eval.max_problems": 5}}, extra={"screening": True})
    for key, value in (("baseline", "one_digit"), ("target_fraction", 0.9)):
        with pytest.raises(ConfigError, match=f"compare.{key}: a screening .* drop compare.{key}"):
            _plan(tmp_path, table=_SCREEN, extra={"screening": True, key: value})
    with pytest.raises(ConfigError, match="compare.screening: must be true or false, got 'yes'"):
        _plan(tmp_path, table=_SCREEN, extra={"screening": "yes"})
    with pytest.raises(ConfigError, match="compare.methods.one_digit: 'task.options' must be the same for every method"):
        _plan(tmp_path, table=_SCREEN, extra={"baseline": "one_digit"})  # not a screening: the task is shared ground


def test_a_screening_report_gives_accuracy_before_and_after_and_the_silent_start(tmp_path, drawn_figures):
    """No baseline, target, speedup or paired difference; per method its task, the accuracy before
    training (step 0) and after (at the budget), and the share of silent groups over the first
    steps (a step logged again after a resume counts once) beside the run's mean."""
    plan = _plan(tmp_path, seeds=1, table=_SCREEN, extra={"screening": True})
    out = tmp_path / "out"
    path = _write_run(out, plan, "one_digit", 0, [(0, 0.2), (100, 0.5), (200, 0.6), (300, 0.7)])
    zero = [1.0, 1.0, 0.5, 0.5, 0.75, 0.25, 0.0, 0.0]  # steps 1-8: the first 5 average 0.75, all 8 0.5
    length = [150, 150, 140, 140, 120, 60, 60, 60]  # the first 5 average 140, all 8 110; a quarter of them cut
    rows = [{"step": s, "zero_variance_groups": z, "completion_len": n, "truncated": 0.25} for s, (z, n) in enumerate(zip(zero, length), 1)]
    rows.append({"step": 3, "zero_variance_groups": 0.5, "completion_len": 140, "truncated": 0.25})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _write_run(out, plan, "two_digit", 0, [(0, 0.0), (100, 0.0), (200, 0.05), (300, 0.1)])
    report = compare.build_report(plan, out)
    one, two = report["methods"]["one_digit"], report["methods"]["two_digit"]
    assert report["screening"] and report["baseline"] is None and report["target_accuracy"] is None and report["pairwise"] == []
    assert one["task"]["name"] == "arithmetic" and one["task"]["options"]["max_digits"] == 1 and one["dataset"] is None
    assert (one["start_accuracy"], one["final_accuracy"], two["start_accuracy"], two["final_accuracy"]) == (0.2, 0.7, 0.0, 0.1)
    assert one["paired_vs_baseline"] is None and one["time_fraction"] is None and one["steps_to_target"] is None
    assert one["signal"]["zero_variance_groups_start"] == pytest.approx(0.75)
    assert one["signal"]["zero_variance_groups"] == pytest.approx(0.5)  # the run's mean: steps 1-8, each once
    assert report["notes"] == [compare.report.SCREENING_NOTE]
    table = compare.format_table(report)
    assert "screening: each method trained on its own task for 5.0 min of training" in table and "baseline" not in table.split("note:")[0]
    line = next(row for row in table.splitlines() if row.startswith("one_digit  arithmetic"))
    assert line.split()[:9] == ["one_digit", "arithmetic", "1", "20.0", "70.0", "(1", "seed)", "+50.0", "70.0"]
    assert line.split()[9:11] == ["75%", "50%"]
    assert line.split()[12:16] == ["140", "/", "110", "25%"]  # completion tokens over the first steps / the run, share cut
    # What one answer to every held-out problem scores: the most common reference among those scored.
    from collections import Counter

    from podsrl.tasks.build import build_task

    cfg = plan.config("one_digit", 0)
    answers = [ex.answer for ex in build_task(cfg).eval[: cfg.eval.max_problems]]
    answer, count = Counter(answers).most_common(1)[0]
    assert one["one_answer"] == {"answer": answer, "share": count / len(answers), "problems": len(answers)}
    assert line.split()[-2:] == [f"{count / len(answers):.0%}", f"({answer!r})"]
    compare.write_report(report, out)
    assert "a screening: each method its own task" in drawn_figures[-1]._suptitle.get_text()


def test_a_held_out_set_with_one_common_answer_gets_a_note(tmp_path):
    """When one answer is the reference of a quarter or more of the held-out problems scored (a
    shortcut: letter_counting's "1"), the report says what giving it to every problem scores."""
    plan = _plan(tmp_path, seeds=1, table={"grpo": {}}, extra={"baseline": "grpo"})
    entry = {"one_answer": {"answer": "1", "share": 0.83, "problems": 100}}
    notes = compare.report._one_answer_notes({"grpo": entry, "pods": dict(entry)})
    assert len(notes) == 1 and notes[0].startswith("grpo: 83% of the 100 held-out problems scored have the answer '1'")
    assert compare.report._one_answer_notes({"grpo": {"one_answer": {"answer": "1", "share": 0.2, "problems": 100}}}) == []
    assert compare.report.one_answer(plan.config("grpo", 0))["share"] < 0.25  # arithmetic's answers vary


def test_the_signal_table_reports_prompt_selection(tmp_path):
    """Rollouts per group trained with a signal, prompts skipped, the prediction's precision and
    the epochs: ratios of the run's sums (a step logged again after a resume counts once), the last
    epoch (issue 44)."""
    plan = _plan(tmp_path)
    out = tmp_path / "out"
    path = _write_run(out, plan, "grpo", 0, [(0, 0.1), (100, 0.3)])
    rows = [{"step": 1, "reward_mean": 0.5, "rollouts_generated": 64, "groups_with_signal": 8, "prompts_skipped": 3, "prompts_explored": 4,
             "prompts_explored_silent": 3, "epoch": 0.2},
            {"step": 2, "reward_mean": 0.5, "rollouts_generated": 32, "groups_with_signal": 4, "prompts_skipped": 5, "prompts_explored": 0,
             "prompts_explored_silent": 0, "epoch": 0.45}]  # fmt: skip
    rows.insert(0, {**rows[0], "rollouts_generated": 1000, "prompts_explored": 9, "prompts_explored_silent": 0})  # step 1 before a resume: its last row counts
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sig = compare.build_report(plan, out)["methods"]["grpo"]["signal_per_seed"][0]
    assert (sig["rollouts_per_signal_group"], sig["prompts_skipped"], sig["explored_silent"], sig["epochs"]) == (8.0, 4.0, 0.75, 0.45)
    assert (sig["revisits_silent"], sig["rest_silent"]) == (None, None)  # no step after the first epoch
    table = compare.format_table(report := compare.build_report(plan, out))
    assert "rollouts / signal group" in table and "75%" in table and report["definitions"]["signal"].count("explored_silent") == 2


def test_the_signal_table_sets_the_predicted_silent_against_the_rest(tmp_path):
    """From the second epoch on: the share of sampled groups that came back silent, and of those not
    predicted silent (sampled, not explored); a step logged again after a resume counts once; a run
    without prompt selection has the first only (issue 44)."""
    plan = _plan(tmp_path)
    out = tmp_path / "out"
    common = {"reward_mean": 0.5, "rollouts_generated": 64, "groups_with_signal": 2}
    selecting = [{"step": 1, "epoch": 0.9, "prompts_sampled": 8, "groups_silent": 8, "prompts_explored": 0, "prompts_explored_silent": 0},
                 {"step": 2, "epoch": 1.1, "prompts_sampled": 8, "groups_silent": 1, "prompts_explored": 1, "prompts_explored_silent": 1},
                 {"step": 2, "epoch": 1.1, "prompts_sampled": 8, "groups_silent": 6, "prompts_explored": 4, "prompts_explored_silent": 3},
                 {"step": 3, "epoch": 1.3, "prompts_sampled": 16, "groups_silent": 6, "prompts_explored": 2, "prompts_explored_silent": 2}]  # fmt: skip
    plain = [{"step": 1, "epoch": 0.9, "prompts_sampled": 8, "groups_silent": 2}, {"step": 2, "epoch": 1.2, "prompts_sampled": 8, "groups_silent": 6}]
    for method, rows in (("grpo", selecting), ("pods", plain)):
        path = _write_run(out, plan, method, 0, [(0, 0.1), (100, 0.3)])
        (path / "metrics.jsonl").write_text("".join(json.dumps(common | r) + "\n" for r in rows))
    report = compare.build_report(plan, out)
    sig = report["methods"]["grpo"]["signal_per_seed"][0]
    # steps 2 (its last row) and 3: 24 sampled, 12 silent; 6 explored (5 silent), the rest 18 with 7 silent;
    # explored_silent over every step, each once: 6 explored, 5 silent (step 2's first row left out)
    assert (sig["explored_silent"], sig["revisits_silent"], sig["rest_silent"]) == (5 / 6, 0.5, 7 / 18)
    assert (report["methods"]["pods"]["signal_per_seed"][0]["revisits_silent"], report["methods"]["pods"]["signal_per_seed"][0]["rest_silent"]) == (0.75, None)
    assert "silent from epoch 1" in compare.format_table(report)


def test_the_signal_table_reads_new_and_old_prompt_metrics_alike(tmp_path):
    """Since issue 57 a step logs ``epoch`` at its start and ``epoch_end`` once it took its prompts,
    and the prompts the fallback forced in (predicted silent too) apart from the explored: epochs is
    the last step's ``epoch_end`` (older rows: ``epoch``, which was the passes after the step), and
    rest_silent leaves the forced out of the rest as it does the explored (older rows counted them as
    explored)."""
    plan = _plan(tmp_path)
    out = tmp_path / "out"
    common = {"reward_mean": 0.5, "rollouts_generated": 64, "groups_with_signal": 2}
    new = [{"step": 1, "epoch": 0.7, "epoch_end": 0.9, "prompts_sampled": 8, "groups_silent": 8, "prompts_explored": 0,
            "prompts_explored_silent": 0, "prompts_forced": 0, "prompts_forced_silent": 0},
           {"step": 2, "epoch": 1.1, "epoch_end": 1.3, "prompts_sampled": 8, "groups_silent": 6, "prompts_explored": 4,
            "prompts_explored_silent": 3, "prompts_forced": 2, "prompts_forced_silent": 2},
           {"step": 3, "epoch": 1.3, "epoch_end": 1.7, "prompts_sampled": 16, "groups_silent": 6, "prompts_explored": 2,
            "prompts_explored_silent": 2, "prompts_forced": 1, "prompts_forced_silent": 0}]  # fmt: skip
    old = [{"step": 1, "epoch": 0.9, "prompts_sampled": 8, "groups_silent": 8, "prompts_explored": 0, "prompts_explored_silent": 0},
           {"step": 2, "epoch": 1.1, "prompts_sampled": 8, "groups_silent": 6, "prompts_explored": 6, "prompts_explored_silent": 5},
           {"step": 3, "epoch": 1.3, "prompts_sampled": 16, "groups_silent": 6, "prompts_explored": 3, "prompts_explored_silent": 2}]  # fmt: skip
    for method, rows in (("grpo", new), ("pods", old)):
        path = _write_run(out, plan, method, 0, [(0, 0.1), (100, 0.3)])
        (path / "metrics.jsonl").write_text("".join(json.dumps(common | r) + "\n" for r in rows))
    methods = compare.build_report(plan, out)["methods"]
    sig, before = methods["grpo"]["signal_per_seed"][0], methods["pods"]["signal_per_seed"][0]
    # steps 2 and 3 (logged at epoch >= 1): 24 sampled, 12 silent; explored 6 (5 silent), forced 3 (2 silent): the rest 15, 5 silent
    assert (sig["epochs"], sig["explored_silent"], sig["revisits_silent"], sig["rest_silent"]) == (1.7, 5 / 6, 0.5, 5 / 15)
    # the same steps as logged before: forced among the explored (9, 7 silent): the rest 15, 5 silent
    assert (before["epochs"], before["explored_silent"], before["revisits_silent"], before["rest_silent"]) == (1.3, 7 / 9, 0.5, 5 / 15)


def test_training_reward_compares_like_with_like(tmp_path):
    """The training reward of a run with exact early stopping logged before podsrl reported it on a
    fixed-n basis (issue 36) pooled every sampled rollout: such steps are left out of ``signal`` and
    named in a note; a step that sampled all B x n, or logged on the new basis (gen_batches), counts."""
    plan = _plan(tmp_path, seeds=1, table={**METHODS, "pods_es": {**METHODS["pods"], "rollout.early_stop": "exact"}})
    out = tmp_path / "out"
    rows = {"pods_es": [{"step": 1, "reward_mean": 0.9, "rollouts_generated": 100},  # old, pooled over early-stopped groups
                        {"step": 2, "reward_mean": 0.5, "rollouts_generated": 128},  # old, every group ran to n = 16 (B = 8)
                        {"step": 3, "reward_mean": 0.7, "rollouts_generated": 90, "gen_batches": 1, "prompts_sampled": 8}],
            "pods": [{"step": 1, "reward_mean": 0.9, "rollouts_generated": 128},
                     {"step": 2, "reward_mean": 0.3, "rollouts_generated": 256, "gen_batches": 2, "prompts_sampled": 16,
                      "groups_with_signal": 8}]}  # fmt: skip
    for name, metrics in rows.items():
        path = _write_run(out, plan, name, 0, [(0, 0.1), (100, 0.3)])
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    report = compare.build_report(plan, out)
    es, pods = report["methods"]["pods_es"], report["methods"]["pods"]
    assert es["signal"]["reward"] == pytest.approx(0.6) and es["runs"][0]["reward_steps_left_out"] == 1
    assert pods["signal"]["reward"] == pytest.approx(0.6) and pods["runs"][0]["reward_steps_left_out"] == 0
    assert pods["signal"]["prompts"] == 12 and pods["signal"]["groups_with_signal"] == 8 and es["signal"]["prompts"] == 8
    assert any(note.startswith("pods_es: the training reward of 1 step is left out") for note in report["notes"])
    assert not any(note.startswith("pods:") for note in report["notes"])
    assert "prompts / step" in compare.format_table(report)


def test_intervals_module_is_a_leaf_shared_by_evaluation_and_compare():
    from test_layout import import_graph

    from podsrl import intervals
    from podsrl.train import evaluate

    graph = import_graph()
    assert graph["podsrl.intervals"] == set()
    assert "podsrl.intervals" in graph["podsrl.train.evaluate"] and "podsrl.intervals" in graph["podsrl.compare.stats"]
    assert evaluate.wilson_interval is intervals.wilson_interval
    assert intervals.Z975 == pytest.approx(1.959964, abs=1e-6)
    # Wilson, 7 of 10: centre (0.7 + z^2/20) / (1 + z^2/10), by hand.
    z = intervals.Z975
    centre = (0.7 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.7 * 0.3 / 10 + z * z / 400) / (1 + z * z / 10)
    assert intervals.wilson_interval(7, 10) == pytest.approx((centre - half, centre + half))
    assert intervals.wilson_interval(0, 0) == (0.0, 1.0)
    # Normal interval of per-problem means (0.25, 0.5, 1.0): mean 0.5833, s^2 = 0.145833; clipped to [0, 1].
    lo, hi = intervals.normal_interval([0.25, 0.5, 1.0])
    half = z * math.sqrt(0.1458333 / 3)
    assert (lo, hi) == pytest.approx((0.5833333 - half, 1.0), abs=1e-6)
    assert intervals.normal_interval([0.5]) == (0.5, 0.5)
    with pytest.raises(ValueError, match="degrees of freedom"):
        intervals.t975(0)


def test_compare_exports_no_private_names():
    assert not [name for name in compare.__all__ if name.startswith("_")]
    assert all(hasattr(compare, name) for name in compare.__all__)


# ------------------------------------------------------------------------- what compare.png says


@pytest.fixture
def drawn_figures(monkeypatch):
    """The figures compare.png is saved from, kept after they are drawn (text extents final)."""
    from matplotlib.figure import Figure

    figures, save = [], Figure.savefig

    def keep(fig, *args, **kwargs):
        save(fig, *args, **kwargs)
        figures.append(fig)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


@pytest.mark.parametrize("samples, band", [(1, "Wilson 95% interval (1 sample per problem)"),
                                           (4, "95% interval over its problems (4 samples per problem: normal, at least Wilson's")])  # fmt: skip
def test_one_seed_band_names_the_interval_evaluation_used(tmp_path, drawn_figures, samples, band):
    """With one seed the band is the run's own interval from eval.jsonl: Wilson's only with one sample
    per problem (podsrl.train.evaluate); the title said Wilson whatever the samples."""
    temperature = {"temperature": 0.0} if samples == 1 else {}
    plan = _plan(tmp_path, seeds=1, base={"eval": {"every_seconds": 100.0, "samples": samples, **temperature}})
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.6)])
    compare.write_report(compare.build_report(plan, out), out)
    title = drawn_figures[-1]._suptitle.get_text()
    assert band in " ".join(title.split()), title  # wrapped over lines
    _assert_title_inside(drawn_figures[-1])


def _assert_title_inside(fig) -> None:
    """The figure's title lies within the figure's width (a long band text ran off both edges)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # closing the figure took its canvas
    canvas.draw()
    extent = fig._suptitle.get_window_extent(canvas.get_renderer())
    assert 0 <= extent.x0 and extent.x1 <= fig.bbox.x1 and extent.y1 <= fig.bbox.y1, (extent, fig.bbox)


def test_difference_labels_stay_inside_their_panel(tmp_path, drawn_figures):
    """A paired difference far from the others had its label centred on it, across the y axis and
    the method names."""
    plan = _mixed_plan(tmp_path)
    out = tmp_path / "out"
    _write_mixed_runs(out, plan)
    report = compare.build_report(plan, out)
    far_left = {"mean": -0.2, "ci95": [-0.21, -0.19], "per_seed": [-0.2, -0.2, -0.2], "seeds": [0, 1, 2], "excludes_zero": True}
    far_right = {**far_left, "mean": 0.3, "ci95": [0.29, 0.31], "per_seed": [0.3] * 3}
    report["methods"]["pods"]["paired_vs_baseline"] = {"auc": far_left, "final_accuracy": far_right}
    report["methods"]["never"]["paired_vs_baseline"] = {"auc": far_right, "final_accuracy": far_left}
    compare.write_report(report, out)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = drawn_figures[-1]
    canvas = FigureCanvasAgg(fig)  # closing the figure took its canvas
    canvas.draw()
    renderer = canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.texts]
    assert len(panels) == 2
    for ax in panels:
        box = ax.get_window_extent(renderer)
        for text in ax.texts:
            extent = text.get_window_extent(renderer)
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1, (text.get_text(), extent, box)


@pytest.mark.parametrize("name", ["compare-long", "compare-vs-trl", "compare-rollouts", "compare-prompts", "compare-loss", "compare-mixed",
                                  "compare-demo-mixed"])  # fmt: skip
def test_the_results_tables_scripts_print_their_tables_from_the_committed_runs(name, capsys, monkeypatch):
    """results/<name>/tables.py (the tables README.md and docs/results.md render from them) still runs
    as a script against podsrl's code and the comparison's committed report and runs: a change to what
    it imports fails here (tests/test_doc_figures.py checks that the pages hold what they render)."""
    import runpy

    script = Path(__file__).resolve().parent.parent / "results" / name / "tables.py"
    monkeypatch.setattr(sys, "argv", [str(script)])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("|---|") >= 1 and re.search(r"[+-]\d+\.\d \[[+-]\d+\.\d, [+-]\d+\.\d\]", out)  # a table, paired intervals in it
