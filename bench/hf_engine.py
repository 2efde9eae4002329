"""Benchmark: the transformers engine's token draw (podsrl/engines/draw.py, inverse transform) and its
shared prefill (podsrl/engines/hf.py) against transformers' ``torch.multinomial`` and a prefill per
row, the engine before them, side by side in one run (issue 66).

    python bench/hf_engine.py --threads 2       # the embedded model, 128 rollouts x 64 tokens
    python bench/hf_engine.py --quick           # a tiny random model, seconds: checks the script runs
    python bench/hf_engine.py --threads 2 --rollouts 64 --length 256 --repeats 1 --ways today,copied-heads
                                                # long completions, two of part 2's ways
    python bench/hf_engine.py --threads 2 --length 256 --ends --ways today,generate
                                                # completions of varied lengths: finished rows leaving

1. **The draw alone**: milliseconds to draw one token a row from [R, V] scores (the embedded model's
   vocabulary, V = 49,152) for R = 8, 64, 128, 256 rows: softmax then ``torch.multinomial`` (what
   ``generate`` does under sampling) against :func:`podsrl.engines.draw.draw` (which includes its
   softmax); medians of --repeats x 5 draws, alternating.
2. **A sampling call**: the transformers engine (``rollout.engine = "transformers"``, the CPU's
   sampler without vLLM) on the embedded SmolLM2-135M-Instruct in float32, one call of --rollouts
   rollouts (16 random prompts of 36 to 44 tokens x n, left-padded as a real call's: bench/peak.py's
   ``prompt_lengths``) of exactly --length tokens (EOS suppressed in place: bench/_fixed_length.py),
   or with --ends of varied lengths up to --length (bench/_fixed_length.py's ``EndAt``: each row's
   length set by its first token, so every way makes the same tokens under a round's seed),
   temperature 1, seven ways: ``today`` (podsrl's draw, a prompt's rows sharing one prefill, the
   KV cache's shared heads read in place: podsrl/engines/attention.py; the cache grown in chunks:
   podsrl/engines/decode.py; the linear layers on oneDNN: podsrl/engines/linear.py; the engine's
   own decode loop, finished rows leaving the batch: podsrl/engines/loop.py), and today's
   with one of them undone: ``generate`` (transformers' ``generate``, every row to the call's last
   step), ``copied heads`` (transformers' ``sdpa`` as it is, which copies every
   key/value head to its query heads when a mask is passed), ``multinomial`` (transformers' own
   sampling, ``do_sample=True``), ``concatenated cache`` (transformers' ``DynamicCache``),
   ``mkl linear`` (the layers' own ``F.linear``); and ``before``, all of them undone and a prefill
   per row: the engine before the changes. One
   warm-up call, then --repeats rounds of the ways, their order rotating from round to round.

Last lines: the ratio of the medians, ``multinomial / draw`` in milliseconds for part 1, and today's
tokens a second over each other way's for part 2 (each change's share; ``today / before``: all of
them). Runs before commit 9a86a53 (results/hf-engine/cpu-amd-epyc-2026-11-29.json) had three ways (no
``copied heads``), 16 prompts of 40 tokens (no padding, so transformers copied no heads) and
``min_new_tokens`` for the fixed length; runs before decode.py (the rest of 2026-11-29's) four;
the runs of commit 4118664 (2026-11-30) timed a way since dropped, ``mkl output layer``: that commit's
engine computed the output layer with oneDNN, and ``F.linear`` was as fast in the whole call; runs
before linear.py five (they record no labels: ``doc_table`` infers them); runs before loop.py six
(no ``generate``; their ``today`` decoded with ``generate``). --out FILE writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # _tiny_model, when imported from a test

PROMPTS, PROMPT_LEN = 16, 40


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def time_draws(vocab: int, rows_list: list[int], repeats: int) -> list[dict]:
    from podsrl.engines.draw import draw

    out = []
    for rows in rows_list:
        scores = torch.randn(rows, vocab)
        multinomial = lambda: torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)  # noqa: E731
        ours = lambda: draw(scores)  # noqa: E731
        multinomial(), ours()  # warm-up
        times = {"multinomial": [], "draw": []}
        for r in range(repeats):
            for name, fn in (("multinomial", multinomial), ("draw", ours))[:: 1 if r % 2 == 0 else -1]:
                times[name].append(median_ms(fn, 5))
        row = {"rows": rows, "vocab": vocab, **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}
        row["ratio"] = row["multinomial_ms"] / row["draw_ms"]
        out.append(row)
        print(f"  draw alone, {rows:>3} x {vocab}: multinomial {row['multinomial_ms']:7.1f} ms, draw {row['draw_ms']:6.1f} ms: {row['ratio']:.2f}x")
    return out


def load(quick: bool):
    """(model, tokenizer): the embedded model in float32, or a tiny random Llama with its tokenizer."""
    from podsrl.models import load_tokenizer, resolve_model_path

    from transformers import AutoModelForCausalLM

    if quick:
        import tempfile

        from _tiny_model import tiny_llama

        path = tiny_llama(Path(tempfile.mkdtemp(prefix="podsrl-hf-engine-")), hidden=32, intermediate=64, heads=4, kv_heads=2)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), load_tokenizer(str(path))

    path = resolve_model_path("smollm2-135m-instruct")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), load_tokenizer(path)


WAYS = ("today", "generate", "copied heads", "multinomial", "concatenated cache", "mkl linear", "before")
PATCHED = ("generate_kwargs", "shared_kv_heads", "chunked_cache", "onednn_linears")  # podsrl.engines.hf's names the ways replace


def _ways(hf) -> dict[str, dict]:
    """Each way's replacements: podsrl.engines.hf's names (PATCHED) and, under "_shared_prefill",
    TransformersEngine's method; today's replaces nothing."""
    ours = hf.generate_kwargs

    def transformers_own(sampling, recorder=None):  # generate's own sampling: torch.multinomial
        if sampling.temperature == 0:
            return ours(sampling)
        return dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)

    unchanged = lambda model: contextlib.nullcontext()  # noqa: E731
    heads = {"shared_kv_heads": unchanged}  # transformers' sdpa as it is: the KV cache copied per query head
    cache = {"chunked_cache": lambda model, cache=None: cache}  # transformers' DynamicCache: a torch.cat a step
    draw = {"generate_kwargs": transformers_own}
    linear = {"onednn_linears": lambda model, rows: contextlib.nullcontext()}  # the layers' own F.linear (MKL)
    generate = {"_loop": lambda model, cache: False}  # transformers' generate: every row to the call's end
    return {"today": {}, "generate": generate, "copied heads": heads, "multinomial": draw, "concatenated cache": cache, "mkl linear": linear,
            "before": {**heads, **draw, **cache, **linear, **generate, "_shared_prefill": lambda self, *a: None}}  # fmt: skip


def time_calls(model, tokenizer, *, rollouts: int, length: int, repeats: int, ways=WAYS, ends: bool = False) -> dict:
    import podsrl.engines.hf as hf
    from podsrl.engines import Sampling, loop

    from _fixed_length import EndAt, SuppressEos, ends_table
    from peak import prompt_lengths

    variants = _ways(hf)
    saved = {name: getattr(hf, name) for name in PATCHED}
    saved_prefill, saved_loop = hf.TransformersEngine._shared_prefill, loop.applies

    def patch(changes: dict) -> None:
        for name in PATCHED:
            setattr(hf, name, changes.get(name, saved[name]))
        hf.TransformersEngine._shared_prefill = changes.get("_shared_prefill", saved_prefill)
        loop.applies = changes.get("_loop", saved_loop)

    engine = hf.TransformersEngine(model, tokenizer, batch_size=rollouts)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab - 1, (n,), generator=gen).tolist() for n in prompt_lengths(PROMPT_LEN, PROMPTS)]
    k = PROMPTS if rollouts % PROMPTS == 0 else 1
    eos = sorted(engine._eos_ids())
    width = max(map(len, prompts[:k]))
    engine.logits_processors = [EndAt(eos, width, ends_table(vocab, length)) if ends else SuppressEos(eos)]  # both decode paths

    def call(name: str, seed: int) -> tuple[float, int]:
        patch(variants[name])
        try:
            start = time.perf_counter()
            out = engine.generate(prompts[:k], Sampling(n=rollouts // k, temperature=1.0, top_p=1.0, max_new_tokens=length, seed=seed))
            return time.perf_counter() - start, sum(map(len, out.completion_ids))
        finally:
            patch({})

    seconds, _ = call("today", 0)
    print(f"  warm-up today       {rollouts} x {length}: {seconds:6.2f} s")
    names = [name for name in variants if name in ways]
    rates: dict[str, list[float]] = {name: [] for name in names}
    tokens_made: dict[str, list[int]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            seconds, tokens = call(name, 1 + r)
            rates[name].append(tokens / seconds)
            tokens_made[name].append(tokens)
            print(f"  round {r + 1} {name:<11} {rollouts} x {length}: {tokens} tokens in {seconds:6.2f} s, {tokens / seconds:6.1f} tokens/s")
    medians = {n: statistics.median(v) for n, v in rates.items()}
    ratio = lambda way: medians["today"] / medians[way] if way in medians else None  # noqa: E731
    return {"rollouts": rollouts, "length": length, "ends": "varied" if ends else "fixed", "prompts": k,
            "prompt_lengths": [len(p) for p in prompts[:k]], "tokens_per_s": medians, "rounds": rates, "tokens": tokens_made,
            "loop_ratio": ratio("generate"), "draw_ratio": ratio("multinomial"), "heads_ratio": ratio("copied heads"),
            "cache_ratio": ratio("concatenated cache"), "linear_ratio": ratio("mkl linear"), "ratio": ratio("before"),
            "labels": {name: LABELS[name] for name in names}}  # fmt: skip


LABELS_BEFORE_HEADS = {  # runs without "copied heads" (before commit 9a86a53)
    "today": "today: podsrl's draw, a prompt's rows share one prefill",
    "multinomial": "transformers' `torch.multinomial`, the prefill shared",
    "before": "before: transformers' `torch.multinomial`, a prefill per row",
}
LABELS_BEFORE_DECODE = {  # runs without "concatenated cache" and "mkl output layer" (before podsrl/engines/decode.py)
    "today": "today: podsrl's draw, a prompt's rows share one prefill, the KV heads read in place",
    "copied heads": "the KV cache copied per query head (transformers' `sdpa` with a mask)",
    "multinomial": "transformers' `torch.multinomial`",
    "before": "before: `torch.multinomial`, a prefill per row, the KV cache copied",
}
LABELS_ONEDNN = {  # the runs of commit 4118664, whose engine also computed the output layer with oneDNN (dropped after them)
    "today": "today at 4118664: podsrl's draw, a prompt's rows share one prefill, the KV heads read in place, the cache grown in chunks, the output layer on oneDNN",
    "concatenated cache": "transformers' `DynamicCache` (a `torch.cat` of every layer's cache a step)",
    "mkl output layer": "the output layer with `F.linear` (MKL), as before 4118664 and since",
    "before": "before: `torch.multinomial`, a prefill per row, the KV cache copied and concatenated, the output layer with `F.linear`",
}
LABELS_BEFORE_LINEAR = {  # runs after podsrl/engines/decode.py, before podsrl/engines/linear.py (they record no labels)
    "today": "today: podsrl's draw, a prompt's rows share one prefill, the KV heads read in place, the cache grown in chunks",
    "copied heads": "the KV cache copied per query head (transformers' `sdpa` with a mask)",
    "multinomial": "transformers' `torch.multinomial`",
    "concatenated cache": "transformers' `DynamicCache` (a `torch.cat` of every layer's cache a step)",
    "before": "before: `torch.multinomial`, a prefill per row, the KV cache copied and concatenated",
}
LABELS_BEFORE_LOOP = {  # runs of linear.py before loop.py (they record their labels)
    **LABELS_BEFORE_LINEAR,
    "today": LABELS_BEFORE_LINEAR["today"] + ", the linear layers on oneDNN",
    "mkl linear": "the linear layers' own `F.linear` (MKL)",
    "before": LABELS_BEFORE_LINEAR["before"] + ", the linear layers' `F.linear`",
}
LABELS = {  # today's; a run records the labels of its ways (call["labels"], in the order it timed them)
    "today": LABELS_BEFORE_LOOP["today"] + ", finished rows leaving the batch",
    "generate": "transformers' `generate` (every row to the call's last step)",
    **{k: v for k, v in LABELS_BEFORE_LOOP.items() if k not in ("today", "before")},
    "before": LABELS_BEFORE_LOOP["before"] + ", `generate`",
}


def doc_table(record: dict) -> str:
    """docs/engines.md's tables of a saved run (tests/test_draw.py checks the page against every
    committed one)."""
    call = record["call"]
    lengths = f" of {min(call['prompt_lengths'])}-{max(call['prompt_lengths'])} tokens" if "prompt_lengths" in call else ""
    size, ends = f"{call['length']}", ""
    if call.get("ends") == "varied":  # bench/_fixed_length.py's EndAt: every way the same tokens
        means = [made / call["rollouts"] for made in call["tokens"]["today"]]  # a round's mean length (each its seed)
        size, ends = f"up to {call['length']}", f"; a round's mean completion {min(means):.1f}-{max(means):.1f} tokens"
    lines = [
        f"{record['cpu']}, {record['threads']} threads, torch {record['torch']}; {record['date']}; `{record['command']}`",
        "",
        "| draw: rows x vocabulary | softmax + `torch.multinomial`: ms | podsrl's draw: ms | ratio |",
        "|---|---:|---:|---:|",
        *(f"| {r['rows']} x {r['vocab']} | {r['multinomial_ms']:.1f} | {r['draw_ms']:.1f} | {r['ratio']:.1f}x |" for r in record["draws"]),
        "",
        f"| transformers engine, one call of {call['rollouts']} x {size} tokens ({call['prompts']} prompts{lengths}{ends}) | tokens/s, median of {len(call['rounds']['today'])} | today / it |",
        "|---|---:|---:|",
    ]
    rates = call["tokens_per_s"]
    labels = call.get("labels") or (  # runs before podsrl/engines/linear.py recorded none: by the ways they timed
        LABELS_ONEDNN if "mkl output layer" in rates else LABELS_BEFORE_LINEAR if "concatenated cache" in rates
        else LABELS_BEFORE_DECODE if "copied heads" in rates else LABELS_BEFORE_HEADS)  # fmt: skip
    for name, label in labels.items():
        if name not in call["tokens_per_s"]:  # --ways left it out
            continue
        rate = call["tokens_per_s"][name]
        ratio = "-" if name == "today" else f"{call['tokens_per_s']['today'] / rate:.2f}x"
        lines.append(f"| {label} | {rate:.0f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny random model: checks the script runs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    parser.add_argument("--rollouts", type=int, default=128, help="rollouts of the sampling call (default 128: a PODS(16, 4) step of 8 prompts)")
    parser.add_argument("--length", type=int, default=64, help="tokens each rollout generates")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each part")
    parser.add_argument("--ways", default=",".join(w.replace(" ", "-") for w in WAYS),
                        help="the sampling call's ways to time, comma-separated, 'today' first (default all: " + ", ".join(w.replace(" ", "-") for w in WAYS) + ")")
    parser.add_argument("--ends", action="store_true", help="completions of varied lengths (bench/_fixed_length.py's EndAt: about 80 tokens "
                        "on average, a tenth cut at --length 256), the same in every way, instead of --length each")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument("--table", type=Path, help="measure nothing: print docs/engines.md's tables of this JSON file")
    args = parser.parse_args(argv)
    if args.table:
        print(doc_table(json.loads(args.table.read_text())), end="")
        return 0
    if args.quick:
        args.rollouts, args.length, args.repeats = min(args.rollouts, 32), min(args.length, 16 if args.ends else 4), min(args.repeats, 2)  # 16 prompts x 2
    torch.set_num_threads(args.threads)
    from podsrl.engines.dtype import cpu_model

    model, tokenizer = load(args.quick)
    vocab = model.config.vocab_size
    print(f"hf_engine: {cpu_model()}, {args.threads} thread(s), torch {torch.__version__}, vocabulary {vocab}")
    draws = time_draws(vocab, [8, 64, 128, 256] if not args.quick else [8, 16], args.repeats)
    ways = [w.strip().replace("-", " ") for w in args.ways.split(",")]
    if ways[0] != "today" or not set(ways) <= set(WAYS):
        parser.error(f"--ways: 'today' first, then any of {', '.join(w.replace(' ', '-') for w in WAYS[1:])}; got {args.ways!r}")
    calls = time_calls(model, tokenizer, rollouts=args.rollouts, length=args.length, repeats=args.repeats, ways=ways, ends=args.ends)
    command = "python bench/hf_engine.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"command": command.strip(), "cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                  "date": time.strftime("%Y-%m-%d"), "draws": draws, "call": calls}  # fmt: skip
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    for row in draws:
        print(f"multinomial / draw at {row['rows']} rows: {row['ratio']:.2f}x the milliseconds")
    what = f"transformers engine {calls['rollouts']} x {'up to ' if args.ends else ''}{calls['length']}"
    for key, name, why in (("loop_ratio", "generate", "finished rows leaving the batch"),
                           ("draw_ratio", "multinomial", "the draw"), ("heads_ratio", "copied heads", "the KV heads read in place"),
                           ("cache_ratio", "concatenated cache", "the cache grown in chunks"),
                           ("linear_ratio", "mkl linear", "the linear layers on oneDNN"),
                           ("ratio", "before", "all of them and the shared prefill")):  # fmt: skip
        if calls.get(key) is not None:
            print(f"today / {name} ({why}), {what}: {calls[key]:.2f}x tokens per second")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
