"""The tables and figures of issue 59's comparison on long completions (docs/results.md, README.md), from
the report and the runs' files in this directory (``python -m podsrl.docs_render --write`` puts them
into the pages; the test suite checks that the pages hold what this script renders):

    podsrl compare configs/compare-long.toml --out results/compare-long --report-only
    .venv/bin/python results/compare-long/tables.py              # prints the tables (podsrl importable)
    .venv/bin/python results/compare-long/tables.py --dir /tmp/out   # another copy of the runs and report

1. Per arm (:func:`arms`): steps in 10 training minutes (mean over seeds), median seconds a step
   (generation, update), held-out accuracy and the held-out completions' mean length at 0, 2.5, 5,
   7.5 and 10 training minutes (each run's evaluations read linearly at the minute, then the mean
   over seeds: :meth:`podsrl.figures.Comparison.accuracy_at`; lengths from eval.jsonl
   ``mean_length``, read the same way), and AUC per training minute minus a reference arm's, paired
   by seed with its 95% interval.
2. Per arm that sampled in bfloat16, the correction by the training completions' length
   (:func:`correction`): each step's ``sampler_kl`` (k3 KL per token, sampler against policy),
   ``is_ess`` (the normalised effective sample size of the sequence weights, (sum w)^2 / (N sum w^2):
   1 when every weight is equal, not a share of rows kept) and ``is_weight_mean`` (metrics.jsonl),
   medians over the steps whose mean completion (``completion_len``) was at least 100 tokens and over
   the shorter ones, the lowest ``is_ess`` of any step, and the steps whose ``is_ess`` fell below
   podsrl's warning bound (podsrl.run.watch.ESS_BOUND).
3. D3S's token selection (:func:`tokens`): the share of the signal rows' tokens its loss kept in the
   steps where the selection was on (compare.json ``signal_tokens_kept``, per seed; the median and
   range of the per-step shares, tokens_kept / tokens_run from metrics.jsonl), and D3S against D3S
   without token selection, paired by seed.
4. The papers' methods against GRPO(4) with the sampler default (bfloat16 + token_truncate, the arm
   that became the default: :func:`against_default`): AUC per training minute and held-out accuracy
   at 10 training minutes, paired by seed.

Accuracy "at 10 minutes" is read at 10.0 training minutes in every arm (above), not at each run's
last evaluation, which comes at the first step end after the budget (compare.json ``final_accuracy``:
up to a step late, 14-43 s here).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from podsrl.compare.stats import value_at  # a curve read at a step (figures.Comparison.eval_at reads a run at a time)
from podsrl.figures import RATIO, Comparison, claim, fraction, mean, paired_text, percent, span, verdict
from podsrl.run.watch import ESS_BOUND

HERE = Path(__file__).resolve().parent
NAMES = {"grpo_f32": "GRPO(4), float32 sampler", "grpo_bf16_seq": "GRPO(4), bfloat16 + sequence_mask",
         "grpo_bf16_tok": "GRPO(4), bfloat16 + token_truncate", "pods_n16_m4": "PODS(16, 4)",
         "d3s_intra": "D3S intra", "d3s_intra_all_tokens": "D3S intra, every token"}  # fmt: skip
MINUTES = (0, 2.5, 5, 7.5, 10)
BUDGET = 600.0
LONG = 100  # tokens: table 2 splits the steps at this mean completion length
SAMPLERS = ("grpo_f32", "grpo_bf16_seq", "grpo_bf16_tok")
METHODS = ("pods_n16_m4", "d3s_intra", "d3s_intra_all_tokens")
DEFAULT = "grpo_bf16_tok"  # GRPO(4) with the sampler and correction that became the default
AT10 = f"accuracy_at:{BUDGET}"


def label(c: Comparison, name: str) -> str:
    k = len(c.entry(name)["runs"])
    return NAMES.get(name, name) + ("" if k == 3 else f" ({k} seed{'s' * (k != 1)})")


def length_at(c: Comparison, method: str, seconds: float) -> float | None:
    """The held-out completions' mean length at ``seconds``, each run read linearly, then the seed mean."""
    return mean(c.eval_at(method, seed, "mean_length", seconds) for seed in c.seeds(method))


