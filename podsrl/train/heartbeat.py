"""Hung and lost ranks: a heartbeat through the job's store, so that a stuck rank stops the job
within ``distributed.hang_seconds``, by name, instead of holding every other rank in a collective
until the 30-minute collective timeout.

On one node torchrun stops the survivors within seconds when a rank *dies*. A rank that *hangs*
(stuck in a reward function, in generation, a node lost mid-collective) is different: the others
wait for it in their next collective. Two ways to bound that wait:

- a collective timeout (``timeout`` of the process group, ``distributed.timeout_minutes``): fails
  the ranks that wait, but not the stuck one (torchrun's agent kills it afterwards; srun alone
  would not), its error names neither the stuck rank nor what it was doing, and on NCCL a tensor
  collective returns to the host before it completes, so the wait surfaces later and elsewhere;
- a heartbeat: chosen. Every rank's watchdog thread publishes, every ``interval`` seconds, a beat
  into the rendezvous store torchrun already runs (a TCPStore; a second client, so the trainer's
  own store traffic never queues behind it): a tick (the thread is alive), how many of podsrl's
  collectives the rank has entered (:class:`podsrl.train.distributed.Dist` counts them), and the
  phase its main thread is in (read from its stack: generate, reward, update, sync, eval,
  checkpoint ...) with the innermost line. Rank 0's watchdog reads every beat and decides
  (:func:`verdict`); every other rank reads the verdict key and watches rank 0's tick.

A rank is **hung** when another rank has entered more collectives than it and it has entered none
itself for longer than the bound: the others are waiting for it, and it has not come. (A rank that is
always a little behind but keeps entering collectives is slow, not hung: each new collective it
enters restarts the clock.) It is **lost** when its tick has not
changed for longer than the bound (its process is frozen, holding the GIL in C code, or its node
is gone). Either way every rank prints the same message, naming the rank, its host and pid, its
phase and line, and exits with code 124 (``podsrl.errors.EXIT_HUNG``) from the watchdog thread
(``os._exit``: the main thread may be blocked in C and cannot be interrupted); torchrun then
restarts the job (``--max-restarts``, with ``--resume auto``) or ends it. Losing the store itself
for longer than the bound (the node running torchrun's agent for rank 0 is gone) ends the rank too.

Choices and limits:

- Long *legitimate* waits count: rank 0 writing a checkpoint while the others wait, a rank whose
  generation is slower than the others' by more than the bound. The bound (default 10 minutes) must
  exceed those; the collective timeout stays as a backstop above it (``hang_seconds`` must be below
  ``timeout_minutes``, a ConfigError otherwise).
- Set-up is exempt from "hung": how long loading the model and building the engine takes differs
  between ranks for good reasons (a cold file cache, a download, a loaded machine: 35 s for the
  tests' tiny model on this project's busy 2-core CPU), and the first collective waits for the
  slowest. A rank lost during set-up is still caught by its tick, one stuck in it by the collective
  timeout.
- Only podsrl's own collectives are counted. A rank that hangs while the others wait inside FSDP's
  collectives or vLLM's is caught by the collective timeout, not by the heartbeat.
- Rank 0 decides alone (one reader of every beat, not world^2), so a job of hundreds of ranks costs
  the store a few hundred small writes and one multi-get per interval. Rank 0 waits (at most two
  intervals) until the others have read a verdict before it exits: without torchrun the store lives
  in rank 0's process.
- One process (no process group): no heartbeat; nothing waits for anyone.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from podsrl.errors import EXIT_HUNG

PREFIX = "podsrl/heartbeat"
VERDICT = "verdict"
ACK = "read"  # ACK/<rank>: that rank has read the verdict

# The phase a rank is in: the outermost of these frames on its main thread's stack.
PHASES: tuple[tuple[str, str, str], ...] = (  # (module prefix, function, phase)
    ("podsrl.train.loop", "setup", "setup"),
    ("podsrl.run.checkpoint", "load_newest", "resume"),
    ("podsrl.train.evaluate", "evaluate", "eval"),
    ("podsrl.run.checkpoint", "save", "checkpoint"),
    ("podsrl.engines", "generate", "generate"),
    ("podsrl.grading.rewards", "compute_rewards", "reward"),
    ("podsrl.train.update", "run_update", "update"),
    ("podsrl.engines", "sync_weights", "sync"),
)


@dataclass
class Beat:
    """What one rank publishes every interval."""

    rank: int
    tick: int  # +1 per interval: the watchdog thread (and so the process) is alive
    collectives: int  # podsrl collectives this rank has entered (Dist.collectives)
    phase: str  # "reward", "update", ... ("-": none of PHASES)
    where: str  # the main thread's innermost Python line, "file:line in function"
    waiting: bool  # the main thread is inside a collective
    host: str
    pid: int
    done: bool = False  # left training (normally or not): no longer watched


@dataclass
class Seen:
    """What rank 0 has seen of one rank, on rank 0's own clock (ranks' clocks need not agree)."""

    tick: int = -1
    changed: float = 0.0  # when its tick last changed (first: when watching began)
    behind_since: float | None = None  # since when another rank has entered more collectives
    collectives: int = -1  # its collective count at the last observation


def observe(seen: dict[int, Seen], beats: dict[int, Beat | None], now: float) -> None:
    """Update ``seen`` from the latest ``beats`` (None: that rank has not published yet)."""
    live = [b for b in beats.values() if b is not None and not b.done]
    most = max((b.collectives for b in live), default=0)
    for rank, beat in beats.items():
        s = seen.setdefault(rank, Seen(changed=now))
        if beat is None:
            continue
        if beat.tick != s.tick:
            s.tick, s.changed = beat.tick, now
        advanced, s.collectives = beat.collectives != s.collectives, beat.collectives
        if beat.done or beat.phase == "setup" or beat.collectives >= most:
            s.behind_since = None
        elif s.behind_since is None or advanced:
            # Behind, but it entered a collective since the last look: slow, not stuck. The clock
            # restarts, so that many short waits for a slow rank never add up to one "hang".
            s.behind_since = now


def verdict(seen: dict[int, Seen], beats: dict[int, Beat | None], now: float, bound: float) -> str | None:
    """The message that stops the job, or None: the first lost rank, else the first hung one."""
    live = {r: b for r, b in beats.items() if b is None or not b.done}
    for rank in sorted(live):
        if now - seen[rank].changed > bound:
            beat = live[rank]
            last = f"; last seen {_doing(beat)}" if beat is not None else "; it never published one"
            return (
                f"rank {rank}{_ident(beat)} has sent no heartbeat for {now - seen[rank].changed:.0f} s{last}: its process is "
                f"frozen or its node is gone (distributed.hang_seconds = {bound:g}); stopping every rank"
            )
    for rank in sorted(live):
        since = seen[rank].behind_since
        if since is not None and now - since > bound:
            beat = live[rank]
            waiting = [r for r, b in live.items() if b is not None and r != rank and b.collectives > beat.collectives]
            return (
                f"rank {rank}{_ident(beat)} has kept rank{'s' if len(waiting) > 1 else ''} {_ranks(waiting)} waiting for "
                f"{now - since:.0f} s: it is {_doing(beat)} (distributed.hang_seconds = {bound:g}); stopping every rank"
            )
    return None


def _ident(beat: Beat | None) -> str:
    return f" (host {beat.host}, pid {beat.pid})" if beat is not None else ""


def _doing(beat: Beat) -> str:
    phase = f"in its {beat.phase} phase" if beat.phase != "-" else "between phases"
    return f"{phase}, at {beat.where}" + (" (inside a collective)" if beat.waiting else "")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) < 8 else f"{', '.join(map(str, ranks[:6]))} ... ({len(ranks)} ranks)"


def describe(thread_id: int) -> tuple[str, str, bool]:
    """(phase, innermost line, inside a collective) of the thread ``thread_id``'s current stack."""
    frame = sys._current_frames().get(thread_id)
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    if not frames:
        return "-", "-", False
    phase = "-"
    for f in reversed(frames):  # outermost first: evaluate() -> generate() is eval, not generate
        module, function = f.f_globals.get("__name__", ""), f.f_code.co_name
        match = next((p for m, fn, p in PHASES if function == fn and module.startswith(m)), None)
        if match is not None:
            phase = match
            break
    inner = frames[0]
    waiting = any(str(f.f_globals.get("__name__", "")).startswith("torch.distributed") for f in frames)
    return phase, f"{_short(inner.f_code.co_filename)}:{inner.f_lineno} in {inner.f_code.co_name}", waiting


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/podsrl/"):
        if marker in filename:
            return ("podsrl/" if marker == "/podsrl/" else "") + filename.rsplit(marker, 1)[1]
    return filename


