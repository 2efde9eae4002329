"""Benchmark: the CPU update with glibc's allocator as it is, with freed memory kept and with huge
pages, with the logits' gradient in a fresh tensor as before commit ae0d70c, and with the key/value
heads copied per query head as before commit 58c0377 (issue 66).

    python bench/host_memory.py                     # 16 rows of 40 + 256 tokens, 2 rounds of 2 timed updates a way
    python bench/host_memory.py --sampler 128 --length 64    # the transformers engine's call of 128 x 64 tokens instead
    python bench/host_memory.py --quick             # a tiny random Llama: checks that it runs (--quick --sampler 4: the embedded model)
    python bench/host_memory.py --train --ways glibc,kept --rounds 1    # whole `podsrl train` runs (the demo), as users start them
    python bench/host_memory.py --paired --rounds 5 # in place against fresh, the two alternating in one process (pairs)
    python bench/host_memory.py --ways glibc,copied # the update's attention reading shared key/value heads in place, or copying them

Why: glibc's ``malloc`` serves a block above its mmap threshold (128 KiB, raised as blocks are freed
up to 32 MiB) with fresh pages and gives them back when it is freed, so the next block of that size
is faulted in again page by page, each page zeroed by the kernel. A CPU update allocates tensors far
above 32 MiB at each micro-batch (the kept logits, [rows x tokens x vocabulary] float32: 805 MB at
16 rows of 256 tokens of the embedded model; their gradient and the log-softmax's chunks until
commits f94e9c4 and ae0d70c wrote them in place). glibc's tunables
(``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...``, read when a
process starts; PyTorch's CPU performance guide points at them, and at jemalloc and tcmalloc) keep
such blocks in the heap for the next one. Or the faults can be made fewer: PyTorch asks the
kernel for transparent huge pages (2 MiB, ``madvise(MADV_HUGEPAGE)``) on its CPU blocks of 2 MiB and
more where ``THP_MEM_ALLOC_ENABLE=1`` is set when it starts (:data:`THP`), one fault for 512 pages
(where /sys/kernel/mm/transparent_hugepage/enabled says ``madvise`` or ``always``).

What: each way runs in a fresh process (the tunables act at start-up), the ways alternating round
by round: ``glibc`` (the environment as it is, without the variables of :data:`CLEARED`),
``kept`` (:data:`KEPT`) and ``thp`` (THP_MEM_ALLOC_ENABLE=1). Two more, the update only, are glibc
as it is with one of podsrl's changes undone by the worker itself (:data:`IN_PROCESS`): ``fresh``, the
update's logits' gradient in a fresh [rows x tokens x V] tensor, as before commit ae0d70c (the worker
makes ``podsrl.train.sequences._gradient_in_place`` say no, and records whether the update asked it
and what it answered), and ``copied``, the attention copying each shared key/value head out to its
query heads, as transformers' ``sdpa`` does and the update did before commit 58c0377 (the worker
makes ``podsrl.train.sequences._attention`` switch nothing, and records whether transformers'
``repeat_kv`` copied heads). ``--ways`` picks them. A
process loads the model, runs a warm-up update, then ``--updates`` timed ``run_update`` calls of one
micro-batch (bench/peak.py's batch: one 40-token prompt shared by ``--rows`` random completions,
advantages +1 and -1, float32), and reports their seconds and its peak resident memory
(``ru_maxrss``). ``--sampler R`` times the transformers engine's sampling call instead (the embedded
model, float32): R rollouts of exactly ``--length`` tokens from bench/peak.py's prompts (R / 16
prompts of 36-44 tokens, end-of-sequence held off), a warm-up call, then ``--updates`` timed calls.
Printed: each way's median update, its ratio to glibc's (above 1: faster than glibc as it is) and
each way's largest peak memory.

``--paired`` compares ``glibc`` and one of :data:`IN_PROCESS` (``--ways glibc,fresh``, the default,
or ``glibc,copied``) within one process (glibc's environment), where the machine's drift from
process to process cannot hide a difference smaller than it: a warm-up update each way, then
``--rounds`` x ``--updates`` pairs of timed updates, one each way, the way that goes first
alternating from pair to pair. Printed: each way's median, and glibc / the other pair by pair,
summarised by its geometric mean with a Student-t 95% interval over the pairs' log ratios
(:func:`paired_ratio`); "resolved" where the interval excludes 1. One process has one peak memory
(the higher way's): the separate processes above measure the ways' memory.

``--train`` runs the CLI instead: ``python -m podsrl train`` with its defaults (the demo: a time
budget of training minutes, evaluations before and after) plus ``--setting KEY=VALUE`` s, in each
way's environment as a user starts it: ``kept`` with PODSRL_KEEP_FREED_MEMORY=1 (the CLI restarts
itself with :data:`KEPT`, podsrl/hostmem.py), ``glibc`` with neither it nor GLIBC_TUNABLES set (the
default; the run of 2026-11-30 set PODSRL_KEEP_FREED_MEMORY=0 there: keeping was the default at its
commit), ``thp`` with THP_MEM_ALLOC_ENABLE=1. Each run's steps, the
medians of its steps' ``time/step``, ``time/update`` and ``time/generate`` (metrics.jsonl), its peak
memory (``os.wait4``'s) and its start-up line's word on the allocator. ``--out FILE`` writes the JSON (results/host-memory/);
``--table FILE`` prints a saved run's table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from podsrl.hostmem import KEPT, SWITCH, tunables_unsupported  # noqa: E402  (the CLI's, with PODSRL_KEEP_FREED_MEMORY=1; hostmem imports no torch)
from podsrl.intervals import t_interval  # noqa: E402  (imports no torch either)

THP = "THP_MEM_ALLOC_ENABLE"  # PyTorch's (c10's alloc_cpu): huge pages for its CPU blocks of 2 MiB and more, read once at start
WAYS = {"glibc": {}, "kept": {"GLIBC_TUNABLES": KEPT}, "thp": {THP: "1"}, "fresh": {}, "copied": {}}  # way -> what its worker's environment adds
IN_PROCESS = ("fresh", "copied")  # glibc's environment, a change of podsrl's undone by the worker (module docstring); the update only
TRAIN_WAYS = {"glibc": {}, "kept": {SWITCH: "1"}, "thp": {THP: "1"}}  # --train: what the CLI's environment adds (module docstring)
CLEARED = ("GLIBC_TUNABLES", THP, SWITCH)  # removed from the caller's environment before a way adds its own
DEFAULT_WAYS = ("glibc", "kept", "thp")


def environment(way: str, *, train: bool = False) -> dict:
    """The environment of ``way``'s worker (``train``: of its ``podsrl train`` run, as a user starts
    it): the caller's without :data:`CLEARED`, plus the way's own. One thread a process is set by the
    worker itself."""
    return {k: v for k, v in os.environ.items() if k not in CLEARED} | (TRAIN_WAYS if train else WAYS)[way]


SPEC = ("rows", "prompt", "length", "updates", "threads", "model", "sampler", "train", "setting", "way", "paired", "rounds")  # what a worker is told
PAIRED = ("glibc", "fresh")  # --paired's default ways: glibc and one of IN_PROCESS, alternating within one process


def train_worker(spec: dict) -> dict:
    """``--train``: one ``podsrl train`` run in ``spec["way"]``'s environment, and what it measured."""
    import subprocess

    run_dir = Path(spec["tmp"]) / "run"
    with open(Path(spec["tmp"]) / "out.log", "w") as log:
        child = subprocess.Popen([sys.executable, "-m", "podsrl", "train", "--out", str(run_dir), *(f"--{s}" for s in spec["setting"])], cwd=ROOT,
                                 env=environment(spec["way"], train=True), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
    text = (Path(spec["tmp"]) / "out.log").read_text()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"podsrl train exited {os.waitstatus_to_exitcode(status)}:\n{text[-3000:]}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    said = next((part.strip() for line in text.splitlines() if line.startswith("podsrl: model on") for part in line.split(", ")
                 if "allocator" in part or "freed memory" in part), None)  # fmt: skip
    median = {k: statistics.median(r[f"time/{k}"] for r in steps) for k in ("step", "update", "generate")}
    return {"seconds": [median["step"]], "timed": "train", "steps": len(steps), "median": median, "said": said,
            "peak_rss_gib": usage.ru_maxrss / 2**20, "tunables": None, "thp": None}  # fmt: skip


