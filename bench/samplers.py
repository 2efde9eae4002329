"""Benchmark: rollouts per second of podsrl's samplers side by side, in one process (issue 66).

    python bench/samplers.py            # CPU: transformers, transformers-static, vllm (when installed)
    python bench/samplers.py --gpu      # GPU: transformers vs transformers-static, 128 and 512 rollouts of 64 tokens
    python bench/samplers.py --quick    # a tiny random model, seconds: checks the script runs

The engines (podsrl/engines): ``transformers`` (today's: the policy itself samples, in calls of
--batch-size sequences, dynamic cache, eager), ``transformers-static`` (a sampler of its own in
--sampler-dtype, static cache, as few calls as memory allows on a GPU, compiled decoding there) and
``vllm`` (podsrl's vLLM engine, eager, in the same sampler dtype; only where vLLM is installed and the
model is on disk); on a GPU also ``transformers-static-gqa`` on request (the static engine with its
attention reading the shared key/value heads in place there too, as the engines do on a CPU:
podsrl/engines/attention.py). Each samples the same B x n rollouts (temperature 1, top_p 1, up to
--max-new-tokens tokens) at every size of --sizes (rollouts, as 16 prompts x n when 16 divides it),
one size after the other: a warm-up call per engine (on a GPU one per size and engine, as the static
engine compiles its decoding for each shape there: its seconds are reported; on the CPU at the first
size only), then --repeats rounds, the engines' order alternating, so a change in the machine's load
hits all alike. ``--budget MINUTES``: a call that would start past them is left out and named (on a
GPU the rounds of an engine whose warm-up was left out too), and what was measured is reported.
Reported per size and engine: the median seconds of a call, rollouts per second, generated tokens,
and the ratio of rollouts per second to the transformers engine's.

The model: on the CPU the embedded SmolLM2-135M-Instruct in float32 with the arithmetic prompts of
bench/engines.py; with --gpu (or --random-weights) SmolLM2-135M's architecture with random weights
(the lent GPU machine has no embedded model and no hub; bench/gpu_check.py does the same), 40-token
random prompts and an EOS that random weights do not sample, so every rollout runs its
--max-new-tokens. --threads (default 1 on the CPU: the machine is shared) sets torch's threads.

Last lines: ``<engine> / transformers at R rollouts: X.XXx rollouts per second`` per other engine
and size (the ratio of the medians). --out FILE also writes the figures as JSON (results/samplers/);
``--table FILE`` prints a saved one's table for docs/engines.md (tests/test_peak.py checks the page).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True)  # fmt: skip  (as bench/gpu_check.py: HuggingFaceTB/SmolLM2-135M's config.json)
TINY = dict(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip  (--quick: the machinery only)
PROMPTS = 16


class StubTokenizer:
    """What the transformers engines ask of a tokenizer, for a model with random weights."""

    def __init__(self, pad: int, eos: int):
        self.pad_token_id, self.eos_token_id = pad, eos

    def batch_decode(self, ids, skip_special_tokens=True):
        return [""] * len(ids)


def build(args):
    """(policy model, tokenizer, prompts, model path or None, description) on the chosen device."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    device = torch.device("cuda" if args.gpu else "cpu")
    if args.quick or args.gpu or args.random_weights:
        arch = TINY if args.quick else SMOLLM2_135M
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**arch)).eval()
        tokenizer = StubTokenizer(pad=0, eos=arch["vocab_size"] - 1)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, arch["vocab_size"] - 1, (40,), generator=gen).tolist() for _ in range(PROMPTS)]
        what = ("a tiny random model" if args.quick else "SmolLM2-135M's architecture, random weights") + ", float32, 40-token prompts"
        return model, tokenizer, prompts, None, what
    from engines import arithmetic_prompts

    from podsrl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().to(device)
    return model, tokenizer, arithmetic_prompts(tokenizer, PROMPTS), path, "SmolLM2-135M-Instruct (embedded), float32, arithmetic prompts"


