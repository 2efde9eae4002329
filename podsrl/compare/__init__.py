"""``podsrl compare``: methods x seeds under one shared budget; accuracy against optimizer steps and
against training wall-clock, the step and time at which each method reaches the baseline's peak,
and two robust summaries (AUC, final accuracy) over seeds and paired against the baseline by seed.

    podsrl compare                                    # the embedded default (= configs/compare.toml)
    podsrl compare configs/compare-2digit.toml --out runs/compare-2digit
    podsrl compare configs/compare-2digit.toml --seeds 3,grpo=5 --out runs/compare-2digit
    podsrl compare my.toml --seeds 3 --methods grpo,pods_max_variance --out runs/cmp
    podsrl compare my.toml --out runs/cmp --parallel 4 --devices 0,1,2,3   # one run per GPU
    podsrl compare my.toml --out runs/cmp --report-only
    podsrl compare --train.max_seconds=600            # overrides change the shared base config

**Input.** A TOML file holding a base config (the usual sections; ``train.max_steps`` and/or
``train.max_seconds`` is the shared budget, whichever comes first, ``eval.every_steps`` or
``eval.every_seconds`` how often the held-out set is scored) and a ``[compare]`` table::

    [compare]
    seeds = 2                   # seeds per method (indices 0, 1)
    seeds_per_method = { pods_max_variance = 5 }   # optional: other counts for some methods
    baseline = "grpo"           # the method whose peak sets the target (default "grpo")
    target_fraction = 0.99      # the target is this fraction of the baseline's peak
    targets = [{ method = "pods_max_variance" }]   # optional: more targets (below)
    read_past_budget = false    # true: read evaluations after the budget too (reports before issue 68)
    [compare.methods]
    grpo = { "select.rule" = "all", "rollout.n" = 4, "select.m" = 4 }
    pods_max_variance = { "select.rule" = "max_variance", "rollout.n" = 16, "select.m" = 4 }

Each method is a table of dotted overrides applied over the base, and may name its trainer:
``trainer = "trl"`` trains it with TRL's GRPOTrainer, ``"trl-pods"`` with podsrl's PODSTrainer in TRL,
from the same config (:mod:`podsrl.compare.trl_arm`, docs/trl.md "TRL arms in podsrl compare");
the default is ``"podsrl"`` (``podsrl train``). ``--section.key=value`` on the
command line changes the base (methods still override it). Seeds: every method trains
``seeds`` seeds unless ``seeds_per_method`` names it (a method not in ``[compare.methods]``, or a
count that is not a whole number >= 1, is a ConfigError); on the command line ``--seeds N`` gives
every method N seeds (replacing the file's whole seed plan), ``--seeds grpo=5,d3s_intra=5`` changes
only those methods over the file's plan, and ``--seeds 3,grpo=5`` does both. Without a file, or without
``[compare.methods]``, the default methods (:data:`DEFAULT_COMPARE`) are used. Methods may not
change what must be shared for the comparison to mean anything: the task, the rewards, the
evaluation protocol, the budget and the seed. Every method's resolved config is built before any
training starts, so a typo fails at once with a ConfigError naming the method and the field
(:mod:`podsrl.compare.plan`).

**A screening** (``[compare] screening = true``, configs/screen-reasoning-gym.toml): the methods
are tasks, to find one on which a comparison has room to show something. Each method may then set
``task.*`` (e.g. one reasoning-gym dataset each) and nothing else shared; there is no baseline
(``baseline`` and ``target_fraction`` are refused), so no target, time fraction or paired difference, and
the first table gives per method its task, the held-out accuracy before training and at the
budget, the change, the peak, and the share of silent groups over the first steps
(``signal.zero_variance_groups_start``) and over the run.

**Protocol** (:mod:`podsrl.compare.runs`). Every method x seed is an ordinary ``podsrl train`` run
in ``OUT/runs/<method>/seed<k>/``, in a process of its own (``--in-process``: in this one),
launched seed-major (all methods of seed 0 first, so an interrupted comparison is complete for the
first seeds). By default one run trains at a time; ``--parallel K`` keeps K runs going at once, and
``--devices 0,1,...`` pins each run to one GPU (CUDA_VISIBLE_DEVICES; one run per GPU when K is at
most the number of devices). Runs that train at once on one device share its time, so their
wall-clocks are inflated: the command says so when it starts, every run records its device and
sharing in ``launch.jsonl``, and the report (compare.json ``device_sharing``, the table's notes,
the plot's title) says that only the step axis is then fair. Seed k trains with ``train.seed =
base seed + k`` while the task's own ``seed`` option stays fixed (at the base ``train.seed`` unless
the base sets ``task.options.seed``): the held-out problems are the same in every run, only the
training randomness (prompt order, sampling, tie-breaking) varies, and with sampled evaluation
(eval.temperature > 0) the evaluation's samples, which the trainer seeds with train.seed.
Re-running the same command resumes: a finished run (``done.json`` written after ``train``
returned, or an evaluation at the budget in its eval.jsonl) is skipped, an interrupted one
continues from its last checkpoint, one interrupted before its first checkpoint starts over;
``--seeds`` (or a method's ``seeds_per_method``) higher than before adds only the new seeds. The
report reads only a run's small files (config.toml, eval.jsonl, metrics.jsonl, launch.jsonl,
done.json), so ``--report-only`` rebuilds it from a results directory without checkpoints. A run directory whose config differs from
what the plan now asks for (other than the budget, which may be raised to extend a comparison) is
an error, not silently reused. Sequential runs' wall-clocks are comparable only if the machine's
load is the same throughout; run comparisons on an otherwise idle machine.

**Measurement** (PODS, Xu et al. 2025, Sec. 4; ALGORITHMS.md section 2; :mod:`podsrl.compare.stats`,
:mod:`podsrl.compare.report`): held-out accuracy against optimizer steps and against the training
clock (evaluation time excluded). The target is 0.99 x the baseline's (GRPO's) peak; on each axis
a method's value is the first step / training time at which its accuracy reaches the target, and
its ratio is that **as a fraction of the baseline's** (``time_fraction``, ``step_fraction``: 0.61
reaches the target in 61% of the baseline's time; reports before issue 68 held the inverse,
``speedup``, which the table still reads). The step axis shows what a method's choice of rollouts
buys per update; the time axis adds what its extra sampling costs.

**Every arm at the same training time.** A run stops at the end of a step, which may end after
``train.max_seconds`` (by up to a step: half a minute and more for a TRL arm); an evaluation after
the budget comes from training no other arm had. So every number of the report reads a run's
evaluations at or before the budget only (:func:`podsrl.compare.stats.within_budget`): its accuracy
at the budget is its last evaluation at or before it, its AUC per training minute covers [0,
budget], its peak and its times to a target are among those evaluations; the ones left out are
listed (compare.json ``runs[].evaluations_past_budget``) and a note names them.

Choices made where the paper is silent (it reports one run per method):

- **Seed-mean curve first, then the peak.** A method's curve is the mean over seeds at common
  points; its peak is the maximum of that mean curve, read on the axis evaluation is scheduled on
  (steps with ``eval.every_steps``, else time), and steps and times are read on the mean curves.
  The alternative, per-seed peaks averaged, is biased upwards by evaluation noise (a max of noisy
  values). The mean of the per-seed peaks is reported too (``peak_per_seed``), for information.
- **Common points.** When the seeds' evaluations are the same points of training (time-based
  evaluation, where evaluation i happens at about i x every_seconds, with equal counts; or
  evaluations at the same steps, as with ``eval.every_steps`` and a step budget) the seeds are
  aligned by evaluation index: point i is (mean of the seeds' i-th steps or training times, mean of
  their i-th accuracies), the same points on both axes. Otherwise every seed's curve is linearly
  interpolated onto the union of the seeds' evaluation steps (or times), restricted to the range
  all seeds cover (no extrapolation).
- **Step and time to target** are the x of the first point of the mean curve at or above the
  target, not interpolated between evaluations (the paper reads evaluation points). None if never
  reached. When the untrained model (step 0) already meets the target, no ratio is measurable:
  the fraction is None with a note.
- **More targets** (``targets``, optional): a list of tables ``{ method = NAME, of = "peak" |
  "final", fraction = F }``, each another accuracy every method is timed to the same way: F (default
  ``target_fraction`` for a peak, 1 for ``"final"``) x NAME's seed-mean peak or its seed-mean
  accuracy at the budget. Per method: step and time to it, and its time as a fraction of NAME's own
  (compare.json ``targets``; the table "more targets"), e.g. "how soon does each arm reach TRL's
  10-minute accuracy" is ``{ method = "trl_grpo_n8", of = "final" }``.
- **Robust summaries** (the threshold rule is fragile on a flat plateau: one evaluation a little
  above or below 99% of the peak moves the step to target by a whole evaluation interval). Per
  seed, the **AUC**, the area under the accuracy-vs-step curve, is the mean held-out accuracy over
  the run's evaluations after step 0 (equal weight per evaluation; with evaluations every k steps
  it is the right-endpoint Riemann sum of the curve divided by the budget; step 0 is left out
  because it is the untrained model, the same for every method), and the **final accuracy** is
  the accuracy at its last evaluation at or before the budget. Each is reported as the mean over the
  method's seeds with a Student-t 95% interval.
- **Paired differences.** Seed index k is the same training seed in every method (same prompt
  order, same evaluation problems), so method minus baseline is taken seed by seed, over the k
  seeds both finished, with the paired t-interval mean(d) +- t_{0.975, k-1} s_d / sqrt(k)
  (:mod:`podsrl.intervals`). compare.json (``paired_vs_baseline``, ``paired_excluding_zero``), the
  table (a star) and its notes say which differences exclude zero. Methods with more seeds than
  the baseline are paired over the seeds they share; their unpaired summaries use all their seeds.
  Every other pair of methods (a before b in the plan) is paired the same way, a - b, for the
  orderings between rules (compare.json ``pairwise``; the table "between methods").
- **Intervals.** The peak's 95% interval is a Student-t interval over the seeds' accuracies at the
  peak point (mean +- t_{0.975, k-1} s / sqrt(k)). The step's and the time's 95% intervals are
  Student-t intervals over the seeds' own first evaluations at or above the target (each seed's
  values are listed too); when some seed never reaches the target there is none (the table says
  how many seeds did). With one seed there is no interval over seeds; the report says so, and the
  plot's band is then that run's own interval per evaluation, as eval.jsonl holds it (Wilson's with
  one sample per problem, with several a normal interval over the problems floored at Wilson's on the
  completions, and Wilson's on the problems when every problem's samples agree: podsrl.intervals).

**Output** in OUT: ``compare.json`` (per method: settings, peak and interval, steps and time to
target with intervals and per seed, their fractions of the baseline's on both axes, AUC and final accuracy with intervals
and per seed, the paired differences against the baseline, steps, median seconds per step and of
its generate and update phases from each run's metrics.jsonl, the training signal from the same
file (``signal``: training reward, share of zero-variance groups, variance of the advantages the
update used, share of tokens in the loss, gradient norm; means over steps, then seeds: what
explains a difference between rules), the mean curves on both axes and
every run's curve; the device sharing; the definitions of every summary), ``compare.png`` (four
panels: accuracy against optimizer steps and against training minutes, seed mean and 95% band,
one line per method, the target dotted, each method's first point at it marked; below them the
paired AUC and final-accuracy differences against the baseline as intervals, every seed's
difference a dot) and the printed tables (:mod:`podsrl.compare.table`): both axes, then the
robust summaries and paired differences, then the training signal.

The module layout reads plan -> run -> report: :mod:`~podsrl.compare.plan` (what to run),
:mod:`~podsrl.compare.layout` (the run directories), :mod:`~podsrl.compare.runs` (training them),
:mod:`~podsrl.compare.report` (compare.json from the run directories' small files),
:mod:`~podsrl.compare.stats` (its pure math), :mod:`~podsrl.compare.table`,
:mod:`~podsrl.compare.plots`. They meet the trainers through one interface,
:mod:`~podsrl.compare.arms` (names, checks, one run trained here or as a child process, checkpoints),
never inside a training loop; a TRL arm's own code is :mod:`~podsrl.compare.trl_arm`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from podsrl.compare.layout import DONE_FILE, LAUNCH_FILE, budget, is_finished, mark_done, read_launches, run_dir, run_status
from podsrl.compare.plan import DEFAULT_COMPARE, DEFAULT_METHODS, Method, Plan, load_plan, resolve
from podsrl.compare.plots import plot_report
from podsrl.compare.report import PHASES, build_report, primary_axis, write_report
from podsrl.compare.runs import RunFailed, run_all
from podsrl.compare.stats import (
    AXES, Curve, Summary, auc, final_accuracy, first_reach, fraction, mean_curve, paired_difference, peak, seed_first_reach,
    time_auc, within_budget,
)  # fmt: skip
from podsrl.compare.table import format_table
from podsrl.errors import ConfigError
from podsrl.intervals import paired_t_interval, t_interval

__all__ = [
    "AXES", "DEFAULT_COMPARE", "DEFAULT_METHODS", "DONE_FILE", "LAUNCH_FILE", "PHASES", "Curve", "Method", "Plan",
    "RunFailed", "Summary", "auc", "budget", "build_report", "final_accuracy", "first_reach", "format_table", "fraction",
    "is_finished", "load_plan", "main", "mark_done", "mean_curve", "paired_difference", "paired_t_interval", "peak",
    "parse_devices", "plot_report", "primary_axis", "read_launches", "resolve", "run_all", "run_dir", "run_status",
    "seed_first_reach", "t_interval", "time_auc", "within_budget", "write_report",
]  # fmt: skip


def parse_devices(text: str | None) -> list[str] | None:
    """``--devices 0,1,3`` -> ["0", "1", "3"] (GPU indices, distinct); None when not given."""
    if text is None:
        return None
    devices = [d.strip() for d in str(text).split(",") if d.strip()]
    if not devices or not all(d.isdigit() for d in devices) or len(set(devices)) != len(devices):
        raise ConfigError(f"--devices: give distinct GPU indices separated by commas, e.g. --devices 0,1; got {text!r}")
    return devices


def main(args, overrides: list[str]) -> int:
    plan = load_plan(getattr(args, "config", None), overrides, seeds=getattr(args, "seeds", None), methods=getattr(args, "methods", None))
    out = Path(getattr(args, "out", None) or "runs/compare")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; podsrl compare writes a directory of runs, give a directory path")
    devices = parse_devices(getattr(args, "devices", None))
    parallel = getattr(args, "parallel", None)
    if parallel is None:
        parallel = len(devices) if devices else 1  # --devices alone: one run per device
    trained = 0
    if not getattr(args, "report_only", False):
        try:
            trained = run_all(plan, out, isolate=not getattr(args, "in_process", False), parallel=parallel, devices=devices)
        except KeyboardInterrupt:
            print("\npodsrl compare: interrupted; run the same command again to resume where it stopped")
            return 130
        except RunFailed as err:
            print(err, file=sys.stderr)
            return err.returncode
    report = build_report(plan, out)
    if trained:  # run_all wrote this report (and its figure) as the last run finished
        json_path, png_path = out / "compare.json", out / "compare.png"
    else:
        json_path, png_path = write_report(report, out)
    print("\n" + format_table(report))
    print(f"\npodsrl compare: wrote {json_path} and {png_path}")
    return 0
