"""``podsrl compare``: methods x seeds under one training wall-clock budget, time-to-accuracy.

    podsrl compare                                    # the embedded default (= configs/compare.toml)
    podsrl compare my.toml --seeds 3 --methods grpo,pods_max_variance --out runs/cmp
    podsrl compare my.toml --out runs/cmp --report-only
    podsrl compare --train.max_seconds=600            # overrides change the shared base config

**Input.** A TOML file holding a base config (the usual sections; ``train.max_seconds`` is the
shared training wall-clock budget, ``eval.every_seconds`` or ``eval.every_steps`` how often the
held-out set is scored) and a ``[compare]`` table::

    [compare]
    seeds = 2                   # seeds per method
    baseline = "grpo"           # the method whose peak sets the target (default "grpo")
    target_fraction = 0.99      # the target is this fraction of the baseline's peak
    [compare.methods]
    grpo = { "select.rule" = "all", "rollout.n" = 4, "select.m" = 4 }
    pods_max_variance = { "select.rule" = "max_variance", "rollout.n" = 16, "select.m" = 4 }

Each method is a table of dotted overrides applied over the base. ``--section.key=value`` on the
command line changes the base (methods still override it). Without a file, or without
``[compare.methods]``, the default methods below (:data:`DEFAULT_COMPARE`) are used. Methods may
not change what must be shared for the comparison to mean anything: the task, the rewards, the
evaluation protocol, the budget and the seed. Every method's resolved config is built before any
training starts, so a typo fails at once with a ConfigError naming the method and the field.

**Protocol.** Every method x seed is an ordinary ``podsrl train`` run in
``OUT/runs/<method>/seed<k>/``, in a process of its own (``--in-process``: in this one), one after
another, seed-major (all methods of seed 0 first, so an interrupted comparison is complete for the
first seeds). Seed k trains with ``train.seed = base
seed + k`` while the task's own ``seed`` option stays fixed (at the base ``train.seed`` unless the
base sets ``task.options.seed``): the held-out problems are the same in every run, only the
training randomness (prompt order, sampling, tie-breaking) varies, and with sampled evaluation
(eval.temperature > 0) the evaluation's samples, which the trainer seeds with train.seed. Re-running the same command
resumes: a finished run (``done.json`` written after ``train`` returned, or an evaluation at the
budget in its eval.jsonl) is skipped, an interrupted one continues from its last checkpoint, one
interrupted before its first checkpoint starts over; ``--seeds`` higher than before adds only the
new seeds. A run directory whose config differs from what the plan now asks for (other than the
budget, which may be raised to extend a comparison) is an error, not silently reused. The methods
run sequentially on one machine, so their wall-clocks are comparable only if the machine's load is
the same throughout; run comparisons on an otherwise idle machine.

**Measurement** (PODS, Xu et al. 2025, Sec. 4; ALGORITHMS.md section 2): accuracy against the
training clock (evaluation time excluded). The target is 0.99 x the baseline's (GRPO's) peak; a
method's time is the first training time at which its accuracy reaches the target, and its speedup
is the baseline's time to the same target divided by the method's.

Choices made where the paper is silent (it reports one run per method):

- **Seed-mean curve first, then the peak.** A method's curve is the mean over seeds at common
  points; its peak is the maximum of that mean curve, and times are read on it. The alternative,
  per-seed peaks averaged, is biased upwards by evaluation noise (a max of noisy values), and
  per-seed times cannot be combined when some seed never reaches the target. The mean of the
  per-seed peaks is reported too (``peak_per_seed``), for information.
- **Common points.** With time-based evaluation (``eval.every_seconds``, no ``every_steps``)
  evaluation i happens at about i x every_seconds in every seed, so the seeds' curves are aligned
  by evaluation index: point i is (mean of the seeds' i-th training times, mean of their i-th
  accuracies). Otherwise (step-based evaluation, or seeds with different numbers of evaluations,
  which clock drift can cause) every seed's curve is linearly interpolated onto the union of the
  seeds' evaluation times, restricted to the range all seeds cover (no extrapolation).
- **Time to target** is the time of the first point of the mean curve at or above the target, not
  interpolated between evaluations (the paper reads evaluation points). None if never reached.
  When the untrained model (time 0) already meets the target, no speed-up is measurable: the
  speedup is None with a note.
- **Intervals.** The peak's 95% interval is a Student-t interval over the seeds' accuracies at the
  peak point (mean +- t_{0.975, k-1} s / sqrt(k)). With one seed there is no interval over seeds;
  the report says so, and the plot's band is then that run's own Wilson interval per evaluation.

**Output** in OUT: ``compare.json`` (per method: settings, peak and interval, time to target,
speedup, steps, median seconds per step and of its generate and update phases from each run's
metrics.jsonl, the mean curve and every run's curve), ``compare.png`` (accuracy against training
minutes, seed mean and 95% band, one line per method, the target dotted) and a printed table.
"""

