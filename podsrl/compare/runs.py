"""Running a comparison: every method x seed an ordinary ``podsrl train`` run in its own directory,
resumable (finished runs skipped, interrupted ones continued from their last checkpoint).

Runs are launched seed-major, one at a time by default. ``parallel`` > 1 keeps that many child
processes going at once; ``devices`` (GPU indices) pins each child to one GPU with
CUDA_VISIBLE_DEVICES, the next run going to the device with the fewest runs on it. Runs that train
at the same time on one device (parallel above the number of devices, or parallel runs with no
devices given) share its time: each run's ``launch.jsonl`` records its device and the most runs
it shared that device with, and the report then says that the wall-clock axis is not fair."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podsrl import config as config_mod
import podsrl.compare.arms as arms
from podsrl.compare.arms import PODSRL, TRAINERS
from podsrl.compare.layout import LOG_FILE, mark_done, run_dir, run_status, write_launch
from podsrl.compare.plan import Plan, check_setup
from podsrl.compare.report import build_report, write_report
from podsrl.config import Config
from podsrl.errors import EXIT_PREEMPTED, ConfigError
from podsrl.run.preemption import StopSignals

_POLL_SECONDS = 0.5


class RunFailed(Exception):
    """A method x seed's training process exited with an error (its own output says why)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def run_all(
    plan: Plan,
    out: Path,
    *,
    log=print,
    isolate: bool = True,
    parallel: int = 1,
    devices: list[str] | None = None,
) -> int:
    """Train every method x seed not finished yet, launched seed-major; the report is refreshed
    after each run finishes. Returns how many runs trained: with none, no report was written here
    (the caller writes it; ``podsrl compare`` does).

    ``isolate``: each run is its own ``podsrl train`` process, so every run starts from the same
    clean state (memory, threads, an in-process vLLM engine's allocations) and a crash loses only
    that run. ``False`` trains in this process (tests, debugging), one run at a time.
    ``parallel``: how many runs train at once (child processes). ``devices``: GPU indices, each
    run pinned to one with CUDA_VISIBLE_DEVICES (the least loaded, first on ties)."""
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(f"--parallel: must be a whole number >= 1, got {parallel!r}")
    if not isolate and (parallel > 1 or devices):
        raise ConfigError("--parallel and --devices run every run in a process of its own; drop --in-process")
    check_setup(plan)  # a method the trainer would refuse stops the comparison before any run trains
    most = max(plan.n_seeds(m.name) for m in plan.methods)
    jobs = [(seed, m.name) for seed in range(most) for m in plan.methods if seed < plan.n_seeds(m.name)]
    todo = []
    for i, (seed, name) in enumerate(jobs, 1):
        cfg = plan.config(name, seed)
        path = run_dir(out, name, seed)
        trainer = plan.trainer(name)
        status = run_status(path, cfg, trainer)
        job = _Job(f"[{i}/{len(jobs)}] {name} seed {seed}", f"{name} seed {seed}", cfg, path, resume=status == "resume", trainer=trainer)
        if status == "done":
            log(f"podsrl compare: {job.head} (train.seed={cfg.train.seed}): finished earlier, skipped")
            continue
        if status == "restart":  # interrupted before its first checkpoint: nothing to resume
            shutil.rmtree(path)
        todo.append(job)
    if devices:
        _check_pinnable(todo, devices)

    def finished(job: _Job) -> None:
        mark_done(job.path, job.cfg)
        arms.finish(job.path, job.trainer)  # a TRL arm's scored checkpoints go
        write_report(build_report(plan, out), out)

    if not isolate:
        for job in todo:
            log(f"podsrl compare: {job.head} (train.seed={job.cfg.train.seed}): {job.verb}{_with(job)}, budget {budget_text(job.cfg)} -> {job.path}")
            arms.train(job.cfg, job.trainer, run_dir=job.path, resume=job.resume, log=log)
            write_launch(job.path, device=None, parallel=1, runs_on_device=1, exit_code=0)
            finished(job)
        return len(todo)
    _run_pool(todo, parallel=parallel, devices=devices, log=log, on_success=finished)
    return len(todo)


@dataclass
class _Job:
    head: str  # "[3/8] pods_random seed 0"
    what: str  # "pods_random seed 0"
    cfg: Config
    path: Path
    resume: bool
    trainer: str = PODSRL  # or a TRL arm's (podsrl.compare.arms)
    device: str | None = None
    runs_on_device: int = 1  # the most runs on its device while it ran, itself included
    proc: subprocess.Popen | None = None
    tmp: tempfile.TemporaryDirectory | None = None
    output: Any = None  # the open train.log, when the output is not passed through
    started: float = field(default_factory=time.monotonic)

    @property
    def verb(self) -> str:
        return "resuming" if self.resume else "training"


