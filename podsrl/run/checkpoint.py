"""Atomic checkpoints: what ``--resume`` needs to continue a run exactly.

A checkpoint is a directory ``checkpoints/step-000020/`` holding the trainable weights
(``weights.safetensors``: the LoRA adapter's tensors, or every weight for full fine-tuning), the
optimizer and scheduler states, the RNG states and the step / training clock (``state.pt``). It is
written into a temporary sibling and renamed into place, and ``checkpoints/latest`` (a one-line
text file, itself replaced atomically) names the newest complete one. A run killed mid-write leaves
the previous checkpoint intact and at worst a stray ``.tmp-*`` directory, which is cleaned up.
A write that fails (a full disk, EIO, a quota; the writers raise OSError, safetensors' own error or,
from ``torch.save``, a RuntimeError without an errno, so any exception of the write counts) does the
same: the partial copy is removed, ``latest`` still names the previous checkpoint, and the error
says where, why, how much space the checkpoint needs and how much is free; the run stops
(``train.checkpoint_failure = "stop"``, exit code 74) or goes on to retry at the next checkpoint.
The files are fsynced before the rename, so an error the file system reports late is caught too.

Reading is as careful as writing: without ``latest`` (deleted, or never written) the newest
complete ``step-*`` directory is used; a file that cannot be read (truncated, corrupt) is a
:class:`DamagedCheckpoint` naming it, and :func:`load_newest` then falls back to the next older
complete checkpoint (``train.keep_checkpoints`` > 1 keeps some). Weights that do not fit the model
(another model or LoRA setting) are a ConfigError, never a half-loaded model: everything is read
and checked before anything is copied.

The trainer draws every random number of step s from generators seeded by (seed, s), so resuming
needs no RNG stream position; the global RNG states are saved anyway for user code that uses them.

A checkpoint is data, never code (SECURITY.md): ``state.pt`` is read with ``torch.load(...,
weights_only=True)``, which rebuilds tensors and plain Python values (dicts, lists, tuples, numbers,
strings, None) and refuses anything else instead of running it. So ``state.pt`` holds only such
values: the optimizer's and the scheduler's ``state_dict()``, :class:`TrainState` as a plain dict
(``dataclasses.asdict``, read back by ``TrainState(**d)``: a field added to TrainState must be such a
value, and a checkpoint written before the field existed gets its default) and the RNG states. A
plain dict rather than ``torch.serialization.add_safe_globals([TrainState])``: the file then loads
in any process, with or without podsrl imported, and no process-wide allow-list is changed. Older
checkpoints stored ``state.__dict__``, the same plain dict, and load unchanged. A ``state.pt`` that
needs more (a pickled object: a file changed or made elsewhere, possibly to run code when loaded) is
an :class:`UnsafeCheckpoint` naming the file, never loaded another way and never skipped for an
older checkpoint: the user decides what to do with a run directory that holds it.

Under torchrun (``dist``) a checkpoint is still one directory of full, unsharded tensors, written by
rank 0 alone: with "ddp" every rank holds the same weights and optimizer state; with "fsdp" they are
gathered first (``torch.distributed.checkpoint.state_dict``'s full state dicts, offloaded to the
CPU; every rank takes part, rank 0 writes). Every rank reads it back (the run directory must be on a
file system all nodes see), so a run can resume at another world size.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from podsrl.errors import CheckpointWriteError, ConfigError
from podsrl.run.rundir import write_text_atomic


# The budget's prediction of the next step (TrainState.next_step_seconds): the longest of the last
# RECENT_STEPS steps, times STEP_MARGIN. Chosen on the committed runs' metrics (python bench/budget_stop.py;
# docs/run-directory.md, "The budget"): none of the 135 runs a time budget ended would have overrun it (every
# one did before), leaving 2.7% of the budget unused on average (1.3% for a rule that knew the next step).
RECENT_STEPS = 5
STEP_MARGIN = 1.25


class DamagedCheckpoint(ConfigError):
    """A checkpoint file that cannot be read: the message names it."""


class UnsafeCheckpoint(ConfigError):
    """A checkpoint file that does not load as plain data (``weights_only=True``): the message names
    it. Not a DamagedCheckpoint: :func:`load_newest` does not fall back past it."""


@dataclass
class TrainState:
    step: int = 0  # optimizer steps completed
    train_seconds: float = 0.0  # training wall-clock so far (evaluation excluded)
    eval_seconds: float = 0.0
    last_eval_seconds: float = 0.0  # train clock at the last evaluation
    world_size: int = 1  # processes the run was trained on (a resume may use another number)
    prompts: dict = dataclasses.field(default_factory=dict)  # the prompt stream (podsrl.train.prompts.PromptStream.state_dict); {}: before issue 44
    step_seconds: list = dataclasses.field(default_factory=list)  # the last RECENT_STEPS steps' training seconds, oldest first; []: before issue 68

    def record_step(self, seconds: float) -> None:
        """One more step of ``seconds`` on the training clock (and in the recent steps the budget's
        prediction reads); ``step`` is counted by the caller."""
        self.train_seconds += seconds
        self.step_seconds = [*self.step_seconds, float(seconds)][-RECENT_STEPS:]

    def next_step_seconds(self) -> float | None:
        """The predicted length of the next step: :data:`STEP_MARGIN` x the longest of the recent
        steps; None before any step (nothing to predict from: the first step always runs)."""
        return STEP_MARGIN * max(self.step_seconds) if self.step_seconds else None

    def done(self, cfg) -> bool:
        """The budget is spent: ``train.max_steps`` steps or ``train.max_seconds`` of training, whichever
        comes first, or too little of ``train.max_seconds`` is left for the next step (:meth:`overrun_note`)."""
        return self._spent(cfg) or self.overrun_note(cfg) is not None

    def overrun_note(self, cfg) -> str | None:
        """A line for the log when the budget is not spent but the next step is predicted not to fit
        in what is left of ``train.max_seconds`` (:meth:`next_step_seconds`; docs/run-directory.md,
        "The budget"); None otherwise."""
        t, predicted = cfg.train, self.next_step_seconds()
        if self._spent(cfg) or not t.max_seconds or predicted is None or self.train_seconds + predicted <= t.max_seconds:
            return None
        return (
            f"the next step would not fit in train.max_seconds = {t.max_seconds:g}: {self.train_seconds:.1f} s trained, "
            f"{t.max_seconds - self.train_seconds:.1f} s left, and the next step is predicted at {predicted:.1f} s "
            f"({STEP_MARGIN:g} x the longest of the last {len(self.step_seconds)})"
        )

    def _spent(self, cfg) -> bool:
        t = cfg.train
        return bool((t.max_steps and self.step >= t.max_steps) or (t.max_seconds and self.train_seconds >= t.max_seconds))

    def eval_due(self, cfg) -> bool:
        """An evaluation is due: every ``eval.every_steps`` steps, or ``eval.every_seconds`` of training since the last."""
        e = cfg.eval
        by_step = e.every_steps and self.step % e.every_steps == 0
        by_time = e.every_seconds and self.train_seconds - self.last_eval_seconds >= e.every_seconds
        return bool(by_step or by_time)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


@dataclass(frozen=True)
class SavePolicy:
    """How a run keeps its checkpoints, and what a checkpoint that cannot be written does."""

    keep: int = 1  # the newest checkpoints kept on disk (train.keep_checkpoints)
    on_failure: str = "stop"  # "stop": raise CheckpointWriteError; "retry": warn and go on (train.checkpoint_failure)
    log: Callable[[str], None] = print  # where the "retry" warning goes


def save(run_dir: Path, model, optimizer, scheduler, state: TrainState, *, policy: SavePolicy = SavePolicy(), dist=None) -> Path | None:
    """Write the checkpoint of ``state.step`` (see the module docstring), keeping the newest
    ``policy.keep``; returns its directory.

    A write that fails (ENOSPC, EIO, a quota: whatever the writers raise) leaves the previous
    checkpoint and ``latest`` as they were and removes the partial one; then ``policy.on_failure``
    "stop" raises a CheckpointWriteError naming the directory, the error, the space the checkpoint
    needs and the space free, and "retry" logs that as a warning and returns None (the next
    checkpoint tries again). Under torchrun every rank learns the outcome from rank 0 and does the same.
    """
    root = Path(run_dir) / "checkpoints"
    target = root / f"step-{state.step:06d}"
    if dist is not None and dist.active:
        weights, optim_state = _gather_full(model, optimizer, dist)
    else:
        weights, optim_state = trainable_state(model), optimizer.state_dict()
    failure = error = None
    if dist is None or dist.is_main:
        try:
            _write(root, target, weights, optim_state, scheduler, state, policy.keep)
        except Exception as err:  # noqa: BLE001 - the writers' I/O errors are OSError, SafetensorError, RuntimeError
            error = _one_line(err)  # the text only: the error's traceback holds the partial file open
        if error is not None:
            failure = _write_failure(root, target, error, weights, optim_state)
    if dist is not None and dist.active:
        failure = dist.broadcast_object(failure)  # also the barrier: the others wait for the write
    if failure is None:
        return target
    previous = latest(run_dir)
    if policy.on_failure == "retry":
        kept = f"{previous.name} stays the newest checkpoint" if previous is not None else "the run has no checkpoint yet"
        policy.log(f"podsrl: warning: {failure}; {kept}; training goes on and the next checkpoint tries again (train.checkpoint_failure = 'retry')")
        return None
    if previous is not None:
        then = f"then resume with `podsrl train --resume {run_dir}` (from {previous.name}, which is intact)"
    else:
        then = f"then start the run again with `--out {run_dir} --overwrite` (it has no earlier checkpoint)"
    raise CheckpointWriteError(f"{failure}; free space there, {then}; train.checkpoint_failure = 'retry' would go on without it")


def _write(root: Path, target: Path, weights: dict, optim_state: dict, scheduler, state: TrainState, keep: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    named = False  # whether `latest` names tmp (then it is the checkpoint to keep)
    try:
        # Tied embeddings share storage; safetensors refuses shared tensors, so clone the duplicates.
        seen: set[int] = set()
        for name, tensor in weights.items():
            if tensor.data_ptr() in seen:
                weights[name] = tensor.clone()
            seen.add(tensor.data_ptr())
        save_file(weights, str(tmp / "weights.safetensors"))
        torch.save(
            {
                "optimizer": optim_state,
                "scheduler": scheduler.state_dict(),
                "state": dataclasses.asdict(state),  # a plain dict: weights_only=True loads it
                "rng": {
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "python": random.getstate(),
                },
            },
            tmp / "state.pt",
        )
        _fsync_dir_files(tmp)  # a full disk can surface only here, at the flush
        if target.exists():
            # Replacing this step's checkpoint (the final save right after a periodic one): point
            # `latest` at the complete new copy first, so that it never names a half-deleted directory.
            _write_atomic(root / "latest", tmp.name)
            named = True
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        if not named:  # the partial copy; `latest` still names the previous checkpoint
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_atomic(root / "latest", target.name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stray in root.glob(".tmp-*"):
        shutil.rmtree(stray, ignore_errors=True)


def _fsync_dir_files(directory: Path) -> None:
    for file in directory.iterdir():
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_failure(root: Path, target: Path, error: str, weights: dict, optim_state: dict) -> str:
    """What went wrong, in one line: the directory, the error, the space needed and the space free.

    The space free is measured once the partial copy is gone: :func:`_write` has removed its
    directory, and the writer that failed (torch.save's zip writer) may still hold its file open
    from the error's traceback, in a reference cycle: a deleted file's blocks are freed only when
    it is closed, so the garbage collector runs first (issue 32: "12.9 MB free", 24 MB after exit)."""
    gc.collect()
    needed = _nbytes(weights) + _nbytes(optim_state)
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = f"{_mb(shutil.disk_usage(where).free)} free there"
    except OSError:
        free = "its free space unknown"
    return f"cannot write checkpoint {target.name} in {root} ({error}): it needs about {_mb(needed)}, {free}"


def _nbytes(obj) -> int:
    """Bytes of the tensors in a (nested) state dict."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def full_weights(model, dist) -> dict[str, torch.Tensor]:
    """The trainable weights as full tensors (FSDP: gathered to the CPU, a collective every rank
    calls; complete on rank 0)."""
    if not dist.sharded:
        return trainable_state(model)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {n: t for n, t in state.items() if n in trainable}


def _gather_full(model, optimizer, dist) -> tuple[dict[str, torch.Tensor], dict]:
    """Trainable weights and optimizer state as full tensors (FSDP: gathered, a collective)."""
    if not dist.sharded:
        return trainable_state(model), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return full_weights(model, dist), get_optimizer_state_dict(model, optimizer, options=options)


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (see :func:`candidates`), or None."""
    found = candidates(run_dir)
    return found[0] if found else None


# What ``latest`` may name: a checkpoint of checkpoints/ itself, or the complete temporary copy that
# replaces one (``_write`` points at it before deleting the old directory of the same step).
_POINTER = re.compile(r"step-\d{6,}|\.tmp-[A-Za-z0-9_]+")
_warned: set[Path] = set()


def candidates(run_dir: Path) -> list[Path]:
    """Complete checkpoints, the one to resume from first: the one ``latest`` names, then every
    complete ``step-*`` directory, newest first. Without a readable pointer (deleted, or the run
    was interrupted between renaming a checkpoint into place and updating it), by step alone. A
    run directory reads nothing outside itself: a pointer that is not the name of a directory in
    checkpoints/ (``step-NNNNNN``, or ``.tmp-*`` mid-replacement), such as an absolute path or one
    with ``..``, is ignored with a warning (once per process), the steps deciding."""
    root = Path(run_dir) / "checkpoints"
    steps = sorted((p for p in root.glob("step-*") if _complete(p)), reverse=True)
    try:
        pointer = (root / "latest").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return steps
    if not _POINTER.fullmatch(pointer):
        if root not in _warned:
            _warned.add(root)
            newest = steps[0].name if steps else "none"
            print(f"podsrl: warning: {root / 'latest'} names {pointer[:200]!r}, not a checkpoint of {root} (step-NNNNNN); "
                  f"it is ignored and the newest complete step is used ({newest})", file=sys.stderr, flush=True)  # fmt: skip
        return steps
    named = root / pointer
    if _complete(named):
        return [named, *(p for p in steps if p != named)]
    return steps


def _complete(path: Path) -> bool:
    return (path / "state.pt").is_file() and (path / "weights.safetensors").is_file()


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    file = Path(path) / "weights.safetensors"
    try:
        return load_file(str(file))
    except Exception as err:  # truncated or corrupt: safetensors raises its own error types
        raise DamagedCheckpoint(f"checkpoint file {file} is damaged ({_one_line(err)})") from None


def _read_state(path: Path, *, mmap: bool = False) -> dict:
    file = Path(path) / "state.pt"
    try:
        # Data only (see the module docstring), to the CPU: a GPU run's optimizer state is saved as CUDA
        # tensors, and a machine without a GPU must still read it (export, eval); the optimizer and
        # FSDP move it to the parameters' device.
        blob = torch.load(file, weights_only=True, mmap=mmap, map_location="cpu")
        missing = {"optimizer", "scheduler", "state", "rng"} - set(blob)
    except pickle.UnpicklingError as err:
        if "weights only" not in str(err).lower():
            raise DamagedCheckpoint(f"checkpoint file {file} is damaged ({_one_line(err)})") from None
        raise UnsafeCheckpoint(_unsafe_message(file, err)) from None
    except Exception as err:  # truncated: RuntimeError, EOFError ...
        raise DamagedCheckpoint(f"checkpoint file {file} is damaged ({_one_line(err)})") from None
    if missing:
        raise DamagedCheckpoint(f"checkpoint file {file} is damaged (no {sorted(missing)[0]!r} entry)")
    return blob


def _unsafe_message(file: Path, err: Exception) -> str:
    """Why ``file`` was refused, in one line: the objects it would build (read without building them)."""
    try:
        needs = torch.serialization.get_unsafe_globals_in_checkpoint(file)
    except Exception:  # noqa: BLE001 - only the message depends on it
        needs = []
    if needs:
        what = f"it would call or build {', '.join(needs[:5])}"
    else:
        reason = str(err).split("WeightsUnpickler error:", 1)[-1]
        what = " ".join(reason.split())[:160]
    return (
        f"checkpoint file {file} holds more than tensors and plain values ({what}), which podsrl never writes there: "
        "it was changed or made elsewhere, and loading it could run code, so podsrl refuses it (torch.load with "
        "weights_only=True; SECURITY.md); resume or export only run directories you made, or delete this checkpoint "
        "directory to use an older one"
    )


def read_train_state(path: Path) -> TrainState:
    """A checkpoint's step and clocks, its file checked but its optimizer state left on disk
    (memory-mapped): what ``podsrl export`` and the model card need. DamagedCheckpoint names a
    file that does not read."""
    return TrainState(**_read_state(path, mmap=True)["state"])


def _apply_weights(path: Path, weights: dict[str, torch.Tensor], model, dist=None) -> None:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}  # FSDP: global shapes
    extra = [n for n in weights if n not in params]
    absent = [n for n in params if n not in weights]
    shapes = [n for n in weights if n in params and params[n].shape != weights[n].shape]
    if extra or absent or shapes:
        if shapes:
            n = shapes[0]
            detail = f"{n} is {list(weights[n].shape)} there, {list(params[n].shape)} here"
        else:
            detail = f"it has {extra[0]}, which this model lacks" if extra else f"it lacks {absent[0]}"
        raise ConfigError(
            f"checkpoint {path} does not fit this model ({detail}): it was written with another model.name or LoRA "
            "setting (model.lora, model.lora_rank, model.lora_target_modules); use the run's own, from its config.toml"
        )
    if dist is not None and dist.sharded:  # every rank read the full tensors; each keeps its shard
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        return
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)


def load_weights(path: Path, model, dist=None) -> None:
    """Copy a checkpoint's trainable weights into ``model`` (built with the run's config)."""
    _apply_weights(path, _read_weights(path), model, dist)


def load(path: Path, model, optimizer, scheduler, dist=None) -> TrainState:
    weights, blob = _read_weights(path), _read_state(path)  # both read before anything changes
    _apply_weights(path, weights, model, dist)
    try:
        if dist is not None and dist.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(model, optimizer, blob["optimizer"], options=StateDictOptions(full_state_dict=True))
        else:
            optimizer.load_state_dict(blob["optimizer"])
        scheduler.load_state_dict(blob["scheduler"])
        state = TrainState(**blob["state"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"checkpoint {path}: its optimizer state does not fit this run ({_one_line(err)}); resume with the "
            "run's own model and optim settings, from its config.toml"
        ) from None
    torch.set_rng_state(blob["rng"]["torch"])
    cuda_rng = blob["rng"].get("cuda")
    if cuda_rng and torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_rng)
    random.setstate(blob["rng"]["python"])
    return state


def load_newest(run_dir: Path, model, optimizer=None, scheduler=None, *, log=print, dist=None) -> tuple[Path, TrainState | None]:
    """Load the newest checkpoint that reads (weights only without ``optimizer``): (its path, its
    state). A damaged one is reported with ``log`` and the next older complete one tried; when none
    is left, the ConfigError names the damaged file(s). Under torchrun every rank calls it and,
    reading the same files, falls back the same way."""
    found = candidates(run_dir)
    if not found:
        raise ConfigError(f"{run_dir}: no checkpoint under {Path(run_dir) / 'checkpoints'}")
    damaged = []
    for i, path in enumerate(found):
        try:
            if optimizer is None:
                load_weights(path, model, dist)
                return path, None
            return path, load(path, model, optimizer, scheduler, dist)
        except DamagedCheckpoint as err:
            damaged.append(str(err))
            if i + 1 < len(found):
                log(f"podsrl: warning: {err}; falling back to the older checkpoint {found[i + 1].name}")
    raise ConfigError(
        f"{'; '.join(damaged)}; no complete checkpoint is left to fall back to (train.keep_checkpoints > 1 keeps "
        "older ones): start the run again with --overwrite"
    )


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def _write_atomic(path: Path, text: str) -> None:
    write_text_atomic(path, text + "\n")
