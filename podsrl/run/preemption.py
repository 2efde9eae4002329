"""Stopping and starting again without a person: preemption signals and restart in place.

**Preemption.** :class:`StopSignals` installs handlers for ``train.stop_signals`` (default SIGTERM
and SIGUSR1: what SLURM's ``--signal`` sends, and what torchrun's agent forwards to every worker
when it is told to stop). The run then writes the checkpoint of its last completed step and raises
:class:`Preempted`; ``podsrl train`` exits with code 75 (``podsrl.errors.EXIT_PREEMPTED``), within
seconds of the signal plus the checkpoint's write, whatever the length of a step: a grace period is
30 s by default (SLURM's ``KillWait``, torchrun's ``--shutdown-timeout``) while a step on long
answers takes minutes (issue 68).

*Abandon the step, do not finish it.* Until its optimizer step a training step changes nothing the
checkpoint holds but the prompt stream's position (``TrainState.prompts``), and the global RNG
states: sampling, scoring, selection and the update's forward and backward passes read the weights
of the last step's end and write only what the step throws away when it is abandoned. So the
trainer marks those parts, and each evaluation, as *abandonable regions* (:meth:`StopSignals.region`):
a signal inside one raises :class:`StepAbandoned` in the main thread at once, as Ctrl-C raises
KeyboardInterrupt (Python runs the handler between two bytecodes, so it takes effect when the
running torch operation returns), and the trainer puts back the TrainState fields and RNG states of
the step's start (:class:`StepStart`), writes the checkpoint of the last completed step (unless it
has one) and raises Preempted. A checkpoint so written is the one an uninterrupted run would have
written at that step, and resumes exactly as it would. Outside the regions (the optimizer step, the
weights' push to the engine, logging, checkpoints) a signal is only recorded; after every step the
trainer asks :meth:`StopSignals.agreed` (one all-reduce of the ranks' flags, so one rank receiving
the signal is enough), and the step that is past its optimizer step is finished and checkpointed,
as before issue 68.

*Several ranks (torchrun, "ddp").* A rank must not leave another blocked for ever in a collective it
no longer makes. Every collective of podsrl (:class:`podsrl.train.distributed.Dist`, through which
all of them go) made inside a region is preceded by a *stop check*, one all-reduce (max) of the
ranks' stop flags (:meth:`StopSignals.collective`), and a region ends with one (:meth:`StopSignals.commit`,
right before the optimizer step, the first thing the run cannot take back). A rank that abandons
between two collectives (its own signal, in generation or a backward pass) makes that same
all-reduce once with its flag (:meth:`StopSignals.tell`): it meets the other ranks' next stop check,
every rank learns of the stop at the same collective, and all abandon the same step. A check and
its collective are one unit: a signal that arrives while a rank is inside either is only recorded,
and acted on when the collective returns (between them, the rank would leave a collective the
others are already in). The region's closing check is what makes its end safe: a rank past it
knows every other rank passed it too. Cost: one all-reduce of one integer per collective inside a
region (a handful a step; docs/distributed.md has the measured figure), nothing outside them.
Folding the flag into the collectives' own payloads would save the all-reduce, at the price of
changing every collective's payload, the object collectives' too.

Limits, and choices where nothing dictates one:

- "fsdp": every forward pass is a collective of FSDP's own, which a rank cannot leave alone. A
  signal is then only recorded, and the stop checks before podsrl's collectives abandon the step
  on every rank at once: within one sampling call or one update's forward and backward passes
  (between two of podsrl's collectives), not within seconds. vLLM's collectives (tensor-parallel
  engines) are outside this too; podsrl's colocated engines make none across ranks.
- A signal sent to one rank only (torchrun and SLURM signal every rank) abandons the step on the
  others at their next collective: at most the rest of their sampling batch, or of their update's
  forward and backward passes.
- An evaluation is abandonable; the checkpoint then holds its step, and a resumed run evaluates
  there first (an evaluation due at the checkpoint's step that eval.jsonl lacks). The final
  evaluation (``eval.at_end``), the final checkpoint and the export are not: the run has reached
  its budget and is finishing.
- A signal before the first step (during the base evaluation) stops the run there, without a
  checkpoint (there is nothing new to save). One before the handlers are installed (while the model
  loads) kills the process as it always did: there is nothing to save then either.
- :class:`StepAbandoned` is a BaseException, as KeyboardInterrupt is: a reward function's or a
  library's ``except Exception`` must not swallow it. What it interrupts (a generation, a reward
  pool's wait) is left as it is: the process is on its way out, and the engine and the reward
  workers are closed as on any error.
- Further signals while stopping are ignored: under SLURM a worker gets SIGTERM from the job step
  and again from torchrun's agent, and the second must not cut the checkpoint short. SIGKILL
  remains the hard stop; Ctrl-C (SIGINT) stays an immediate KeyboardInterrupt unless listed.
- Handlers can only be installed in the main thread (Python's rule); elsewhere this is a no-op.
  The previous handlers are restored when training ends (library use, tests), unless a stop signal
  came: then the stop signals stay ignored while the process exits (see :meth:`StopSignals.restore`).
  Without regions (the TRL arms of ``podsrl compare``) a signal is only recorded, and the run
  finishes its step.

**Restart in place.** ``train.resume = "auto"`` (``podsrl train --resume auto``) makes one command
right for the first start and for every restart (``torchrun --max-restarts``, a SLURM requeue):
:func:`auto_resume` resumes when the run directory holds a run with a complete checkpoint, starts
the run again (replacing its files) when it holds the same run without one (it died before its
first checkpoint), and starts it when the directory holds none. Only the same run resumes: the
config check of ``--resume`` applies (a ConfigError naming the settings that differ). A default
name with ``{time}`` in ``train.out_dir`` would be a new directory at every start: refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from podsrl.config import catchable_signal
from podsrl.errors import ConfigError
from podsrl.run import checkpoint as ckpt
from podsrl.run import rundir

if TYPE_CHECKING:
    from podsrl.config import Config
    from podsrl.train.distributed import Dist


class Preempted(Exception):
    """The run stopped on a stop signal after ``step``, with a checkpoint of that step (``checkpoint``;
    None when it stopped before its first step and had none). ``abandoned``: what the signal cut
    short ("step 3", "the evaluation at step 2"); None when it came between steps."""

    def __init__(self, path: Path, checkpoint: Path | None, sig: signal.Signals, step: int, abandoned: str | None = None):
        self.path = Path(path)
        self.checkpoint = checkpoint
        self.signal = sig
        self.step = step
        self.abandoned = abandoned
        super().__init__(f"{path}: {self._what()}")

    def _what(self) -> str:
        return f"stopped by {self.signal.name} after step {self.step}" + (f", abandoning {self.abandoned}" if self.abandoned else "")

    def advice(self) -> str:
        return self._what() + rundir.resume_advice(self.path, self.checkpoint)


class StepAbandoned(BaseException):
    """A stop signal cut an abandonable region short (the module docstring). ``told``: the other
    ranks know (it was decided by a stop check, a collective every rank made); False: this rank
    abandoned on its own signal and must :meth:`StopSignals.tell` them."""

    def __init__(self, sig: signal.Signals, *, told: bool):
        super().__init__(f"abandoned on {sig.name}")
        self.signal = sig
        self.told = told


@dataclass
class StepStart:
    """What a step changes before its optimizer step that a checkpoint holds, as it was when the
    step started: the TrainState (the prompt stream's position) and the global RNG states."""

    state: ckpt.TrainState
    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    python_rng: tuple

    @classmethod
    def take(cls, state: ckpt.TrainState) -> StepStart:
        # A shallow copy is enough: a step replaces TrainState's dict and list fields, never changes them in place.
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return cls(dataclasses.replace(state), torch.get_rng_state(), cuda, random.getstate())

    def restore(self, state: ckpt.TrainState) -> None:
        for f in dataclasses.fields(state):
            setattr(state, f.name, getattr(self.state, f.name))
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)


