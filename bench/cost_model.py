"""The wall-clock ratio of PODS / D3S against GRPO, predicted from per-step costs, checked against runs.

    python bench/cost_model.py                                   # the committed two-digit comparison
    python bench/cost_model.py --runs runs/compare-fair --seeds 0,1,2
    python bench/cost_model.py --rho 0.02                        # also predict at sampling/update cost ratio 0.02
    python bench/cost_model.py --compare results/compare-fair/compare.json   # costs from one comparison, step counts from another
    python bench/cost_model.py --runs results/compare-vs-trl/runs --seeds 0,1,2  # GRPO(n) and PODS(16, m) at n = 4-16
    python bench/cost_model.py --runs results/compare-long/runs --seeds 0,1,2 --baseline grpo_bf16_seq \
        --methods grpo_bf16_seq,grpo_bf16_tok,pods_n16_m4,d3s_intra,d3s_intra_all_tokens --per-token-sampling --gpu-tokens 64
                                                                 # long completions (100-170 tokens), one sampler dtype
    python bench/cost_model.py --peak results/peak/<machine>-<date>.json   # the update's and a sampling call's cost from bench/peak.py

Every ratio printed is a method's time to the target as a fraction of the baseline's (below 1:
sooner; podsrl.figures.RATIO), as podsrl compare reports it since issue 68. Until issue 66 this script
printed speedups, the baseline's time over the method's: the docs' older paragraphs quote them so.

The model. A training step of B prompts costs

    t_step = g0 * C + s * R  +  u0 * U + u * F + c * S  +  o

- C: the step's sampling calls (metrics ``sample_rounds``: 1 a step at fixed n, one per round with
  early stopping, one per round of every batch with dynamic sampling), at g0 each (a call's fixed
  cost: bench/sampling_call.py);
- R: rollouts generated (B * n, fewer with early stopping, more with dynamic sampling: metrics
  ``rollouts_generated``), at s seconds each beyond the calls' fixed cost (weight sync excluded);
- with ``--per-token-sampling``, G in R's place: the completion tokens generated (R x
  ``completion_len``, the mean length of the step's rollouts), at s_t each. A call's decode steps
  follow its completions' length, which the answers of 10-15 tokens of the short comparisons barely
  vary (R and G are then nearly proportional, and their fits keep R) and long completions do (100-170
  tokens in results/compare-long, falling as the policy learns to answer shorter: there a fit on C
  and G halves the root-mean-square error of one on C and R, 3.1 s against 5.9 s a step, and one on
  all three gives a rollout a negative cost, -3.8 ms, for no better fit);
- U: 1 when the step ran an update, 0 when it kept no row (dynamic sampling that met no signal
  within its cap of batches);
- F: completion tokens that take the update's forward and backward (``tokens_run``; ``tokens_total``
  before exact skipping), at u each beyond the fixed u0 (optimizer step, gradient clipping, one
  pass over the weights). Tokens rather than rows: the rows per step are fixed except in D3S,
  where they grow as completions shorten, which confounds a fit on rows; tokens vary in every run;
- S: completion tokens scored by D3S's entropy pass (F while ``token_fraction`` < 1, else 0), c each;
- o: reward, selection and weight sync (the step's rest, taken as measured per method).

g0, s (or s_t) are fitted by least squares on every step's ``time/generate`` against C and R (or
G); u0, u, c on ``time/update`` against F and S, over the methods and seeds given (``--methods``:
only those, e.g. to leave out an arm whose sampler ran in another dtype, which costs another s): podsrl's own runs only (a TRL
arm of ``podsrl compare``, one with a trainer.json naming TRL, samples and updates with TRL's code,
and logs no token counts). The baseline is the comparison's (compare.json ``baseline``, or
``--baseline``): every ratio is the method's time as a fraction of its time. Across GRPO(n) and PODS(n, m) the
counts carry the difference: GRPO(n)'s update grows with n (F: its B x n rows' tokens, less the
skipped), PODS's with m, and sampling with n in both (R). The check: summing the
predicted step times up to the step where each method first reaches the comparison's target
(compare.json ``steps_to_target``, the seed mean) gives a predicted training time to the target, and
its ratio to GRPO's is compared with the ratio measured from the runs' own clocks (``train_seconds``
at that step, the median over the seeds).

Predictions, from the same fitted costs:

- **prompt selection** (``prompts.skip_silent``): a skipped prompt is replaced by the stream's next
  one, so a batch still samples B prompts; what skipping changes is the share of groups with a
  signal: more rows to update a step (F, as measured) and, with dynamic sampling, fewer further
  batches to fill the step (C and R, as measured). The model needs no term of its own for it; the
  first table adds the share of the prompts read that were skipped and the rollouts generated per
  group with a signal. On the GPU-like sampler below a call costs about the same for any R up to K,
  so there what skipping saves is the further batches (C) it spares dynamic sampling.
- **exact skipping** (``optim.skip_zero_advantage``): as measured (``tokens_run``) for a run that
  skipped; for one that did not, F = S = tokens_total x (1 - zero_variance_groups). This
  holds for binary rewards under GRPO, max-variance and D3S: a kept row's advantage is exactly 0 iff
  its group's rewards are all equal (max-variance keeps a constant set only from a constant group;
  D3S centres on the full group's mean, which a reward of 0 or 1 equals only in a constant group).
  (Scaling the tokens by the share of groups assumes groups of equal lengths.) Not for ``random``
  or ``max_reward``, which can keep a constant subset of a mixed group; they are left out.
- **sampling cheaper or dearer**: rho = s / u, the cost of sampling one rollout over the cost of
  updating one completion token, set to the values given (``--rho``; 0, 1, this CPU's, 10 and the
  H100 figure of docs/results.md, 68, are always printed), u and every count kept: the wall-clock
  ratio with skipping at the same step counts.

- **a GPU-like sampler**: a GPU engine samples K rollouts at once in about the time of one (a
  decode step reads the weights once for the whole batch: on an A100, vLLM serving Llama-3.1-8B
  gave 6.6x the throughput at 8 concurrent requests for almost no added latency,
  johnmusgrave.com/p/vllm-throughput-latency-sweep-on; a 135M model batches far more). A step's
  sampling then costs C x W x ceil(R / C / K) update-token units: W is one call's cost in units of
  updating one completion token (``--gpu-call``; default 8800, this project's H100 run in
  docs/results.md "On a GPU": transformers ``generate`` of 128 rollouts of 64 tokens in 1.5 s
  against 1.4 s to update those 8,192 tokens), and every other cost stays as fitted. Printed for K
  = 8, 128 and unbounded and W, W/4, W/16 (a vLLM-like engine; no vLLM GPU figure was measured
  here). Dynamic sampling pays W for every further batch: that is what the table weighs. A call's
  decode steps follow its completions' length: with ``--gpu-tokens T``, W is the cost of a call of
  completions of T tokens and a step's call costs W x (its mean completion length) / T (the H100's
  8800 was measured at T = 64); without it W is the same at any length, as for the short
  comparisons, whose commands gave W scaled by hand (2200 for answers of at most 16 tokens).

``--update-cost U0,U`` replaces the fitted update cost in the predictions (not in the check) by a
measured one, e.g. bench/zero_signal.py's two updates of the same batch, with skipping and without
(2.09 s for 7 rows of ~70 completion tokens, 4.80 s for 32 rows of ~320: U0 = 1.33 s, U = 0.0108 s
a token, fused AdamW): the committed runs always updated 32 rows in two micro-batches, so they
cannot tell the update's fixed part (the optimizer step, a pass over the weights per micro-batch)
from its per-token part, and the fit puts too much into the fixed part, which skipping cannot save.

``--peak FILE`` (bench/peak.py's JSON) replaces the update's cost and the GPU-like sampler's in the
predictions (not in the check) by that run's measurements: U0 = the optimizer's seconds (a fixed cost
per update) and U = the rest of the update over its completion tokens, from the update row of
``--peak-model`` (default: the file's first model) in the precision ``model.mixed_precision = "auto"``
took on that machine, at the completion length nearest the runs' mean (among equals, the row of most
tokens); and for each sampler engine of that model, its call of the most rollouts K at the length
nearest the runs' mean, T tokens, W = its seconds / U update-token units: the GPU-like table's
columns are then those measured calls (W, K, T) instead of the assumed grid. The file's model should
be the runs' (the CPU mode's is the embedded model; the GPU mode's are Qwen2.5-1.5B and 0.5B, for
predicting those models' runs).

``--same-n METHOD`` (a PODS(n, m) method of the runs) predicts GRPO(n) at the same n from that
method's own steps (``same_n``): whether a comparison of the two at equal training time gets enough
steps to be worth running (issue 67, item 4), before committing the hours.

Last line: ``predicted time to the target as a fraction of BASELINE's, every exact saving: ...; model check: ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from podsrl.figures import RATIO  # how every ratio printed here reads
from podsrl.run.rundir import PODSRL, read_trainer  # a TRL arm of podsrl compare names its trainer in trainer.json

ROOT = Path(__file__).resolve().parents[1]
H100_RHO = 68.0  # (1.5 s / 128 rollouts) / (1.4 s / (128 x 64 tokens)), docs/results.md "On a GPU"
RULES = ("all", "max_variance", "d3s_intra", "d3s_cross")  # binary rewards: skipping is exact and predictable


def _steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _config(run: Path) -> dict:
    import tomllib

    return tomllib.loads((run / "config.toml").read_text())


def load(runs: Path, seeds: list[int], baseline: str = "grpo") -> dict[str, list[list[dict]]]:
    """method -> [steps of each seed], for every podsrl method under ``runs`` whose rule is one of
    RULES (the baseline first); every step gets C, R, F, S (the model's counts) as measured."""
    out: dict[str, list[list[dict]]] = {}
    methods = sorted((p.name for p in runs.iterdir() if p.is_dir()), key=lambda m: (m != baseline, m)) if runs.is_dir() else []
    for method in methods:
        for seed in seeds:
            run = runs / method / f"seed{seed}"
            if not (run / "metrics.jsonl").exists() or read_trainer(run) != PODSRL:
                continue
            config = _config(run)
            if config["select"]["rule"] not in RULES:
                continue
            generated = int(config["rollout"]["n"]) * int(config["train"]["prompts_per_step"])
            steps = _steps(run)
            for st in steps:
                st["C"] = st.get("sample_rounds", 1)
                st["R"] = st.get("rollouts_generated", generated)
                st["G"] = st["R"] * st.get("completion_len", 0.0)  # completion tokens generated
                st["U"] = 1.0 if st.get("kept", 1) else 0.0  # a step that kept no row runs no update (dynamic sampling at its cap)
                st["F"] = st.get("tokens_run", st.get("tokens_total", 0))
                st["S"] = st["F"] if st.get("token_fraction", 1.0) < 1.0 else 0
                # A run that skipped measured it (with dynamic sampling the trained groups are not the
                # first B that zero_variance_groups counts); a run that did not is predicted.
                skipped = config.get("optim", {}).get("skip_zero_advantage", False) and "tokens_run" in st
                st["F_skip"] = st["tokens_run"] if skipped else st.get("tokens_total", 0) * (1.0 - st["zero_variance_groups"])
                st["S_skip"] = st["F_skip"] if st["S"] else 0.0
            out.setdefault(method, []).append(steps)
    return out


def skip_share(runs: list[list[dict]]) -> float:
    """The share of the prompts read from the stream that prompt selection skipped before sampling
    (``prompts.skip_silent``; metrics ``prompts_skipped`` and ``prompts_sampled``), over every step
    of every seed: 0 for a run without it (the module docstring says how the model carries it)."""
    skipped = sum(st.get("prompts_skipped", 0) for run in runs for st in run)
    sampled = sum(st.get("prompts_sampled", 0) for run in runs for st in run)
    return skipped / (skipped + sampled) if skipped + sampled else 0.0


def rollouts_per_signal_group(runs: list[list[dict]]) -> float:
    """Rollouts generated per group trained on with a signal, over every step of every seed."""
    signal = sum(st.get("groups_with_signal", 0) for run in runs for st in run)
    return sum(st["R"] for run in runs for st in run) / signal if signal else math.inf


def fit(data: dict[str, list[list[dict]]], *, per_token: bool = False) -> dict[str, float]:
    """The costs by least squares (module docstring); ``per_token``: sampling per generated completion
    token (s_t) instead of per rollout (s; the other 0)."""
    steps = [st for seeds in data.values() for run in seeds for st in run]
    C = np.array([st["C"] for st in steps], dtype=float)
    count = np.array([st["G" if per_token else "R"] for st in steps], dtype=float)
    g = np.array([st["time/generate"] for st in steps])
    (g0, each), *_ = np.linalg.lstsq(np.stack([C, count], 1), g, rcond=None)
    s, s_t = (0.0, each) if per_token else (each, 0.0)
    X = np.stack([[st["U"] for st in steps], [st["F"] for st in steps], [st["S"] for st in steps]], 1).astype(float)
    y = np.array([st["time/update"] for st in steps])
    (u0, u, c), *_ = np.linalg.lstsq(X, y, rcond=None)
    return dict(g0=g0, s=s, s_t=s_t, u0=u0, u=u, c=c)


def after_sampling(st: dict, k: dict, *, skip: bool) -> float:
    """The step's update (u0 * U + u * F + c * S, with exact skipping's counts if ``skip``) plus its
    rest o as measured: everything but sampling."""
    F, S = (st["F_skip"], st["S_skip"]) if skip else (st["F"], st["S"])
    rest = st["time/step"] - st["time/generate"] - st["time/update"]
    return k["u0"] * st["U"] + k["u"] * F + k["c"] * S + rest


def step_time(st: dict, k: dict, *, skip: bool, rho: float | None = None) -> float:
    """The predicted step; ``rho``: sampling a rollout costs rho tokens of update, its tokens included
    (the fitted per-token sampling at its mean length folded into the rollout's cost)."""
    if rho is None:
        sampling = k["s"] * st["R"] + k["s_t"] * st["G"]
    else:
        sampling = rho * k["u"] * st["R"]
    return k["g0"] * st["C"] + sampling + after_sampling(st, k, skip=skip)


def gpu_step_time(st: dict, k: dict, *, call: float, parallel: float, tokens: float | None = None) -> float:
    """The step with exact skipping and a GPU-like sampler (module docstring): sampling is C calls
    of ``call`` update-token units per wave of ``parallel`` rollouts; with ``tokens``, ``call`` is
    for completions of that length and scales with the step's mean completion length."""
    waves = max(1, math.ceil(st["R"] / st["C"] / parallel))  # a call of any size takes one wave at least
    if tokens:
        call = call * (st["G"] / st["R"] if st["R"] else 0.0) / tokens
    return st["C"] * call * k["u"] * waves + after_sampling(st, k, skip=True)


def time_to(runs: list[list[dict]], step: int, k: dict | None, *, gpu: tuple[float, float] | tuple[float, float, float | None] | None = None,
            **kw) -> float:
    """Median over seeds of the training time to ``step``: measured (k None) or predicted (with
    ``gpu`` = (call, parallel[, tokens]): the GPU-like sampler)."""
    per_seed = []
    for run in runs:
        upto = [st for st in run if st["step"] <= step]
        if k is None:
            per_seed.append(upto[-1]["train_seconds"])
        elif gpu is not None:
            per_seed.append(sum(gpu_step_time(st, k, call=gpu[0], parallel=gpu[1], tokens=gpu[2] if len(gpu) > 2 else None) for st in upto))
        else:
            per_seed.append(sum(step_time(st, k, **kw) for st in upto))
    return statistics.median(per_seed)


def same_n(runs: list[list[dict]], k: dict, *, minutes: float) -> dict:
    """GRPO(n) at a PODS(n, m) run's n, predicted from that run's own steps (``--same-n``): the same
    sampling (``time/generate`` as measured: both sample n rollouts a prompt) and the same rest, and an
    update of every row of the groups with a signal (exact skipping drops the others): F = the step's
    generated completion tokens G x (1 - ``zero_variance_groups``), at the fitted u0 + u * F (no
    scoring pass). Returns, over the seeds, the median predicted and measured step seconds and the
    median number of steps that fit in ``minutes`` of training at each seed's mean step, predicted
    (GRPO(n)) and measured (the PODS run itself): an extrapolation where the runs trained less long,
    at their steps' lengths (completions that shorten over a longer run make later steps cheaper)."""
    predicted, measured, fit_pred, fit_meas = [], [], [], []
    for run in runs:
        times = []
        for st in run:
            rest = st["time/step"] - st["time/generate"] - st["time/update"]
            F = st["G"] * (1.0 - st["zero_variance_groups"])
            times.append(st["time/generate"] + k["u0"] * (1.0 if F else 0.0) + k["u"] * F + rest)
        predicted += times
        measured += [st["time/step"] for st in run]
        fit_pred.append(60 * minutes / statistics.mean(times))  # at the run's mean step: its steps may span less than ``minutes``
        fit_meas.append(60 * minutes / statistics.mean(st["time/step"] for st in run))
    return {"step_predicted": statistics.median(predicted), "step_measured": statistics.median(measured),
            "steps_predicted": statistics.median(fit_pred), "steps_measured": statistics.median(fit_meas),
            "seeds": len(runs)}  # fmt: skip


def peak_inputs(peak: dict, mean_length: float, model: str | None = None) -> dict:
    """The update's and the sampler's costs from bench/peak.py's JSON (module docstring, ``--peak``):
    {"model", "u0", "u", "update": the row's label, "calls": [(engine, W, K, T)], "note"}."""
    models = {name: entry for name, entry in peak.get("models", {}).items() if entry.get("update")}
    if not models:
        raise SystemExit("cost_model: --peak: the file has no update measured (bench/peak.py's JSON: models.<name>.update)")
    name = model or next(iter(models))
    if name not in models:
        raise SystemExit(f"cost_model: --peak-model {name!r}: not in the file; its models with an update: {', '.join(models)}")
    rows = models[name]["update"]
    auto = peak.get("mixed_precision_auto") == "bf16"
    rows = [r for r in rows if r["mixed_precision"] == auto] or rows
    length = min({r["completion"] for r in rows}, key=lambda c: (abs(c - mean_length), c))
    row = max((r for r in rows if r["completion"] == length), key=lambda r: r["tokens"])
    u0 = row["seconds"]["optimizer"]
    u = (row["seconds"]["update"] - u0) / row["tokens"]
    calls = []
    for engine in dict.fromkeys(r["engine"] for r in models[name].get("sampler", [])):
        mine = [r for r in models[name]["sampler"] if r["engine"] == engine]
        t = min({r["completion"] for r in mine}, key=lambda c: (abs(c - mean_length), c))
        call = max((r for r in mine if r["completion"] == t), key=lambda r: r["rollouts"])
        calls.append((engine, call["seconds"] / u, call["rollouts"], float(t)))
    precision = "mixed precision" if row["mixed_precision"] else "float32"
    note = (f"{name} on {peak['machine'].get('gpu') or peak['machine']['cpu']} ({peak['date'][:10]}): update {row['label']} at "
            f"{row['prompt']}+{row['completion']} tokens, {precision}")  # fmt: skip
    return {"model": name, "u0": u0, "u": u, "update": row["label"], "calls": calls, "note": note}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "results/compare-2digit/runs")
    parser.add_argument("--compare", type=Path, default=None, help="compare.json (default: beside --runs)")
    parser.add_argument("--seeds", default="1,2,3,4", help="seeds to read (default: the quiet seeds of the committed comparison)")
    parser.add_argument("--rho", type=float, action="append", default=[], help="also predict at this sampling/update cost ratio")
    parser.add_argument("--gpu-call", type=float, default=8800.0, help="a GPU-like sampler's call, in update-token units")
    parser.add_argument("--update-cost", default=None, help="U0,U: the update's fixed seconds and seconds per token, for the predictions")
    parser.add_argument("--baseline", default=None, help="the method every time is a fraction of (default: compare.json's baseline)")
    parser.add_argument("--methods", default=None, help="only these methods (comma-separated), fitted and checked")
    parser.add_argument("--per-token-sampling", action="store_true", help="fit sampling per generated completion token too (long completions)")
    parser.add_argument("--gpu-tokens", type=float, default=None,
                        help="--gpu-call is a call of completions of this many tokens; a step's call scales with its mean length")  # fmt: skip
    parser.add_argument("--peak", type=Path, default=None, help="bench/peak.py's JSON: the update's cost and the samplers' calls, for the predictions")
    parser.add_argument("--peak-model", default=None, help="the model of --peak's file to read (default: its first)")
    parser.add_argument("--same-n", default=None, metavar="METHOD",
                        help="also predict GRPO(n) at this PODS(n, m) method's n from its steps (issue 67, item 4)")  # fmt: skip
    parser.add_argument("--minutes", type=float, default=30.0, help="--same-n: the training budget whose steps are counted")
    args = parser.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    compare = json.loads((args.compare or args.runs.parent / "compare.json").read_text())
    base = args.baseline or compare.get("baseline") or "grpo"
    data = load(args.runs, seeds, base)
    if args.methods:
        wanted = {m.strip() for m in args.methods.split(",") if m.strip()}
        data = {m: runs for m, runs in data.items() if m in wanted}
    if base not in data:
        sys.exit(f"cost_model: no podsrl run of the baseline {base!r} under {args.runs} for seeds {seeds}" + (" among --methods" if args.methods else ""))
    k = fit(data, per_token=args.per_token_sampling)
    fitted = k  # the fitted costs check the model against the runs' clocks
    each = f"{1000 * k['s_t']:.2f} ms/completion token" if args.per_token_sampling else f"{k['s']:.4f} s/rollout"
    print(f"fitted: generate {k['g0']:.2f} s a call + {each}; update {k['u0']:.2f} s + {k['u']:.4f} s/token "
          f"+ {k['c']:.4f} s/scored token")  # fmt: skip
    lengths = [st["G"] / st["R"] for runs in data.values() for run in runs for st in run if st["R"]]
    mean_length = statistics.mean(lengths) if lengths else 0.0
    peak_in = None  # bench/peak.py's figures (--peak)
    if args.peak:
        peak_in = peak_inputs(json.loads(args.peak.read_text()), mean_length, args.peak_model)
        args.update_cost = f"{peak_in['u0']},{peak_in['u']}"
        print(f"from {args.peak}: {peak_in['note']}; sampling calls " + ", ".join(
            f"{e} {K} rollouts of {T:.0f} tokens = W {W:.0f}" for e, W, K, T in peak_in["calls"]))  # fmt: skip
    if args.update_cost:
        u0, u = (float(x) for x in args.update_cost.split(","))
        k = dict(k, u0=u0, u=u, c=k["c"] * u / k["u"])  # the scoring pass keeps its fitted share of a token's cost
        print(f"predictions with the update cost given: {u0:.2f} s + {u:.4f} s/token")
    rho_here = (k["s"] + k["s_t"] * mean_length) / k["u"]  # seconds to sample one rollout (of the runs' mean length) / to update one completion token
    print(f"rho = s/u = {rho_here:.1f} (sampling one rollout / updating one completion token)")
    target = {m: compare["methods"].get(m, {}).get("steps_to_target") for m in data}  # None: not in that comparison, or never
    if target[base] is None:
        sys.exit(f"cost_model: the baseline {base!r} has no steps to the target in {args.compare or args.runs.parent / 'compare.json'}")
    t_base = {"measured": time_to(data[base], target[base], None), "model": time_to(data[base], target[base], fitted, skip=False),
              "skip": time_to(data[base], target[base], k, skip=True)}  # fmt: skip
    rows, fractions, errors = [], {}, []
    for method, runs in data.items():
        if target[method] is None:
            continue
        measured = time_to(runs, target[method], None)
        model = time_to(runs, target[method], fitted, skip=False)
        skip = time_to(runs, target[method], k, skip=True)
        zero = statistics.mean(st["zero_variance_groups"] for run in runs for st in run)
        row = dict(method=method, seeds=len(runs), step=target[method], zero=zero, measured=measured, model=model, skip=skip,
                   skipped=skip_share(runs), per_signal=rollouts_per_signal_group(runs),
                   of_measured=measured / t_base["measured"], of_model=model / t_base["model"], of_skip=skip / t_base["skip"])  # fmt: skip
        rows.append(row)
        fractions[method] = row["of_skip"]
        errors.append(abs(model / measured - 1))
    print(f"{'method':>18} {'seeds':>5} {'step':>4} {'zero-var':>8} {'skipped':>7} {'R/signal':>8} {'measured min':>12} "
          f"{'model min':>9} {'time/base measured':>18} {'model':>6} {'with skipping':>13}")  # fmt: skip
    for r in rows:
        print(f"{r['method']:>18} {r['seeds']:>5} {r['step']:>4.0f} {r['zero']:>8.2f} {r['skipped']:>7.2f} {r['per_signal']:>8.1f} "
              f"{r['measured'] / 60:>12.1f} {r['model'] / 60:>9.1f} "
              f"{r['of_measured']:>17.2f}x {r['of_model']:>5.2f}x {r['of_skip']:>12.2f}x")  # fmt: skip
    print(f"(every ratio: {RATIO}; the baseline: {base})")
    rhos = [*args.rho, 0.0, 1.0, rho_here, 10.0, H100_RHO] + [W / K for _, W, K, _ in (peak_in["calls"] if peak_in else [])]
    print(f"\ntime as a fraction of {base}'s with skipping, at the same step counts, as sampling gets cheaper (rho = s/u):")
    print(f"{'method':>18} " + " ".join(f"{'rho ' + format(r, '.3g'):>10}" for r in rhos))
    for r in rows:
        line = []
        for rho in rhos:
            method_runs = data[r["method"]]
            line.append(time_to(method_runs, target[r["method"]], k, skip=True, rho=rho) / time_to(data[base], target[base], k, skip=True, rho=rho))
        print(f"{r['method']:>18} " + " ".join(f"{x:>9.2f}x" for x in line))
    print(f"(rho {rho_here:.1f}: this CPU with vLLM; rho {H100_RHO:g}: the H100 of docs/results.md with transformers "
          f"generate, 1.5 s for 128 rollouts against 1.4 s to update 128 rows of 64 tokens"
          + "".join(f"; rho {W / K:.3g}: {e}'s call of {K} measured by --peak" for e, W, K, _ in (peak_in["calls"] if peak_in else [])) + ")")  # fmt: skip
    print(f"\ntime as a fraction of {base}'s with skipping and a GPU-like sampler (K rollouts at once, a call of W update-token units):")
    if peak_in:
        grid = [(W, K, T) for _, W, K, T in peak_in["calls"]]
        print("(the calls --peak measured: " + ", ".join(f"{e}: W {W:.0f} for K {K} rollouts of T {T:.0f} tokens" for e, W, K, T in peak_in["calls"])
              + f"; a step's call costs W x its mean completion length / T: {mean_length:.0f} tokens on average here)")  # fmt: skip
    else:
        grid = [(w, K, args.gpu_tokens) for w in (args.gpu_call, args.gpu_call / 4, args.gpu_call / 16) for K in (8, 128, math.inf)]
        if args.gpu_tokens:
            print(f"(W is a call of completions of {args.gpu_tokens:g} tokens; a step's call costs W x its mean completion length / {args.gpu_tokens:g}: "
                  f"{mean_length:.0f} tokens on average here)")  # fmt: skip
    print(f"{'method':>18} " + " ".join(f"{f'W {w:.0f} K {K:g}':>15}" for w, K, _ in grid))
    for r in rows:
        line = [time_to(data[r["method"]], target[r["method"]], k, gpu=(w, K, T)) / time_to(data[base], target[base], k, gpu=(w, K, T)) for w, K, T in grid]
        print(f"{r['method']:>18} " + " ".join(f"{x:>14.2f}x" for x in line))
    if args.same_n:
        if args.same_n not in data:
            sys.exit(f"cost_model: --same-n {args.same_n!r}: no podsrl run of it under {args.runs} for seeds {seeds}")
        got = same_n(data[args.same_n], k, minutes=args.minutes)
        print(f"\nGRPO(n) at {args.same_n}'s n, predicted from its {got['seeds']} runs' steps (the same sampling, every row of the "
              f"groups with a signal updated): a step {got['step_predicted']:.1f} s against {args.same_n}'s {got['step_measured']:.1f} s "
              f"(medians; means {60 * args.minutes / got['steps_predicted']:.1f} s and {60 * args.minutes / got['steps_measured']:.1f} s); "
              f"steps in {args.minutes:g} training minutes at the runs' mean step: {got['steps_predicted']:.0f} against {got['steps_measured']:.0f}")  # fmt: skip
    summary = ", ".join(f"{m} {v:.2f}x" for m, v in fractions.items() if m != base)
    print(f"predicted time to the target as a fraction of {base}'s, every exact saving: {summary}; model check: training time to the "
          f"target within {100 * max(errors):.0f}% of the measured for every method")  # fmt: skip


if __name__ == "__main__":
    main()
