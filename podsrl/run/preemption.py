"""Stopping and starting again without a person: preemption signals and restart in place.

**Preemption.** :class:`StopSignals` installs handlers for ``train.stop_signals`` (default SIGTERM
and SIGUSR1: what SLURM's ``--signal`` sends, and what torchrun's agent forwards to every worker
when it is told to stop) that only record the signal. After every step the trainer asks
:meth:`StopSignals.agreed`: one all-reduce (max) of the ranks' flags, so one rank receiving the
signal is enough and every rank stops after the same step. The trainer then writes a checkpoint
of that step and raises :class:`Preempted`; ``podsrl train`` exits with code 75
(``podsrl.errors.EXIT_PREEMPTED``). Choices where nothing dictates one:

- The step in progress is finished, not abandoned. On several ranks it is full of collectives the
  others are already in, and abandoning it would lose the work since the last checkpoint; a step
  is seconds to minutes, which is what grace periods are for (SLURM ``--signal=B:TERM@120``,
  torchrun ``--shutdown-timeout``). An evaluation due at that step is skipped (the checkpoint comes
  first); one already running when the signal arrives finishes.
- A signal before the first step (during the base evaluation) stops the run there, without a
  checkpoint (there is nothing new to save). One before the handlers are installed (while the model
  loads) kills the process as it always did: there is nothing to save then either.
- Further signals while stopping are ignored: under SLURM a worker gets SIGTERM from the job step
  and again from torchrun's agent, and the second must not cut the checkpoint short. SIGKILL
  remains the hard stop; Ctrl-C (SIGINT) stays an immediate KeyboardInterrupt unless listed.
- Handlers can only be installed in the main thread (Python's rule); elsewhere this is a no-op.
  The previous handlers are restored when training ends (library use, tests), unless a stop signal
  came: then the stop signals stay ignored while the process exits (see :meth:`StopSignals.restore`).

**Restart in place.** ``train.resume = "auto"`` (``podsrl train --resume auto``) makes one command
right for the first start and for every restart (``torchrun --max-restarts``, a SLURM requeue):
:func:`auto_resume` resumes when the run directory holds a run with a complete checkpoint, starts
the run again (replacing its files) when it holds the same run without one (it died before its
first checkpoint), and starts it when the directory holds none. Only the same run resumes: the
config check of ``--resume`` applies (a ConfigError naming the settings that differ). A default
name with ``{time}`` in ``train.out_dir`` would be a new directory at every start: refused.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from podsrl.config import catchable_signal
from podsrl.errors import ConfigError
from podsrl.run import checkpoint as ckpt
from podsrl.run import rundir

if TYPE_CHECKING:
    from podsrl.config import Config
    from podsrl.train.distributed import Dist


class Preempted(Exception):
    """The run stopped on a stop signal after ``step``, with a checkpoint of that step (``checkpoint``;
    None when it stopped before its first step and had none)."""

    def __init__(self, path: Path, checkpoint: Path | None, sig: signal.Signals, step: int):
        super().__init__(f"{path}: stopped by {sig.name} after step {step}")
        self.path = Path(path)
        self.checkpoint = checkpoint
        self.signal = sig
        self.step = step

    def advice(self) -> str:
        return f"stopped by {self.signal.name} after step {self.step}" + rundir.resume_advice(self.path, self.checkpoint)


class StopSignals:
    """``with StopSignals(["SIGTERM"]) as stop:`` (or ``install()`` ... ``restore()``) records the
    first of those signals in ``stop.received`` instead of dying; see the module docstring."""

    def __init__(self, names: Sequence[str]):
        self.signals = [catchable_signal(name) for name in names]
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

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
        # Only a flag: a handler runs between two bytecodes of whatever the main thread is doing
        # (printing, writing a file), so anything more could re-enter it.
        if self.received is None:
            self.received = signal.Signals(signum)

    def agreed(self, dist: Dist) -> signal.Signals | None:
        """The stop signal any rank has received, the same answer on every rank (a collective:
        every rank calls it at the same point of the loop); None when there is none."""
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
