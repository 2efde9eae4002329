"""The run directory: one run per directory, one process at a time, nothing lost.

A run directory holds one run (``config.toml``, ``metrics.jsonl``, ``eval.jsonl``,
``checkpoints/`` ...). The rules, and why:

- **One run per directory.** A directory that already holds a run is refused unless the run is
  continued (``resume``) or replaced (``overwrite``: its run files, ``RUN_FILES``, are deleted and
  nothing else, so ``--out .`` never empties the working directory). Starting over silently
  would truncate its metrics, mix two runs' evaluations and leave ``checkpoints/latest`` naming
  the old run's weights.
- **One process at a time.** The writer holds an exclusive lock on ``DIR/.lock`` (``filelock``:
  ``flock`` on POSIX, ``msvcrt`` on Windows); the operating system drops it when the process exits,
  however it dies (a pid file alone would outlive a ``kill -9``). The holder writes its pid into the
  file, for the message a second process gets. A second process is refused with the holder's pid, before it loads a model when the
  lock is already held, and again under the lock (another run may have finished meanwhile).
- **Unique default names.** A name made from ``train.out_dir`` (``runs/{time}-{rule}``) never
  collides: it is claimed with an exclusive ``mkdir``, and a ``-2``, ``-3`` ... suffix is added
  when it is taken (two runs started in the same second).
- **Nothing before the checks.** :func:`prepare` only reads; :meth:`RunDir.open` creates the
  directory, and the trainer calls it once the config, task, rewards and model have loaded, so a
  run that fails its checks leaves no empty directory behind.
- **Resume keeps the training.** The config of a resumed run may differ from the run's own only in
  settings that do not change what is learned (``FREE``: logging, checkpointing, devices, engine
  resources, mathematically exact batching options, exact early stopping and the reward values it
  relies on) and in a raised budget (``BUDGET``), except ``train.max_steps`` under a cosine learning
  rate, which decays to 0 at that step. Anything else is refused, naming the settings; an allowed
  change is recorded in ``config_changes.jsonl`` and ``config.toml`` is rewritten. A run with no
  checkpoint has nothing to resume: every command says to train it again in place
  (:func:`restart_advice`).
- **Atomic rewrites.** :func:`write_text_atomic` (write a temporary sibling, fsync, rename) is how
  every run file is rewritten; appends of whole lines are left to the readers' torn-line rule.

Distributed runs: everything here belongs to rank 0. :func:`prepare` is read-only, but its lock
probe on another rank can find the lock taken by rank 0 of the same job (under FSDP nothing is
collective while the model loads, so rank 0 may already have called :meth:`RunDir.open`): the
trainer runs it on rank 0 and broadcasts the result. :meth:`RunDir.open`, :meth:`RunDir.write_config`
and :meth:`RunDir.close` write; rank 0 then broadcasts ``RunDir.path`` (a default name's suffix is
only chosen in ``open``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from podsrl.errors import ConfigError

if TYPE_CHECKING:
    from podsrl.config import Config

LOCK_FILE = ".lock"
CHANGES_FILE = "config_changes.jsonl"
# Files that mark a directory as holding a run ...
MARKERS = ("config.toml", "metrics.jsonl", "eval.jsonl", "checkpoints")
# A run that another trainer than `podsrl train` trained (a TRL arm of podsrl compare,
# podsrl.compare.trl_arm) says which in this file, and keeps that trainer's checkpoints in TRL_DIR.
TRAINER_FILE = "trainer.json"
TRL_DIR = "trl"
PODSRL = "podsrl"  # the trainer of a run without TRAINER_FILE
# ... and everything a run writes, which `overwrite` deletes (done.json: podsrl compare's marker;
# model: the exported policy, podsrl.run.export). docs/run-directory.md describes each.
RUN_FILES = (*MARKERS, "curves.png", CHANGES_FILE, "tensorboard", "wandb", "done.json", "model", TRAINER_FILE, TRL_DIR)

# May be raised on resume (None, no limit, is the highest); lowering one would change the
# schedules the run has followed so far (learning rate, m, token fraction: all follow progress).
BUDGET = ("train.max_steps", "train.max_seconds")
# Exact early stopping trains on what fixed-n sampling trains on, in law (podsrl/core/early_stop.py),
# and reward.values is read by it alone: turning it on or off, its round size and the declared values
# may change on resume (the way forward when a reward leaves its declared values). Like a changed
# world size, the rollouts then differ from an uninterrupted run's; what is learned does not, in law.
EXACT_IN_LAW = ("rollout.early_stop", "rollout.round_size", "reward.values")
# May change on resume: where and how the run executes (the device, and with it the arithmetic: a
# GPU's kernels, or bfloat16 under model.mixed_precision, whose "auto" resolves anew on each machine),
# what it logs, how often it checkpoints, and batching options that are exact (the same update). Evaluation *timing* is free; what an
# evaluation measures is not, or eval.jsonl would mix two measurements.
FREE = frozenset(
    {
        "train.progress", "train.out_dir", "train.tensorboard", "train.wandb", "train.wandb_project",
        "train.checkpoint_every", "train.keep_checkpoints",
        "train.export_model", "train.export_checkpoints", "train.export_dtype", "train.export_merged", "train.push_to_hub",
        "train.resume", "train.stop_signals", "train.checkpoint_failure",
        "reward.timeout_seconds", "reward.max_timeout_fraction", "reward.workers",
        "eval.every_steps", "eval.every_seconds", "eval.at_start", "eval.at_end",
        "model.device", "model.gradient_checkpointing", "model.mixed_precision",
        "optim.micro_batch_size", "optim.micro_batch_tokens", "optim.share_prompts",
        "rollout.engine", "rollout.generation_batch_size", "rollout.gpu_memory_utilization",
        "rollout.enable_sleep_mode", "rollout.kv_cache_gib", "rollout.enforce_eager", "rollout.max_model_len",
        *EXACT_IN_LAW,
    }
)  # fmt: skip
FREE_SECTIONS = ("distributed.",)  # how many processes, and how they split the work
# What decides which tensors a checkpoint holds and what they mean (the LoRA ones only with LoRA).
WEIGHT_SETTINGS = ("model.name", "model.lora", "model.lora_rank", "model.lora_alpha", "model.lora_target_modules")


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: carries the run directory and its newest checkpoint (None when it
    has none yet) so the CLI can say exactly how to go on."""

    def __init__(self, path: Path, checkpoint: Path | None):
        super().__init__(str(path))
        self.path = Path(path)
        self.checkpoint = checkpoint

    def advice(self) -> str:
        return "interrupted" + resume_advice(self.path, self.checkpoint)


