"""Before the CLI starts: with ``PODSRL_KEEP_FREED_MEMORY=1`` on Linux with glibc, ``podsrl train |
eval | compare`` restart themselves once, at start, with glibc told to keep freed memory for reuse
(issue 66). Off by default: it made the CPU update faster and a whole run's peak memory larger, and
since the update writes in place its gain is not resolved (below).

Why: a CPU update allocates and frees tensors far above glibc's mmap threshold (128 KiB, raised as
blocks are freed up to 32 MiB) at every micro-batch: the kept logits, [rows x tokens x vocabulary]
float32 (805 MB at 16 rows of 256 tokens of the embedded model), and the model's activations (the
logits' gradient and the log-softmax's chunks were such blocks too, in the first measurements
below; they are now written in place: podsrl/train/sequences.py). glibc serves each with fresh pages
and unmaps it when it is freed, so the next one is faulted in again page by page, every page zeroed
by the kernel. Two of glibc's tunables keep such blocks in the heap for the next one (:data:`KEPT`:
an mmap threshold of 4 GiB - 1 and a trim threshold of 16 GiB), as PyTorch's own CPU launcher
(``torch.backends.xeon.run_cpu``) keeps freed memory in jemalloc or tcmalloc.

Measured side by side in fresh processes on a 2-core AMD EPYC (bench/host_memory.py, docs/results.md,
"The update and glibc's allocator"): the update at 16 rows of 40 + 256 tokens 1.08x and 1.16x as
fast in two runs at the same peak memory, 1.04x at 64 tokens and a sampling call 1.05x (both not
resolved); whole ``podsrl train`` runs of the demo (16-token answers, vLLM sampling in the process)
1.05x a step, not resolved (the update 1.03-1.15x, the sampling a little slower), at 0.7-1.1 GiB more
peak memory (8.2 against 7.1-7.5 GiB): freed blocks the update keeps are not what the sampler asks
for. Since the update writes its logits' gradient in place (commit ae0d70c): 1.07x, not resolved,
at the same peak memory ("The update writes in place"). Hence opt-in: worth trying where long
completions make the update the step's cost and memory is not short. Huge pages (PyTorch's
``THP_MEM_ALLOC_ENABLE=1``: fewer faults, each page still zeroed) gave 1.00x.

How: the tunables act only when a process starts, so :func:`restart_if_asked` (called by the CLI's
entry point, :func:`podsrl.launch.entry`) replaces the process with the same
command line (``os.execve``: the same process id, which torchrun, SLURM and signals see) before
anything heavy is imported, about a tenth of a second. Child processes inherit the setting
(torchrun's ranks, vLLM's workers, ``podsrl compare``'s runs) and do not restart. Never over a
``GLIBC_TUNABLES`` already set; not off Linux with glibc; not for other commands; not for podsrl used
as a library (set ``GLIBC_TUNABLES`` yourself when starting Python). The start-up line says which
(:func:`describe`). This module imports no torch.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import NamedTuple

__all__ = ["COMMANDS", "KEPT", "SWITCH", "Restart", "decide", "describe", "restart_if_asked", "tunables_unsupported"]

KEPT = "glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=17179869184"  # 4 GiB - 1, 16 GiB
SWITCH = "PODSRL_KEEP_FREED_MEMORY"  # "1": restart with KEPT; unset or anything else: glibc as it is
COMMANDS = frozenset({"train", "eval", "compare"})  # the commands that train or sample


class Restart(NamedTuple):
    """What :func:`decide` chose: restart with :data:`KEPT` (``restart``) or not, and why."""

    restart: bool
    reason: str


def decide(argv: list[str], environ, *, system: str | None = None, libc: str | None = None) -> Restart:
    """Whether the CLI started as ``podsrl ARGV`` should restart with :data:`KEPT`. ``system`` and
    ``libc``: ``platform.system()`` and ``platform.libc_ver()[0]`` (None: this machine's)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        return Restart(False, f"not for {command or 'no command'}")
    if environ.get(SWITCH, "").strip() != "1":
        return Restart(False, f"{SWITCH} is not 1")
    if "GLIBC_TUNABLES" in environ:
        return Restart(False, "GLIBC_TUNABLES is set already")
    why = tunables_unsupported(system=system, libc=libc)
    return Restart(False, why) if why else Restart(True, f"{SWITCH}=1")


def tunables_unsupported(*, system: str | None = None, libc: str | None = None) -> str | None:
    """Why glibc's tunables do not apply on this machine, or None on Linux with glibc. ``system`` and
    ``libc``: ``platform.system()`` and ``platform.libc_ver()[0]`` (None: this machine's)."""
    system = platform.system() if system is None else system
    libc = platform.libc_ver()[0] if libc is None else libc
    if system != "Linux" or libc != "glibc":
        return f"glibc's tunables need Linux with glibc ({system}, {libc or 'another C library'})"
    return None


def restart_if_asked() -> None:
    """Replace this process with its own command line under :data:`KEPT` where :func:`decide` says
    to (``os.execve``); return where it does not, or where the restart fails (said on stderr)."""
    if sys.executable and decide(sys.argv[1:], os.environ).restart:  # an embedded interpreter may not know its executable
        try:
            os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": KEPT})
        except OSError as exc:  # cannot restart: run as it is, and say so
            print(f"podsrl: could not restart with glibc keeping freed memory ({exc}); running as it is", file=sys.stderr)


def describe(environ=None) -> str:
    """For the start-up line of a run on a CPU: whether glibc keeps freed memory, and how to change it."""
    environ = os.environ if environ is None else environ
    tunables = environ.get("GLIBC_TUNABLES")
    if tunables == KEPT:
        return f"glibc keeps freed memory (GLIBC_TUNABLES={KEPT})"
    if tunables is not None:
        return f"glibc's allocator as GLIBC_TUNABLES={tunables} sets it"
    return f"the C library's allocator as it is ({SWITCH}=1 on Linux: glibc keeps freed memory; docs/results.md measures it)"
