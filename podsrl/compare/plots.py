"""compare.png, four panels. Top: held-out accuracy against optimizer steps (left; the curve whose
area is the AUC) and against training wall-clock (right), seed mean and 95% band per method, the
target dotted, and each method's first point at the target marked. Bottom: each method minus the
baseline, paired by seed, in accuracy points: AUC (left) and final accuracy (right), the mean with
its paired 95% t-interval, every seed's own difference as a dot, zero dashed; an interval that
excludes zero is drawn solid and labelled with a star. A screening (each method its own task) has
no baseline: its bottom panels say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Panel: (axis in the report's curves, the report's key of the first point at the target, x label, x scale)
_PANELS = (
    ("step", "steps_to_target", "optimizer steps", 1.0),
    ("train_seconds", "time_to_target_seconds", "training wall-clock, minutes (evaluation excluded)", 1 / 60),
)


def plot_report(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(13, 9.5), constrained_layout=True, gridspec_kw={"height_ratios": [5, 3.5]})
    axes = grid[0]
    axes[1].sharey(axes[0])
    shared = report.get("device_sharing", {}).get("runs_per_device", 1) > 1
    target = report["target_accuracy"]
    for ax, (axis, reach_key, xlabel, scale) in zip(axes, _PANELS):
        for i, (name, entry) in enumerate(report["methods"].items()):
            c = entry["curves"][axis]
            if not c["x"]:
                continue
            color = f"C{i % 10}"
            x = [v * scale for v in c["x"]]
            k = len(entry["runs"])
            ax.plot(x, [100 * a for a in c["accuracy"]], "o-", ms=3, color=color, label=f"{name} ({k} seed{'s' * (k != 1)})")
            if all(v is not None for v in c["band_low"] + c["band_high"]):
                low = [100 * max(0.0, v) for v in c["band_low"]]  # a t-band can leave [0, 1]; accuracy cannot
                high = [100 * min(1.0, v) for v in c["band_high"]]
                ax.fill_between(x, low, high, color=color, alpha=0.15)
            if entry.get(reach_key) is not None and target is not None:
                ax.plot([entry[reach_key] * scale], [100 * target], marker="v", ms=9, color=color, ls="none")
        if target is not None:
            ax.axhline(100 * target, color="gray", ls=":", lw=1,
                       label=f"{100 * report['target_fraction']:.0f}% of {report['baseline']}'s peak (v: first reached)")  # fmt: skip
        title = "against optimizer steps"
        if axis == "train_seconds":
            title = "against training wall-clock" + (" (runs shared a device: not a fair axis)" if shared else "")
        ax.set(xlabel=xlabel, title=title)
        ax.grid(alpha=0.3)
    seeds = {len(e["runs"]) for e in report["methods"].values() if e["runs"]}  # a method not run yet draws no band
    band = "95% t-band over seeds" if seeds != {1} else f"band: {one_run_interval(report.get('eval_samples'))} (1 seed)"
    axes[0].set_ylabel("held-out accuracy %")
    below = ("a screening: each method its own task" if report.get("screening")
             else f"below: method - {report['baseline']} paired by seed (*: the 95% interval excludes 0)")  # fmt: skip
    fig.suptitle(_wrapped(f"held-out accuracy, seed mean ({band})", below))
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    colors = {name: f"C{i % 10}" for i, name in enumerate(report["methods"])}
    for ax, what in zip(grid[1], ("auc", "final_accuracy")):
        _plot_differences(ax, report, what, colors)
    grid[1][0].set_title("AUC (mean accuracy over the evaluations after step 0)")
    grid[1][1].set_title("final accuracy (at the budget)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


TITLE_CHARACTERS = 110  # a title line's characters at the figure's width (13 in) and the title's font, with room


def _wrapped(*parts: str) -> str:
    """The title's parts, each from a new line and over as many lines as it needs to stay inside the
    figure (a one-seed band's text is long)."""
    import textwrap

    return "\n".join(line for part in parts for line in textwrap.wrap(part, TITLE_CHARACTERS))


def one_run_interval(samples: int | None) -> str:
    """What the band of a one-seed curve is: the run's own 95% interval of each evaluation, which
    podsrl.train.evaluate computes by the samples per problem."""
    if samples == 1:
        return "the run's Wilson 95% interval (1 sample per problem)"
    if samples:
        return (f"the run's 95% interval over its problems ({samples} samples per problem: normal, at least Wilson's on the "
                "completions; Wilson's on the problems when all agree)")
    return "the run's own 95% interval per evaluation"


def _label_alignment(x: float, low: float, high: float) -> str:
    """Where a label at ``x`` sits against its point, so that it stays inside [low, high]: beside
    the point towards the middle near either end, centred on it in the middle third."""
    where = (x - low) / (high - low) if high > low else 0.5
    return "left" if where < 1 / 3 else "right" if where > 2 / 3 else "center"


def _plot_differences(ax, report: dict[str, Any], key: str, colors: dict[str, str]) -> None:
    """One row per method other than the baseline: its paired differences (points) on ``key``."""
    rows = [(name, (e.get("paired_vs_baseline") or {}).get(key)) for name, e in report["methods"].items()]
    rows = [(name, d) for name, d in rows if d and d["mean"] is not None]
    if report.get("screening"):
        ax.text(0.5, 0.5, "a screening: each method trained on its own task, no paired differences", ha="center", va="center",
                transform=ax.transAxes)  # fmt: skip
        ax.set(xticks=[], yticks=[])
        return
    ax.axvline(0, color="gray", ls="--", lw=1)
    ax.set_xlabel(f"method - {report['baseline']}, accuracy points (line: 95% paired t-interval; o: seeds)")
    ax.grid(alpha=0.3, axis="x")
    if not rows:
        ax.text(0.5, 0.5, f"no paired runs of {report['baseline']} and another method", ha="center", va="center",
                transform=ax.transAxes)  # fmt: skip
        ax.set_yticks([])
        return
    labels, notes = [], []
    for y, (name, d) in enumerate(reversed(rows)):
        color = colors[name]
        # The seeds' own differences just below the interval, so the line does not hide them.
        ax.plot([100 * v for v in d["per_seed"]], [y - 0.22] * len(d["per_seed"]), "o", ms=5, color=color, alpha=0.6, mfc="none")
        interval = ""
        if d["ci95"] is not None:
            ax.plot([100 * v for v in d["ci95"]], [y, y], color=color, lw=3 if d["excludes_zero"] else 1.5,
                    ls="-" if d["excludes_zero"] else (0, (4, 2)))  # fmt: skip
            interval = f" [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}]"
        ax.plot([100 * d["mean"]], [y], "D", ms=7, color=color)
        k = len(d["seeds"])
        notes.append(ax.annotate(f"{100 * d['mean']:+.1f}{interval}, {k} seed{'s' * (k != 1)}", (100 * d["mean"], y),
                                 xytext=(0, 7), textcoords="offset points", ha="center", fontsize=8, color=color))  # fmt: skip
        labels.append(f"{name}{' *' if d['excludes_zero'] else ''}")
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.set_ylim(-0.6, len(labels) - 0.4)
    low, high = ax.get_xlim()
    pad = 0.05 * (high - low)
    ax.set_xlim(min(low, -pad), max(high, pad))  # zero always in view
    low, high = ax.get_xlim()
    for note in notes:  # a label centred on a point near an end ran over the axis and the method names
        note.set_ha(_label_alignment(note.xy[0], low, high))
