"""Several processes, one per device, on PyTorch's own distributed stack (``torch.distributed``).

Launch with ``torchrun`` (or ``accelerate launch``, which sets the same environment)::

    torchrun --nproc-per-node=8 -m podsrl train my.toml
    torchrun --nproc-per-node=2 -m podsrl train            # CPU, gloo

Without a launcher's environment (no ``WORLD_SIZE``) nothing here runs: :func:`init` returns the
single-process :class:`Dist`, whose collectives are identities, and training is what it always was.

What each rank does in a step (the trainer calls these helpers; see docs/distributed.md):

- The B prompts of a step are drawn identically on every rank; rank r takes the r-th contiguous
  block of B / world *whole groups* (:meth:`Dist.shard`), samples its n rollouts per prompt with its
  own colocated engine and scores them.
- The [b, n] rewards are gathered into the global [B, n] tensor (B * n floats: nothing next to the
  update) and selection and advantages run on it *on every rank*, with the same generator, so the
  kept set, tie-breaking included, is exactly one process's (``d3s_cross`` pools the global batch).
  Each rank then keeps its own rows (:meth:`Dist.local_rows`).
- The update normalises by the global sequence and token counts and takes D3S's top-fraction token
  threshold over the whole batch (:mod:`podsrl.train.update`), so the ranks' gradients *sum* to the
  single-process gradient. Parallelism (``distributed.parallel``):

  - ``"ddp"``: every rank holds the whole model; after the backward passes one summed all-reduce of
    the trainable gradients (:meth:`Dist.all_reduce_grads`) makes them identical everywhere, then
    each rank clips and steps the same way. Not ``DistributedDataParallel`` itself: PODS gives ranks
    different numbers of kept rows (the DAPO filter or ``d3s_cross`` may leave one with none), and a
    single explicit all-reduce after accumulation is correct for any count, including zero, without
    DDP's join machinery. Its size is the trainable parameters, independent of n and of m.
  - ``"fsdp"``: FSDP2 (``torch.distributed.fsdp.fully_shard``) per decoder layer and on the root,
    for full fine-tuning of models that do not fit one device; gradients are reduce-scattered as
    sums. Every forward is a collective, so the update pads each rank to the same number of
    micro-batches with an empty one, generation runs with ``synced_gpus``, and the shared-prompt
    forward is off (the number of forward calls must not depend on a rank's data).

- Metrics are computed from the gathered tensors, evaluation is sharded over ranks and gathered, and
  only rank 0 writes files, logs and checkpoints.

One backend per group, and one device for its tensor collectives (:attr:`Dist.device`): cuda:LOCAL_RANK
under NCCL, which carries CUDA tensors only, the CPU under gloo. Every tensor collective method here
moves its input there (:meth:`Dist.place`) and returns its result on the input's device, so a caller
passes tensors from wherever it has them (the rewards table and the counts live on the CPU, the
gradients on the GPU) and every rank sends a given collective from the same device. Nothing outside
this module calls a torch.distributed tensor collective (tests/test_distributed.py checks both). The
object collectives (``broadcast_object_list``, ``all_gather_object``) are torch's, which picks their
device itself: the current CUDA device under NCCL, set by :func:`init`. See docs/distributed.md.

While training, every collective here made inside an abandonable region (sampling, scoring, the
update up to its optimizer step, evaluation) is preceded by a stop check, one all-reduce of one
integer, so that a stop signal abandons the step on every rank at the same collective
(:mod:`podsrl.run.preemption`); :meth:`Dist.commit` ends the region before the optimizer step.

Communication is counted (payload bytes and seconds) in ``Dist.comm_bytes`` / ``comm_seconds`` for
what goes through this module; FSDP's own all-gathers and reduce-scatters are not counted there.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from podsrl.errors import ConfigError

PARALLEL = ("ddp", "fsdp")
BACKENDS = ("auto", "gloo", "nccl")
T = TypeVar("T")


def launched() -> bool:
    """Whether a launcher (torchrun, accelerate launch, SLURM via torchrun) set up this process."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


