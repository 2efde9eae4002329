"""Atomic checkpoints: what ``--resume`` needs to continue a run exactly.

A checkpoint is a directory ``checkpoints/step-000020/`` holding the trainable weights
(``weights.safetensors``: the LoRA adapter's tensors, or every weight for full fine-tuning), the
optimizer and scheduler states, the RNG states and the step / training clock (``state.pt``). It is
written into a temporary sibling and renamed into place, and ``checkpoints/latest`` (a one-line
text file, itself replaced atomically) names the newest complete one. A run killed mid-write leaves
the previous checkpoint intact and at worst a stray ``.tmp-*`` directory, which is cleaned up.

The trainer draws every random number of step s from generators seeded by (seed, s), so resuming
needs no RNG stream position; the global RNG states are saved anyway for user code that uses them.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


@dataclass
class TrainState:
    step: int = 0  # optimizer steps completed
    train_seconds: float = 0.0  # training wall-clock so far (evaluation excluded)
    eval_seconds: float = 0.0
    last_eval_seconds: float = 0.0  # train clock at the last evaluation


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def save(run_dir: Path, model, optimizer, scheduler, state: TrainState, *, keep: int = 1) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"step-{state.step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    weights = trainable_state(model)
    # Tied embeddings share storage; safetensors refuses shared tensors, so clone the duplicates.
    seen: set[int] = set()
    for name, tensor in weights.items():
        if tensor.data_ptr() in seen:
            weights[name] = tensor.clone()
        seen.add(tensor.data_ptr())
    save_file(weights, str(tmp / "weights.safetensors"))
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "state": state.__dict__,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "python": random.getstate(),
            },
        },
        tmp / "state.pt",
    )
    if target.exists():
        # Replacing this step's checkpoint (the final save right after a periodic one): point
        # `latest` at the complete new copy first, so that it never names a half-deleted directory.
        _write_atomic(root / "latest", tmp.name)
        shutil.rmtree(target)
    os.replace(tmp, target)
    _write_atomic(root / "latest", target.name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stray in root.glob(".tmp-*"):
        shutil.rmtree(stray, ignore_errors=True)
    return target


def latest(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if _complete(path):
        return path
    # Interrupted between renaming the new checkpoint into place and updating the pointer.
    done = sorted(p for p in root.glob("step-*") if _complete(p))
    return done[-1] if done else None


def _complete(path: Path) -> bool:
    return (path / "state.pt").is_file() and (path / "weights.safetensors").is_file()


def load_weights(path: Path, model) -> None:
    """Copy a checkpoint's trainable weights into ``model`` (built with the run's config)."""
    weights = load_file(str(Path(path) / "weights.safetensors"))
    params = dict(model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise ValueError(f"checkpoint {path} has weights the model lacks (different model or LoRA setting?): {missing[:3]}")
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)


def load(path: Path, model, optimizer, scheduler) -> TrainState:
    load_weights(path, model)
    blob = torch.load(Path(path) / "state.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    torch.set_rng_state(blob["rng"]["torch"])
    cuda_rng = blob["rng"].get("cuda")
    if cuda_rng and torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_rng)
    random.setstate(blob["rng"]["python"])
    return TrainState(**blob["state"])


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