class Heartbeat:
    """``with Heartbeat(dist, bound):`` watches this rank and (rank 0) every rank; see the module
    docstring. A no-op in one process or without a bound."""

    def __init__(self, dist, bound: float | None, *, store=None, interval: float | None = None, on_verdict: Callable[[str], None] | None = None):
        self.dist = dist
        self.bound = bound
        self.enabled = bool(dist.active and bound)
        self.interval = interval if interval is not None else min(5.0, max(0.5, (bound or 0) / 10))
        self._store = store
        self._on_verdict = on_verdict or _exit_hung
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trainer = threading.get_ident()  # the thread that trains: the one to describe

    def __enter__(self) -> Heartbeat:
        if self.enabled:
            # A namespace of this job attempt's own, the same on every rank: torchrun's store can
            # outlive the workers, and TORCHELASTIC_RESTART_COUNT may differ between nodes.
            namespace = self.dist.broadcast_object(uuid.uuid4().hex if self.dist.is_main else None)
            if self._store is None:
                self._store = job_store(self.bound, namespace)
            self._thread = threading.Thread(target=self._watch, name="podsrl-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10 * self.interval)
        self._thread = None
        try:
            self._publish(0, done=True)
        except Exception:  # noqa: BLE001 - the store may be gone already; nobody needs the beat then
            pass

    def _beat(self, tick: int, *, done: bool = False) -> Beat:
        phase, where, waiting = describe(self._trainer)
        return Beat(self.dist.rank, tick, self.dist.collectives, phase, where, waiting, socket.gethostname(), os.getpid(), done)

    def _publish(self, tick: int, *, done: bool = False) -> None:
        self._store.set(str(self.dist.rank), json.dumps(asdict(self._beat(tick, done=done))))

    def _read(self, ranks: list[int]) -> dict[int, Beat | None]:
        keys = [str(r) for r in ranks]
        # One round trip once every rank has published (a multi_get of a missing key would block).
        present = ranks if self._store.check(keys) else [r for r, k in zip(ranks, keys) if self._store.check([k])]
        values = self._store.multi_get([str(r) for r in present]) if present else []
        beats: dict[int, Beat | None] = dict.fromkeys(ranks)
        for r, raw in zip(present, values):
            beats[r] = Beat(**json.loads(raw))
        return beats

    def _watch(self) -> None:
        seen: dict[int, Seen] = {}
        tick, store_ok, decided = 0, time.monotonic(), False
        ranks = list(range(self.dist.world)) if self.dist.is_main else [0]
        while not self._stop.wait(0 if tick == 0 else self.interval):
            now = time.monotonic()
            try:
                self._publish(tick)
                message = None
                if self._store.check([VERDICT]):
                    message = self._store.get(VERDICT).decode()
                    self._store.set(f"{ACK}/{self.dist.rank}", "1")
                else:
                    beats = self._read(ranks)
                    observe(seen, beats, now)
                    if self.dist.is_main:
                        message = verdict(seen, beats, now, self.bound)
                        decided = message is not None
                    else:  # rank 0's beat only: is the decider alive?
                        beat = beats[0]
                        if (beat is None or not beat.done) and now - seen[0].changed > self.bound:
                            message = verdict(seen, beats, now, self.bound)
                store_ok = now
            except Exception as err:  # noqa: BLE001 - the store's client raises plain RuntimeErrors
                if now - store_ok <= self.bound:
                    tick += 1
                    continue
                message = (
                    f"rank {self.dist.rank} has lost the job's store for {now - store_ok:.0f} s ({type(err).__name__}: "
                    f"{' '.join(str(err).split())[:200]}): the node running rank 0's agent is gone or unreachable "
                    f"(distributed.hang_seconds = {self.bound:g}); stopping this rank"
                )
            if message is not None and not self._stop.is_set():
                sys.stdout.flush()
                sys.stderr.write(f"podsrl: error: {message}\n")
                sys.stderr.flush()
                if decided:
                    self._publish_verdict(message)
                self._on_verdict(message)
                return
            tick += 1

    def _publish_verdict(self, message: str) -> None:
        """Rank 0: tell every rank, and wait (at most two intervals) until they have read it, so
        that it does not take the store with it (it lives in rank 0's process without torchrun)."""
        try:
            self._store.set(VERDICT, message)
            others = [f"{ACK}/{r}" for r in range(1, self.dist.world)]
            deadline = time.monotonic() + 2 * self.interval
            while others and time.monotonic() < deadline and not self._store.check(others):
                time.sleep(0.05)
        except Exception:  # noqa: BLE001 - a store that fails now: the others find out by themselves
            pass


def _exit_hung(message: str) -> None:
    del message  # already printed
    os._exit(EXIT_HUNG)


def job_store(bound: float, namespace: str):
    """A client of the process group's store (torchrun's TCPStore) of its own, under ``namespace``."""
    import torch.distributed as tdist
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()  # no public accessor; stable since torch 1.x
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    timeout = datetime.timedelta(seconds=max(10.0, min(60.0, bound / 4)))
    if isinstance(store, tdist.TCPStore):
        store = tdist.TCPStore(store.host, store.port, is_master=False, timeout=timeout, wait_for_workers=False)
    return tdist.PrefixStore(f"{PREFIX}/{namespace}/", store)