def accuracy(c: Comparison, method: str, seconds: float) -> float | None:
    return mean(c.accuracy_at(method, seconds).values())


def steps(c: Comparison, method: str) -> float:
    return statistics.fmean(c.entry(method)["steps"])


def phase(c: Comparison, method: str, key: str) -> float:
    return c.entry(method)["median_seconds"][key]


def arms(c: Comparison, reference: str = "", *names: str) -> str:
    """Table 1 over ``names`` (every arm when none); with a ``reference`` arm (or "-": none), a column
    of AUC per training minute minus the reference's, paired by seed (* resolved)."""
    names = names or tuple(n for n, e in c.methods.items() if e["runs"])
    ref = reference or c.baseline
    at_min = " / ".join(f"{m:g}" for m in MINUTES)
    head = f"| arm | steps in 10 min | s/step (generate, update) | held-out % at {at_min} training min | held-out completion tokens at {at_min} |"
    if ref != "-":
        head += f" AUC per training min - {NAMES[ref]}, paired |"
    lines = [head, "|---" * (5 + (ref != "-")) + "|"]
    for name in names:
        cells = [
            label(c, name),
            f"{steps(c, name):.0f}",
            f"{phase(c, name, 'step'):.1f} ({phase(c, name, 'generate'):.1f}, {phase(c, name, 'update'):.1f})",
            " / ".join(percent(accuracy(c, name, 60 * m)) for m in MINUTES),
            " / ".join(f"{length_at(c, name, 60 * m):.0f}" for m in MINUTES),
        ]
        if ref != "-":
            cells.append(("(baseline)" if ref == c.baseline else "(reference)") if name == ref else _starred(c.paired(name, ref, "time_auc")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _starred(d) -> str:
    return paired_text(d) + ("*" if verdict(d) == "resolved" else "")


def _steps_with_ess(c: Comparison, name: str) -> list[dict]:
    return [r for seed in c.seeds(name) for r in c.metrics(name, seed) if isinstance(r.get("is_ess"), (int, float))]


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def correction(c: Comparison) -> str:
    lines = [
        f"| arm | steps: completions >= {LONG} tokens / shorter | sampler KL per token, median (long / short) | is_ess, median (long / short) "
        f"| is_weight_mean, median (long / short) | lowest is_ess | steps with is_ess < {ESS_BOUND} |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, e in c.methods.items():
        rows = _steps_with_ess(c, name)
        if not e["runs"] or not rows or all(abs(r.get("sampler_kl") or 0.0) < 1e-6 for r in rows):
            continue  # a float32 sampler: no gap to correct
        long = [r for r in rows if r["completion_len"] >= LONG]
        short = [r for r in rows if r["completion_len"] < LONG]

        def pair(key: str, fmt: str = "{:.2f}") -> str:
            return " / ".join(fmt.format(statistics.median([r[key] for r in part])) if part else "-" for part in (long, short))

        low = sum(r["is_ess"] < ESS_BOUND for r in rows)
        cells = [label(c, name), f"{len(long)} / {len(short)}", pair("sampler_kl", "{:.4f}"), pair("is_ess"), pair("is_weight_mean"),
                 f"{min(r['is_ess'] for r in rows):.2f}", f"{low} of {len(rows)}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _token_shares(c: Comparison, name: str) -> list[float]:
    """Per step where D3S's token selection was on: the share of the signal rows' tokens its loss kept."""
    return [r["tokens_kept"] / r["tokens_run"] for seed in c.seeds(name) for r in c.metrics(name, seed)
            if (r.get("token_fraction") or 1.0) < 1.0 and (r.get("tokens_run") or 0) > 0]  # fmt: skip


def tokens(c: Comparison) -> str:
    lines = ["| arm | signal-row tokens kept, per seed | per-step share: median [min, max] | against D3S every token: AUC per training min, "
             "paired | accuracy at 10 min, paired |", "|---|---|---|---|---|"]  # fmt: skip
    for name, e in c.methods.items():
        if e.get("rule") != "d3s_intra" or not e["runs"]:
            continue
        kept = [s.get("signal_tokens_kept") for s in e.get("signal_per_seed") or []]
        shares = _token_shares(c, name)
        cells = [label(c, name), ", ".join("-" if k is None else f"{k:.0%}" for k in kept),
                 f"{statistics.median(shares):.0%} [{min(shares):.0%}, {max(shares):.0%}]" if shares else "- (never on)"]  # fmt: skip
        if name != "d3s_intra_all_tokens":
            cells += [_starred(c.paired(name, "d3s_intra_all_tokens", key)) for key in ("time_auc", AT10)]
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def against_default(c: Comparison) -> str:
    """Table 4: the methods minus GRPO(4) with the default sampler, and D3S minus D3S without token selection."""
    lines = [f"| arm - {NAMES[DEFAULT]} | seeds | steps in 10 min ({NAMES[DEFAULT].split(',')[0]}: {steps(c, DEFAULT):.0f}) "
             "| AUC per training min, paired | accuracy at 10 min, paired |", "|---|---|---|---|---|"]  # fmt: skip
    for name in METHODS:
        auc, end = c.paired(name, DEFAULT, "time_auc"), c.paired(name, DEFAULT, AT10)
        lines.append(f"| {NAMES[name]} | {len(auc.seeds)} | {steps(c, name):.0f} | {_starred(auc)} | {_starred(end)} |")
    auc, end = c.paired("d3s_intra", "d3s_intra_all_tokens", "time_auc"), c.paired("d3s_intra", "d3s_intra_all_tokens", AT10)
    lines.append(f"| D3S intra - D3S intra, every token | {len(auc.seeds)} | - | {_starred(auc)} | {_starred(end)} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- sentences


def _ess(c: Comparison, name: str, which: str = "long") -> dict[str, float]:
    rows = _steps_with_ess(c, name)
    part = [r for r in rows if (r["completion_len"] >= LONG) == (which == "long")]
    return {"median": statistics.median(r["is_ess"] for r in part), "lowest": min(r["is_ess"] for r in part),
            "weight": statistics.median(r["is_weight_mean"] for r in part), "kl": statistics.median(r["sampler_kl"] for r in part)}  # fmt: skip


def ess(c: Comparison, name: str, what: str = "median", which: str = "long") -> str:
    """``ess ARM [median|lowest|weight|kl] [long|short]``: one figure of the correction's weights."""
    return f"{_ess(c, name, which)[what]:.4f}" if what == "kl" else f"{_ess(c, name, which)[what]:.2f}"


def samplers_reading(c: Comparison) -> str:
    """docs/results.md: what the three sampler arms say."""
    pairs = {(a, b): c.paired(a, b, "time_auc") for a, b in (("grpo_bf16_seq", "grpo_f32"), ("grpo_bf16_tok", "grpo_f32"),
                                                           ("grpo_bf16_tok", "grpo_bf16_seq"))}  # fmt: skip
    none = claim(all(verdict(d) == "not resolved" for d in pairs.values()), "No sampler arm is resolved from another per training minute")
    ratio = [steps(c, a) / steps(c, "grpo_f32") for a in ("grpo_bf16_seq", "grpo_bf16_tok")]
    ends = {a: c.accuracy_at(a, BUDGET) for a in SAMPLERS}
    worst = {a: min(v for v in ends[a].values()) for a in SAMPLERS}
    rest = [v for a in SAMPLERS for v in ends[a].values() if v != worst[a]]
    noisy = claim(max(worst.values()) < min(rest), "one seed of each arm barely learned")
    long_for = {a: max(m for m in MINUTES if length_at(c, a, 60 * m) >= LONG) for a in SAMPLERS}
    lengths = [length_at(c, a, 60 * m) for a in SAMPLERS for m in MINUTES if m <= long_for[a]]
    best_end = []
    for a in SAMPLERS:
        seed = max(ends[a], key=ends[a].get)
        best_end.append(c.eval_at(a, seed, "mean_length", BUDGET))
    shortest = claim(min(SAMPLERS, key=lambda a: length_at(c, a, BUDGET)) == "grpo_bf16_seq", "`sequence_mask`'s arm shortened most")
    seq, tok = _ess(c, "grpo_bf16_seq"), _ess(c, "grpo_bf16_tok")
    return "\n".join([
        "What it says:",
        f"- **{none}**: AUC per training minute against the float32 sampler "
        f"{paired_text(pairs['grpo_bf16_seq', 'grpo_f32'], with_verdict=True)} with `sequence_mask`, "
        f"{paired_text(pairs['grpo_bf16_tok', 'grpo_f32'], with_verdict=True)} with `token_truncate`; `token_truncate` against "
        f"`sequence_mask` {paired_text(pairs['grpo_bf16_tok', 'grpo_bf16_seq'], with_verdict=True)}. The bfloat16 sampler fits "
        f"{span(ratio, lambda v: f'{v:.1f}')}x the float32 sampler's steps (a step's generation "
        f"{span((phase(c, a, 'generate') for a in ('grpo_bf16_seq', 'grpo_bf16_tok')), lambda v: f'{v:.0f}')} s against "
        f"{phase(c, 'grpo_f32', 'generate'):.0f} s). The task is noisy: {noisy} "
        f"({span((100 * v for v in worst.values()), lambda v: f'{v:.1f}')}% at 10 minutes), the others reached "
        f"{span((100 * v for v in rest), lambda v: f'{v:.1f}')}%.",
        "- **The completions shorten as the model learns**, in every arm: a completion cut at 256 tokens has no answer and "
        "scores 0, so the rewarded ones are the shorter ones, and held-out accuracy rises as the length falls (the seed "
        f"of each arm that learned most ended at {span(best_end, lambda v: f'{v:.0f}')} tokens at 10 minutes). The "
        f"long-completion reading holds for the first {span(long_for.values(), lambda v: f'{v:g}')} minutes of each run, where "
        f"the held-out completions averaged {span(lengths, lambda v: f'{v:.0f}')} tokens. {shortest} "
        f"({length_at(c, 'grpo_bf16_seq', BUDGET):.0f} tokens at 10 minutes against "
        f"{span((length_at(c, a, BUDGET) for a in ('grpo_f32', 'grpo_bf16_tok')), lambda v: f'{v:.0f}')}).",
        f"- **The correction's weights**: at steps whose completions averaged {LONG} tokens or more, `sequence_mask`'s "
        f"sequence weights had a normalised effective sample size (`is_ess`, (sum w)^2 / (N sum w^2), 1 when all weights "
        f"are equal) of {seq['median']:.2f} (median; lowest step {seq['lowest']:.2f}, mean sequence weight {seq['weight']:.2f}) at "
        f"this task's gap (KL {seq['kl']:.4f} nats a token); `token_truncate`'s {tok['median']:.2f} (lowest step "
        f"{tok['lowest']:.2f}).",
    ])


def methods_reading(c: Comparison) -> str:
    """docs/results.md: what the papers' methods against GRPO(4) say."""
    auc = {m: c.paired(m, DEFAULT, "time_auc") for m in METHODS}
    end = {m: c.paired(m, DEFAULT, AT10) for m in METHODS}
    between = [c.paired(a, b, "time_auc") for i, a in enumerate(METHODS) for b in METHODS[i + 1 :]]
    none = claim(all(verdict(d) == "not resolved" for d in [*auc.values(), *end.values(), *between]),
                 "Per training minute, no method is resolved from GRPO(4) or from another")  # fmt: skip
    above = claim(all(d.mean > 0 for d in [*auc.values(), *end.values()]), "Every mean is above GRPO(4)'s")

    def at_step(name: str, step: float) -> float | None:
        curve = c.entry(name)["curves"]["step"]
        return value_at(curve["x"], curve["accuracy"], step)

    step = min(min(c.entry(m)["steps"]) for m in METHODS)
    cost = [phase(c, m, "step") / phase(c, DEFAULT, "step") for m in METHODS]
    step_costs = ", ".join(f"{NAMES[m]} {phase(c, m, 'step'):.1f} s" for m in METHODS)
    shares = _token_shares(c, "d3s_intra")
    kept = [s.get("signal_tokens_kept") for s in c.entry("d3s_intra").get("signal_per_seed") or []]
    signal_steps = len(shares)
    dropped = sum(s <= 0.8 + 1e-9 for s in shares)
    tok = {m: _ms_per_token(c, m) for m in ("d3s_intra", "d3s_intra_all_tokens")}
    d3s_vs = [c.paired("d3s_intra", "d3s_intra_all_tokens", key) for key in ("time_auc", AT10)]
    no_help = claim(all(verdict(d) == "not resolved" for d in d3s_vs), "Token selection did not resolve a difference here")
    ess_rows = [r for m in METHODS for r in _steps_with_ess(c, m)]
    grpo_len = {m: length_at(c, DEFAULT, 60 * m) for m in (2.5, 10)}
    return "\n".join([
        "What it says:",
        f"- **{none}.** {above} ({span(100 * d.mean for d in auc.values())} AUC points a minute, "
        f"{span(100 * d.mean for d in end.values())} points at 10 minutes) and every paired interval holds 0. Per step the "
        f"methods' means are higher (seed-mean held-out accuracy at step {step}, the fewest steps any method's seed "
        f"trained: {', '.join(f'{NAMES[m]} {percent(at_step(m, step))}%' for m in METHODS)}, against GRPO(4)'s "
        f"{span(100 * at_step(a, step) for a in SAMPLERS)}% with any of the three samplers; not a paired comparison), but a "
        f"step samples 128 rollouts instead of 32 and costs {span(cost, lambda v: f'{v:.1f}')}x GRPO(4)'s time "
        f"({step_costs}, GRPO(4) "
        f"{phase(c, DEFAULT, 'step'):.1f} s), so in 10 minutes they fit {span((steps(c, m) for m in METHODS), lambda v: f'{v:.0f}')} "
        f"steps against {steps(c, DEFAULT):.0f}. D3S's update is the largest: its schedule raises m from 4 to 8 rows a group, so "
        f"by the end it updates on twice PODS's rows.",
        f"- **D3S's token selection drops the share the issue asked for**: over the steps where it was on, its loss kept "
        f"{', '.join(f'{k:.0%}' for k in kept)} of the signal rows' tokens (seeds 0, 1, 2; the target: a fifth dropped or "
        f"more); per step the share rises with the schedule from {min(shares):.0%} to {max(shares):.0%} (median "
        f"{statistics.median(shares):.0%}), so {dropped} of its {signal_steps} steps with a signal dropped at least a fifth "
        "and the later ones less.",
        f"- **{no_help}**: D3S with it against D3S without it, AUC per training minute "
        f"{paired_text(d3s_vs[0], with_verdict=True)}, accuracy at 10 minutes {paired_text(d3s_vs[1], with_verdict=True)}. It does not save update time in podsrl: the "
        "dropped tokens still run the forward and backward (they sit inside the kept sequences: only their gradient is "
        "masked), and the entropy it scores tokens by is computed besides, so a D3S update took a median "
        f"{tok['d3s_intra']:.1f} ms per completion token it ran against {tok['d3s_intra_all_tokens']:.1f} ms without the "
        "selection.",
        f"- **The correction stayed out of the way**: `token_truncate`'s `is_ess` read "
        f"{span((r['is_ess'] for r in ess_rows), lambda v: f'{v:.2f}')} at every step of every method arm (mean weight "
        f"{span((r['is_weight_mean'] for r in ess_rows), lambda v: f'{v:.2f}')}), at completions of {LONG}+ tokens and shorter.",
        f"- **The completions shorten in every arm, sooner for the methods** (held-out: "
        f"{span((length_at(c, m, 150) for m in METHODS), lambda v: f'{v:.0f}')} tokens at 2.5 minutes against GRPO(4)'s "
        f"{grpo_len[2.5]:.0f}; at 10 minutes {', '.join(f'{length_at(c, m, BUDGET):.0f} for {NAMES[m]}' for m in METHODS)}, "
        f"{grpo_len[10]:.0f} for GRPO(4)), so for them the reading on long completions holds for the first 2.5-5 minutes.",
    ])


def _ms_per_token(c: Comparison, name: str) -> float:
    """Median over the steps that ran an update of the update's milliseconds per completion token run."""
    return 1000 * statistics.median(r["time/update"] / r["tokens_run"] for seed in c.seeds(name) for r in c.metrics(name, seed)
                                    if (r.get("tokens_run") or 0) > 0)  # fmt: skip


def premise(c: Comparison) -> str:
    """README's premise: which half of a step costs more, measured with short answers
    (results/compare-vs-trl, beside this directory) and with long ones (this comparison)."""
    short = Comparison(c.root.parent / "compare-vs-trl")

    def split(comparison: Comparison, arm: str) -> str:
        med = comparison.entry(arm)["median_seconds"]
        return f"{med['step']:.1f} s: {med['generate']:.1f} sampling, {med['update']:.1f} updating"

    update = claim(all(short.entry(a)["median_seconds"]["update"] > short.entry(a)["median_seconds"]["generate"]
                       for a in ("grpo_n16", "trl_grpo_n8", "trl_grpo_n16")), "the update dominates")  # fmt: skip
    sampling = claim(all(phase(c, a, "generate") > phase(c, a, "update") for a in (*SAMPLERS, "pods_n16_m4")), "sampling dominates")
    none = claim(all(verdict(c.paired(m, DEFAULT, "time_auc")) == "not resolved" for m in METHODS),
                 "no method was resolved from GRPO(4) per training minute")  # fmt: skip
    t_p4, t_g16 = short.entry("pods_n16_m4")["time_to_target_seconds"], short.entry("grpo_n16")["time_to_target_seconds"]
    return (
        "Which half of a step costs more was measured both ways on a 2-core CPU. With answers of at most 16 "
        f"tokens {update} (GRPO(16)'s median step {split(short, 'grpo_n16')}), and there PODS(16, 4) reached 99% of "
        f"GRPO(16)'s peak in {fraction(t_p4, t_g16)} its time; with worked answers of about "
        f"{statistics.fmean(length_at(c, a, 0) for a in c.methods):.0f} tokens {sampling} (GRPO(4)'s step "
        f"{split(c, 'grpo_f32')}) and {none}. Every ratio of times in this README and in docs/results.md is {RATIO}."
    )


FIGURES = {
    "premise": premise,
    "arms": arms,
    "correction": correction,
    "tokens": tokens,
    "against-default": against_default,
    "ess": ess,
    "samplers-reading": samplers_reading,
    "methods-reading": methods_reading,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the comparison's output directory (compare.json, runs/)")
    args = parser.parse_args()
    c = Comparison(args.dir)
    for table in (arms(c), correction(c), tokens(c), against_default(c)):
        print(table)
        print()


if __name__ == "__main__":
    main()