def resume_advice(path: Path, checkpoint: Path | None) -> str:
    """How to go on with the run in ``path`` whose newest checkpoint is ``checkpoint`` (None: it
    has none), as the tail of a sentence: "; resume with `podsrl train --resume DIR` (from ...)"."""
    if checkpoint is not None:
        return f"; resume with `podsrl train --resume {path}` (from {checkpoint.name})"
    return f" before the first checkpoint of {path}; nothing to resume: {restart_advice(path)}"


def restart_advice(path: Path) -> str:
    """The one way forward for a run with no checkpoint (``--resume``, ``podsrl export`` and
    ``podsrl eval --run`` all give it): train it again from its own config.toml, in place."""
    return f"train it again with `{restart_command(path)}` (and checkpoint more often with --train.checkpoint_every)"


def restart_command(path: Path) -> str:
    """The command that trains the run in ``path`` again from the start, with its own settings: its
    config.toml is read before --overwrite deletes the old run's files (a bare `--out DIR
    --overwrite` would train the defaults, the demo, instead)."""
    return f"podsrl train {Path(path) / 'config.toml'} --out {path} --overwrite"


@dataclass
class RunDir:
    """A run directory claimed by :func:`prepare`; :meth:`open` creates and locks it."""

    path: Path
    resume: bool = False
    overwrite: bool = False
    unique: bool = False  # a name from train.out_dir: add a suffix rather than refuse
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # resume: setting -> (run's, now)
    _lock: FileLock | None = field(default=None, repr=False)

    def open(self) -> Path:
        """Create the directory (parents too), take its lock, and (``overwrite``) delete the old
        run's files; returns the path, with a default name's suffix. Raises ConfigError when the
        directory cannot be made, is in use, or holds a run that is neither resumed nor replaced."""
        try:
            if self.unique:
                self.path = _claim_unique(self.path)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot create the run directory {self.path}: {err.strerror or err}; pick another --out") from None
        self._lock = _lock(self.path)
        try:
            if not self.resume and holds_run(self.path):  # again, under the lock
                if not self.overwrite:
                    raise ConfigError(_refusal(self.path))
                for name in RUN_FILES:
                    _remove(self.path / name)
        except BaseException:
            self.close()
            raise
        return self.path

    def write_config(self, cfg: Config, *, step: int = 0, log=print, notes: dict[str, str] | None = None) -> None:
        """Write ``config.toml`` (atomically) and, on resume, append what changed to
        ``config_changes.jsonl`` with the step it applies from. ``notes``: comments after settings
        (:func:`podsrl.config.to_toml`), e.g. what ``rollout.sampler_dtype`` resolved to here."""
        from podsrl.config import to_toml

        if self.changes:
            row = {
                "step": step,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "changes": {k: {"run": old, "now": new} for k, (old, new) in self.changes.items()},
            }
            with open(self.path / CHANGES_FILE, "a") as f:
                f.write(json.dumps(row) + "\n")
            log("podsrl: resuming with changed settings: " + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in self.changes.items()))
        write_text_atomic(self.path / "config.toml", to_toml(cfg, notes))

    def close(self) -> None:
        """Release the lock (the lock file stays: deleting it would let two processes lock two
        different files of the same name)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Path:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def prepare(path: str | Path, cfg: Config | None = None, *, resume: bool = False, overwrite: bool = False, unique: bool = False) -> RunDir:
    """Check that a run may use ``path``, creating and writing nothing.

    ``resume``: ``path`` must hold a run whose config differs from ``cfg`` only as ``FREE`` and
    ``BUDGET`` allow (the differences are kept in ``RunDir.changes``). Otherwise ``path`` must not be
    a file, must be creatable, and must not hold a run unless ``overwrite`` (``unique``: a taken
    name gets a suffix instead). A lock already held by a live process is refused here too.
    """
    if resume and overwrite:
        raise ConfigError("--resume continues a run and --overwrite replaces one; give only one of them")
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run directory {path} is a file, not a directory; pick another --out")
    changes: dict[str, tuple[Any, Any]] = {}
    if resume:
        check_is_run(path, "--resume")
        if cfg is not None:
            changes = resume_changes(path, cfg)
    elif path.is_dir() and holds_run(path) and not overwrite and not unique:
        raise ConfigError(_refusal(path))
    else:
        _check_creatable(path)
    if path.is_dir():
        _probe_lock(path)
    return RunDir(path=path, resume=resume, overwrite=overwrite, unique=unique, changes=changes)


def check_is_run(path: Path, option: str) -> None:
    """ConfigError naming ``option`` unless ``path`` holds a run (its config.toml)."""
    if not (Path(path) / "config.toml").is_file():
        raise ConfigError(f"{option} {path}: not a run directory (no config.toml); give the directory a `podsrl train` made")


def read_trainer(path: Path) -> str:
    """Which trainer made the run in ``path``: its TRAINER_FILE's ("trl", "trl-pods"), "podsrl" without one."""
    file = Path(path) / TRAINER_FILE
    return json.loads(file.read_text())["trainer"] if file.is_file() else PODSRL


