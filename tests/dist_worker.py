"""One optimizer step per case, on fixed rollouts, at any world size: what tests/test_distributed.py
runs alone (``python tests/dist_worker.py SPEC``) and under ``torchrun --nproc-per-node=2``.

SPEC is a JSON file: {"model": dir, "reward": "file.py:fn", "out": dir, "cases": {name: {...}}}, a
case being {"overrides": {"section.key": value}, "uniform_second_half": bool, "uniform_all": bool}
(zero-variance groups: the second half of the prompts, or all). For every case rank 0
writes ``out/<name>-w<world>.safetensors`` (the trainable weights after the step, full tensors),
``out/<name>-w<world>-grads.safetensors`` (the gradients the optimizer stepped with, summed over the
ranks, full tensors) and ``out/<name>-w<world>.json`` (the step's metrics).

``python tests/dist_worker.py -m podsrl ARGS...`` runs ``python -m podsrl ARGS...`` instead (what
tests/test_distributed.py's ``_torchrun`` launches for ``-m podsrl``). Either way the process runs in
strict mode (:func:`hold_collectives_to_placement`): every tensor podsrl hands to a torch.distributed
tensor collective must be on ``Dist.device``, which is what an NCCL group requires (CUDA tensors
only) and what this CPU's gloo would otherwise never check; under gloo strict mode makes
``Dist.device`` a stand-in device that no caller's tensor is on, as no CPU tensor is on a GPU.
"""

from __future__ import annotations

import functools
import json
import random
import runpy
import sys
import weakref
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parents[1]
OURS = (ROOT / "podsrl", ROOT / "tests")  # not ROOT: `make setup`'s .venv, with the libraries, lies in it

from conftest import exit_without_teardown, tiny_config_dict  # noqa: E402

from podsrl.run import checkpoint as ckpt  # noqa: E402
from podsrl.train import distributed  # noqa: E402
from podsrl.train import loop as trainer
from podsrl.config import from_dict  # noqa: E402
from podsrl.engines import Rollouts, Sampling  # noqa: E402


class FixedEngine:
    """Completions that depend only on (prompt, sample index), never on the rank, the seed or the
    weights: the same rollouts at any world size. With ``uniform_from``, the prompts at global
    position >= uniform_from get n identical completions (zero-variance groups)."""

    def __init__(self, tokenizer, *, offset: int = 0, uniform_from: int | None = None):
        self.tokenizer, self.offset, self.uniform_from = tokenizer, offset, uniform_from

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollouts:
        eos = self.tokenizer.eos_token_id
        completions = []
        for b, prompt in enumerate(prompt_ids):
            uniform = self.uniform_from is not None and self.offset + b >= self.uniform_from
            for j in range(sampling.n):
                rng = random.Random(hash((tuple(prompt), 0 if uniform else j)) % (2**31))
                length = rng.randint(1, sampling.max_new_tokens)
                ids = [rng.randint(200, min(5000, len(self.tokenizer) - 1)) for _ in range(length)]
                if length < sampling.max_new_tokens:
                    ids[-1] = eos
                completions.append(ids)
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        truncated = [c[-1] != eos for c in completions]
        return Rollouts(prompt_ids=prompt_ids, completion_ids=completions, texts=texts, truncated=truncated)

    def sync_weights(self, model) -> None:
        pass

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ strict mode: placement as NCCL needs it

# torch.distributed's tensor collectives (not the object ones, which place their own tensors).
TENSOR_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
)  # fmt: skip

# Strict mode's collectives device under gloo: a device this process has none of (torch's slot for an
# out-of-tree backend), so no tensor of a caller is on it, as no CPU tensor is on an NCCL rank's GPU.
STAND_IN = torch.device("privateuseone", 0)


class PlacementError(AssertionError):
    pass


