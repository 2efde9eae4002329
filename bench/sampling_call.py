"""Benchmark: what one vLLM sampling call costs, fixed part and per rollout, under vLLM's settings.

    python bench/sampling_call.py                       # float32 and bfloat16 weights, eager; 2 rounds
    python bench/sampling_call.py --arms float32-eager,float32-compiled --rounds 3
    python bench/sampling_call.py --arms float32-eager,fast-eager  # rollout.sampler_dtype = "fast" as it resolves here
    python bench/sampling_call.py --quick               # one round, fewer sizes: checks it runs

Each arm is one setting of podsrl's vLLM engine on the embedded SmolLM2-135M-Instruct: the weights'
dtype (``rollout.sampler_dtype``) and eager or torch.compile'd execution (``rollout.enforce_eager``).
An arm runs in a fresh process (vLLM starts once per process), arms one after another for --rounds
rounds, the order alternating, so a change in the machine's load hits every arm. In each process the
engine samples k prompts x n rollouts of the built-in arithmetic prompts (temperature 1, up to
--max-new-tokens tokens; the training default is 16) for k x n from 1 to 256 rollouts, --repeats
calls at each size after one warm-up call; each size's time is the median call. The fixed cost is
the time of a call of one rollout (a prefill and 16 decode steps at the default length); the cost a
rollout is the slope of the least-squares line through the calls of 16 to 128 rollouts (a line
through all sizes is not one: below 16 the batch does not fill the vector units, at 256 the
attention over the batch grows, and its intercept swings between 0.08 and 0.2 s from run to run).

Where the time goes (py-spy on a call of 1 rollout, float32, eager): 68% in oneDNN's matrix
products and 10% in the output projection over the 49k-token vocabulary: the call is 17 forward
passes (a prefill and 16 decode steps) that each stream every weight of the model through the
CPU, about 18 ms a pass; vLLM's scheduling and sampling are about 5%. That is the fixed cost.

Last lines: each arm's median fixed cost, cost a rollout and time of 128 rollouts, then
``fixed cost, <arm> / <first arm>: R; call of 128 rollouts: R2`` for every other arm (medians of
the per-round ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _isolated import run_isolated  # noqa: E402  (bench/_isolated.py)

SIZES = ((1, 1), (1, 4), (1, 16), (2, 16), (4, 16), (8, 16), (16, 16))  # (prompts, n)
QUICK_SIZES = ((1, 1), (1, 16), (8, 16))
DTYPES = ("float32", "bfloat16", "float16", "fast")  # rollout.sampler_dtype's values other than "auto" (fast: as it resolves here)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``seconds = intercept + per_rollout * rollouts`` over the calls of 16 to 128 rollouts."""
    xs, ys = zip(*[(x, y) for x, y in points if 16 <= x <= 128])
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def worker(spec: dict) -> dict:
    """One arm (``spec["arm"]``) in this process: the seconds of a call at each size."""
    import torch

    from bench.engines import arithmetic_prompts
    from podsrl.engines import Sampling
    from podsrl.engines.dtype import resolve_sampler_dtype
    from podsrl.engines.vllm import VLLMEngine, VLLMOptions
    from podsrl.models import load_tokenizer, resolve_model_path

    arm, max_new_tokens = spec["arm"], spec["max_new_tokens"]
    dtype, mode = arm.split("-")
    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    prompts = arithmetic_prompts(tokenizer, 16)
    options = VLLMOptions(dtype=resolve_sampler_dtype(dtype, torch.float32).dtype, max_model_len=max(map(len, prompts)) + max_new_tokens + 16,
                          kv_cache_gib=1.0, enforce_eager=mode == "eager")  # fmt: skip
    engine = VLLMEngine(path, tokenizer, options, eos_token_ids=[tokenizer.eos_token_id])

    def call(k: int, n: int, seed: int) -> float:
        start = time.perf_counter()
        engine.generate(prompts[:k], Sampling(n=n, temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed))
        return time.perf_counter() - start

    call(8, 4, seed=99)
    seconds = {}
    for k, n in QUICK_SIZES if spec["quick"] else SIZES:
        seconds[k * n] = statistics.median(call(k, n, seed=r) for r in range(spec["repeats"]))
    engine.close()
    return {"arm": arm, "seconds": seconds}


def record(results: dict[str, list[dict]], r: int, arm: str, seconds: dict[int, float]) -> None:
    """Keep one worker's calls and print its line."""
    _, per = fit(sorted(seconds.items()))
    results[arm].append({"seconds": seconds, "fixed": seconds[1], "per": per})
    sizes = "  ".join(f"{x}: {y:.3f}" for x, y in sorted(seconds.items()))
    print(f"round {r + 1} {arm:>18}: fixed {seconds[1]:.3f} s, {per * 1000:.1f} ms a rollout   (rollouts: s  {sizes})", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="float32-eager,bfloat16-eager", help="DTYPE-MODE,...; MODE: eager | compiled")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="calls at each size (median)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.worker:
        Path(args.result).write_text(json.dumps(worker(json.loads(rest[0]))))
        return
    arms = args.arms.split(",")
    bad = [a for a in arms if a.count("-") != 1 or a.split("-")[0] not in DTYPES or a.split("-")[1] not in ("eager", "compiled")]
    if bad:
        parser.error(f"--arms: {bad} are not DTYPE-MODE with DTYPE one of {DTYPES} and MODE eager or compiled (e.g. bfloat16-compiled)")
    spec = {"repeats": args.repeats, "max_new_tokens": args.max_new_tokens, "quick": args.quick}
    rounds = 1 if args.quick else args.rounds
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="sampling-call-") as logs:
        for r in range(rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                out = run_isolated(__file__, ["--worker"], {**spec, "arm": arm}, log=Path(logs) / f"{arm}-{r}.log", prefix="sampling-call-")
                if "error" in out:
                    sys.exit(f"worker {arm} (round {r + 1}) failed: {out['error']}")
                record(results, r, arm, {int(k): v for k, v in out["seconds"].items()})
    for arm, rows in results.items():
        print(f"{arm:>18}: fixed {statistics.median(r['fixed'] for r in rows):.3f} s, {statistics.median(r['per'] for r in rows) * 1000:.1f} ms a rollout, "
              f"128 rollouts {statistics.median(r['seconds'][128] for r in rows):.3f} s", flush=True)  # fmt: skip
    base = arms[0]
    for arm in arms[1:]:
        pairs = list(zip(results[arm], results[base]))
        fixed = statistics.median(a["fixed"] / b["fixed"] for a, b in pairs)
        big = statistics.median(a["seconds"][128] / b["seconds"][128] for a, b in pairs)
        print(f"fixed cost, {arm} / {base}: {fixed:.2f}; call of 128 rollouts: {big:.2f}", flush=True)


if __name__ == "__main__":
    main()