from __future__ import annotations

import bisect
import copy
import inspect
import json
import math
import shutil
import statistics
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podsrl import checkpoint as ckpt
from podsrl import config as config_mod
from podsrl.config import Config
from podsrl.errors import ConfigError
from podsrl.logging import read_jsonl

# The embedded default comparison; configs/compare.toml is the same written as a file (a test
# checks they agree). Sized for the embedded 135M model on a CPU: 10 minutes of training per run
# (the demo's budget), evaluated every minute.
_D3S_SCHEDULE = {
    "select.m_final": 8,
    "select.m_schedule": "linear",
    "select.token_fraction": 0.5,
    "select.token_fraction_final": 1.0,
    "select.token_schedule": "linear",
}
DEFAULT_METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"select.rule": "all", "rollout.n": 4, "select.m": 4},
    "pods_max_variance": {"select.rule": "max_variance", "rollout.n": 16, "select.m": 4},
    "pods_random": {"select.rule": "random", "rollout.n": 16, "select.m": 4},
    "pods_max_reward": {"select.rule": "max_reward", "rollout.n": 16, "select.m": 4},
    "d3s_intra": {"select.rule": "d3s_intra", "rollout.n": 16, "select.m": 4, **_D3S_SCHEDULE},
    "d3s_cross": {"select.rule": "d3s_cross", "rollout.n": 16, "select.m": 4, **_D3S_SCHEDULE},
}
DEFAULT_COMPARE: dict[str, Any] = {
    "train": {"max_steps": None, "max_seconds": 600.0},
    "eval": {"every_seconds": 60.0},
    "compare": {"seeds": 2, "baseline": "grpo", "target_fraction": 0.99, "methods": DEFAULT_METHODS},
}

# What a method may not override: the comparison's shared ground.
_SHARED_PREFIXES = ("task.", "reward.", "eval.", "train.seed", "train.max_seconds", "train.max_steps")
# Settings that may differ between a run directory's config and the plan: the budget (raising it
# extends a comparison) and cosmetics.
_MAY_DIFFER = {"train.max_seconds", "train.max_steps", "train.progress", "train.out_dir"}
_COMPARE_KEYS = {"seeds", "baseline", "target_fraction", "methods"}
DONE_FILE = "done.json"

# Two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30 (no scipy dependency).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The plan: base config, methods, seeds


@dataclass(frozen=True)
class Method:
    name: str
    overrides: dict[str, Any]  # dotted setting -> value, applied over the base


@dataclass(frozen=True)
class Plan:
    base: dict[str, Any]  # config sections (no [compare]), CLI overrides applied
    methods: list[Method]  # the ones to run and report, in order
    all_methods: dict[str, Method]
    seeds: int
    baseline: str
    target_fraction: float = 0.99
    configs: dict[tuple[str, int], Config] = field(default_factory=dict, repr=False)

    def config(self, method: str, seed: int) -> Config:
        if (method, seed) not in self.configs:
            self.configs[(method, seed)] = resolve(self.base, self.all_methods[method], seed)
        return self.configs[(method, seed)]