class StandInDevice(TorchFunctionMode):
    """Tensors "on" :data:`STAND_IN`, stored on the CPU. A tensor is on it when it was made there
    (a factory called with ``device=STAND_IN``) or moved there (``Tensor.to(STAND_IN)``, which copies
    a tensor that is not on it yet, as a move from the CPU to a GPU does, and returns one that is
    already there as it is); nothing else is, whatever its ``.device`` says (``cpu``). A weak registry
    of those tensors stands for the device."""

    def __init__(self):
        super().__init__()
        self.on: dict[int, weakref.ref] = {}

    def holds(self, t: torch.Tensor) -> bool:
        ref = self.on.get(id(t))
        return ref is not None and ref() is t

    def _add(self, t: torch.Tensor) -> None:
        key = id(t)
        self.on[key] = weakref.ref(t, lambda ref, key=key: self.on.pop(key) if self.on.get(key) is ref else None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not any(isinstance(v, torch.device) and v == STAND_IN for v in (*args, *kwargs.values())):
            return func(*args, **kwargs)
        cpu = torch.device("cpu")
        args = tuple(cpu if isinstance(v, torch.device) and v == STAND_IN else v for v in args)
        kwargs = {k: cpu if isinstance(v, torch.device) and v == STAND_IN else v for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        if func is torch.Tensor.to and out is args[0] and not self.holds(out):
            out = out.clone()  # a move to another device is a copy
        for t in _tensors([out]):
            self._add(t)
        return out


def hold_collectives_to_placement(patch=setattr) -> StandInDevice:
    """Strict mode, for the rest of this process (an in-process test undoes ``patch`` with pytest's
    ``monkeypatch.setattr`` and leaves the returned mode with ``__exit__``). An NCCL group carries
    CUDA tensors only, so under NCCL a collective fails on a CPU tensor (or, with a mixed group, a
    CPU tensor on one rank and a CUDA tensor on another pick different backends and hang). On this
    CPU every tensor is on the CPU and gloo takes anything, so a check against gloo's device (the CPU)
    would catch nothing. Strict mode therefore declares another collectives device: under gloo
    ``distributed.collective_device`` answers :data:`STAND_IN`, which no caller's tensor is on (the
    :class:`StandInDevice` mode keeps its tensors on the CPU), and every torch.distributed tensor
    collective called from this repository's code (podsrl's, a test's) must get tensors on the
    collectives' device, or raises :class:`PlacementError`: a Dist method that skips ``Dist.place``
    (or a ``place`` that does not move), or a caller that bypasses Dist. Under NCCL (on a GPU) the
    collectives' device is the real one (cuda:LOCAL_RANK) and the check is ``t.device`` against it.
    Callers in installed libraries are exempt, since they place their tensors themselves: torch's
    (FSDP's all-gathers and reduce-scatters, ``torch.distributed.checkpoint``, the object
    collectives: the group's device), transformers' (``synced_gpus``' flag: the model's device)."""
    mode = StandInDevice()
    group = {"device": STAND_IN}
    original = distributed.collective_device

    @functools.wraps(original)
    def collective_device(backend: str, device: torch.device) -> torch.device:
        real = original(backend, device)
        group["device"] = STAND_IN if real.type == "cpu" else real
        return group["device"]

    patch(distributed, "collective_device", collective_device)
    for name in TENSOR_COLLECTIVES:
        if hasattr(torch.distributed, name):
            patch(torch.distributed, name, _strict(name, getattr(torch.distributed, name), mode, group))
    mode.__enter__()
    return mode


def _strict(name: str, collective, mode: StandInDevice, group: dict):
    @functools.wraps(collective)
    def call(*args, **kwargs):
        caller = sys._getframe(1)
        if any(Path(caller.f_code.co_filename).resolve().is_relative_to(d) for d in OURS):  # podsrl's or a test's call
            device = group["device"]
            for t in _tensors([*args, *kwargs.values()]):
                if not (mode.holds(t) if device == STAND_IN else t.device == device):
                    where = "the caller's CPU" if device == STAND_IN else t.device
                    raise PlacementError(
                        f"strict collectives: torch.distributed.{name} called at {caller.f_code.co_filename}:{caller.f_lineno} "
                        f"({caller.f_code.co_name}) with a tensor on {where}, not on the collectives' device {device} "
                        "(Dist.device; strict mode's stand-in for the GPU under gloo): pass it through Dist.place; an NCCL "
                        "group would refuse a CPU tensor there (issue 36)"
                    )
        return collective(*args, **kwargs)

    return call


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


def main(spec_path: str) -> None:
    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    dist = None
    for name, case in spec["cases"].items():
        cfg = from_dict(tiny_config_dict(Path(spec["model"]), Path(spec["reward"].split(":")[0]), **case["overrides"]))
        dist = distributed.init(cfg)  # the process group is made once and reused
        run = trainer.setup(cfg, dist)
        B, world = cfg.train.prompts_per_step, dist.world
        uniform_from = 0 if case.get("uniform_all") else B // 2 if case.get("uniform_second_half") else None
        run.engine = FixedEngine(run.policy.tokenizer, offset=dist.rank * (B // world), uniform_from=uniform_from)
        model = run.policy.model
        model.train()
        optimizer, scheduler = trainer.make_optimizer(cfg, model)
        grads = record_gradients(model, optimizer)
        metrics = trainer.train_step(run, model, optimizer, scheduler, ckpt.TrainState())
        weights = ckpt.full_weights(model, dist)
        if dist.is_main:
            tag = f"{name}-w{world}"
            save_file({k: v.detach().float().contiguous().cpu().clone() for k, v in weights.items()}, str(out / f"{tag}.safetensors"))
            save_file(grads, str(out / f"{tag}-grads.safetensors"))
            (out / f"{tag}.json").write_text(json.dumps(metrics))
        dist.barrier()
    if dist is not None:
        dist.close()


def record_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The gradients ``optimizer`` steps with (its first step), by parameter name, as full float32
    CPU tensors (FSDP's sharded ones gathered: every rank steps, so every rank joins the gather)."""
    names = {id(p): name for name, p in model.named_parameters()}
    recorded: dict[str, torch.Tensor] = {}
    step = optimizer.step

    def recording_step(*args, **kwargs):
        if not recorded:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                    recorded[names[id(p)]] = g.detach().float().cpu().contiguous().clone()
        return step(*args, **kwargs)

    optimizer.step = recording_step
    return recorded


def run_module(argv: list[str]) -> None:
    """``-m MODULE ARGS...``: run MODULE as ``python -m`` would (its ``sys.exit`` ends the process)."""
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # Strict mode from the module ``dist_worker``, not from ``__main__``, which ``run_module`` replaces:
    # torch.compile (vLLM's) traces the mode's code and looks up its globals by module name.
    import dist_worker

    dist_worker.hold_collectives_to_placement()
    if sys.argv[1] == "-m":
        run_module(sys.argv[2:])
    else:
        main(sys.argv[1])
        exit_without_teardown()