def worker(spec: dict) -> dict:
    """One process: a warm-up, then the timed updates or sampling calls (``--sampler``), or a
    ``podsrl train`` run (``--train``; module docstring)."""
    if spec.get("train"):
        return train_worker(spec)
    import resource

    args = argparse.Namespace(**{k: spec[k] for k in SPEC})

    import torch

    import peak
    from podsrl.train.update import run_update

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model, shapes, pad, tokenizer, path = peak.build_model(args.model, device)
    gen = torch.Generator().manual_seed(0)
    answers: list[bool] = []  # the update's: what its backward was told, one answer a call (module docstring)
    copies: list[bool] = []  # the update's: whether transformers' repeat_kv copied heads, one a call
    if args.sampler:
        from podsrl.engines import Sampling

        fixed = peak._FixedLength()
        engines, _, _ = peak.make_engines(["transformers"], model, tokenizer, path, max_len=args.prompt + peak.PROMPT_SPREAD + args.length,
                                          threads=args.threads, fixed=fixed)  # fmt: skip
        fixed.length = args.length
        k = peak.distinct_prompts(args.sampler)
        prompts = [torch.randint(3, shapes.vocab - 1, (n,), generator=gen).tolist() for n in peak.prompt_lengths(args.prompt, k)]
        sampling = Sampling(n=args.sampler // k, temperature=1.0, top_p=1.0, max_new_tokens=args.length, seed=0)

        def once():
            return sum(map(len, engines["transformers"].generate(prompts, sampling).completion_ids))
    else:
        from podsrl.train import sequences

        import transformers.integrations.sdpa_attention as sdpa

        state = {"way": args.way}  # what the next update undoes (IN_PROCESS); --paired switches it update by update
        asked, attention, repeat_kv = sequences._gradient_in_place, sequences._attention, sdpa.repeat_kv

        def answer(logits) -> bool:
            answers.append(False if state["way"] == "fresh" else asked(logits))
            return answers[-1]

        def counted(hidden, n_rep):
            copies.append(n_rep > 1)
            return repeat_kv(hidden, n_rep)

        sequences._gradient_in_place = answer
        sequences._attention = lambda model, *args: contextlib.nullcontext() if state["way"] == "copied" else attention(model, *args)
        sdpa.repeat_kv = counted
        optimizer, scheduler = peak._optimizer(model)
        prompt = torch.randint(3, shapes.vocab - 1, (args.prompt,), generator=gen).tolist()
        batch = peak._batch([prompt], args.rows, args.length, shapes.vocab, gen)
        settings = peak._settings(args.length, pad, args.rows, False)
        model.train()

        def once():
            run_update(model, optimizer, scheduler, batch, settings)
            return args.rows * args.length

    if args.paired:
        return paired_worker(once, state, (answers, copies), (PAIRED[0], args.way), args.rounds * args.updates)
    once()  # the warm-up
    answers.clear()  # the timed calls' only
    copies.clear()
    seconds = []
    for _ in range(args.updates):
        start = time.perf_counter()
        tokens = once()
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "timed": "sampler" if args.sampler else "update", "tokens": tokens,  # completion tokens a timed call or update
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "tunables": os.environ.get("GLIBC_TUNABLES"), "thp": os.environ.get(THP),
            "gradient_in_place": all(answers) if answers else None, "heads_copied": None if args.sampler else any(copies)}  # fmt: skip