class ContinuousBatching:
    """Bench only: transformers' continuous batching (``model.generate_batch``, paged attention) on
    the policy itself, the same rollouts as the engines (no log-probs, nothing podsrl ships)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def generate(self, prompt_ids, sampling):
        from transformers import GenerationConfig

        from podsrl.engines.base import Rollouts

        config = GenerationConfig(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                                  max_new_tokens=sampling.max_new_tokens, eos_token_id=self.tokenizer.eos_token_id,
                                  pad_token_id=self.tokenizer.pad_token_id)  # fmt: skip
        repeated = [ids for ids in prompt_ids for _ in range(sampling.n)]
        out = self.model.generate_batch(repeated, generation_config=config, progress_bar=False)
        completions = [list(r.generated_tokens) for r in out.values()]
        return Rollouts(prompt_ids=prompt_ids, completion_ids=completions, texts=[""] * len(completions), truncated=[False] * len(completions))

    def close(self) -> None:
        pass


def compiled_everywhere():
    """Bench only: the static engine with transformers' compiled decoding forced off a GPU too
    (``CompileConfig._compile_all_devices``; inductor's default mode, CUDA graphs being GPU-only)."""
    from podsrl.engines.static import StaticCacheEngine

    class CompiledEverywhere(StaticCacheEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.compiled = True

        def _compile_config(self, CompileConfig):
            config = CompileConfig(mode="default")
            config._compile_all_devices = True
            return config

    return CompiledEverywhere


def shared_heads_everywhere():
    """``transformers-static-gqa``: the static engine with its attention reading the shared key/value
    heads in place on this device too (podsrl.engines.attention's ``DEVICES`` widened for its calls
    alone): on a GPU, where the engines copy them today, the whole sampler both ways side by side."""
    from podsrl.engines import attention
    from podsrl.engines.static import StaticCacheEngine

    class SharedHeadsEverywhere(StaticCacheEngine):
        def _generate_call(self, *args, **kwargs):
            before = attention.DEVICES
            attention.DEVICES = before | {self.device.type}
            try:
                return super()._generate_call(*args, **kwargs)
            finally:
                attention.DEVICES = before

    return SharedHeadsEverywhere


def make_engines(args, model, tokenizer, prompts, path) -> dict:
    import torch

    from podsrl.engines.dtype import resolve_sampler_dtype
    from podsrl.engines.hf import TransformersEngine
    from podsrl.engines.static import StaticCacheEngine

    CompiledEverywhere = compiled_everywhere()
    sampler = resolve_sampler_dtype(args.sampler_dtype, torch.float32)
    print(f"sampler dtype: {sampler.describe()}", flush=True)
    engines = {}
    for name in args.engines.split(","):
        start = time.perf_counter()
        if name == "transformers":
            engines[name] = TransformersEngine(model, tokenizer, batch_size=args.batch_size)
        elif name == "transformers-static":
            engines[name] = StaticCacheEngine(model, tokenizer, sampler_dtype=sampler, batch_size=args.batch_size)
        elif name == "vllm":
            import importlib.util

            if importlib.util.find_spec("vllm") is None or path is None:
                print("vllm: skipped (not installed, or no model on disk)", flush=True)
                continue
            from podsrl.engines.vllm import VLLMEngine, VLLMOptions

            options = VLLMOptions(dtype=sampler.dtype, max_model_len=max(map(len, prompts)) + args.max_new_tokens + 16,
                                  kv_cache_gib=getattr(args, "kv_cache_gib", None) or 2.0)  # bench/peak.py sizes it to its largest call
            engines[name] = VLLMEngine(path, tokenizer, options, eos_token_ids={tokenizer.eos_token_id})
            torch.set_num_threads(args.threads or torch.get_num_threads())  # vLLM's CPU worker may lower it
        elif name == "transformers-cb":
            engines[name] = ContinuousBatching(model, tokenizer)
        elif name == "transformers-static-compiled":
            engines[name] = CompiledEverywhere(model, tokenizer, sampler_dtype=sampler, batch_size=args.batch_size)
        elif name == "transformers-static-gqa":
            engines[name] = shared_heads_everywhere()(model, tokenizer, sampler_dtype=sampler, batch_size=args.batch_size)
        else:
            raise SystemExit(f"--engines: unknown engine {name!r} (transformers, transformers-static, vllm, transformers-cb, transformers-static-compiled, "
                             "transformers-static-gqa)")  # fmt: skip
        print(f"{name}: ready in {time.perf_counter() - start:.1f} s", flush=True)
    return engines


def doc_table(data: dict) -> str:
    """docs/engines.md's table of a saved run (``--table FILE``): a row per size, the transformers
    engine's rollouts a second and each other engine's ratio to it (the medians')."""
    engines = list(dict.fromkeys(r["engine"] for r in data["rows"]))
    rows = {(r["engine"], r["rollouts"]): r for r in data["rows"]}
    lines = ["| rollouts | " + " | ".join(engines) + " |", "|---:|" + "---:|" * len(engines)]
    for size in dict.fromkeys(r["rollouts"] for r in data["rows"]):
        cells = []
        for name in engines:
            r = rows.get((name, size))
            cells.append("-" if r is None else f"{r['rollouts_per_second']:.1f} rollouts/s" if name == "transformers"
                         else f"{r['vs_transformers']:.2f}x" if r["vs_transformers"] else "-")  # fmt: skip
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="on the GPU, SmolLM2-135M's architecture with random weights")
    parser.add_argument("--quick", action="store_true", help="a tiny random model, small sizes: checks the script runs")
    parser.add_argument("--random-weights", action="store_true", help="SmolLM2-135M's architecture with random weights on the CPU too")
    parser.add_argument("--engines", default=None, help="comma-separated (default: all three on the CPU, the two transformers ones on a GPU)")
    parser.add_argument("--sizes", default=None, help="rollouts per call, comma-separated (default 32,128 on the CPU, 128,512 on a GPU)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 32 on the CPU, 64 on a GPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="rollout.generation_batch_size (the transformers engine; the static one on the CPU)")
    parser.add_argument("--sampler-dtype", default="fast", help="rollout.sampler_dtype of the static and vLLM engines")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 on the CPU, torch's on a GPU)")
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    parser.add_argument("--budget", type=float, default=None, help="minutes: a call that would start past them is left out (and named)")
    parser.add_argument("--table", type=Path, default=None, help="measure nothing: print docs/engines.md's table of this JSON file")
    args = parser.parse_args(argv)
    if args.table:
        data = json.loads(args.table.read_text())
        print(doc_table(data))
        return data
    import torch

    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu: torch sees no GPU (torch.cuda.is_available() is false)")
    args.engines = args.engines or ("transformers,transformers-static" if args.gpu or args.quick else "transformers,transformers-static,vllm")
    sizes = [int(s) for s in (args.sizes or ("128,512" if args.gpu else "8,16" if args.quick else "32,128")).split(",")]
    args.max_new_tokens = args.max_new_tokens or (64 if args.gpu else 8 if args.quick else 32)
    args.threads = args.threads if args.threads is not None else (None if args.gpu else 1)
    if args.threads:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.gpu else (lambda: None)
    from podsrl.engines import Sampling

    model, tokenizer, prompts, path, what = build(args)
    engines = make_engines(args, model, tokenizer, prompts, path)
    device = torch.cuda.get_device_name() if args.gpu else "cpu"
    print(f"{what} on {device}; sizes {sizes} rollouts of up to {args.max_new_tokens} tokens; torch threads {torch.get_num_threads()}", flush=True)

    def call(engine, size: int, seed: int) -> tuple[float, int, list[int]]:
        k = PROMPTS if size % PROMPTS == 0 else 1
        sampling = Sampling(n=size // k, temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=seed)
        sync()
        start = time.perf_counter()
        out = engine.generate(prompts[:k], sampling)
        sync()
        return time.perf_counter() - start, sum(map(len, out.completion_ids)), list(getattr(engine, "calls", []))

    result = {"command": "python bench/samplers.py " + " ".join(argv if argv is not None else sys.argv[1:]), "model": what, "device": device,
              "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(), "sampler_dtype": args.sampler_dtype,
              "batch_size": args.batch_size, "rows": [], "left_out": []}  # fmt: skip
    deadline = time.monotonic() + 60 * args.budget if args.budget else float("inf")
    left_out: list[str] = []  # the calls --budget left out
    warm: dict[tuple[str, int], float] = {}
    times: dict[tuple[str, int], list[tuple[float, int]]] = {(name, size): [] for size in sizes for name in engines}
    for size in sizes:  # one size after the other, so that a --budget that runs out leaves whole sizes measured
        for name, engine in engines.items():
            if not (args.gpu or size == sizes[0]):  # a GPU compiles per shape; the CPU only warms its allocator
                continue
            if time.monotonic() > deadline:
                left_out.append(f"warm-up {name} {size}")
                continue
            seconds, _, calls = call(engine, size, seed=100)
            warm[(name, size)] = seconds
            print(f"  warm-up {name:>19} {size:4d} rollouts: {seconds:7.2f} s" + (f" (calls of {calls})" if calls else ""), flush=True)
        for rep in range(args.repeats):
            order = list(engines.items()) if rep % 2 == 0 else list(engines.items())[::-1]
            for name, engine in order:
                if time.monotonic() > deadline or (args.gpu and (name, size) not in warm):  # a GPU call without its compile: not timed
                    left_out.append(f"round {rep + 1} {name} {size}")
                    continue
                seconds, tokens, _ = call(engine, size, seed=rep)
                times[(name, size)].append((seconds, tokens))
                print(f"  round {rep + 1} {name:>19} {size:4d} rollouts: {tokens:6d} tokens in {seconds:7.2f} s = {size / seconds:7.1f} rollouts/s", flush=True)
    print(f"\n| engine | rollouts | warm-up s | median s | rollouts / s | tokens | vs transformers |\n|---|---:|---:|---:|---:|---:|---:|")
    medians = {key: statistics.median(s for s, _ in values) for key, values in times.items() if values}
    for (name, size), seconds in medians.items():
        base = medians.get(("transformers", size))
        ratio = base / seconds if base else None
        tokens = statistics.median(t for _, t in times[(name, size)])
        result["rows"].append({"engine": name, "rollouts": size, "warmup_seconds": warm.get((name, size)), "seconds": seconds,
                               "rollouts_per_second": size / seconds, "tokens": tokens, "vs_transformers": ratio})  # fmt: skip
        warmup = f"{warm[(name, size)]:.2f}" if (name, size) in warm else "-"
        print(f"| {name} | {size} | {warmup} | {seconds:.2f} | {size / seconds:.1f} | {tokens:.0f} | {f'{ratio:.2f}x' if ratio else '-'} |")
    if left_out:
        result["left_out"] = left_out
        print(f"\n--budget {args.budget:g} minutes left out: {', '.join(left_out)}")
    print()
    for row in result["rows"]:
        if row["engine"] != "transformers" and row["vs_transformers"]:
            print(f"{row['engine']} / transformers at {row['rollouts']} rollouts: {row['vs_transformers']:.2f}x rollouts per second")
    for engine in engines.values():
        engine.close()
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