def _run_pool(todo: list[_Job], *, parallel: int, devices: list[str] | None, log, on_success) -> None:
    """Keep up to ``parallel`` child processes going until ``todo`` is done. After a failure no
    new run starts; the running ones finish (they are kept), then RunFailed is raised. While the
    children run, the first of their train.stop_signals is recorded, passed on to them
    (:func:`_pass_on`), and no new run starts."""
    slots: list[str | None] = list(devices) if devices else [None]
    _say_sharing(slots, parallel, len(todo), devices, log)
    env = _child_env(parallel, len(todo))
    queue, running, failed = deque(todo), [], []
    stop = StopSignals(sorted({name for job in todo for name in job.cfg.train.stop_signals})).install()
    passed_on = False
    try:
        while queue or running:
            while queue and len(running) < parallel and not failed and stop.received is None:
                _launch(queue.popleft(), running, slots, env, parallel, log)
            if not running:
                break  # a run failed and the others have finished
            time.sleep(_POLL_SECONDS)
            if stop.received is not None and not passed_on:
                passed_on = True
                _pass_on(stop.received, running, log)
            for job in [j for j in running if j.proc.poll() is not None]:
                running.remove(job)
                if not _reap(job, parallel, stop.received, log, on_success, running=len(running)):
                    failed.append((job, job.proc.returncode))
    except KeyboardInterrupt:
        _stop(running, parallel)
        raise
    finally:
        stop.restore(ignore_after_stop=False)  # the runs checkpoint; this process only reports
    _raise_failure(stop.received, failed, len(queue), parallel)