def paired_worker(once, state: dict, records: tuple[list, list], ways: tuple[str, str], pairs: int) -> dict:
    """``--paired``: a warm-up update each of ``ways``, then ``pairs`` pairs of timed updates, the way
    that goes first alternating (``state["way"]`` chooses the way of the next update; ``records``: the
    worker's answers and copies lists, which each update fills)."""
    import resource

    answers, copies = records
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    told: dict[str, list[bool]] = {w: [] for w in ways}
    copied: dict[str, list[bool]] = {w: [] for w in ways}
    for way in ways:
        state["way"] = way
        once()
    order = []
    for p in range(pairs):
        for way in ways if p % 2 == 0 else ways[::-1]:
            state["way"] = way
            answers.clear()
            copies.clear()
            start = time.perf_counter()
            once()
            seconds[way].append(time.perf_counter() - start)
            told[way].append(bool(answers) and all(answers))
            copied[way].append(any(copies))
            order.append(way)
    return {"seconds": seconds, "order": order, "timed": "update", "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "tunables": os.environ.get("GLIBC_TUNABLES"), "thp": os.environ.get(THP), "gradient_in_place": {w: all(told[w]) for w in ways},
            "heads_copied": {w: all(copied[w]) for w in ways}}  # fmt: skip


def paired_ratio(base: list[float], other: list[float]) -> dict:
    """base_i / other_i pair by pair (above 1: ``other`` faster), their geometric mean and its
    Student-t 95% interval over the log ratios (None for fewer than two pairs); ``resolved`` where
    the interval excludes 1."""
    logs = [math.log(b / o) for b, o in zip(base, other, strict=True)]
    interval = t_interval(logs)
    low, high = (math.exp(x) for x in interval) if interval else (None, None)
    return {"ratios": [math.exp(x) for x in logs], "geometric_mean": math.exp(statistics.fmean(logs)), "interval": [low, high] if interval else None,
            "resolved": bool(interval) and (low > 1 or high < 1)}  # fmt: skip