def load_plan(
    path: str | Path | None = None,
    overrides: list[str] = (),
    *,
    seeds: int | None = None,
    methods: str | list[str] | None = None,
) -> Plan:
    """Read and validate a comparison: every method's config (seed 0) is built here, so a bad
    setting fails before any training. ``methods``: a subset, comma-separated or a list."""
    if path is None:
        data = copy.deepcopy(DEFAULT_COMPARE)
    else:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"comparison file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"comparison file {path}: invalid TOML: {err}") from err
    table = data.pop("compare", {})
    if not isinstance(table, dict):
        raise ConfigError("[compare] must be a table with seeds, baseline, target_fraction and methods")
    unknown = set(table) - _COMPARE_KEYS
    if unknown:
        raise ConfigError(f"unknown setting compare.{sorted(unknown)[0]}; valid settings in [compare]: {', '.join(sorted(_COMPARE_KEYS))}")
    for key, raw in config_mod.parse_overrides(overrides):
        config_mod.set_dotted(data, key, raw, from_text=True)

    n_seeds = seeds if seeds is not None else table.get("seeds", DEFAULT_COMPARE["compare"]["seeds"])
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        raise ConfigError(f"compare.seeds: must be a whole number >= 1, got {n_seeds!r}")
    fraction = table.get("target_fraction", 0.99)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError(f"compare.target_fraction: must be in (0, 1], got {fraction!r}")
    raw_methods = table.get("methods", DEFAULT_METHODS)
    if not isinstance(raw_methods, dict) or not raw_methods:
        raise ConfigError('compare.methods: give a table of named methods, e.g. grpo = { "select.rule" = "all" }')
    all_methods = {}
    for name, over in raw_methods.items():
        if not isinstance(over, dict):
            raise ConfigError(f"compare.methods.{name}: must be a table of dotted settings, got {over!r}")
        all_methods[name] = Method(name, dict(over))
    baseline = table.get("baseline", "grpo")
    if baseline not in all_methods:
        raise ConfigError(f"compare.baseline: {baseline!r} is not a method; methods: {', '.join(all_methods)}")

    if methods is None:
        chosen = list(all_methods)
    else:
        chosen = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
        bad = [m for m in chosen if m not in all_methods]
        if bad or not chosen:
            raise ConfigError(f"--methods: unknown method {bad[0] if bad else '(none)'!r}; methods: {', '.join(all_methods)}")

    base_cfg = _from_dict(data, "the base config")
    if base_cfg.train.max_seconds is None:
        raise ConfigError("train.max_seconds: a comparison needs the shared training wall-clock budget; set e.g. train.max_seconds = 1200")
    if not (base_cfg.eval.every_seconds or base_cfg.eval.every_steps):
        raise ConfigError("eval.every_seconds: a comparison needs held-out evaluations during training; set eval.every_seconds (or eval.every_steps)")
    plan = Plan(base=data, methods=[all_methods[m] for m in chosen], all_methods=all_methods, seeds=n_seeds,
                baseline=baseline, target_fraction=float(fraction))  # fmt: skip
    for method in all_methods.values():  # every method, chosen or not: a typo fails now
        plan.config(method.name, 0)
    return plan


def resolve(base: dict[str, Any], method: Method, seed: int) -> Config:
    """The Config of ``method`` for seed index ``seed`` (train.seed = base seed + seed)."""
    data = copy.deepcopy(base)
    where = f"compare.methods.{method.name}"
    for dotted, value in method.overrides.items():
        if any(dotted == p or dotted.startswith(p) for p in _SHARED_PREFIXES):
            raise ConfigError(
                f"{where}: {dotted!r} must be the same for every method (task, rewards, evaluation, budget and seed "
                "are the comparison's shared ground); set it in the base config instead"
            )
        config_mod.set_dotted(data, dotted, value, from_text=False, where=where)
    base_cfg = _from_dict(base, "the base config")
    data.setdefault("train", {})["seed"] = base_cfg.train.seed + seed
    from podsrl.tasks import TASKS

    if "seed" in inspect.signature(TASKS[base_cfg.task.name]).parameters:
        # The held-out set is drawn with the task's seed (the trainer defaults it to train.seed):
        # pin it to the base's, so every seed is scored on the same problems.
        data.setdefault("task", {})["options"] = {"seed": base_cfg.train.seed, **base_cfg.task.options}
    return _from_dict(data, where)