def check_trained_by_podsrl(path: Path, option: str) -> None:
    """ConfigError naming ``option`` and what to do instead when another trainer than ``podsrl train``
    made the run in ``path`` (a TRL arm of podsrl compare): its checkpoints are that trainer's, which
    ``--resume``, ``--run`` and ``podsrl export`` do not read."""
    trainer = read_trainer(path)
    if trainer == PODSRL:
        return
    raise ConfigError(
        f"{option} {path}: this run was trained by TRL (trainer = {trainer!r}, a TRL arm of `podsrl compare`; "
        f"{TRAINER_FILE}), and its checkpoints, if any are left in {Path(path) / TRL_DIR}, are TRL's, not podsrl's. "
        "To continue it, run the `podsrl compare` command that made it again (it resumes its runs); its held-out "
        f"evaluations are in {Path(path) / 'eval.jsonl'}; to score one of its TRL checkpoints, "
        f"`podsrl eval {Path(path) / 'config.toml'} --model {Path(path) / TRL_DIR}/checkpoint-N`"
    )


def holds_run(path: Path) -> bool:
    return any((Path(path) / name).exists() for name in MARKERS)


def config_differences(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """Every setting whose value differs: dotted name -> (old, new). An unset ``select.m`` counts as
    the m it resolves to (a run's config.toml holds the resolved m: :func:`resolved_m`)."""
    a, b = resolved_m(old).to_dict(), resolved_m(new).to_dict()
    out = {}
    for section in {**a, **b}:
        sa, sb = a.get(section, {}), b.get(section, {})
        for key in {**sa, **sb}:
            if sa.get(key) != sb.get(key):
                out[f"{section}.{key}"] = (sa.get(key), sb.get(key))
    return out


def resume_changes(path: Path, cfg: Config) -> dict[str, tuple[Any, Any]]:
    """The differences between ``cfg`` and the run's ``config.toml`` that a resume may make;
    raises ConfigError naming the others."""
    run_cfg = run_config(path)
    changes = config_differences(run_cfg, cfg)
    refused, lowered = [], []
    for name, (old, new) in changes.items():
        if name in BUDGET:
            if new is not None and (old is None or new < old):
                lowered.append(f"{name} ({_show(old)} -> {_show(new)})")
        elif name == "model.dtype" and new == "float32":
            pass  # upcast: a bfloat16 full fine-tuning run (refused since, issue 32) goes on in float32
        elif name not in FREE and not name.startswith(FREE_SECTIONS):
            refused.append(f"{name} ({_show(old)} -> {_show(new)})")
    if refused:
        hint = (
            "; to evaluate the run differently use `podsrl eval --run DIR` with those settings"
            if all(r.startswith("eval.") for r in refused)
            else ""
        )
        raise ConfigError(
            f"--resume {path}: the run was trained with different settings: {', '.join(refused)}; a resumed run keeps "
            f"its training settings (only train.max_steps and train.max_seconds may be raised): drop those overrides, "
            f"or start a new run with --out{hint}"
        )
    if lowered:
        raise ConfigError(
            f"--resume {path}: {', '.join(lowered)} lowers the run's budget; a resumed run may only raise it (the "
            "learning-rate and selection schedules follow it); to stop sooner, press Ctrl-C after a checkpoint"
        )
    if "train.max_steps" in changes and run_cfg.optim.lr_schedule == "cosine":
        old, new = changes["train.max_steps"]
        raise ConfigError(
            f"--resume {path}: train.max_steps ({_show(old)} -> {_show(new)}) with optim.lr_schedule = 'cosine', which "
            f"decays the rate to 0 at train.max_steps: the steps left would follow a cosine over {_show(new)} steps, the "
            f"rate rising again from where the {_show(old)}-step schedule left it, a schedule neither length has. A cosine "
            f"run's length is fixed: train a new run with the longer schedule (`podsrl train {Path(path) / 'config.toml'} "
            f"--train.max_steps={_show(new)} --out NEW_DIR`), or resume this one with its own train.max_steps"
        )
    return changes


def check_weight_settings(path: Path, cfg: Config) -> None:
    """Refuse model settings that differ from the run's where they decide which tensors its
    checkpoint holds or what they mean (``podsrl eval --run DIR --model.lora_rank=8``)."""
    run_cfg = run_config(path)
    names = WEIGHT_SETTINGS if (run_cfg.model.lora or cfg.model.lora) else WEIGHT_SETTINGS[:2]
    differ = [f"{k} ({_show(old)} -> {_show(new)})" for k, (old, new) in config_differences(run_cfg, cfg).items() if k in names]
    if differ:
        raise ConfigError(
            f"--run {path}: its checkpoint was trained with other model settings: {', '.join(differ)}; "
            "drop those overrides (the run's own are in its config.toml)"
        )


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a reader, or a kill at any instant, sees the old
    content or the new, never a mix: write a temporary sibling, fsync it, rename it over."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable; cheap, and not possible everywhere
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------


def run_config(path: Path) -> Config:
    """The run's config, from its config.toml (a ConfigError names the file), with ``select.m`` as
    the run trained with it (:func:`trained_m`: a config.toml of an older podsrl may leave it unset)."""
    cfg = _saved_config(path)
    return with_m(cfg, trained_m(path, cfg)[0])


def _saved_config(path: Path) -> Config:
    from podsrl import config as config_mod

    try:
        return config_mod.load(Path(path) / "config.toml")
    except ConfigError as err:
        if str(Path(path) / "config.toml") in str(err):
            raise
        raise ConfigError(f"{Path(path) / 'config.toml'}: {err}") from None


def with_m(cfg: Config, m: int) -> Config:
    """``cfg`` with ``select.m = m``."""
    import dataclasses

    return cfg if cfg.select.m == m else dataclasses.replace(cfg, select=dataclasses.replace(cfg.select, m=m))


def resolved_m(cfg: Config) -> Config:
    """``cfg`` with ``select.m`` set to what an unset m resolves to today (the trainer saves it so:
    a later change of m's default cannot change a run, nor what its card and reports say)."""
    return with_m(cfg, cfg.select.m_start(cfg.rollout.n))


def trained_m(path: Path, cfg: Config | None = None) -> tuple[int, str | None]:
    """``select.m`` as the run in ``path`` trained with it (``cfg``: its config.toml, read when not
    given), and, when that config.toml leaves m unset and the run's m is not today's default, a line
    saying so. podsrl saves the resolved m since issue 45; before, config.toml said none, which meant
    the default of the day: max(1, n // 4) until issue 38 (2026-11-25; one rollout kept per group
    below n = 8), max(2, n // 4) at most n since, so a run with n from 2 to 7 would resume at another
    m. The m of the run's first step in metrics.jsonl decides (the first step's progress is 0: it
    logs the m a schedule starts from); without one, the default before issue 38."""
    cfg = cfg if cfg is not None else _saved_config(path)
    sel, n = cfg.select, cfg.rollout.n
    now = sel.m_start(n)
    before = n if sel.rule == "all" else max(1, n // 4)
    if sel.m is not None or before == now:
        return now, None
    first = _first_step_m(Path(path) / "metrics.jsonl")
    m, source = (first, "as its first step in metrics.jsonl logged") if first in (before, now) else (before, "m's default then")
    if m == now:
        return m, None
    return m, (
        f"podsrl: {Path(path) / 'config.toml'} leaves select.m unset (written by podsrl before issue 45, which saves "
        f"it): the run trained with m = {m} ({source}; today's default for rollout.n = {n} is {now}), and keeps m = {m}"
    )


def _first_step_m(metrics: Path) -> int | None:
    """The ``m`` of the first step row of a metrics.jsonl (None: no file, no such row)."""
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row:
            return row.get("m") if isinstance(row.get("m"), int) else None
    return None


def _refusal(path: Path) -> str:
    return (
        f"run directory {path} already holds a run; continue it with `podsrl train --resume {path}`, replace it "
        "with --overwrite, or pick another --out"
    )


def _show(value: Any) -> str:
    return "none" if value is None else json.dumps(value) if isinstance(value, (bool, list, dict)) else repr(value)


def _check_creatable(path: Path) -> None:
    """Fail early when ``path`` cannot be made: its nearest existing ancestor is a file or is not
    writable. (root may write anywhere; what is left is found when ``open`` makes it.)"""
    if path.is_dir():
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"cannot create the run directory {path}: {parent} is a file, not a directory; pick another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create the run directory {path}: {parent} is not writable; pick another --out")


def _claim_unique(path: Path) -> Path:
    """Create ``path``, or ``path-2``, ``path-3`` ... when taken; mkdir is atomic, so two
    processes never get the same one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(1, 10_000):
        candidate = path if i == 1 else path.with_name(f"{path.name}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise ConfigError(f"cannot find a free name for the run directory {path}-N; pick one with --out")


def _lock(path: Path) -> FileLock:
    """Take ``path/.lock`` exclusively (non-blocking) and write our pid into it."""
    lock = FileLock(path / LOCK_FILE)
    for attempt in range(5):  # another process's `_probe_lock` holds it for microseconds
        try:
            lock.acquire(blocking=False)
            break
        except Timeout:
            if attempt == 4:
                raise ConfigError(_in_use(path, _holder(path))) from None
            time.sleep(0.05)
        except OSError as err:
            raise ConfigError(f"cannot create the run directory's lock {path / LOCK_FILE}: {err.strerror or err}; pick another --out") from None
    with contextlib.suppress(OSError):  # informational (Windows locks the bytes against other handles)
        (path / LOCK_FILE).write_text(f"{os.getpid()}\n")
    return lock


def _probe_lock(path: Path) -> None:
    """Refuse now, before a model is loaded, when a live process holds ``path``'s lock."""
    if not (path / LOCK_FILE).is_file():
        return
    lock = FileLock(path / LOCK_FILE)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise ConfigError(_in_use(path, _holder(path))) from None
    except OSError:
        return  # open() will say what is wrong
    lock.release()


def _holder(path: Path) -> str:
    try:
        return (path / LOCK_FILE).read_text().strip() or "unknown"
    except (OSError, UnicodeDecodeError):
        return "unknown"


def _in_use(path: Path, holder: str) -> str:
    return (
        f"run directory {path} is in use by another podsrl process (pid {holder}); wait for it to finish, "
        "or pick another --out"
    )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
