"""User rewards with a time limit (``reward.timeout_seconds``): every call runs in a worker process,
and a call that exceeds the limit is stopped by killing its worker.

A reward function written by a user (a verifier, a sandbox, a remote grader) can hang on one
completion. A Python thread cannot be stopped from outside, so the calls go to worker processes:
:class:`RewardPool` keeps ``reward.workers`` of them, sends each one a call at a time, and kills
(SIGKILL, to its whole process group, so a sandbox it started goes too) any worker whose call
outlives the limit, starting a fresh one in its place. The call is scored ``reward.timeout_score``
(0 by default: a failure), counted (``reward/timeouts`` in metrics.jsonl) and reported in a
warning naming the function and the example. When one function times out on more than
``reward.max_timeout_fraction`` of a training step's completions the run stops with a RewardError
naming it (a verifier that times out that often is broken, and its zeros would look like a model
that does not learn): :func:`check_timeouts`, which the trainer calls once per step over every
completion the step scored, every sampling round (``rollout.early_stop``), generation batch
(``rollout.dynamic_sampling``) and rank together (podsrl/train/sampling.py). Checking each call
instead would stop a run on one timeout in a small early-stopping round (issue 36).

Choices:

- Only user functions ("module:function", "file.py:function") go to the pool; the built-in
  rewards are pure, bounded string work and stay in the trainer's process, and without
  ``reward.timeout_seconds`` there is no pool at all: nobody pays for what they do not use.
- Workers are started with the "spawn" method (a fork of a process running torch's and vLLM's
  threads can deadlock) and lazily, at the first call, so ``podsrl eval`` never starts them. A
  worker imports the functions once and says "ready" before it is given work, so its start-up
  (about a second) never counts against a call's limit.
- A worker ignores SIGINT, SIGTERM, SIGUSR1/2 and SIGHUP: the trainer decides when it ends (a
  preemption signal sent to the whole job must not turn into a failed reward), and it exits by
  itself when the trainer's process is gone (a thread polls its parent).
- A function that raises or returns something that is not a finite number stops the run with the
  same RewardError as in-process scoring; a worker that dies on its own (a segfault, the OOM killer)
  is a RewardError too: it is not a slow completion, and it would die again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from podsrl.errors import RewardError
from podsrl.tasks.types import Example

START_SECONDS = 120.0  # a worker that has not imported the reward functions by then is broken


class _RemoteTraceback(Exception):
    """The worker's traceback, chained as the cause of the RewardError raised here."""

    def __init__(self, text: str):
        super().__init__(text)

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