def transparent_hugepage() -> str | None:
    """The kernel's huge-page mode (``always``, ``madvise`` or ``never``: the bracketed word of
    /sys/kernel/mm/transparent_hugepage/enabled), None where it cannot be read."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


def table(data: dict) -> str:
    """The saved run's table (``--table``)."""
    s = data["sizes"]
    if s.get("train"):
        return train_table(data)
    if s.get("paired"):
        return paired_table(data)
    sampler = s.get("sampler")  # runs before --sampler timed the update alone
    rows = [f"| way | {'sampling call' if sampler else 'update'}: s (median) | vs glibc | peak memory: GiB |", "|---|---:|---:|---:|"]
    base = data["median"]["glibc"]
    for way in data["median"]:  # the run's ways, glibc first
        rows.append(f"| {way} | {data['median'][way]:.2f} | {base / data['median'][way]:.2f}x | {data['peak_rss_gib'][way]:.2f} |")
    what = (f"the transformers engine's call of {sampler} x {s['length']} tokens, {s['rounds']} rounds of {s['updates']} timed calls a way" if sampler
            else f"{s['rows']} rows of {s['prompt']} + {s['length']} tokens, {s['rounds']} rounds of {s['updates']} timed updates a way")  # fmt: skip
    head = f"{data['machine']}, {s['threads']} threads, torch {data['torch']}; {data['date'][:10]}; `{data['command']}`: {what}"
    return head + "\n\n" + "\n".join(rows)


def paired_table(data: dict) -> str:
    """``--paired``: each way's median and glibc / way pair by pair, in one process."""
    s, r = data["sizes"], data["paired"]
    other = next(w for w in data["median"] if w != "glibc")
    low, high = r["interval"] or (None, None)
    interval = f"[{low:.2f}, {high:.2f}]{', resolved' if r['resolved'] else ', not resolved'}" if low else "(one pair, no interval)"
    rows = ["| way | update: s (median) | glibc / way, pair by pair: geometric mean [95% CI] |", "|---|---:|---:|",
            f"| glibc | {data['median']['glibc']:.2f} | 1.00x |", f"| {other} | {data['median'][other]:.2f} | {r['geometric_mean']:.2f}x {interval} |"]  # fmt: skip
    head = (f"{data['machine']}, {s['threads']} threads, torch {data['torch']}; {data['date'][:10]}; `{data['command']}`: {s['rows']} rows of "
            f"{s['prompt']} + {s['length']} tokens, {len(r['ratios'])} pair{'s' if len(r['ratios']) != 1 else ''} of timed updates in one process, the first of a pair alternating; "
            f"its peak memory {data['peak_rss_gib']['process']:.2f} GiB")  # fmt: skip
    return head + "\n\n" + "\n".join(rows)