class StopSignals:
    """``with StopSignals(["SIGTERM"]) as stop:`` (or ``install()`` ... ``restore()``) records the
    first of those signals in ``stop.received`` instead of dying, and inside :meth:`region` raises
    :class:`StepAbandoned` (see the module docstring). ``immediate=False`` (FSDP): a region is
    abandoned at podsrl's stop checks only, never between them."""

    def __init__(self, names: Sequence[str], *, immediate: bool = True):
        self.signals = [catchable_signal(name) for name in names]
        self.received: signal.Signals | None = None
        self.immediate = immediate
        self._previous: dict[signal.Signals, object] = {}
        self._open = False  # the main thread is in an abandonable region
        self._shielded = 0  # ... and inside one of podsrl's collectives (or its stop check): record only

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    @property
    def installed(self) -> bool:
        """Whether a stop signal can come: handlers are installed (some signals, the main thread)."""
        return bool(self._previous)

    def restore(self, *, ignore_after_stop: bool = True) -> None:
        """Put the handlers back as they were before :meth:`install`; after a stop signal they are
        left ignoring the stop signals instead: the process is on its way out with exit code 75,
        and the same signal again (torchrun's agent forwards SLURM's, or tears down the job when
        another rank exits first) must not turn that into a death by signal. ``ignore_after_stop=False``
        puts them back in every case (``podsrl compare``, whose runs are the ones that checkpoint)."""
        for sig, previous in self._previous.items():
            if self.received is not None and ignore_after_stop:
                signal.signal(sig, signal.SIG_IGN)
            else:  # None: the previous handler was not installed from Python; the default is the closest
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()

    def _handle(self, signum: int, frame) -> None:
        # A flag, and in a region an exception: a handler runs between two bytecodes of whatever the
        # main thread is doing, so outside the regions (printing, writing a file) anything more could
        # re-enter it or leave a file half-written.
        if self.received is None:
            self.received = signal.Signals(signum)
            self._abandon_now()

    def _abandon_now(self) -> None:
        """Raise StepAbandoned when a signal has come and the main thread may leave where it is."""
        if self._open and not self._shielded and self.immediate and self.received is not None:
            self._open = False
            raise StepAbandoned(self.received, told=False)

    @contextlib.contextmanager
    def region(self, dist: Dist) -> Iterator[None]:
        """``with stop.region(dist):`` the block may be abandoned (StepAbandoned); leaving it normally
        is its :meth:`commit`, unless the block committed already. Every rank enters and leaves it at
        the same point of the loop. A signal recorded before it opens abandons it at once."""
        if self._open:
            raise RuntimeError("abandonable regions do not nest")
        self._open = True
        try:
            self._abandon_now()
            yield
            self.commit(dist)
        finally:
            self._open = False

    def commit(self, dist: Dist) -> None:
        """End the region: from here the block changes what it cannot take back (the optimizer step).
        Under torchrun every rank calls it at the same point and learns there, in one stop check,
        whether any rank is stopping: then all abandon (StepAbandoned), else none does. A no-op
        outside a region, or in one committed already."""
        if not self._open:
            return
        if not dist.active:
            self._open = False
            return
        flag = self._check(dist)
        if flag:
            raise StepAbandoned(signal.Signals(flag), told=True)

    @contextlib.contextmanager
    def collective(self, dist: Dist) -> Iterator[None]:
        """Around each of podsrl's collectives (:meth:`podsrl.train.distributed.Dist._comm`): in a
        region, a stop check first (StepAbandoned on every rank alike when any rank is stopping);
        a signal during the collective is recorded, and acted on once it has returned."""
        if not (self._open and dist.active):
            yield
            return
        self._shielded += 1
        try:
            flag = dist.stop_flag(self._flag())
            if flag:
                self._open = False
                self._received(flag)
                raise StepAbandoned(signal.Signals(flag), told=True)
            yield
        finally:
            self._shielded -= 1
        self._abandon_now()

    def tell(self, dist: Dist, abandoned: StepAbandoned) -> None:
        """A rank that abandoned on its own signal: its flag in the all-reduce that the other ranks'
        next stop check makes, so that they abandon the same step (a no-op on one process, or when
        they know)."""
        if dist.active and not abandoned.told:
            dist.stop_flag(int(abandoned.signal))

    def _check(self, dist: Dist) -> int:
        """One stop check, the region closed after it whatever a signal does meanwhile: the largest
        of the ranks' flags (0: none is stopping)."""
        self._shielded += 1
        try:
            flag = dist.stop_flag(self._flag())
        finally:
            self._open = False
            self._shielded -= 1
        self._received(flag)
        return flag

    def _flag(self) -> int:
        return int(self.received or 0)

    def _received(self, flag: int) -> None:
        if flag and self.received is None:  # another rank's signal: this rank is stopping too (see restore)
            self.received = signal.Signals(flag)

    def agreed(self, dist: Dist) -> signal.Signals | None:
        """The stop signal any rank has received, the same answer on every rank (a collective:
        every rank calls it at the same point of the loop, outside the regions); None when there is none."""
        number = dist.max_int(int(self.received or 0))
        if not number:
            return None
        self.received = self.received or signal.Signals(number)  # this rank is stopping too (see restore)
        return signal.Signals(number)