def _from_dict(data: dict[str, Any], where: str) -> Config:
    try:
        return config_mod.from_dict(copy.deepcopy(data))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


# ---------------------------------------------------------------------------------------------
# Running: every method x seed, resumable


def run_dir(out: Path, method: str, seed: int) -> Path:
    return Path(out) / "runs" / method / f"seed{seed}"


def run_status(path: Path, cfg: Config) -> str:
    """"new", "done", "resume" (has a checkpoint) or "restart" (started, no checkpoint)."""
    path = Path(path)
    if not (path / "config.toml").is_file():
        return "new"
    _check_same_config(path, cfg)
    if is_finished(path, cfg):
        return "done"
    return "resume" if ckpt.latest(path) is not None else "restart"


def is_finished(path: Path, cfg: Config) -> bool:
    """Trained to ``cfg``'s budget: our done marker for that budget, or an evaluation at the budget
    (a periodic evaluation never happens at or past the budget, so it is the final one)."""
    done = Path(path) / DONE_FILE
    if done.is_file() and json.loads(done.read_text()) == _budget(cfg):
        return True
    evals = read_jsonl(Path(path) / "eval.jsonl")
    if not evals:
        return False
    last, t = evals[-1], cfg.train
    return bool((t.max_seconds and last["train_seconds"] >= t.max_seconds) or (t.max_steps and last["step"] >= t.max_steps))


def _budget(cfg: Config) -> dict[str, Any]:
    return {"max_seconds": cfg.train.max_seconds, "max_steps": cfg.train.max_steps}


def _check_same_config(path: Path, cfg: Config) -> None:
    try:
        existing = config_mod.load(path / "config.toml").to_dict()
    except ConfigError as err:
        raise ConfigError(f"{path}: its config.toml does not load ({err}); use another --out or delete that run") from None
    wanted = cfg.to_dict()
    differ = [
        f"{section}.{key}"
        for section, values in wanted.items()
        for key, value in values.items()
        if f"{section}.{key}" not in _MAY_DIFFER and existing.get(section, {}).get(key) != value
    ]
    if differ:
        raise ConfigError(
            f"{path} was trained with a different config ({', '.join(differ)} differ from the plan); "
            "use another --out for a changed comparison, or delete that run directory"
        )