def _say_sharing(slots: list[str | None], parallel: int, jobs: int, devices: list[str] | None, log) -> None:
    """A line when runs will share a device: their wall-clocks are then inflated."""
    per_device = -(-min(parallel, jobs) // len(slots))  # ceil: the most runs one device gets at once
    if per_device > 1:
        where = f"each of the devices {','.join(slots)}" if devices else "one device (the machine's CPU or its one GPU)"
        log(f"podsrl compare: up to {per_device} runs train at once on {where} and share its time: wall-clock times "
            "are inflated by the sharing, so the step axis is the fair comparison")  # fmt: skip


def _child_env(parallel: int, jobs: int) -> dict[str, str]:
    """The children's environment: each would otherwise start a thread per core, and K children
    oversubscribe the CPU."""
    env = dict(os.environ)
    if parallel > 1 and "OMP_NUM_THREADS" not in env and jobs:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // min(parallel, jobs)))
    return env


def _launch(job: _Job, running: list[_Job], slots: list[str | None], env: dict[str, str], parallel: int, log) -> None:
    """Start ``job`` on the least loaded device and record how many runs share it."""
    job.device = min(slots, key=lambda d: sum(j.device == d for j in running))
    _start(job, env, quiet=parallel > 1)
    running.append(job)
    on_device = [j for j in running if j.device == job.device]
    for j in on_device:
        j.runs_on_device = max(j.runs_on_device, len(on_device))
    pin = "" if job.device is None else f" on device {job.device}"
    out = f" (output in {job.path / LOG_FILE})" if parallel > 1 else ""
    log(f"podsrl compare: {job.head} (train.seed={job.cfg.train.seed}): {job.verb}{_with(job)}{pin}, budget {budget_text(job.cfg)} -> {job.path}{out}")


def _reap(job: _Job, parallel: int, received: signal.Signals | None, log, on_success, *, running: int) -> bool:
    """A child that has exited: cleaned up, its outcome said (``running``: how many still run); True
    when it finished its run."""
    rc = _end(job, parallel)
    minutes = (time.monotonic() - job.started) / 60
    if rc == 0:
        log(f"podsrl compare: {job.head}: finished ({minutes:.1f} min of wall-clock)")
        on_success(job)
        return True
    if rc == EXIT_PREEMPTED and received is not None:
        kept = "saved a checkpoint and stopped" if run_status(job.path, job.cfg, job.trainer) == "resume" else \
            "stopped before its first checkpoint: the same command trains it again from the start"
        log(f"podsrl compare: {job.head}: {kept} ({minutes:.1f} min of wall-clock)")
        return False
    if parallel > 1:
        log(f"podsrl compare: {job.head}: failed with exit code {rc}; the end of {job.path / LOG_FILE}:\n{_tail(job.path / LOG_FILE)}")
    if running:
        log(f"podsrl compare: no new runs start; waiting for the {running} running to finish")
    return False


def _raise_failure(received: signal.Signals | None, failed: list[tuple[_Job, int]], not_started: int, parallel: int) -> None:
    """RunFailed for the first failed run, or for a stop signal passed on to the runs (exit 75)."""
    if received is not None and (failed or not_started) and all(rc == EXIT_PREEMPTED for _, rc in failed):
        raise RunFailed(
            f"podsrl compare: stopped by {received.name}: the runs in progress stopped at their last checkpoint (or, before their first, start again) "
            f"({not_started + len(failed)} run(s) left); finished runs are kept: run the same command again to go on",
            EXIT_PREEMPTED,
        )
    if failed:
        job, rc = failed[0]
        if rc == EXIT_PREEMPTED:  # the run itself got a stop signal (not through this process)
            raise RunFailed(
                f"podsrl compare: the run {job.what} ({job.path}) was stopped by a signal after saving a checkpoint "
                "(exit code 75); finished runs are kept: run the same command again to resume it",
                rc,
            )
        where = f"its output is in {job.path / LOG_FILE}" if parallel > 1 else "its output is above"
        more = f" ({len(failed) - 1} more run(s) failed too)" if len(failed) > 1 else ""
        raise RunFailed(
            f"podsrl compare: the run {job.what} ({job.path}) failed with exit code {rc} ({where}){more}; "
            "finished runs are kept: fix the cause and run the same command again to go on",
            rc,
        )


def _with(job: _Job) -> str:
    """" with TRL GRPOTrainer" for a TRL arm; "" for podsrl's."""
    return "" if job.trainer == PODSRL else f" with {TRAINERS[job.trainer]}"


def _start(job: _Job, env: dict[str, str], *, quiet: bool) -> None:
    job.tmp = tempfile.TemporaryDirectory(prefix="podsrl-compare-")
    config = Path(job.tmp.name) / "config.toml"
    cfg = job.cfg
    if quiet:  # a progress bar written to a log file is noise (train.progress may differ from the plan)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, progress=False))
    config.write_text(config_mod.to_toml(cfg))
    child_env = dict(env)
    if job.device is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = job.device
    if quiet:
        job.path.mkdir(parents=True, exist_ok=True)
        job.output = open(job.path / LOG_FILE, "a")
    job.started = time.monotonic()
    job.proc = subprocess.Popen(arms.command(config, job.path, resume=job.resume, trainer=job.trainer), env=child_env,
                                stdout=job.output, stderr=subprocess.STDOUT if quiet else None)  # fmt: skip


def _end(job: _Job, parallel: int) -> int:
    """Clean up after a child that has exited; its launch record is appended to the run directory."""
    rc = job.proc.returncode
    if job.output is not None:
        job.output.close()
    job.tmp.cleanup()
    write_launch(job.path, device=job.device, parallel=parallel, runs_on_device=job.runs_on_device, exit_code=rc)
    return rc


def _pass_on(received: signal.Signals, running: list[_Job], log) -> None:
    """The stop signal this process received (SIGTERM from a scheduler, SLURM's ``--signal``) sent to
    every running child, which finishes its step, checkpoints and exits with code 75. A child that
    got the signal directly too (the same process group) ignores the second one (podsrl.run.preemption)."""
    alive = [j for j in running if j.proc.poll() is None]
    log(f"podsrl compare: {received.name}: passed on to the {len(alive)} running run(s), which checkpoint and stop; no new run starts")
    for job in alive:
        job.proc.send_signal(received)


def _stop(running: list[_Job], parallel: int) -> None:
    """On Ctrl-C: the children in the terminal's process group got the SIGINT too; give them time
    to stop (a run resumes from its last checkpoint), then interrupt, then kill what is left."""
    for sig, grace in ((None, 10.0), (signal.SIGINT, 30.0), (signal.SIGKILL, 10.0)):
        alive = [j for j in running if j.proc.poll() is None]
        if not alive:
            break
        for job in alive:
            if sig is not None:
                job.proc.send_signal(sig)
        deadline = time.monotonic() + grace
        for job in alive:
            try:
                job.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for job in running:
        if job.proc.poll() is not None:
            _end(job, parallel)


def _check_pinnable(todo: list[_Job], devices: list[str]) -> None:
    """CUDA_VISIBLE_DEVICES=N makes GPU N the child's only GPU, cuda:0: a run must not name another."""
    for job in todo:
        device = job.cfg.model.device
        if device not in ("auto", "cuda", "cuda:0"):
            raise ConfigError(
                f"--devices pins each run to one GPU with CUDA_VISIBLE_DEVICES, which its model.device={device!r} "
                f"({job.what}) contradicts; set model.device to auto or cuda"
            )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def budget_text(cfg: Config) -> str:
    """"80 steps", "10.0 min" or "80 steps or 10.0 min (whichever first)"."""
    t = cfg.train
    parts = ([f"{t.max_steps} steps"] if t.max_steps else []) + ([f"{t.max_seconds / 60:.1f} min"] if t.max_seconds else [])
    return " or ".join(parts) + (" (whichever first)" if len(parts) > 1 else "")
