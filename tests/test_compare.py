"""``podsrl compare``: the report math on hand-written run directories (peak, time to the baseline's
99% peak, speedup, never-reached, intervals, alignment), the resume logic (finished runs skipped,
interrupted ones resumed, new seeds added), config validation naming the method, and one tiny
end-to-end comparison on the random 2-layer model from conftest.py.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from podsrl import compare
from podsrl.config import _toml_value, to_toml
from podsrl.errors import ConfigError

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


def _plan(tmp_path: Path, *, seeds: int = 2, table: dict | None = None, base: dict | None = None, **kw) -> compare.Plan:
    data = {
        "train": {"max_steps": None, "max_seconds": 300.0},
        "eval": {"every_seconds": 100.0},
        **(base or {}),
        "compare": {"seeds": seeds, "methods": table or METHODS},
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
        (path / compare.DONE_FILE).write_text(json.dumps(compare._budget(cfg)))
    return path


# ----------------------------------------------------------------------------------- report math


def test_report_peak_time_to_target_speedup_and_never(tmp_path):
    plan = _plan(tmp_path)
    out = tmp_path / "out"
    # GRPO: seed means 0.2, 0.55, 0.70, 0.80 at mean times 0, 101, 202, 303 -> peak 0.80 at 303 s.
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.8), (300, 0.7)])
    _write_run(out, plan, "grpo", 1, [(0, 0.2), (102, 0.6), (204, 0.6), (306, 0.9)])
    # PODS: mean 0.2, 0.80 (>= 0.99 x 0.80 = 0.792) at 101 s -> 3x faster; peak 0.875 at 303 s.
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
    assert g["time_to_target_seconds"] == pytest.approx(303) and g["speedup"] == pytest.approx(1.0)
    assert p["time_to_target_seconds"] == pytest.approx(101)
    assert p["speedup"] == pytest.approx(3.0)
    assert p["peak_accuracy"] == pytest.approx(0.875) and p["peak_train_seconds"] == pytest.approx(303)
    assert nv["time_to_target_seconds"] is None and nv["speedup"] is None
    assert nv["peak_accuracy"] == pytest.approx(0.5)
    # t-interval over the seeds at GRPO's peak point (0.7, 0.9): 0.8 +- 12.706 * 0.1414 / sqrt(2).
    half = 12.706 * math.sqrt(0.02) / math.sqrt(2)
    assert g["peak_ci95"] == pytest.approx([0.8 - half, 0.8 + half])
    assert g["peak_per_seed"] == [0.8, 0.9] and g["steps"] == [30, 30]
    assert g["curve"]["aligned_by"] == "index" and g["runs"][1]["accuracy"] == [0.2, 0.6, 0.6, 0.9]
    assert [r["train_seed"] for r in g["runs"]] == [0, 1]
    # Steps 1..29 of each seed: time/step 4, 3, 4, ... (15 x 4.0, 14 x 3.0) -> median 4.0.
    assert g["median_seconds"] == {"step": 4.0, "generate": 1.0, "update": 3.0}
    assert g["runs"][0]["median_seconds"] == {"step": 4.0, "generate": 1.0, "update": 3.0}

    json_path, png_path = compare.write_report(report, out)
    assert json.loads(json_path.read_text())["methods"]["pods"]["speedup"] == pytest.approx(3.0)
    assert png_path.stat().st_size > 0
    table = compare.format_table(report)
    assert "3.00x" in table and "never" in table and "79.2%" in table and "4.0 (1.0, 3.0)" in table


def test_one_seed_has_no_interval_over_seeds_and_says_so(tmp_path):
    plan = _plan(tmp_path, seeds=1)
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.2), (100, 0.5), (200, 0.6)])
    report = compare.build_report(plan, out)
    g = report["methods"]["grpo"]
    assert g["peak_ci95"] is None and "1 seed" in g["peak_ci_note"]
    assert g["curve"]["band_low"] == pytest.approx([0.1, 0.4, 0.5])  # the run's own Wilson interval
    assert "1 seed, no CI" in compare.format_table(report)
    assert report["methods"]["pods"]["peak_accuracy"] is None  # not run: reported as missing
    assert report["methods"]["pods"]["seeds_missing"] == [0]


def test_unequal_evaluation_counts_are_interpolated_on_the_common_range():
    a = [{"train_seconds": 0, "accuracy": 0.0}, {"train_seconds": 100, "accuracy": 1.0}, {"train_seconds": 200, "accuracy": 1.0}]
    b = [{"train_seconds": 0, "accuracy": 0.0}, {"train_seconds": 50, "accuracy": 0.5}, {"train_seconds": 150, "accuracy": 0.5},
         {"train_seconds": 180, "accuracy": 0.7}]  # fmt: skip
    c = compare.mean_curve([a, b], time_based_eval=True)
    assert c.aligned_by == "interpolation"
    assert c.train_seconds == [0, 50, 100, 150, 180]  # union, clipped to [0, min(200, 180)]
    assert c.per_seed[0] == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0])
    assert c.per_seed[1] == pytest.approx([0.0, 0.5, 0.5, 0.5, 0.7])
    assert c.accuracy == pytest.approx([0.0, 0.5, 0.75, 0.75, 0.85])
    assert compare.time_to_target(c, 0.75) == 100 and compare.time_to_target(c, 0.8) == 180
    # Step-based evaluation is interpolated even with equal counts.
    assert compare.mean_curve([a, a], time_based_eval=False).aligned_by == "interpolation"


def test_target_met_before_training_gives_no_speedup(tmp_path):
    plan = _plan(tmp_path, seeds=1)
    out = tmp_path / "out"
    _write_run(out, plan, "grpo", 0, [(0, 0.6), (100, 0.5), (200, 0.55)])
    _write_run(out, plan, "pods", 0, [(0, 0.6), (100, 0.7), (200, 0.7)])
    report = compare.build_report(plan, out)
    assert report["methods"]["pods"]["time_to_target_seconds"] == 0
    assert report["methods"]["pods"]["speedup"] is None
    assert any("time 0" in n for n in report["notes"])


def test_t_interval_and_quantiles():
    assert compare.t_interval([0.5]) is None
    lo, hi = compare.t_interval([1.0, 2.0, 3.0])
    assert (lo + hi) / 2 == pytest.approx(2.0) and hi - 2.0 == pytest.approx(4.303 / math.sqrt(3))
    assert compare._t975(30) == pytest.approx(2.042)
    assert compare._t975(60) == pytest.approx(2.000, abs=1e-3) and compare._t975(120) == pytest.approx(1.980, abs=1e-3)


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
    import podsrl.trainer

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

    monkeypatch.setattr(podsrl.trainer, "train", fake_train)
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
        ({"select.m": 32}, r"compare.methods.bad: select.m: = 32 exceeds rollout.n"),
        ({"rollout.n": "sixteen"}, r"compare.methods.bad: rollout.n: expected a whole number"),
        ({"selekt.m": 2}, r"compare.methods.bad: unknown config section \[selekt\]"),
        ({"task.name": "gsm8k"}, r"compare.methods.bad: 'task.name' must be the same for every method"),
        ({"train.seed": 3}, r"compare.methods.bad: 'train.seed' must be the same"),
    ],
)
def test_a_bad_method_fails_before_training_naming_method_and_field(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        _plan(tmp_path, table={**METHODS, "bad": {"rollout.n": 16, **override}}, methods="grpo")


def test_plan_validation_errors(tmp_path):
    with pytest.raises(ConfigError, match="train.max_seconds: a comparison needs"):
        _plan(tmp_path, base={"train": {"max_steps": 10, "max_seconds": None}})
    with pytest.raises(ConfigError, match="eval.every_seconds: a comparison needs"):
        _plan(tmp_path, base={"eval": {"every_seconds": 0.0}})
    with pytest.raises(ConfigError, match="--methods: unknown method 'podz'; methods: grpo, pods, never"):
        compare.load_plan(_write_plan_file(tmp_path), methods="grpo,podz")
    with pytest.raises(ConfigError, match="compare.baseline: 'gpro' is not a method"):
        compare.load_plan(_write_plan_file(tmp_path, baseline="gpro"))
    with pytest.raises(ConfigError, match="unknown setting compare.seed;"):
        compare.load_plan(_write_plan_file(tmp_path, seed=2))
    with pytest.raises(ConfigError, match="compare.seeds: must be a whole number >= 1"):
        compare.load_plan(_write_plan_file(tmp_path), seeds=0)
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


@pytest.mark.usefixtures("one_thread")
def test_tiny_comparison_end_to_end_and_rerun_skips(tmp_path, tiny_model_dir, reward_file, capsys):
    from conftest import tiny_config_dict

    base = tiny_config_dict(tiny_model_dir, reward_file)
    base["train"].update(max_steps=2, max_seconds=600.0, checkpoint_every=0)
    base["eval"].update(every_steps=1)
    data = {**base, "compare": {"seeds": 1, "methods": {
        "grpo": {"select.rule": "all", "rollout.n": 2, "select.m": 2},
        "pods_max_variance": {"select.rule": "max_variance", "rollout.n": 4, "select.m": 2},
    }}}  # fmt: skip
    path = tmp_path / "tiny.toml"
    path.write_text(_toml(data))
    out = tmp_path / "cmp"
    args = argparse.Namespace(config=str(path), out=str(out), seeds=None, methods=None, report_only=False)
    assert compare.main(args, []) == 0
    report = json.loads((out / "compare.json").read_text())
    for name in ("grpo", "pods_max_variance"):
        entry = report["methods"][name]
        assert entry["steps"] == [2] and len(entry["runs"][0]["accuracy"]) == 3  # at start, step 1, end
        assert (out / "runs" / name / "seed0" / compare.DONE_FILE).is_file()
    assert (out / "compare.png").stat().st_size > 0
    capsys.readouterr()
    assert compare.main(args, []) == 0  # everything finished: skipped, report rebuilt
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2
    args.report_only = True
    assert compare.main(args, []) == 0


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
