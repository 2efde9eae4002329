"""Benchmark: the CPU update with glibc's allocator as it is and with freed memory kept (issue 66).

    python bench/host_memory.py                     # 16 rows of 40 + 256 tokens, 2 rounds of 2 timed updates a way
    python bench/host_memory.py --quick             # a tiny random Llama: checks that it runs

Why: glibc's ``malloc`` serves a block above its mmap threshold (128 KiB, raised as blocks are freed
up to 32 MiB) with fresh pages and gives them back when it is freed, so the next block of that size
is faulted in again page by page, each page zeroed by the kernel. A CPU update allocates tensors far
above 32 MiB at each micro-batch (the kept logits, [rows x tokens x vocabulary] float32: 805 MB at
16 rows of 256 tokens of the embedded model, their gradient, the log-softmax's chunks). glibc's
tunables (``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...``, read
when a process starts; PyTorch's CPU performance guide points at them, and at jemalloc and tcmalloc)
keep such blocks in the heap for the next one.

What: each way runs in a fresh process (the tunables act at start-up), the ways alternating round
by round: ``glibc`` (the environment as it is, GLIBC_TUNABLES removed) and ``kept`` (:data:`KEPT`). A
process loads the model, runs a warm-up update, then ``--updates`` timed ``run_update`` calls of one
micro-batch (bench/peak.py's batch: one 40-token prompt shared by ``--rows`` random completions,
advantages +1 and -1, float32), and reports their seconds and its peak resident memory
(``ru_maxrss``). Printed: each way's median update, the ratio (glibc over kept: above 1, kept is
faster) and each way's largest peak memory. ``--out FILE`` writes the JSON (results/host-memory/);
``--table FILE`` prints a saved run's table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

KEPT = "glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=17179869184"  # 4 GiB - 1, 16 GiB
WAYS = ("glibc", "kept")


def environment(way: str) -> dict:
    """The worker's environment for ``way``: one thread a process is set by the worker itself."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if way == "kept":
        env["GLIBC_TUNABLES"] = KEPT
    return env


def worker(args: argparse.Namespace) -> dict:
    """One process: the warm-up and the timed updates (module docstring)."""
    import resource

    import torch

    import peak
    from podsrl.train.update import run_update

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model, shapes, pad, _, _ = peak.build_model(args.model, device)
    optimizer, scheduler = peak._optimizer(model)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, shapes.vocab - 1, (args.prompt,), generator=gen).tolist()
    batch = peak._batch([prompt], args.rows, args.length, shapes.vocab, gen)
    settings = peak._settings(args.length, pad, args.rows, False)
    model.train()
    run_update(model, optimizer, scheduler, batch, settings)
    seconds = []
    for _ in range(args.updates):
        start = time.perf_counter()
        run_update(model, optimizer, scheduler, batch, settings)
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "tunables": os.environ.get("GLIBC_TUNABLES")}  # fmt: skip


def table(data: dict) -> str:
    """The saved run's table (``--table``)."""
    rows = ["| way | update: s (median) | vs glibc | peak memory: GiB |", "|---|---:|---:|---:|"]
    base = data["median"]["glibc"]
    for way in WAYS:
        rows.append(f"| {way} | {data['median'][way]:.2f} | {base / data['median'][way]:.2f}x | {data['peak_rss_gib'][way]:.2f} |")
    s = data["sizes"]
    head = (f"{data['machine']}, {s['threads']} threads, torch {data['torch']}; {data['date'][:10]}; `{data['command']}`: "
            f"{s['rows']} rows of {s['prompt']} + {s['length']} tokens, {s['rounds']} rounds of {s['updates']} timed updates a way")  # fmt: skip
    return head + "\n\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--updates", type=int, default=2, help="timed updates a process")
    parser.add_argument("--rounds", type=int, default=2, help="processes a way, the ways alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="bench/peak.py's model name (default: the embedded one)")
    parser.add_argument("--quick", action="store_true", help="a tiny random Llama, 2 rows of 8 + 16 tokens")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table", type=Path, default=None, help="print a saved run's table and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return None
    import peak

    if args.quick:
        args.model, args.rows, args.prompt, args.length, args.updates, args.rounds, args.threads = "tiny-llama", 2, 8, 16, 1, 1, 1
    args.model = args.model or peak.EMBEDDED
    if args.worker:
        print(json.dumps(worker(args)))
        return None
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        raise SystemExit("bench/host_memory.py: glibc's tunables: Linux with glibc only")
    forwarded = [f"--{k}={getattr(args, k)}" for k in ("rows", "prompt", "length", "updates", "threads", "model")]
    runs: dict[str, list[dict]] = {w: [] for w in WAYS}
    started = time.time()
    for r in range(args.rounds):
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:
            out = subprocess.run([sys.executable, __file__, "--worker", *forwarded], env=environment(way), capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"bench/host_memory.py: the {way} worker failed:\n{out.stderr[-3000:]}")
            runs[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {way:>5}: updates {', '.join(f'{s:.2f}' for s in runs[way][-1]['seconds'])} s, "
                  f"peak memory {runs[way][-1]['peak_rss_gib']:.2f} GiB", flush=True)  # fmt: skip
    import torch

    from peak import machine

    data = {"benchmark": "host_memory", "command": "python bench/host_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine(torch.device("cpu"), args.threads)["cpu"],
            "torch": torch.__version__, "tunables": KEPT, "seconds": round(time.time() - started, 1),
            "sizes": {k: getattr(args, k) for k in ("rows", "prompt", "length", "updates", "rounds", "threads", "model")},
            "runs": runs, "median": {w: statistics.median(s for run in runs[w] for s in run["seconds"]) for w in WAYS},
            "peak_rss_gib": {w: max(run["peak_rss_gib"] for run in runs[w]) for w in WAYS}}  # fmt: skip
    print(table(data))
    print(f"update time glibc / kept: {data['median']['glibc'] / data['median']['kept']:.2f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return data


if __name__ == "__main__":
    main()