class RunFailed(Exception):
    """A method x seed's training process exited with an error (its own output says why)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def run_all(plan: Plan, out: Path, *, log=print, isolate: bool = True) -> None:
    """Train every method x seed not finished yet, seed-major; the report is refreshed after each.

    ``isolate``: each run is its own ``podsrl train`` process, so every run starts from the same
    clean state (memory, threads, an in-process vLLM engine's allocations) and a crash loses only
    that run. ``False`` trains in this process (tests, debugging)."""
    from podsrl.trainer import train

    jobs = [(seed, m.name) for seed in range(plan.seeds) for m in plan.methods]
    for i, (seed, name) in enumerate(jobs, 1):
        cfg = plan.config(name, seed)
        path = run_dir(out, name, seed)
        status = run_status(path, cfg)
        head = f"podsrl compare: [{i}/{len(jobs)}] {name} seed {seed} (train.seed={cfg.train.seed})"
        if status == "done":
            log(f"{head}: finished earlier, skipped")
            continue
        if status == "restart":  # interrupted before its first checkpoint: nothing to resume
            shutil.rmtree(path)
        log(f"{head}: {'resuming' if status == 'resume' else 'training'}, budget {cfg.train.max_seconds / 60:.1f} min -> {path}")
        if isolate:
            _train_subprocess(cfg, path, resume=status == "resume", what=f"{name} seed {seed}")
        else:
            train(cfg, run_dir=path, resume=status == "resume", log=log)
        (path / DONE_FILE).write_text(json.dumps(_budget(cfg)))
        write_report(build_report(plan, out), out)


def _train_subprocess(cfg: Config, path: Path, *, resume: bool, what: str) -> None:
    """``podsrl train`` in a child process (same interpreter), its output passed through."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="podsrl-compare-") as tmp:
        job = Path(tmp) / "config.toml"
        job.write_text(config_mod.to_toml(cfg))
        where = ["--resume", str(path)] if resume else ["--out", str(path)]
        rc = subprocess.run([sys.executable, "-m", "podsrl.cli", "train", str(job), *where, "--no-plot"]).returncode
    if rc != 0:
        raise RunFailed(
            f"podsrl compare: the run {what} ({path}) failed with exit code {rc} (its output is above); "
            "finished runs are kept: fix the cause and run the same command again to go on",
            rc,
        )


# ---------------------------------------------------------------------------------------------
# Report math (pure: lists of eval rows in, numbers out)


@dataclass
class Curve:
    """A method's seed-mean accuracy curve at common points."""

    train_seconds: list[float]  # [P]
    accuracy: list[float]  # [P] mean over seeds
    per_seed: list[list[float]]  # [S][P] each seed's accuracy at the points
    band_low: list[float]  # [P] 95% band: t over seeds, or the run's Wilson interval for one seed
    band_high: list[float]  # [P]
    aligned_by: str  # "index" or "interpolation"


def t_interval(values: list[float]) -> tuple[float, float] | None:
    """95% Student-t interval for the mean of ``values``; None for fewer than two."""
    k = len(values)
    if k < 2:
        return None
    mean = statistics.fmean(values)
    half = _t975(k - 1) * statistics.stdev(values) / math.sqrt(k)
    return mean - half, mean + half


def _t975(df: int) -> float:
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion in 1/df; within 1e-3 of the exact quantile for df > 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_curve(runs: list[list[dict]], *, time_based_eval: bool) -> Curve:
    """Seed-mean of eval.jsonl rows (``train_seconds``, ``accuracy``; ``ci_low``/``ci_high`` for
    one seed). Aligned by index when evaluation is time-based and all seeds have as many points,
    else interpolated onto the union of the seeds' times within their common range."""
    runs = [sorted(r, key=lambda row: row["train_seconds"]) for r in runs if r]
    if not runs:
        return Curve([], [], [], [], [], "index")
    if len(runs) == 1:
        rows = runs[0]
        acc = [r["accuracy"] for r in rows]
        return Curve([r["train_seconds"] for r in rows], acc, [acc],
                     [r.get("ci_low", a) for r, a in zip(rows, acc)], [r.get("ci_high", a) for r, a in zip(rows, acc)], "index")  # fmt: skip
    if time_based_eval and len({len(r) for r in runs}) == 1:
        times = [statistics.fmean(r[i]["train_seconds"] for r in runs) for i in range(len(runs[0]))]
        per_seed = [[row["accuracy"] for row in r] for r in runs]
        aligned = "index"
    else:
        lo = max(r[0]["train_seconds"] for r in runs)
        hi = min(r[-1]["train_seconds"] for r in runs)
        times = sorted({row["train_seconds"] for r in runs for row in r if lo <= row["train_seconds"] <= hi})
        per_seed = [_interp(times, [row["train_seconds"] for row in r], [row["accuracy"] for row in r]) for r in runs]
        aligned = "interpolation"
    mean = [statistics.fmean(col) for col in zip(*per_seed)]
    bands = [t_interval(list(col)) for col in zip(*per_seed)]
    return Curve(times, mean, per_seed, [b[0] for b in bands], [b[1] for b in bands], aligned)


def _interp(x: list[float], xp: list[float], fp: list[float]) -> list[float]:
    """Piecewise-linear interpolation of (xp, fp) at x; xp ascending, ends held constant."""
    out = []
    for t in x:
        j = bisect.bisect_right(xp, t)  # xp[j-1] <= t < xp[j]
        if j == 0:
            out.append(fp[0])
        elif j == len(xp):
            out.append(fp[-1])
        else:
            w = (t - xp[j - 1]) / (xp[j] - xp[j - 1])
            out.append(fp[j - 1] + w * (fp[j] - fp[j - 1]))
    return out


def peak(curve: Curve) -> tuple[int, float] | None:
    """(index, accuracy) of the curve's maximum (the first, if tied); None for an empty curve."""
    if not curve.accuracy:
        return None
    i = max(range(len(curve.accuracy)), key=lambda j: (curve.accuracy[j], -j))
    return i, curve.accuracy[i]


def time_to_target(curve: Curve, target: float) -> float | None:
    """Training seconds of the first point of the mean curve at or above ``target``; None if never."""
    for t, acc in zip(curve.train_seconds, curve.accuracy):
        if acc >= target - 1e-12:
            return t
    return None


def speedup(baseline_time: float | None, method_time: float | None) -> float | None:
    """Baseline's time to the target over the method's; None when either is missing or zero."""
    if baseline_time is None or method_time is None or baseline_time <= 0 or method_time <= 0:
        return None
    return baseline_time / method_time


# ---------------------------------------------------------------------------------------------
# Report: compare.json, compare.png, the table


def build_report(plan: Plan, out: Path) -> dict[str, Any]:
    """Rebuild the report from the finished runs of seeds 0..plan.seeds-1 in ``out``."""
    out = Path(out)
    names = [m.name for m in plan.methods]
    if plan.baseline not in names:
        names.append(plan.baseline)  # its finished runs, if any, set the target
    entries: dict[str, dict[str, Any]] = {}
    curves: dict[str, Curve] = {}
    for name in names:
        entry, curve = _method_entry(plan, out, name)
        if name == plan.baseline and name not in [m.name for m in plan.methods] and not entry["runs"]:
            continue
        entries[name], curves[name] = entry, curve

    base = entries.get(plan.baseline)
    base_peak = base["peak_accuracy"] if base else None
    target = plan.target_fraction * base_peak if base_peak is not None else None
    base_time = time_to_target(curves[plan.baseline], target) if target is not None else None
    notes = []
    if base_peak is None:
        notes.append(f"no finished run of the baseline {plan.baseline!r}: no target, no times or speedups")
    elif base_time == 0:
        notes.append("the untrained model already meets the target (time 0): no speedup is measurable")
    for name, entry in entries.items():
        t = time_to_target(curves[name], target) if target is not None else None
        entry["time_to_target_seconds"] = t
        entry["speedup"] = speedup(base_time, t)
        if t == 0:
            entry["note"] = "the target is met at time 0 (before training): no speedup"
    cfg = plan.config(plan.methods[0].name, 0)
    return {
        "baseline": plan.baseline,
        "baseline_peak_accuracy": base_peak,
        "target_fraction": plan.target_fraction,
        "target_accuracy": target,
        "budget_seconds": cfg.train.max_seconds,
        "eval_problems": _eval_problems(entries),
        "seeds": plan.seeds,
        "definitions": {
            "peak": "max over evaluation points of the seed-mean accuracy curve; 95% CI: Student-t over the seeds' accuracies at that point",
            "time_to_target": "first training time (evaluation excluded) at which the seed-mean curve reaches target_accuracy",
            "speedup": "baseline time_to_target / method time_to_target",
            "alignment": "seeds aligned by evaluation index (time-based evaluation, equal counts), else linearly interpolated onto the union of evaluation times",
        },
        "notes": notes,
        "methods": entries,
    }


def _method_entry(plan: Plan, out: Path, name: str) -> tuple[dict[str, Any], Curve]:
    cfg0 = plan.config(name, 0)
    runs, rows_per_run, missing, all_metrics = [], [], [], []
    for seed in range(plan.seeds):
        cfg = plan.config(name, seed)
        path = run_dir(out, name, seed)
        if not (path / "config.toml").is_file() or not is_finished(path, cfg):
            missing.append(seed)
            continue
        _check_same_config(path, cfg)
        evals = read_jsonl(path / "eval.jsonl")
        metrics = read_jsonl(path / "metrics.jsonl")
        all_metrics += metrics
        steps = max([r["step"] for r in metrics] + [r["step"] for r in evals] + [0])
        rows_per_run.append(evals)
        runs.append({
            "seed": seed,
            "train_seed": cfg.train.seed,
            "dir": str(path),
            "steps": steps,
            "train_seconds": [r["train_seconds"] for r in evals],
            "accuracy": [r["accuracy"] for r in evals],
            "problems": evals[-1]["problems"] if evals else None,
            "peak_accuracy": max((r["accuracy"] for r in evals), default=None),
            "median_seconds": _median_phase_seconds(metrics),
        })  # fmt: skip
    e = cfg0.eval
    curve = mean_curve(rows_per_run, time_based_eval=bool(e.every_seconds) and not e.every_steps)
    top = peak(curve)
    ci, ci_note = None, None
    if top is not None:
        ci = t_interval([seed_acc[top[0]] for seed_acc in curve.per_seed])
        if len(runs) == 1:
            ci_note = "1 seed: no confidence interval over seeds"
    sel = cfg0.select
    entry = {
        "overrides": plan.all_methods[name].overrides,
        "rule": sel.rule,
        "n": cfg0.rollout.n,
        "m": sel.m,
        "m_final": sel.m_final if sel.m_final not in (None, sel.m) else None,
        "token_fraction": [sel.token_fraction, sel.token_fraction_final or sel.token_fraction] if sel.uses_token_selection else None,
        "seeds_done": [r["seed"] for r in runs],
        "seeds_missing": missing,
        "peak_accuracy": top[1] if top else None,
        "peak_ci95": list(ci) if ci else None,
        "peak_train_seconds": curve.train_seconds[top[0]] if top else None,
        "peak_per_seed": [r["peak_accuracy"] for r in runs],
        "steps": [r["steps"] for r in runs],
        "median_seconds": _median_phase_seconds(all_metrics),
        "curve": {
            "aligned_by": curve.aligned_by,
            "train_seconds": curve.train_seconds,
            "accuracy": curve.accuracy,
            "band_low": curve.band_low,
            "band_high": curve.band_high,
        },
        "runs": runs,
    }
    if ci_note:
        entry["peak_ci_note"] = ci_note
    return entry, curve


PHASES = ("step", "generate", "update")


def _median_phase_seconds(metrics: list[dict]) -> dict[str, float | None]:
    """Median seconds per training step of the whole step and of its generate and update phases
    (``time/<phase>`` in metrics.jsonl, over every logged step): what explains a speedup."""
    out = {}
    for phase in PHASES:
        values = [r[f"time/{phase}"] for r in metrics if isinstance(r.get(f"time/{phase}"), (int, float))]
        out[phase] = statistics.median(values) if values else None
    return out


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
    json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    return json_path, plot_report(report, out / "compare.png")


def plot_report(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    for i, (name, entry) in enumerate(report["methods"].items()):
        c = entry["curve"]
        if not c["train_seconds"]:
            continue
        minutes = [t / 60 for t in c["train_seconds"]]
        k = len(entry["runs"])
        ax.plot(minutes, [100 * a for a in c["accuracy"]], "o-", ms=3, color=f"C{i % 10}", label=f"{name} ({k} seed{'s' * (k != 1)})")
        if all(v is not None for v in c["band_low"] + c["band_high"]):
            low = [100 * max(0.0, v) for v in c["band_low"]]  # a t-band can leave [0, 1]; accuracy cannot
            high = [100 * min(1.0, v) for v in c["band_high"]]
            ax.fill_between(minutes, low, high, color=f"C{i % 10}", alpha=0.15)
    if report["target_accuracy"] is not None:
        ax.axhline(100 * report["target_accuracy"], color="gray", ls=":", lw=1,
                   label=f"{100 * report['target_fraction']:.0f}% of {report['baseline']}'s peak")  # fmt: skip
    seeds = {len(e["runs"]) for e in report["methods"].values()}
    band = "95% t-band over seeds" if seeds != {1} else "band: the run's Wilson 95% interval (1 seed)"
    ax.set(xlabel="training wall-clock, minutes (evaluation excluded)", ylabel="held-out accuracy %",
           title=f"held-out accuracy, seed mean ({band})")  # fmt: skip
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _format_phases(med: dict[str, float | None]) -> str:
    if med.get("step") is None:
        return "-"
    parts = ", ".join("-" if med.get(p) is None else f"{med[p]:.1f}" for p in ("generate", "update"))
    return f"{med['step']:.1f} ({parts})"


def format_table(report: dict[str, Any]) -> str:
    rows = [("method", "rule", "n", "m", "peak acc (95% CI)", f"t to {100 * report['target_fraction']:.0f}% {report['baseline']} peak", "speedup", "steps", "s/step (generate, update)")]
    for name, e in report["methods"].items():
        m = f"{e['m']}->{e['m_final']}" if e["m_final"] else str(e["m"])
        if e["peak_accuracy"] is None:
            acc = "no finished run"
        elif e["peak_ci95"]:
            low, high = (100 * min(1.0, max(0.0, v)) for v in e["peak_ci95"])  # a t-interval can leave [0, 1]
            acc = f"{100 * e['peak_accuracy']:.1f}% [{low:.1f}, {high:.1f}]"
        else:
            acc = f"{100 * e['peak_accuracy']:.1f}% (1 seed, no CI)"
        t = e["time_to_target_seconds"]
        s = e["speedup"]
        rows.append((
            name, e["rule"], str(e["n"]), m, acc,
            "never" if t is None and report["target_accuracy"] is not None else ("-" if t is None else f"{t / 60:.1f} min"),
            "-" if s is None else f"{s:.2f}x",
            ", ".join(map(str, e["steps"])) or "-",
            _format_phases(e.get("median_seconds") or {}),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = []
    if report["target_accuracy"] is not None:
        head.append(
            f"target: {100 * report['target_fraction']:.0f}% of {report['baseline']}'s peak "
            f"{100 * report['baseline_peak_accuracy']:.1f}% = {100 * report['target_accuracy']:.1f}% held-out accuracy; "
            f"budget {report['budget_seconds'] / 60:.1f} min of training per run"
        )
    return "\n".join(head + lines + [f"note: {n}" for n in report["notes"]])


# ---------------------------------------------------------------------------------------------
# Entry point (``podsrl compare``, wired in podsrl/cli.py)


def main(args, overrides: list[str]) -> int:
    plan = load_plan(getattr(args, "config", None), overrides, seeds=getattr(args, "seeds", None), methods=getattr(args, "methods", None))
    out = Path(getattr(args, "out", None) or "runs/compare")
    if not getattr(args, "report_only", False):
        try:
            run_all(plan, out, isolate=not getattr(args, "in_process", False))
        except KeyboardInterrupt:
            print("\npodsrl compare: interrupted; run the same command again to resume where it stopped")
            return 130
        except RunFailed as err:
            print(err, file=sys.stderr)
            return err.returncode
    report = build_report(plan, out)
    json_path, png_path = write_report(report, out)
    print("\n" + format_table(report))
    print(f"\npodsrl compare: wrote {json_path} and {png_path}")
    return 0
