"""Where a run's numbers go: ``metrics.jsonl`` (one line per step), ``eval.jsonl`` (one line per
evaluation), a progress bar with ETA and the key figures, and TensorBoard / Weights & Biases when
asked for and installed. The notes a person should read about those numbers (steps without a
signal, cut-off completions: :mod:`podsrl.run.watch`) are printed above the bar.

The bar shows the step just taken: its figures (:data:`BAR_FIELDS`) are set before the bar
advances to "k/N", then the last evaluation's accuracy (read back from ``eval.jsonl`` on resume) and
the step's own time ("this step 179.6s": ``time/step``, generation to update). Beside the elapsed
time, "mean 246.21s/step" is the wall time a step since the bar started (or the run resumed),
evaluations and checkpoints included: the ETA is read from it (:data:`BAR_FORMAT`).

On resume, lines written after the checkpoint's step are dropped first, so the files read as if
the run had never been interrupted; that rewrite is atomic (a temporary file renamed over the old
one), so a kill during it loses no row.
"""

from __future__ import annotations

import json
import math
import secrets
import string
from pathlib import Path

from tqdm.auto import tqdm

from podsrl.errors import ConfigError, RunWriteError
from podsrl.run.rundir import write_text_atomic
from podsrl.run.watch import RunWatch

# The progress bar's figures of a step, in order: (label, metrics.jsonl key, format). A metric the
# step did not log is left out, so a new figure is one line here.
BAR_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("reward", "reward_mean", "{:.2f}"),
    ("kept", "reward_kept_mean", "{:.2f}"),
    ("len", "completion_len", "{:.0f}"),
)


# tqdm's layouts with its rate named: with smoothing 0 the rate is the mean over the steps since the
# bar started, not tqdm's moving average of the last few (which jumps after each evaluation).
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, mean {rate_fmt}{postfix}]"
BAR_FORMAT_NO_TOTAL = "{desc}: {n_fmt}{unit} [{elapsed}, mean {rate_fmt}{postfix}]"  # no train.max_steps: no bar, no ETA


def bar_text(metrics: dict, last_eval: str) -> str:
    """The text beside the progress bar's "k/N" for a step's ``metrics``."""
    parts = [f"{label} {fmt.format(metrics[key])}" for label, key, fmt in BAR_FIELDS if isinstance(metrics.get(key), (int, float))]
    if sampling := _sampling_postfix(metrics):
        parts.append(sampling)
    parts.append(f"eval {last_eval}")
    if isinstance(metrics.get("time/step"), (int, float)):
        parts.append(f"this step {metrics['time/step']:.1f}s")
    return " ".join(parts)


def _eval_text(accuracy: float) -> str:
    return f"{100 * accuracy:.0f}%"


def _truncate_jsonl(path: Path, max_step: int) -> None:
    if not path.exists():
        return
    rows = read_jsonl(path)
    for i, row in enumerate(rows, 1):
        if not isinstance(row.get("step"), int):
            raise ConfigError(f"{path}: row {i} has no step number; is it a podsrl {path.name}? (fix or delete that row)")
    write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in rows if row["step"] <= max_step))


