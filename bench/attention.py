"""Benchmark: a sampling step's attention over the KV cache, three ways side by side (issue 66).

    python bench/attention.py                # CPU: SmolLM2-135M's heads, float32, 64 and 128 rollouts
    python bench/attention.py --gpu          # GPU: SmolLM2-135M's and Qwen2.5-0.5B's heads, bfloat16, 128 and 512
    python bench/attention.py --tiny         # small shapes, seconds: checks the script runs

Most small instruct models share each key/value head among r query heads (SmolLM2-135M: 9 query
heads, 3 key/value heads; Qwen2.5-0.5B: 14 and 2). A sampling call's prompts differ in length, so
every step passes an attention mask. The ways, each on the same query, cache and mask:

- ``copied``: transformers' ``sdpa`` attention as it is
  (``transformers.integrations.sdpa_attention.sdpa_attention_forward``): with a mask it first copies
  each key/value head to its r query heads (``repeat_kv``), every layer, every step. What runs on a
  GPU today.
- ``enable_gqa``: podsrl's :func:`podsrl.engines.attention.sdpa_gqa_forward`, PyTorch's own sharing
  with the mask. What the engines run on a CPU since commit 9a86a53. On CUDA, transformers says
  PyTorch takes it to the math kernel when a mask is passed (why it copies there); on a lent H200
  (torch 2.11, a decode step) it was the fastest of the three and equal to ``copied`` to the bit.
- ``grouped``: :func:`podsrl.engines.attention.grouped_queries_forward`: the r query heads of a
  key/value head passed as its query rows, the mask repeated r times, no copy of the cache, a plain
  masked kernel. Written as the candidate for CUDA; on a lent H200 (2026-11-30) it was slower
  than ``enable_gqa``, as on this project's CPU. No engine uses it.

A decode step (one query a row) at ``rows`` rollouts over ``positions`` cached positions (a prompt
and the completion so far; the static engine's cache always holds its full length), the mask hiding
0-8 left-padding positions a row. Reported per shape and way: the median seconds of one call (one
layer), the step's attention over every layer (x the model's layers), and the ratio to ``copied``
(above 1: faster). The ways' outputs are checked against ``copied`` (the largest difference is
reported; a way that differs by more than the dtype's tolerance fails the run). A sample is as many
back-to-back calls as take about 20 ms; a way's time at a shape is the median of 5 samples after a
warm-up. ``--rounds`` (default 3) repeats every shape, the ways' order rotating; the median over the
rounds is reported, each round's kept in the JSON. (On this project's CPU the copy's time moved
several-fold between runs, far more than within one: docs/engines.md.)

--out FILE writes the figures as JSON (results/attention/); ``--table FILE`` prints a saved one's
table (docs/engines.md; tests/test_attention.py checks the page). bench/peak.py calls
:func:`measure` for its sampler's model (on a GPU: within the lent GPU's one command).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # podsrl from this working tree; the sibling benches (peak)

WAYS = ("copied", "enable_gqa", "grouped")
PADDING = 8  # the most left-padding positions a row's mask hides


@dataclass(frozen=True)
class Heads:
    """A model's attention shape: query heads, key/value heads, head size, layers."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    layers: int


SMOLLM2_135M = Heads("smollm2-135m", 9, 3, 64, 30)
QWEN25_05B = Heads("qwen2.5-0.5b", 14, 2, 64, 24)
TINY = Heads("tiny", 4, 2, 16, 2)


def _forward(way: str):
    from podsrl.engines.attention import grouped_queries_forward, sdpa_gqa_forward

    if way == "copied":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    return {"enable_gqa": sdpa_gqa_forward, "grouped": grouped_queries_forward}[way]


class _Module:
    """What transformers' attention functions read from the layer calling them."""

    is_causal = True
    training = False

    def __init__(self, heads: Heads):
        self.num_key_value_groups = heads.heads // heads.kv_heads


