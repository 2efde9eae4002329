"""Run one benchmark worker in a fresh Python process: its own memory peak, no state left over from
the worker before it. Shared by bench/vs_trl.py and bench/trl_pods.py.

The worker is the calling script itself, started as ``python SCRIPT ARGS... --result FILE``; it
writes its measurements to FILE as JSON and its output goes to a log file, whose tail is returned
as the error when the worker fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def run_isolated(script: str, args: list[str], spec: dict, *, log: Path, prefix: str, python: str | Path | None = None,
                 environ: dict | None = None) -> dict:  # fmt: skip
    """Run ``python script *args --spec-json ... --result FILE`` with ``spec`` (plus a scratch
    directory as ``spec["tmp"]``) in ``environ`` (default: this process's environment) with
    :data:`OFFLINE_ENV` over it; return the worker's JSON result with ``wall_seconds`` added (the
    process's whole life, model loading included), or ``{"error": ...}`` with the log's tail."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        result = Path(tmp) / "result.json"
        command = [str(python or sys.executable), script, *args, json.dumps({**spec, "tmp": tmp}), "--result", str(result)]
        start = time.perf_counter()
        with open(log, "w") as f:
            proc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env={**(os.environ if environ is None else environ), **OFFLINE_ENV}, check=False)
        if proc.returncode != 0 or not result.exists():
            tail = "".join(log.read_text().splitlines(keepends=True)[-25:])
            return {"error": f"exit code {proc.returncode}; log {log}:\n{tail}"}
        out = json.loads(result.read_text())
        out["wall_seconds"] = time.perf_counter() - start
        return out