def read_jsonl(path: Path) -> list[dict]:
    """The rows (JSON objects) of a JSON-lines file; a torn last line (a kill mid-write, or a
    write in progress while plotting a live run) is left out. Anything else that is not a JSON
    object, or text that is not UTF-8, is a ConfigError naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); is it a podsrl JSON-lines file?") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    rows = []
    for i, (number, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:
                continue
            raise ConfigError(f"{path}:{number}: not valid JSON ({err.msg}); fix or delete that line") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}; fix or delete that line")
        rows.append(row)
    return rows


class RunLogger:
    def __init__(self, run_dir: Path, cfg, *, start_step: int = 0, grader: str | None = None):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"  # one line per step
        _truncate_jsonl(self.metrics_path, start_step)
        # An eval at the resumed step was already done before the interruption... or not: keep
        # those at earlier steps only, the trainer re-evaluates where due.
        _truncate_jsonl(self.run_dir / "eval.jsonl", start_step)
        t = cfg.train
        total = t.max_steps if t.max_steps else None
        self.bar = tqdm(total=total, initial=start_step, desc="train", unit="step", disable=not t.progress, dynamic_ncols=True,
                        smoothing=0, bar_format=BAR_FORMAT if total else BAR_FORMAT_NO_TOTAL)  # fmt: skip
        evals = read_jsonl(self.run_dir / "eval.jsonl")  # a resumed run's last evaluation
        self.last_eval: str = _eval_text(evals[-1]["accuracy"]) if evals and isinstance(evals[-1].get("accuracy"), (int, float)) else "-"
        self.watch = RunWatch(cfg, grader)  # grader: the task's, which the all-zero warning names
        self.last_metrics: dict | None = None  # the last step's, for the bar
        self.tb = self.wandb = None
        if t.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ConfigError("train.tensorboard = true needs TensorBoard: pip install tensorboard") from err
            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        if t.wandb:
            try:
                import wandb
            except ImportError as err:
                raise ConfigError("train.wandb = true needs Weights & Biases: pip install wandb") from err
            self.wandb = wandb.init(
                project=t.wandb_project, dir=str(self.run_dir), config=cfg.to_dict(), id=wandb_run_id(self.run_dir), resume="allow"
            )

    def log_step(self, metrics: dict, state) -> None:
        _append(self.metrics_path, json.dumps(_finite(metrics)) + "\n")
        self.bar.set_postfix_str(bar_text(metrics, self.last_eval), refresh=False)  # before update(1) draws "k/N"
        self.bar.update(1)
        self.last_metrics = metrics
        self._notes(self.watch.step(metrics))
        self._scalars(metrics, state.step, prefix="train/")

    def log_eval(self, result, state) -> None:
        row = {"step": state.step, "train_seconds": state.train_seconds, **result.to_dict()}
        _append(self.run_dir / "eval.jsonl", json.dumps(row) + "\n")
        self.last_eval = _eval_text(result.accuracy)
        if self.last_metrics is not None:  # the bar shows it now, not after the next step
            self.bar.set_postfix_str(bar_text(self.last_metrics, self.last_eval))
        self._notes(self.watch.evaluation(result, state.step))
        self._scalars({"accuracy": result.accuracy, **result.pass_at_k}, state.step, prefix="eval/")

    def _notes(self, lines: list[str]) -> None:
        for line in lines:
            self.bar.write(line)  # above the bar (plain print would break it)

    def _scalars(self, values: dict, step: int, prefix: str) -> None:
        numbers = {prefix + k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in numbers.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)

    def close(self) -> None:
        self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


WANDB_ID_FILE = Path("wandb") / "podsrl-run-id"  # in the run directory; wandb.init(dir=RUN) writes RUN/wandb/ too


def wandb_run_id(run_dir: Path) -> str:
    """The Weights & Biases run id of the run in ``run_dir``: made (and written to
    ``RUN/wandb/podsrl-run-id``) when the run starts, read back when it resumes, so that a resumed
    run (``--resume``, ``train.resume = "auto"``) goes on logging to the same W&B run
    (``resume="allow"``: W&B continues the run with that id, or creates it). ``--overwrite``
    deletes ``wandb/``: a new run in the directory gets a new W&B run. W&B keeps the rows logged
    after the checkpoint and before the interruption; the resumed run's rows of those steps are
    ignored by W&B (a step must increase); metrics.jsonl holds the resumed run's."""
    path = Path(run_dir) / WANDB_ID_FILE
    if path.exists():
        run_id = path.read_text(encoding="utf-8").strip()
        if run_id:
            return run_id
    alphabet = string.ascii_lowercase + string.digits  # as wandb.util.generate_id
    run_id = "".join(secrets.choice(alphabet) for _ in range(8))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, run_id + "\n")
    return run_id


class NullLogger:
    """What ranks other than 0 log to: nothing (rank 0 writes the run's files)."""

    def log_step(self, metrics: dict, state) -> None:
        pass

    def log_eval(self, result, state) -> None:
        pass

    def close(self) -> None:
        pass


def _append(path: Path, line: str) -> None:
    """One JSON line at the end of ``path``. A write that fails (a full disk) is a RunWriteError
    naming the file; a torn line it may leave is dropped on resume (``_truncate_jsonl``)."""
    try:
        with open(path, "a") as f:
            f.write(line)
    except OSError as err:
        raise RunWriteError(f"could not write {path}: {err.strerror or err}; free space there") from err


def _finite(metrics: dict) -> dict:
    """JSON has no NaN: write null instead."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


def _sampling_postfix(metrics: dict) -> str:
    """The progress bar's sampling figures: groups trained with a signal of B, the prompts and
    generation batches sampled (with dynamic sampling, when more than one), the rollouts, the
    prompts skipped (prompt selection) and the epoch (passes over the training prompts)."""
    if "gen_batches" not in metrics:
        return ""
    B = metrics["prompts_sampled"] // max(1, metrics["gen_batches"])
    text = f"signal {metrics['groups_with_signal']}/{B}"
    if metrics["gen_batches"] > 1:
        text += f" of {metrics['prompts_sampled']} prompts ({metrics['gen_batches']} batches)"
    text += f" {metrics['rollouts_generated']} rollouts"
    if metrics.get("prompts_skipped"):
        text += f" skipped {metrics['prompts_skipped']}"
    if isinstance(metrics.get("epoch"), (int, float)):
        text += f" ep {metrics['epoch']:.2f}"
    return text


def comparable_reward(row: dict, *, early_stop: bool, rollouts: int) -> float | None:
    """A metrics.jsonl row's ``reward_mean`` when it is on a fixed-n run's basis (the step's first B
    prompts, each group's first round: podsrl/train/sampling.py), else None. Rows written since
    podsrl logs that basis have ``gen_batches``; an older row is on it unless its run used exact
    early stopping (``early_stop``) and the step sampled fewer than B x n rollouts (``rollouts``):
    then its mean was pooled over every sampled rollout, which weighs the groups that ran to n
    more than the others and is not comparable with a fixed-n run's (docs/run-directory.md)."""
    value = row.get("reward_mean")
    if not isinstance(value, (int, float)) or value != value:
        return None
    if "gen_batches" in row or not early_stop or row.get("rollouts_generated", rollouts) >= rollouts:
        return float(value)
    return None