def inputs(heads: Heads, rows: int, positions: int, dtype, device, seed: int = 0):
    """A decode step's query [rows, H, 1, D], key and value [rows, G, positions, D], and its boolean
    mask [rows, 1, 1, positions] hiding 0-PADDING leading positions a row (left padding)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, 1, heads.heads, heads.head_dim, generator=gen).transpose(1, 2)  # as the layers make it
    key = torch.randn(rows, heads.kv_heads, positions, heads.head_dim, generator=gen)
    value = torch.randn(rows, heads.kv_heads, positions, heads.head_dim, generator=gen)
    pad = torch.randint(0, PADDING + 1, (rows,), generator=gen)
    mask = (torch.arange(positions)[None, :] >= pad[:, None])[:, None, None, :]
    return (query.to(device=device, dtype=dtype), key.to(device=device, dtype=dtype), value.to(device=device, dtype=dtype),
            mask.to(device))  # fmt: skip


def _sync(device) -> None:
    from peak import _sync as sync  # bench/peak.py's (it imports this module only inside its functions)

    sync(device)


def _add_ratios(ways: dict) -> None:
    """Each way's ``vs_copied``: ``copied``'s seconds over its own (above 1: faster)."""
    base = ways.get("copied", {}).get("seconds")
    for figures in ways.values():
        figures["vs_copied"] = base / figures["seconds"] if base else None


def time_call(fn, device, *, target: float = 0.02, samples: int = 5) -> float:
    """Median seconds of one ``fn()``: a warm-up, then ``samples`` samples of as many calls as take
    about ``target`` seconds."""
    fn()
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    inner = max(1, round(target / max(time.perf_counter() - start, 1e-6)))
    taken = []
    for _ in range(samples):
        _sync(device)
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        taken.append((time.perf_counter() - start) / inner)
    return statistics.median(taken)


def measure(heads: Heads, rows_list, positions_list, dtype_name: str, device, *, ways=WAYS, deadline: float | None = None) -> list[dict]:
    """Every (rows, positions) shape, every way: seconds a call, the step's attention over every layer,
    the ratio to ``copied``, the largest difference from ``copied``'s output. Shapes that would start
    past ``deadline`` (time.monotonic) are left out."""
    import torch

    dtype = getattr(torch, dtype_name)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    module = _Module(heads)
    out = []
    for rows in rows_list:
        for positions in positions_list:
            if deadline is not None and time.monotonic() > deadline:
                return out
            query, key, value, mask = inputs(heads, rows, positions, dtype, device)
            with torch.no_grad():
                reference = _forward("copied")(module, query, key, value, mask)[0]
                row = {"model": heads.name, "heads": heads.heads, "kv_heads": heads.kv_heads, "head_dim": heads.head_dim, "layers": heads.layers,
                       "rows": rows, "positions": positions, "dtype": dtype_name, "ways": {}}  # fmt: skip
                for way in ways:
                    fn = _forward(way)
                    got = fn(module, query, key, value, mask)[0]
                    diff = float((got.float() - reference.float()).abs().max())
                    if diff > tolerance:
                        raise AssertionError(f"{way} differs from copied by {diff:.2e} at {rows} x {positions} ({dtype_name})")
                    seconds = time_call(lambda fn=fn: fn(module, query, key, value, mask), device)
                    row["ways"][way] = {"seconds": seconds, "step_seconds": seconds * heads.layers, "max_diff": diff}
                _add_ratios(row["ways"])
            out.append(row)
            del query, key, value, mask, reference
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return out


def median_of_rounds(rounds: list[list[dict]]) -> list[dict]:
    """One row a shape from several rounds of :func:`measure` (the shapes every round measured): each
    way's median seconds over the rounds, its ratio to ``copied``'s median, every round's seconds kept."""
    out = []
    for row in rounds[0]:
        same = [r for rows in rounds for r in rows if (r["model"], r["rows"], r["positions"]) == (row["model"], row["rows"], row["positions"])]
        if len(same) < len(rounds):
            continue
        merged = {**row, "ways": {}}
        for way in row["ways"]:
            seconds = [r["ways"][way]["seconds"] for r in same]
            median = statistics.median(seconds)
            merged["ways"][way] = {"seconds": median, "step_seconds": median * row["layers"], "rounds": seconds,
                                   "max_diff": max(r["ways"][way]["max_diff"] for r in same)}  # fmt: skip
        _add_ratios(merged["ways"])
        out.append(merged)
    return out


def table(data: dict) -> str:
    """The saved run's table: one line a shape, each way's milliseconds a step (every layer) and its
    ratio to ``copied``."""
    ways = [w for w in WAYS if any(w in r["ways"] for r in data["rows"])]
    head = "| model (query / key-value heads) | dtype | rollouts x positions | " + " | ".join(f"{w}: ms a step | vs copied" for w in ways) + " |"
    lines = [head, "|" + "---|" * 3 + "---:|---:|" * len(ways)]
    for r in data["rows"]:
        cells = []
        for w in ways:
            f = r["ways"].get(w)
            cells += [f"{1e3 * f['step_seconds']:.3g}", f"{f['vs_copied']:.2f}x"] if f else ["-", "-"]
        lines.append(f"| {r['model']} ({r['heads']} / {r['kv_heads']}) | {r['dtype']} | {r['rows']} x {r['positions']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--gpu", action="store_true", help="CUDA, bfloat16: SmolLM2-135M's and Qwen2.5-0.5B's heads, 128 and 512 rollouts")
    mode.add_argument("--tiny", action="store_true", help="small shapes on the CPU, seconds")
    mode.add_argument("--table", type=Path, metavar="FILE", help="print a saved run's table and exit")
    parser.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], help="rollouts a call (comma-separated)")
    parser.add_argument("--positions", type=lambda s: [int(x) for x in s.split(",")],
                        help="cached positions (comma-separated; default 40-token prompts + 64 and 256 generated, GPU + 64 and 512)")
    parser.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every shape (the ways' orders rotating); medians reported")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return {}
    import torch

    from peak import machine

    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("attention: --gpu: torch sees no GPU (torch.cuda.is_available() is false); --tiny runs the code on this CPU")
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.gpu else "cpu")
    if args.gpu:
        models, dtype, rows, positions = [SMOLLM2_135M, QWEN25_05B], "bfloat16", [128, 512], [40 + 64, 40 + 512]
    elif args.tiny:
        models, dtype, rows, positions = [TINY], "float32", [4, 8], [12, 20]
    else:
        models, dtype, rows, positions = [SMOLLM2_135M], "float32", [64, 128], [40 + 64, 40 + 256]
    rows, positions = args.rows or rows, args.positions or positions
    started = time.time()
    data = {"benchmark": "attention", "command": "python bench/attention.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "machine": machine(device, args.threads),
            "models": [asdict(m) for m in models], "rows": []}  # fmt: skip
    for heads in models:
        rounds = [measure(heads, rows, positions, dtype, device, ways=WAYS[k % 3:] + WAYS[:k % 3]) for k in range(args.rounds)]
        data["rows"] += median_of_rounds(rounds)
    data["seconds"] = round(time.time() - started, 1)
    print(table(data))
    for r in data["rows"]:
        for way in WAYS[1:]:
            if way in r["ways"]:
                print(f"{way} / copied at {r['model']} {r['rows']} x {r['positions']} ({r['dtype']}): {r['ways'][way]['vs_copied']:.2f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return data


if __name__ == "__main__":
    main()
