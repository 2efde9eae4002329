"""compare.png: held-out accuracy against optimizer steps (left) and against training wall-clock
(right), seed mean and 95% band per method, the target dotted, and each method's first point at the
target marked."""

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

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True, constrained_layout=True)
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
    seeds = {len(e["runs"]) for e in report["methods"].values()}
    band = "95% t-band over seeds" if seeds != {1} else "band: the run's Wilson 95% interval (1 seed)"
    axes[0].set_ylabel("held-out accuracy %")
    fig.suptitle(f"held-out accuracy, seed mean ({band})")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
