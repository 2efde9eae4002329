"""Benchmark: rollout throughput of the vLLM engine vs the transformers engine on the embedded model.

    python bench/engines.py [--prompts 16] [--n 8] [--max-new-tokens 64] [--repeats 3] [--compile]

Both engines sample the same B x n rollouts (arithmetic prompts through the chat template, as the
trainer builds them; temperature 1, top_p 1) from SmolLM2-135M-Instruct in float32, in one process,
alternating engine by engine for --repeats rounds after one warm-up call each, so background load
hits both alike. Both run on --threads torch threads (default 0: torch's default, one per core; on
a machine shared with other jobs pass 1, since a second OpenMP thread that waits for a scheduler
time slice in every parallel region slows both engines several-fold and makes the timings noise).
Throughput is generated tokens (EOS included, padding not) per second of
``generate``; the medians are reported. The transformers engine generates in batches of
--batch-size sequences (default 128, i.e. all 128 rollouts at once). The weight sync into vLLM is
timed too. The last line printed is the speedup (tokens/s ratio).

    python bench/engines.py --vllm-threads 1,2 [--prompts 8 --n 16 --max-new-tokens 16]

times the vLLM engine alone at each torch thread count (``torch.set_num_threads`` before each
``generate``, the counts alternating round by round, the order too), for the question whether
sampling uses both cores of a 2-core machine (vLLM's CPU build logs "Reducing Torch threads from 2
to 1 for serving" while it starts; podsrl puts the process's thread count back afterwards). Last
line: ``vllm sampling tokens/s, T2 threads / T1 threads: R`` (median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def arithmetic_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        messages = [{"role": "user", "content": f"What is {a} + {b}? Give only the final number."}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def timed(engine, prompts, sampling) -> tuple[float, int]:
    start = time.perf_counter()
    ro = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - start
    return seconds, sum(len(c) for c in ro.completion_ids)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="transformers engine: sequences per generate call")
    parser.add_argument("--compile", action="store_true", help="vLLM with torch.compile (slow start) instead of eager")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both engines (0: torch's default)")
    parser.add_argument("--vllm-threads", default=None, help="e.g. 1,2: time vLLM alone at these torch thread counts")
    args = parser.parse_args(argv)
    if args.vllm_threads:
        return vllm_threads(args, [int(t) for t in args.vllm_threads.split(",")])

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from podsrl.engines import Sampling
    from podsrl.engines.hf import TransformersEngine
    from podsrl.engines.vllm import VLLMEngine, VLLMOptions
    from podsrl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = arithmetic_prompts(tokenizer, args.prompts)
    hf = TransformersEngine(model, tokenizer, batch_size=args.batch_size)
    start = time.perf_counter()
    options = VLLMOptions(
        dtype=torch.float32,
        max_model_len=max(len(p) for p in prompts) + args.max_new_tokens + 16,
        kv_cache_gib=1.0,
        enforce_eager=not args.compile,
    )
    vllm = VLLMEngine(path, tokenizer, options, eos_token_ids=hf._eos_ids())
    mode = "compiled" if args.compile else "eager"
    print(f"vLLM {vllm.version} ready in {time.perf_counter() - start:.1f} s ({mode})", flush=True)
    print(
        f"{args.prompts} prompts x n={args.n}, max_new_tokens={args.max_new_tokens}, "
        f"temperature={args.temperature}, torch threads={torch.get_num_threads()}",
        flush=True,
    )
    engines = {"transformers": hf, "vllm": vllm}
    warm = Sampling(n=2, temperature=args.temperature, top_p=1.0, max_new_tokens=8, seed=0)
    for engine in engines.values():
        engine.generate(prompts[:2], warm)
    results: dict[str, list[float]] = {name: [] for name in engines}
    syncs = []
    for rep in range(args.repeats):
        sampling = Sampling(
            n=args.n, temperature=args.temperature, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=rep
        )
        for name, engine in engines.items():
            seconds, tokens = timed(engine, prompts, sampling)
            results[name].append(tokens / seconds)
            rate = tokens / seconds
            print(f"  round {rep + 1} {name:>12}: {tokens:5d} tokens in {seconds:6.1f} s = {rate:6.1f} tok/s", flush=True)
        vllm.sync_weights(model)
        syncs.append(vllm.last_sync_seconds)
    median = {name: statistics.median(v) for name, v in results.items()}
    for name, value in median.items():
        print(f"{name:>12}: median {value:.1f} tok/s", flush=True)
    print(f"vLLM weight sync: median {statistics.median(syncs):.2f} s", flush=True)
    vllm.close()
    print(f"vllm speedup vs transformers: {median['vllm'] / median['transformers']:.1f}x", flush=True)


def vllm_threads(args, counts: list[int]) -> None:
    """vLLM's sampling throughput at each torch thread count in ``counts``, alternating."""
    import torch

    from podsrl.engines import Sampling
    from podsrl.engines.vllm import VLLMEngine, VLLMOptions
    from podsrl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    prompts = arithmetic_prompts(tokenizer, args.prompts)
    options = VLLMOptions(dtype=torch.float32, max_model_len=max(len(p) for p in prompts) + args.max_new_tokens + 16,
                          kv_cache_gib=1.0, enforce_eager=not args.compile)  # fmt: skip
    vllm = VLLMEngine(path, tokenizer, options, eos_token_ids=[tokenizer.eos_token_id])
    print(f"vLLM {vllm.version}; {args.prompts} prompts x n={args.n}, max_new_tokens={args.max_new_tokens}; "
          f"torch threads after start {torch.get_num_threads()}", flush=True)  # fmt: skip
    vllm.generate(prompts[:2], Sampling(n=2, temperature=args.temperature, top_p=1.0, max_new_tokens=8, seed=0))
    rates: dict[int, list[float]] = {t: [] for t in counts}
    for rep in range(args.repeats):
        sampling = Sampling(n=args.n, temperature=args.temperature, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=rep)
        for t in counts if rep % 2 == 0 else counts[::-1]:
            torch.set_num_threads(t)
            seconds, tokens = timed(vllm, prompts, sampling)
            rates[t].append(tokens / seconds)
            print(f"  round {rep + 1}, {t} thread(s): {tokens:5d} tokens in {seconds:6.2f} s = {tokens / seconds:6.1f} tok/s", flush=True)
    vllm.close()
    for t, values in rates.items():
        print(f"{t} thread(s): median {statistics.median(values):.1f} tok/s")
    low, high = counts[0], counts[-1]
    ratio = statistics.median(a / b for a, b in zip(rates[high], rates[low]))
    print(f"vllm sampling tokens/s, {high} threads / {low} threads: {ratio:.2f}")


if __name__ == "__main__":
    main()
