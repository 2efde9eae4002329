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
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    main()
