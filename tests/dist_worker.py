"""One optimizer step per case, on fixed rollouts, at any world size: what tests/test_distributed.py
runs alone (``python tests/dist_worker.py SPEC``) and under ``torchrun --nproc-per-node=2``.

SPEC is a JSON file: {"model": dir, "reward": "file.py:fn", "out": dir, "cases": {name: {...}}}, a
case being {"overrides": {"section.key": value}, "uniform_second_half": bool, "uniform_all": bool}
(zero-variance groups: the second half of the prompts, or all). For every case rank 0
writes ``out/<name>-w<world>.safetensors`` (the trainable weights after the step, full tensors) and
``out/<name>-w<world>.json`` (the step's metrics).

``python tests/dist_worker.py -m podsrl ARGS...`` runs ``python -m podsrl ARGS...`` instead (what
tests/test_distributed.py's ``_torchrun`` launches for ``-m podsrl``). Either way the process runs in
strict mode (:func:`hold_collectives_to_placement`): every tensor podsrl hands to a torch.distributed
tensor collective must be one that ``Dist.place`` put on ``Dist.device``, which is what an NCCL group
requires (CUDA tensors only) and what this CPU's gloo would otherwise never check.
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


class PlacementError(AssertionError):
    pass


def hold_collectives_to_placement(patch=setattr) -> None:
    """Strict mode. An NCCL group carries CUDA tensors only, so under NCCL a collective fails (or, with
    a mixed group, a CPU tensor on one rank and a CUDA tensor on another pick different backends and
    hang). On this CPU every tensor is on the CPU and gloo takes anything, so a device check would
    catch nothing; instead every torch.distributed tensor collective called from outside torch must
    get tensors that ``Dist.place`` returned (a registry of them), and ``Dist.place`` must return
    them on ``Dist.device`` (cuda:LOCAL_RANK under NCCL): a caller in this repository that bypasses
    Dist, or a Dist method that skips placement, raises :class:`PlacementError`. Callers in installed
    libraries are exempt, since they place their tensors themselves: torch's (FSDP's all-gathers and
    reduce-scatters, ``torch.distributed.checkpoint``, the object collectives: the group's device),
    transformers' (``synced_gpus``' flag: the model's device). ``patch`` sets the wrappers
    (pytest's ``monkeypatch.setattr`` undoes them after an in-process test)."""
    placed: dict[int, weakref.ref] = {}
    original = getattr(distributed.Dist, "place", None)
    if original is not None:

        @functools.wraps(original)
        def place(self, t, *args, **kwargs):
            out = original(self, t, *args, **kwargs)
            if out.device != self.device:
                raise PlacementError(f"Dist.place returned a tensor on {out.device}, not on the collectives' device {self.device}")
            key = id(out)
            placed[key] = weakref.ref(out, lambda ref, key=key: placed.pop(key) if placed.get(key) is ref else None)
            return out

        patch(distributed.Dist, "place", place)
    for name in TENSOR_COLLECTIVES:
        if hasattr(torch.distributed, name):
            patch(torch.distributed, name, _strict(name, getattr(torch.distributed, name), placed))


def _strict(name: str, collective, placed: dict[int, weakref.ref]):
    @functools.wraps(collective)
    def call(*args, **kwargs):
        caller = sys._getframe(1)
        if any(Path(caller.f_code.co_filename).resolve().is_relative_to(d) for d in OURS):  # podsrl's or a test's call
            for t in _tensors([*args, *kwargs.values()]):
                ref = placed.get(id(t))
                if ref is None or ref() is not t:
                    raise PlacementError(
                        f"strict collectives: torch.distributed.{name} called at {caller.f_code.co_filename}:{caller.f_lineno} "
                        f"({caller.f_code.co_name}) with a tensor on {t.device} that Dist.place did not put on the "
                        "collectives' device; an NCCL group would refuse a CPU tensor there (issue 36)"
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
        s = trainer.setup(cfg, dist)
        B, world = cfg.train.prompts_per_step, dist.world
        uniform_from = 0 if case.get("uniform_all") else B // 2 if case.get("uniform_second_half") else None
        s.engine = FixedEngine(s.policy.tokenizer, offset=dist.rank * (B // world), uniform_from=uniform_from)
        model = s.policy.model
        model.train()
        optimizer, scheduler = trainer.make_optimizer(cfg, model)
        metrics = trainer.train_step(s, model, optimizer, scheduler, ckpt.TrainState())
        weights = ckpt.full_weights(model, dist)
        if dist.is_main:
            tag = f"{name}-w{world}"
            save_file({k: v.detach().float().contiguous().cpu().clone() for k, v in weights.items()}, str(out / f"{tag}.safetensors"))
            (out / f"{tag}.json").write_text(json.dumps(metrics))
        dist.barrier()
    if dist is not None:
        dist.close()


def run_module(argv: list[str]) -> None:
    """``-m MODULE ARGS...``: run MODULE as ``python -m`` would (its ``sys.exit`` ends the process)."""
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    hold_collectives_to_placement()
    if sys.argv[1] == "-m":
        run_module(sys.argv[2:])
    else:
        main(sys.argv[1])
        exit_without_teardown()