def train_table(data: dict) -> str:
    """``--train``: a row per run (the ways alternating), its steps, medians and peak memory."""
    s = data["sizes"]
    rows = ["| way | round | steps | step: s (median) | update: s (median) | sampling: s (median) | peak memory: GiB | the start-up line |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in range(s["rounds"]):
        for way in data["runs"]:
            run = data["runs"][way][r]
            m = run["median"]
            rows.append(f"| {way} | {r + 1} | {run['steps']} | {m['step']:.2f} | {m['update']:.2f} | {m['generate']:.2f} | {run['peak_rss_gib']:.2f} | "
                        f"{run['said']} |")  # fmt: skip
    settings = " ".join(f"--{x}" for x in s["setting"]) or "its defaults"
    head = f"{data['machine']}, torch {data['torch']}; {data['date'][:10]}; `{data['command']}`: `podsrl train` with {settings}, {s['rounds']} round(s)"
    return head + "\n\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--updates", type=int, default=2, help="timed updates (or sampling calls) a process")
    parser.add_argument("--sampler", type=int, default=0, help="time the transformers engine's call of this many rollouts instead of the update")
    parser.add_argument("--rounds", type=int, default=2, help="processes a way, the ways alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="bench/peak.py's model name (default: the embedded one)")
    parser.add_argument("--ways", default=None, help=f"comma-separated, glibc first (of {', '.join(WAYS)}; default {','.join(DEFAULT_WAYS)}, "
                        f"with --paired {','.join(PAIRED)} or glibc and another of {', '.join(IN_PROCESS)})")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a tiny random Llama, 2 rows of 8 + 16 tokens")
    parser.add_argument("--train", action="store_true", help="whole `podsrl train` runs instead (module docstring)")
    parser.add_argument("--setting", action="append", default=[], help="--train: a setting KEY=VALUE for podsrl train (repeatable)")
    parser.add_argument("--paired", action="store_true", help="glibc and fresh (or copied) alternating in one process: rounds x updates pairs (module docstring)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table", type=Path, default=None, help="print a saved run's table and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.worker:  # bench/_isolated.py's protocol: the spec as JSON, the result to a file
        Path(args.result).write_text(json.dumps(worker(json.loads(rest[0]))))
        return None
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return None
    import peak

    if args.quick:
        args.rows, args.prompt, args.length, args.updates, args.rounds, args.threads = 2, 8, 16, 1, 2 if args.paired else 1, 1  # two pairs: an interval
        args.model = args.model or (None if args.sampler else "tiny-llama")  # the sampler needs a tokenizer: the embedded model's
    args.model = args.model or peak.EMBEDDED
    if why := tunables_unsupported():
        raise SystemExit(f"bench/host_memory.py: {why}")
    args.ways = args.ways or ",".join(PAIRED if args.paired else DEFAULT_WAYS)
    ways = tuple(args.ways.split(","))
    if args.paired and (len(ways) != 2 or ways[1] not in IN_PROCESS or args.sampler or args.train):
        parser.error(f"--paired: glibc against one of {', '.join(IN_PROCESS)} (--ways {args.ways!r}); not with --sampler or --train")
    if ways[0] != "glibc" or len(set(ways)) != len(ways) or not set(ways) <= set(WAYS) or len(ways) < 2:
        parser.error(f"--ways {args.ways!r}: glibc first, then one or more of {', '.join(w for w in WAYS if w != 'glibc')}, each once")
    if set(IN_PROCESS) & set(ways) and (args.sampler or args.train):
        parser.error(f"--ways {args.ways!r}: {' and '.join(IN_PROCESS)} change the update: not with --sampler or --train")
    from _isolated import run_isolated

    if args.paired:
        return paired_main(args, argv)
    args.way = None
    spec = {k: getattr(args, k) for k in SPEC}
    what = "calls" if args.sampler else "updates"
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    started = time.time()
    logs = tempfile.mkdtemp(prefix="host-memory-logs-")
    for r in range(args.rounds):
        for way in ways if r % 2 == 0 else ways[::-1]:
            out = run_isolated(__file__, ["--worker"], spec | {"way": way}, log=Path(logs) / f"{way}-{r + 1}.log", prefix="host-memory-",
                               environ=environment(way))  # fmt: skip
            if "error" in out:
                raise SystemExit(f"bench/host_memory.py: the {way} worker (round {r + 1}) failed: {out['error']}")
            runs[way].append(out)
            print(f"round {r + 1} {way:>5}: {'train: a median step' if args.train else what} {', '.join(f'{s:.2f}' for s in runs[way][-1]['seconds'])} s, "
                  f"peak memory {runs[way][-1]['peak_rss_gib']:.2f} GiB", flush=True)  # fmt: skip
    data = record(args, argv, started, ("sampler", "train", "setting"), tunables=KEPT, runs=runs,
                  median={w: statistics.median(s for run in runs[w] for s in run["seconds"]) for w in ways},
                  peak_rss_gib={w: max(run["peak_rss_gib"] for run in runs[w]) for w in ways})  # fmt: skip
    print(table(data))
    for way in ways[1:]:
        print(f"{'train step' if args.train else 'sampling call' if args.sampler else 'update'} time glibc / {way}: "
              f"{data['median']['glibc'] / data['median'][way]:.2f}x")  # fmt: skip
    return save(args, data)


def record(args: argparse.Namespace, argv: list[str] | None, started: float, sizes: tuple[str, ...], **measured) -> dict:
    """The run's JSON: its command, date, machine and sizes (the shared ones and ``sizes``), then ``measured``."""
    import torch

    from peak import machine

    return {"benchmark": "host_memory", "command": "python bench/host_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine(torch.device("cpu"), args.threads)["cpu"],
            "torch": torch.__version__, "seconds": round(time.time() - started, 1),
            "sizes": {k: getattr(args, k) for k in ("rows", "prompt", "length", "updates", "rounds", "threads", "model", *sizes)},
            **measured, "transparent_hugepage": transparent_hugepage()}  # fmt: skip


def save(args: argparse.Namespace, data: dict) -> dict:
    """Write ``data`` to ``--out`` (if given); return it."""
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return data


def paired_main(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """``--paired``: one worker in glibc's environment, the ways alternating inside it."""
    from _isolated import run_isolated

    ways = tuple(args.ways.split(","))
    args.way = ways[1]  # the worker's first way: glibc's turn sets its own
    started = time.time()
    log = Path(tempfile.mkdtemp(prefix="host-memory-logs-")) / "paired.log"
    out = run_isolated(__file__, ["--worker"], {k: getattr(args, k) for k in SPEC}, log=log, prefix="host-memory-", environ=environment("glibc"))
    if "error" in out:
        raise SystemExit(f"bench/host_memory.py: the paired worker failed: {out['error']}")
    for way in ways:
        print(f"{way:>6}: updates {', '.join(f'{s:.2f}' for s in out['seconds'][way])} s", flush=True)
    data = record(args, argv, started, ("paired",), run=out, median={w: statistics.median(out["seconds"][w]) for w in ways},
                  peak_rss_gib={"process": out["peak_rss_gib"]}, paired=paired_ratio(out["seconds"]["glibc"], out["seconds"][ways[1]]))  # fmt: skip
    print(table(data))
    r = data["paired"]
    words = "resolved" if r["resolved"] else "not resolved"
    bounds = f" [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}], {words}" if r["interval"] else ", one pair"
    print(f"update time glibc / {ways[1]}, pair by pair: {r['geometric_mean']:.2f}x{bounds} (below 1: glibc, podsrl as it is, is faster)")
    return save(args, data)


if __name__ == "__main__":
    main()
