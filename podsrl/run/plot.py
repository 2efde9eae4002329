"""``podsrl plot``: reward and held-out accuracy against step and against training wall-clock.

Several runs go on one figure, one colour each, labelled by the end of their run directory's path
that tells them apart (``grpo/seed0`` and ``pods/seed0`` for two runs of one ``podsrl compare``,
whose directories are both named ``seed0``). Wall-clock
is the training clock (evaluation time excluded), the axis the PODS paper's speed-ups are read on.
A damaged metrics file, a row without the fields plotted, or an output that cannot be written is a
ConfigError naming it; the image is written to a temporary file and renamed into place.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from podsrl.errors import ConfigError
from podsrl.run.metrics import comparable_reward, read_jsonl


def plot_runs(run_dirs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    fmt = out.suffix[1:].lower() or "png"
    if out.is_dir():
        raise ConfigError(f"cannot write the plot {out}: it is a directory; give a file name such as {out / 'curves.png'}")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    if fmt not in fig.canvas.get_supported_filetypes():
        plt.close(fig)
        raise ConfigError(f"cannot write the plot {out}: matplotlib writes no .{fmt} files; use .png, .pdf or .svg")
    names = distinct_names([Path(r) for r in run_dirs])
    for i, run in enumerate(map(Path, run_dirs)):
        if not (run / "metrics.jsonl").exists():
            plt.close(fig)
            raise ConfigError(f"{run} is not a podsrl run directory (no metrics.jsonl); pass directories made by `podsrl train`")
        try:
            steps = _rows(run / "metrics.jsonl", ("step", "train_seconds", "reward_mean"))
            evals = _rows(run / "eval.jsonl", ("step", "train_seconds", "accuracy", "ci_low", "ci_high"))
        except ConfigError:
            plt.close(fig)
            raise
        label = labels[i] if labels else names[i]
        color = f"C{i % 10}"
        x_step = [r["step"] for r in steps]
        x_time = [r["train_seconds"] / 60 for r in steps]
        early_stop, rollouts = _sampling(run)
        reward = _smooth([comparable_reward(r, early_stop=early_stop, rollouts=rollouts) for r in steps])
        axes[0, 0].plot(x_step, reward, color=color, label=label)
        axes[0, 1].plot(x_time, reward, color=color, label=label)
        if evals:
            acc = [100 * r["accuracy"] for r in evals]
            lo = [100 * r["ci_low"] for r in evals]
            hi = [100 * r["ci_high"] for r in evals]
            for ax, xs in ((axes[1, 0], [r["step"] for r in evals]), (axes[1, 1], [r["train_seconds"] / 60 for r in evals])):
                ax.plot(xs, acc, "o-", color=color, label=label)
                ax.fill_between(xs, lo, hi, color=color, alpha=0.15)
    axes[0, 0].set(title="training reward (first B prompts, first round: the fixed-n basis; smoothed)", xlabel="step", ylabel="reward")
    axes[0, 1].set(title="training reward vs training wall-clock", xlabel="minutes (eval excluded)", ylabel="reward")
    axes[1, 0].set(title="held-out accuracy (95% CI)", xlabel="step", ylabel="accuracy %")
    axes[1, 1].set(title="held-out accuracy vs training wall-clock", xlabel="minutes (eval excluded)", ylabel="accuracy %")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=110, format=fmt)
        os.replace(tmp, out)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write the plot {out}: {err.strerror or err}; pick another -o") from None
    finally:
        plt.close(fig)
    return out


def distinct_names(runs: list[Path]) -> list[str]:
    """The shortest ends of the runs' paths (the name, then parent/name, ...) that differ between
    different directories; the same directory given twice gets the same name."""
    parts = [Path(run).resolve().parts for run in runs]
    distinct = len(set(parts))
    for k in range(1, max((len(p) for p in parts), default=1) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if len(set(names)) == distinct:
            return names
    return [str(run) for run in runs]


def _rows(path: Path, fields: tuple[str, ...]) -> list[dict]:
    """The rows of a run's JSON-lines file, each checked to have the fields plotted."""
    rows = read_jsonl(path)
    for i, row in enumerate(rows, 1):
        missing = [f for f in fields if f not in row or (f != "reward_mean" and row[f] is None)]
        if missing:
            raise ConfigError(f"{path}: row {i} has no {missing[0]!r}; is it a podsrl {path.name}? (fix or delete that row)")
    return rows


def _sampling(run: Path) -> tuple[bool, int]:
    """(exact early stopping, B x n) from the run's config.toml, for comparable_reward: older
    early-stopping runs logged a pooled reward, which is left out of the curve (a gap)."""
    import tomllib

    try:
        data = tomllib.loads((run / "config.toml").read_text(encoding="utf-8"))
        return data["rollout"].get("early_stop", "off") != "off", int(data["train"]["prompts_per_step"]) * int(data["rollout"]["n"])
    except (OSError, ValueError, KeyError, TypeError):
        return False, 0  # no readable config: plot the logged reward as it is


def _smooth(values: list[float], window: int = 5) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else float("nan"))
    return out
