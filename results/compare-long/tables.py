"""The markdown tables of issue 59's comparison on long completions (docs/results.md, docs/vllm.md),
from the report and the runs' files in this directory:

    podsrl compare configs/compare-long.toml --out results/compare-long --report-only
    .venv/bin/python results/compare-long/tables.py              # prints the tables (podsrl importable)
    .venv/bin/python results/compare-long/tables.py --dir /tmp/out   # another copy of the runs and report

1. Per arm: sampler and correction, steps in 10 training minutes (mean over seeds), median seconds a
   step (generation, update), held-out accuracy and the held-out completions' mean length at 0, 2.5,
   5, 7.5 and 10 training minutes (seed means read between each run's own evaluations, as the
   report's table; lengths from eval.jsonl ``mean_length``), AUC per training minute minus the
   float32 sampler's, paired by seed with its 95% interval, and training minutes to 99% of the
   float32 sampler's peak (compare.json ``time_to_target_seconds``) with that time as a fraction of
   its own.
2. Per arm that sampled in bfloat16, the correction by the training completions' length: each step's
   ``sampler_kl`` (k3 KL per token, sampler against policy), ``is_ess`` and ``is_weight_mean``
   (metrics.jsonl, logged whether or not a row was updated), medians over the steps whose mean
   completion (``completion_len``) was at least 100 tokens and over the shorter ones, the lowest
   ``is_ess`` of any step, and the steps whose ``is_ess`` fell below podsrl's warning bound
   (podsrl.run.watch.ESS_BOUND).
3. D3S's token selection: per D3S arm, the share of the signal rows' tokens its loss kept in the steps
   where the selection was on (compare.json ``signal_tokens_kept``, per seed; the median and range
   of the per-step shares, tokens_kept / tokens_run from metrics.jsonl), and the paired AUC per
   training minute and accuracy at 10 minutes of D3S against D3S without token selection (the
   report's paired_difference, by seed).
4. The papers' methods against GRPO(4) with the sampler default (bfloat16 + token_truncate, the arm
   that became the default): AUC per training minute and held-out accuracy at 10 minutes, paired by
   seed (the report's paired_difference), with the steps each fitted in the 10 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from podsrl.compare.stats import paired_difference, value_at
from podsrl.compare.table import difference
from podsrl.run.watch import ESS_BOUND

HERE = Path(__file__).resolve().parent
NAMES = {"grpo_f32": "GRPO(4), float32 sampler", "grpo_bf16_seq": "GRPO(4), bfloat16 + sequence_mask",
         "grpo_bf16_tok": "GRPO(4), bfloat16 + token_truncate", "pods_n16_m4": "PODS(16, 4)",
         "d3s_intra": "D3S intra", "d3s_intra_all_tokens": "D3S intra, every token"}  # fmt: skip
MINUTES = (0, 2.5, 5, 7.5, 10)
LONG = 100  # tokens: table 2 splits the steps at this mean completion length
DEFAULT = "grpo_bf16_tok"  # table 4's reference: GRPO(4) with the sampler and correction that became the default


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def evals(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]


def mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def by_seed(entry: dict, key: str) -> dict[int, float | None]:
    return {r["seed"]: r.get(key) for r in entry["runs"]}


def runs_of(root: Path, entry: dict) -> list[Path]:
    return [root / "runs" / Path(r["dir"]).parent.name / f"seed{r['seed']}" for r in entry["runs"]]


def label(name: str, entry: dict) -> str:
    k = len(entry["runs"])
    return NAMES.get(name, name) + ("" if k == 3 else f" ({k} seed{'s' * (k != 1)})")


def arms(report: dict, root: Path) -> list[str]:
    methods, base = report["methods"], report["baseline"]
    base_time = methods[base]["time_to_target_seconds"] if base in methods else None
    at_min = " / ".join(f"{m:g}" for m in MINUTES)
    lines = [
        f"| arm | steps in 10 min | s/step (generate, update) | held-out % at {at_min} training min | held-out completion tokens at {at_min} "
        f"| AUC per training min - float32 sampler, paired | min to 99% of its peak ({100 * (report['target_accuracy'] or 0):.1f}%) |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, e in methods.items():
        if not e["runs"]:
            continue
        curve = e["curves"]["train_seconds"]
        acc = [value_at(curve["x"], curve["accuracy"], 60 * m) for m in MINUTES]
        length = []
        for m in MINUTES:
            per_run = []
            for run in runs_of(root, e):
                rows = evals(run)
                per_run.append(value_at([r["train_seconds"] for r in rows], [r["mean_length"] for r in rows], 60 * m))
            length.append(mean(per_run))
        med = e["median_seconds"]
        t = e["time_to_target_seconds"]
        cells = [
            label(name, e),
            f"{statistics.fmean(e['steps']):.0f}",
            f"{med['step']:.1f} ({med['generate']:.1f}, {med['update']:.1f})",
            " / ".join("-" if a is None else f"{100 * a:.1f}" for a in acc),
            " / ".join("-" if v is None else f"{v:.0f}" for v in length),
            difference((e.get("paired_vs_baseline") or {}).get("time_auc"), baseline=name == base, count=False),
            "never" if t is None else f"{t / 60:.1f}" + (f" ({t / base_time:.2f}x)" if base_time else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def correction(report: dict, root: Path) -> list[str]:
    lines = [
        f"| arm | steps: completions >= {LONG} tokens / shorter | sampler KL per token, median (long / short) | is_ess, median (long / short) "
        f"| is_weight_mean, median (long / short) | lowest is_ess | steps with is_ess < {ESS_BOUND} |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, e in report["methods"].items():
        if not e["runs"]:
            continue
        steps = [r for run in runs_of(root, e) for r in metrics(run) if isinstance(r.get("is_ess"), (int, float))]
        if not steps or all(abs(r.get("sampler_kl") or 0.0) < 1e-6 for r in steps):
            continue  # a float32 sampler: no gap to correct
        long = [r for r in steps if r["completion_len"] >= LONG]
        short = [r for r in steps if r["completion_len"] < LONG]

        def pair(key: str) -> str:
            return f"{median([r[key] for r in long])} / {median([r[key] for r in short])}"

        kl = f"{statistics.median([r['sampler_kl'] for r in long]):.4f}" if long else "-"
        kl += f" / {statistics.median([r['sampler_kl'] for r in short]):.4f}" if short else " / -"
        low = sum(r["is_ess"] < ESS_BOUND for r in steps)
        cells = [label(name, e), f"{len(long)} / {len(short)}", kl, pair("is_ess"), pair("is_weight_mean"),
                 f"{min(r['is_ess'] for r in steps):.2f}", f"{low} of {len(steps)}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def tokens(report: dict, root: Path) -> list[str]:
    methods = report["methods"]
    lines = [
        "| arm | signal-row tokens kept, per seed | per-step share: median [min, max] | against D3S every token: AUC per training min, paired "
        "| accuracy at 10 min, paired |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    other = methods.get("d3s_intra_all_tokens")
    for name, e in methods.items():
        if e.get("rule") != "d3s_intra" or not e["runs"]:
            continue
        kept = [s.get("signal_tokens_kept") for s in e.get("signal_per_seed") or []]
        shares = [
            r["tokens_kept"] / r["tokens_run"]
            for run in runs_of(root, e)
            for r in metrics(run)
            if (r.get("token_fraction") or 1.0) < 1.0 and (r.get("tokens_run") or 0) > 0
        ]
        cells = [label(name, e), ", ".join("-" if k is None else f"{k:.0%}" for k in kept),
                 f"{statistics.median(shares):.0%} [{min(shares):.0%}, {max(shares):.0%}]" if shares else "- (never on)"]  # fmt: skip
        if name != "d3s_intra_all_tokens" and other and other["runs"]:
            for key in ("time_auc", "final_accuracy"):
                d = paired_difference(by_seed(e, key), by_seed(other, key))
                cells.append(difference(d.to_json(), count=False))
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def against_default(report: dict) -> list[str]:
    methods = report["methods"]
    ref = methods.get(DEFAULT)
    if not (ref and ref["runs"]):
        return []
    lines = [f"| arm - {NAMES[DEFAULT]} | seeds | steps in 10 min (GRPO(4): {statistics.fmean(ref['steps']):.0f}) "
             "| AUC per training min, paired | accuracy at 10 min, paired |", "|---|---|---|---|---|"]  # fmt: skip
    for name in ("pods_n16_m4", "d3s_intra", "d3s_intra_all_tokens"):
        e = methods.get(name)
        if not (e and e["runs"]):
            continue
        auc, final = (paired_difference(by_seed(e, key), by_seed(ref, key)) for key in ("time_auc", "final_accuracy"))
        cells = [NAMES[name], str(len(auc.seeds)), f"{statistics.fmean(e['steps']):.0f}",
                 difference(auc.to_json(), count=False), difference(final.to_json(), count=False)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=HERE, help="the comparison's output directory (compare.json, runs/)")
    args = parser.parse_args()
    report = json.loads((args.dir / "compare.json").read_text())
    print("\n".join(arms(report, args.dir)))
    print()
    print("\n".join(correction(report, args.dir)))
    print()
    print("\n".join(tokens(report, args.dir)))
    print()
    print("\n".join(against_default(report)))


if __name__ == "__main__":
    main()