def _serve(conn: Connection, names: list[str]) -> None:
    """A worker's main loop: import the functions, then ("call", i, name, completion, example) ->
    (i, "value", value) | (i, "raised", "Type: message", traceback)."""
    os.setpgrp()  # its own process group: the pool kills it together with anything it starts
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    parent = os.getppid()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    from podsrl.grading.user import load_user_reward

    try:
        functions = {name: load_user_reward(name) for name in names}
    except BaseException as err:  # noqa: BLE001 - reported to the trainer, which raises it
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the trainer is gone
        if message[0] == "exit":
            return
        _, i, name, completion, example = message
        try:
            value = functions[name](completion, example)
        except Exception as exc:  # noqa: BLE001 - reported, with its traceback
            conn.send((i, "raised", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        try:
            conn.send((i, "value", value))
        except Exception:  # noqa: BLE001 - a value that does not pickle is no number either
            conn.send((i, "value", repr(value)))


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    started: float
    ready: bool = False
    call: int | None = None  # the completion index it is scoring
    deadline: float = 0.0


@dataclass
class _Job:
    """One reward function's calls on one step's completions."""

    name: str
    completions: Sequence[str]
    examples: Sequence[Example]
    values: list[float]  # [N], timeout_score until answered
    timed_out: list[bool]  # [N]
    todo: deque  # completion indices not yet sent


@dataclass
class RewardPool:
    """Scores user reward functions in worker processes, each call limited to ``timeout`` seconds."""

    names: list[str]  # the user reward specs it serves
    timeout: float
    workers: int = 1
    timeout_score: float = 0.0
    max_fraction: float = 0.25  # reward.max_timeout_fraction, for the step's check_timeouts (the pool itself only warns)
    warn: Callable[[str], None] = field(default=lambda text: print(f"podsrl: warning: {text}", file=sys.stderr, flush=True))
    _pool: list[_Worker] = field(default_factory=list, init=False, repr=False)

    @classmethod
    def from_config(cls, cfg, names: Sequence[str]) -> RewardPool | None:
        """The pool for ``cfg`` (:class:`podsrl.config.RewardConfig`) over the user functions among
        ``names``; None without ``timeout_seconds`` or without a user function."""
        user = [name for name in names if ":" in name]
        if cfg.timeout_seconds is None or not user:
            return None
        return cls(user, cfg.timeout_seconds, cfg.workers, cfg.timeout_score, cfg.max_timeout_fraction)

    def serves(self, name: str) -> bool:
        return name in self.names

    def score(self, name: str, completions: Sequence[str], examples: Sequence[Example]) -> tuple[list[float], list[bool]]:
        """(value per completion, whether its call timed out), a timed-out call valued
        ``timeout_score`` and warned about. Raises RewardError when the function raises, returns a
        non-number or kills its worker; too many timeouts are the step's check (:func:`check_timeouts`)."""
        if not self._pool:
            self._pool = [self._start() for _ in range(self.workers)]
        job = _Job(name, completions, examples, [self.timeout_score] * len(completions), [False] * len(completions), deque(range(len(completions))))
        while job.todo or any(w.call is not None for w in self._pool):
            self._dispatch(job)
            self._receive(job)
            self._expire(job)
        self._report(job)
        return job.values, job.timed_out

    def _dispatch(self, job: _Job) -> None:
        """Give every ready, idle worker the next completion to score."""
        for k, w in enumerate(self._pool):
            if w.ready and w.call is None and job.todo:
                i = job.todo.popleft()
                try:
                    w.conn.send(("call", i, job.name, job.completions[i], job.examples[i]))
                except OSError:  # it died while idle (the OOM killer): not this call's doing
                    job.todo.appendleft(i)
                    self._kill(w)
                    self._pool[k] = self._start()
                    continue
                w.call, w.deadline = i, time.monotonic() + self.timeout

    def _receive(self, job: _Job) -> None:
        """Wait for the first answer or deadline, and take every answer that has come."""
        from podsrl.grading.rewards import check_value, describe_failure

        busy = [w for w in self._pool if w.call is not None or not w.ready]
        deadlines = [w.deadline if w.call is not None else w.started + START_SECONDS for w in busy]
        for conn in wait([w.conn for w in busy], max(0.0, min(deadlines, default=0.0) - time.monotonic())):
            w = next(w for w in self._pool if w.conn is conn)
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._died(w, job.name, job.completions, job.examples)  # raises
            if message[0] == "ready":
                w.ready = True
            elif message[0] == "failed":
                self.close()
                raise RewardError(f"reward worker for {', '.join(self.names)} could not load them: {message[1]}")
            elif message[1] == "value":
                i, w.call = message[0], None
                try:
                    job.values[i] = check_value(job.name, message[2], job.completions[i], job.examples[i])
                except RewardError:
                    self.close()
                    raise
            else:  # raised
                i = message[0]
                self.close()
                failure = describe_failure(job.name, f"raised {message[2]}", job.completions[i], job.examples[i])
                raise RewardError(failure) from _RemoteTraceback(message[3])

    def _expire(self, job: _Job) -> None:
        """Kill (and replace) every worker past its call's deadline; a worker that does not start is an error."""
        now = time.monotonic()
        for k, w in enumerate(self._pool):
            if w.call is not None and now >= w.deadline:
                job.timed_out[w.call] = True
                self._kill(w)
                self._pool[k] = self._start()
            elif not w.ready and now >= w.started + START_SECONDS:
                self.close()
                raise RewardError(f"reward worker for {', '.join(self.names)} did not start within {START_SECONDS:.0f} s")

    def _report(self, job: _Job) -> None:
        """Warn about this call's timeouts (the step's check_timeouts decides whether they are too many)."""
        count = sum(job.timed_out)
        if not count:
            return
        ids = [job.examples[i].id for i, t in enumerate(job.timed_out) if t]
        self.warn(
            f"reward function {job.name!r} timed out (> {self.timeout:g} s, reward.timeout_seconds) on {count} of "
            f"{len(job.completions)} completions (example {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}); "
            f"scored {self.timeout_score:g} (reward.timeout_score)"
        )

    def check_timeouts(self, timed_out: dict[str, int], total: int) -> None:
        """:func:`check_timeouts` with this pool's limit and ``max_fraction``."""
        check_timeouts(timed_out, total, max_fraction=self.max_fraction, timeout=self.timeout)

    def close(self) -> None:
        for w in self._pool:
            self._kill(w)
        self._pool = []

    # ---------------------------------------------------------------------------------------

    def _start(self) -> _Worker:
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=_serve, args=(theirs, self.names), name="podsrl-reward", daemon=True)
        process.start()
        theirs.close()
        return _Worker(process, ours, time.monotonic())

    def _kill(self, w: _Worker) -> None:
        try:
            os.killpg(w.process.pid, signal.SIGKILL)  # the worker and whatever it started
        except (ProcessLookupError, PermissionError):
            w.process.kill()  # not yet its own group leader
        w.process.join(timeout=10)
        w.conn.close()

    def _died(self, w: _Worker, name: str, completions: Sequence[str], examples: Sequence[Example]) -> None:
        from podsrl.grading.rewards import describe_failure

        w.process.join(timeout=10)
        code = w.process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        i = w.call
        self.close()
        if i is None:
            raise RewardError(f"a reward worker for {', '.join(self.names)} died while starting ({how})")
        problem = f"killed its worker process ({how}; a crash or the out-of-memory killer, not a slow call)"
        raise RewardError(describe_failure(name, problem, completions[i], examples[i]))


def check_timeouts(timed_out: dict[str, int], total: int, *, max_fraction: float, timeout: float) -> None:
    """Stop the run (RewardError naming the function) when one reward function timed out on more than
    ``max_fraction`` of a training step's ``total`` completions; ``timed_out``: function -> how many of
    its calls timed out in the step. Checked once over the whole step, never per call: a step sampled
    in small rounds would otherwise stop on one timeout."""
    for name, count in timed_out.items():
        if total and count > max_fraction * total:
            raise RewardError(
                f"reward function {name!r} timed out (> {timeout:g} s, reward.timeout_seconds) on {count} of the step's "
                f"{total} completions, more than reward.max_timeout_fraction = {max_fraction:g} of them: it hangs "
                "systematically (fix it, or raise reward.timeout_seconds or reward.max_timeout_fraction and resume)"
            )