@dataclass
class Dist:
    """This process's place in the job; the single-process default has world = 1 and no group."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    parallel: str = "ddp"
    backend: str | None = None  # None: no process group
    device: torch.device = torch.device("cpu")  # where this group's tensor collectives run (collective_device)
    comm_seconds: float = 0.0  # spent in this module's collectives, since the last reset
    comm_bytes: int = 0  # their payload (what this rank sends), since the last reset
    collectives: int = 0  # how many of this module's collectives this rank has entered (podsrl.train.heartbeat)
    stop: object | None = None  # while training, the run's podsrl.run.preemption.StopSignals: the stop check before each collective in an abandonable region

    @property
    def active(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """FSDP: every forward is a collective, so ranks must run the same number of them."""
        return self.active and self.parallel == "fsdp"

    def reset_counters(self) -> tuple[float, int]:
        out = (self.comm_seconds, self.comm_bytes)
        self.comm_seconds, self.comm_bytes = 0.0, 0
        return out

    # ------------------------------------------------------------------ splitting the batch

    def shard(self, items: Sequence) -> list:
        """This rank's contiguous block of ``items`` (whose length the world size divides)."""
        k = len(items) // self.world
        return list(items[self.rank * k : (self.rank + 1) * k])

    def local_rows(self, t: Tensor) -> Tensor:
        """[B, ...] -> this rank's [B / world, ...] block of rows."""
        k = t.shape[0] // self.world
        return t[self.rank * k : (self.rank + 1) * k]

    def pad_shard(self, items: Sequence) -> tuple[list, int]:
        """This rank's block of ``items`` when the world size need not divide them: blocks of
        ceil(len / world), the last ones padded by repeating the first item (so every rank runs the
        same number of engine calls: FSDP's generation is a collective). Returns (block, real)."""
        k = -(-len(items) // self.world)
        block = list(items[self.rank * k : (self.rank + 1) * k])
        real = len(block)
        return block + [items[0]] * (k - real), real

    # ------------------------------------------------------------------ collectives

    @contextlib.contextmanager
    def _comm(self, nbytes: int, *, checked: bool = True) -> Iterator[None]:
        """Around every collective here: counted, timed, and (``checked``, while training) preceded
        in an abandonable region by the stop check (podsrl.run.preemption), which may raise
        StepAbandoned on every rank alike instead of the collective."""
        with self.stop.collective(self) if checked and self.stop is not None else contextlib.nullcontext():
            self.collectives += 1  # on entry: a rank that waits here is ahead of one that has not come
            start = time.perf_counter()
            try:
                yield
            finally:
                self.comm_seconds += time.perf_counter() - start
                self.comm_bytes += nbytes

    def place(self, t: Tensor, *, copy: bool = False) -> Tensor:
        """``t`` on :attr:`device`, the one way a tensor reaches a collective here (``t`` itself when
        it is there already, unless ``copy``)."""
        return t.to(self.device, copy=copy)

    def gather_rows(self, t: Tensor) -> Tensor:
        """Every rank's [b, ...] (same shape on all) -> [world * b, ...] in rank order, on every rank
        (on ``t``'s device)."""
        if not self.active:
            return t
        local = self.place(t.contiguous())
        out = self.place(torch.empty((self.world * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=self.device))
        with self._comm(local.numel() * local.element_size()):
            torch.distributed.all_gather_into_tensor(out, local)
        return out.to(t.device)

    def row_counts(self, k: int) -> list[int]:
        """Every rank's ``k`` (its rows of a ragged tensor), in rank order: what :meth:`gather_ragged`
        gathers first, for a caller that gathers several tensors of the same rows, or needs where
        its own rows start in the gathered one. One collective."""
        if not self.active:
            return [k]
        return self.gather_rows(torch.tensor([k])).tolist()

    def gather_ragged(self, t: Tensor, sizes: list[int] | None = None) -> Tensor:
        """Every rank's [k_r, ...] (k_r may differ, even be 0) -> [sum k_r, ...] in rank order (on
        ``t``'s device). ``sizes``: every rank's k_r (:meth:`row_counts`), when the caller already
        has them, saving the collective that gathers them."""
        if not self.active:
            return t
        if sizes is None:
            sizes = self.row_counts(t.shape[0])
        elif len(sizes) != self.world or sizes[self.rank] != t.shape[0]:
            raise ValueError(f"gather_ragged: sizes {sizes} do not hold this rank's {t.shape[0]} rows at {self.rank} of {self.world} ranks")
        width = max(sizes)
        if width == 0:  # no rank has a row (every rank knows it: no collective of empty tensors)
            return t
        padded = torch.zeros((width, *t.shape[1:]), dtype=t.dtype, device=t.device)
        padded[: t.shape[0]] = t
        rows = self.gather_rows(padded)
        return torch.cat([rows[r * width : r * width + k] for r, k in enumerate(sizes)])

    def sum(self, values: Tensor) -> Tensor:
        """Element-wise sum over ranks (a new tensor on ``values``' device; the input is left alone)."""
        if not self.active:
            return values
        out = self.place(values, copy=True)
        with self._comm(out.numel() * out.element_size()):
            torch.distributed.all_reduce(out)
        return out.to(values.device)

    def max(self, values: Tensor) -> Tensor:
        """Element-wise maximum over ranks (a new tensor on ``values``' device; the input is left alone)."""
        if not self.active:
            return values
        out = self.place(values, copy=True)
        with self._comm(out.numel() * out.element_size()):
            torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MAX)
        return out.to(values.device)

    def max_int(self, value: int) -> int:
        """The largest of the ranks' ``value``s."""
        if not self.active:
            return value
        t = self.place(torch.tensor([value]))
        with self._comm(t.numel() * t.element_size()):
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t)

    def stop_flag(self, value: int) -> int:
        """The largest of the ranks' stop flags (a signal number, 0: none): the stop check itself
        (podsrl.run.preemption), one all-reduce of one integer, never checked in turn."""
        if not self.active:
            return value
        t = self.place(torch.tensor([value]))
        with self._comm(t.numel() * t.element_size(), checked=False):
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t)

    def commit(self) -> None:
        """Right before what a step cannot take back (its optimizer step): the end of its
        abandonable region, where every rank learns whether any is stopping (podsrl.run.preemption).
        A no-op outside training."""
        if self.stop is not None:
            self.stop.commit(self)

    def all_reduce_grads(self, params: list[torch.nn.Parameter], bucket_bytes: int = 64 << 20) -> None:
        """Sum the gradients of ``params`` over ranks, in place (a missing gradient counts as zero:
        a rank that kept no rollouts joins with zero contribution). Flattened into buckets of about
        ``bucket_bytes`` per dtype and device, so a full model is a handful of collectives."""
        if not self.active:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets: dict[tuple, list[list[Tensor]]] = {}
        for p in params:
            key = (p.grad.dtype, p.grad.device)
            groups = buckets.setdefault(key, [[]])
            if groups[-1] and sum(g.numel() * g.element_size() for g in groups[-1]) >= bucket_bytes:
                groups.append([])
            groups[-1].append(p.grad)
        for groups in buckets.values():
            for grads in groups:
                flat = self.place(torch.cat([g.reshape(-1) for g in grads]))  # already there under NCCL: no copy
                with self._comm(flat.numel() * flat.element_size()):
                    torch.distributed.all_reduce(flat)
                for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                    g.copy_(part.view_as(g))

    def broadcast_params(self, model: torch.nn.Module) -> None:
        """Rank 0's trainable weights to every rank (random LoRA init, or any drift at start)."""
        if not self.active or self.sharded:
            return
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    data = p.data
                    sent = self.place(data)
                    with self._comm(sent.numel() * sent.element_size()):
                        torch.distributed.broadcast(sent, src=0)
                    if sent is not data:
                        data.copy_(sent)

    def broadcast_object(self, obj: object) -> object:
        """Rank 0's ``obj`` on every rank (pickled)."""
        if not self.active:
            return obj
        box = [obj]
        with self._comm(len(pickle.dumps(obj)) if self.is_main else 0):
            torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj: object) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list = [None] * self.world
        with self._comm(len(pickle.dumps(obj))):
            torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        # Under NCCL torch's barrier is an all-reduce on the device init_process_group bound (device_id).
        if self.active:
            with self._comm(0):
                torch.distributed.barrier()

    def from_main(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on rank 0 alone, its result on every rank; a ConfigError it raises is raised
        on every rank (decisions about the run directory, which only rank 0 may touch)."""
        if not self.active:
            return fn()
        outcome: tuple[bool, object] | None = None
        if self.is_main:
            try:
                outcome = (True, fn())
            except ConfigError as err:
                outcome = (False, err)
        ok, value = self.broadcast_object(outcome)
        if not ok:
            raise value
        return value

    def close(self, *, barrier: bool = True) -> None:
        """Leave the process group; ``barrier=False`` on the way out of an error, where another
        rank may never reach a barrier (it is in a collective this rank left, or dead)."""
        if self.active and torch.distributed.is_initialized():
            if barrier:
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()
            self.backend = None


# ---------------------------------------------------------------------------------- set-up


def init(cfg) -> Dist:
    """The process group from the launcher's environment (none without one), after checking the
    launch against ``cfg`` (:class:`podsrl.config.Config`): bad combinations are ConfigErrors."""
    d = cfg.distributed
    if not launched():
        if d.parallel == "fsdp":
            raise ConfigError(
                "distributed.parallel: 'fsdp' shards the model over processes and needs a launcher; "
                "run `torchrun --nproc-per-node=N -m podsrl train ...` (N = 1 works), or use 'ddp'"
            )
        return Dist()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    check_launch(cfg, world)
    if not torch.distributed.is_available():
        raise ConfigError("launched with WORLD_SIZE set, but this torch build has no torch.distributed")
    device = rank_device(cfg.model.device, local_rank, world)
    backend = d.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and (device.type != "cuda" or not torch.distributed.is_nccl_available()):
        raise ConfigError(
            "distributed.backend: 'nccl' needs CUDA GPUs and a CUDA build of torch "
            f"(this process runs on {device}); use 'gloo' (or 'auto') for CPU processes"
        )
    if backend == "gloo" and not torch.distributed.is_gloo_available():
        raise ConfigError("distributed.backend: this torch build has no gloo; use 'nccl' on GPUs")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(minutes=d.timeout_minutes),
            device_id=device if device.type == "cuda" else None,
        )
    if rank == 0 and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        print(
            "podsrl: warning: torchrun --max-restarts with its rendezvous store shared with the workers (torchrun's "
            "default): a restart can fail or hang in init_process_group on the previous attempt's keys (pytorch/pytorch#135712; "
            "3 of 5 restarts here); start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (docs/distributed.md)",
            file=sys.stderr,
            flush=True,
        )
    return Dist(rank=rank, world=world, local_rank=local_rank, parallel=d.parallel, backend=backend,
                device=collective_device(backend, device))  # fmt: skip


def collective_device(backend: str, device: torch.device) -> torch.device:
    """Where a group's tensor collectives run: this rank's GPU under NCCL (CUDA tensors only), the
    CPU under gloo (whose collectives all take CPU tensors, while only some take CUDA ones)."""
    return device if backend == "nccl" else torch.device("cpu")


def check_launch(cfg, world: int) -> None:
    """What the config must satisfy for ``world`` processes (ConfigError naming the field)."""
    B = cfg.train.prompts_per_step
    if B % world:
        lower, upper = (B // world) * world, -(-B // world) * world
        hint = f"{lower} or {upper}" if lower else f"{upper}"
        raise ConfigError(
            f"train.prompts_per_step: {B} prompts cannot be split into whole groups over {world} processes; "
            f"it is the global batch, so make it a multiple of the number of processes (e.g. {hint})"
        )


def rank_device(name: str, local_rank: int, world: int) -> torch.device:
    """``model.device`` for this rank: a GPU run takes cuda:LOCAL_RANK, a CPU run the CPU; one
    process may pin a GPU ("cuda:N")."""
    from podsrl.models import resolve_device

    if name.startswith("cuda:") and world > 1:
        raise ConfigError(
            f"model.device: {name!r} pins one GPU, but {world} processes run; use 'cuda' or 'auto' "
            "(each process takes the GPU of its LOCAL_RANK)"
        )
    device = resolve_device(name)
    if device.type == "cuda" and device.index is None:
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise ConfigError(f"model.device: LOCAL_RANK {local_rank} but this machine has {count} GPU(s); launch at most {count} processes per node")
        return torch.device("cuda", local_rank)
    return device


def fsdp_wrap(model: torch.nn.Module, *, mixed_precision: bool) -> torch.nn.Module:
    """FSDP2 over each decoder layer and the root; gradients reduce-scattered as sums (the loss is
    normalised by global counts), with bf16 compute and float32 reduction when ``mixed_precision``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs = {}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    for module in (*layers, model):  # each FSDP module's own parameter group
        module.set_gradient_divide_factor(1.0)
        # gloo has no PREMUL_SUM/AVG reduce-scatter; a plain sum is what we want anyway.
        module.set_force_sum_reduction_for_comms(True)
    return model


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    for attr in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        obj = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    return []
