"""podsrl/hostmem.py: asked (PODSRL_KEEP_FREED_MEMORY=1), the CLI restarts itself once with glibc keeping
freed memory, for the commands that train or sample, never over the user's own setting (issue 66)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from podsrl.hostmem import KEPT, SWITCH, decide, describe

ROOT = Path(__file__).resolve().parents[1]
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
LINUX = dict(system="Linux", libc="glibc")


@pytest.mark.parametrize(
    ("argv", "environ", "where", "restart", "why"),
    [
        (["train"], {SWITCH: "1"}, LINUX, True, f"{SWITCH}=1"),
        (["train", "my.toml", "--select.m=8"], {SWITCH: "1"}, LINUX, True, ""),
        (["eval", "--run", "runs/x"], {SWITCH: "1"}, LINUX, True, ""),
        (["compare", "configs/compare.toml"], {SWITCH: "1"}, LINUX, True, ""),
        (["train"], {}, LINUX, False, f"{SWITCH} is not 1"),  # off by default
        (["train"], {SWITCH: "0"}, LINUX, False, f"{SWITCH} is not 1"),
        (["plot", "runs/a"], {SWITCH: "1"}, LINUX, False, "not for plot"),
        (["env"], {SWITCH: "1"}, LINUX, False, "not for env"),
        ([], {SWITCH: "1"}, LINUX, False, "not for no command"),
        (["train"], {SWITCH: "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, LINUX, False, "set already"),  # the user's, or an earlier start's
        (["train"], {SWITCH: "1"}, dict(system="Darwin", libc=""), False, "Linux with glibc (Darwin, another C library)"),
        (["train"], {SWITCH: "1"}, dict(system="Linux", libc=""), False, "Linux with glibc (Linux, another C library)"),  # musl
    ],
)
def test_decide_restarts_only_when_asked_for_the_commands_that_train_or_sample_on_glibc(argv, environ, where, restart, why):
    chosen = decide(argv, environ, **where)
    assert chosen.restart == restart and why in chosen.reason, chosen


def test_describe_says_what_the_allocator_does_and_how_to_change_it():
    assert describe({"GLIBC_TUNABLES": KEPT}) == f"glibc keeps freed memory (GLIBC_TUNABLES={KEPT})"
    assert describe({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == "glibc's allocator as GLIBC_TUNABLES=glibc.malloc.arena_max=2 sets it"
    assert describe({}) == f"the C library's allocator as it is ({SWITCH}=1 on Linux: glibc keeps freed memory; docs/results.md measures it)"


ENTRY = """
import os, sys, types
sys.modules["podsrl.cli"] = types.SimpleNamespace(main=lambda: print("main", os.getpid(), os.environ.get("GLIBC_TUNABLES")) or 0)  # no torch
sys.argv = ["podsrl", *sys.argv[1:]]
print("start", os.getpid(), flush=True)
from podsrl.launch import entry
entry()
"""


def _entry(*argv: str, **env: str) -> list[list[str]]:
    environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", SWITCH)} | env
    done = subprocess.run([sys.executable, "-c", ENTRY, *argv], env=environ, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [line.split() for line in done.stdout.splitlines()]


@pytest.mark.skipif(not GLIBC, reason="the restart is for Linux with glibc")
def test_the_entry_point_restarts_once_in_the_same_process_with_the_tunables_then_runs_the_cli():
    """``PODSRL_KEEP_FREED_MEMORY=1 podsrl train``: the command line runs twice (a restart) under one
    process id, the CLI once, with GLIBC_TUNABLES = KEPT; without the switch, and ``podsrl plot`` with it,
    it runs once, as it is."""
    (start, pid), (again, pid2), (main, pid3, tunables) = _entry("train", **{SWITCH: "1"})
    assert (start, again, main) == ("start", "start", "main") and pid == pid2 == pid3 and tunables == KEPT
    assert [line[0] for line in _entry("train")] == ["start", "main"] and _entry("train")[-1][2] == "None"
    assert [line[0] for line in _entry("plot", "runs/a", **{SWITCH: "1"})] == ["start", "main"]
    assert _entry("train", GLIBC_TUNABLES="glibc.malloc.arena_max=2", **{SWITCH: "1"})[-1][2] == "glibc.malloc.arena_max=2"  # theirs, kept as it is


def test_the_train_start_up_line_says_what_the_allocator_does_on_a_cpu(monkeypatch):
    from podsrl.config import load
    from podsrl.train.distributed import Dist
    from podsrl.train.loop import _describe
    from podsrl.train.precision import MixedPrecision

    run = types.SimpleNamespace(cfg=load(), dist=Dist(), engine=types.SimpleNamespace(), precision=MixedPrecision("none", False, "as set"))
    monkeypatch.setenv("GLIBC_TUNABLES", KEPT)
    assert _describe(run, torch.nn.Linear(2, 2)).endswith(f"update in float32 (model.mixed_precision = 'none': as set), {describe()}")
    assert "glibc keeps freed memory" in describe()