def auto_resume(run_dir: Path | None, cfg: Config) -> tuple[Path, bool, bool]:
    """``train.resume = "auto"``: (run directory, resume, overwrite) for this start. ``run_dir``
    None: the name ``train.out_dir`` gives, which must then not change between starts."""
    if run_dir is None:
        if "{time}" in cfg.train.out_dir:
            raise ConfigError(
                f"train.resume: 'auto' needs the same run directory at every start, but train.out_dir = "
                f"{cfg.train.out_dir!r} names a new one each time; give --out DIR (e.g. --out runs/$SLURM_JOB_ID)"
            )
        run_dir = Path(cfg.train.out_dir.format(time="", rule=cfg.select.rule, seed=cfg.train.seed))
    path = Path(run_dir).expanduser()
    if not path.is_dir() or not rundir.holds_run(path):
        return path, False, False
    if not (path / "config.toml").is_file():
        raise ConfigError(
            f"train.resume: 'auto' found run files in {path} but no config.toml, so it cannot tell whether they are "
            "this run's; continue with --overwrite to replace them, or pick another --out"
        )
    rundir.resume_changes(path, cfg)  # only the same run resumes (a ConfigError names what differs)
    if ckpt.latest(path) is not None:
        return path, True, False
    return path, False, True  # the same run, stopped before its first checkpoint: start it again
