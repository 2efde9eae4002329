"""Benchmark: the default sampler's gap and each importance correction's weights on long completions.

    python bench/importance_gap.py                                  # 8 GSM8K prompts x 4 samples, 64-512 tokens
    python bench/importance_gap.py --prompts 4 --samples 2 --lengths 32,64
    python bench/importance_gap.py --model DIR --engine transformers  # a bfloat16 copy as the sampler (no vLLM)
    python bench/importance_gap.py --sampler-dtype bfloat16         # vLLM in bfloat16 where "fast" would not choose it
    python bench/importance_gap.py --trainer-mixed-precision          # the trainer's log-probs under bfloat16 autocast (issue 66)

What it measures (issue 59). The policy (``--model``, the embedded SmolLM2-135M-Instruct by default,
float32, as ``podsrl train`` holds it) and its sampler, ``rollout.sampler_dtype = "fast"`` (the
default: bfloat16 on a CPU with native bfloat16; ``--sampler-dtype`` sets it), sample ``--samples`` completions of each of the first
``--prompts`` questions of GSM8K's test split (``--data``, read in place; chat-templated with the
gsm8k task's instruction, as the trainer does) at temperature 1, top_p 1 (the training defaults), up
to the longest of ``--lengths`` tokens. The sampler returns each token's log-prob; the policy's
float32 log-probs of the same tokens are computed as the update computes pi_old (one packed forward,
:func:`podsrl.train.sequences.forward_logprobs`). A completion cut at L tokens is a sample at the
limit L (the tokens before L do not depend on the limit), so one sample at the longest limit gives
every shorter one: each length's figures are over the first L tokens of the same completions.

Per length L, over its N = prompts x samples completions, with d = log pi_trainer - log pi_sampler
per completion token:

- the completions' mean length and the share cut at L (no end-of-sequence within the first L tokens); the per-token gap: mean d, mean |d| and the
  k3 estimate of KL(sampler || trainer), mean exp(d) - 1 - d (``sampler_kl`` in metrics.jsonl);
- the sequence ratio r_i = exp(sum_t d): its 10/50/90% quantiles and the share below 0.1;
- for each correction mode at TRL's default bounds (clip_max 3, no clip_min), through podsrl's own
  :func:`podsrl.core.importance.importance_weights`: the mean sequence weight ``is_weight_mean``,
  the effective sample size at the mode's level ``is_ess`` (over the tokens' own weights for the
  token modes, over the sequences' for the others) and at the other level (``is_ess_sequences`` or
  ``is_ess_tokens``), as a run logs them (over the N completions as one step), and the share of
  completion tokens whose weight is 0.

``--engine vllm`` (the default) samples with podsrl's vLLM engine as ``podsrl train`` does;
``--engine transformers`` samples with the transformers engine from a bfloat16 copy of the policy
and takes that copy's log-probs as the sampler's (a stand-in for machines without vLLM, and the
cheap test's). ``--trainer-mixed-precision`` computes the trainer's log-probs as the update does under
``model.mixed_precision = "bf16"`` (bfloat16 autocast over the float32 weights, the output layer in
float32: podsrl/train/precision.py), so that the gap between a bfloat16 sampler and a bfloat16
update is measured. Prints two Markdown tables (the gap, then the modes) with the command and date, and
as its last line each mode's ESS at the longest limit.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from podsrl.config import RolloutConfig  # noqa: E402
from podsrl.core.importance import MODES, ImportanceSettings, importance_weights  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"  # ../shared/data/gsm8k beside the repository


def prompts(tokenizer, data: Path, k: int) -> list[list[int]]:
    """The first ``k`` questions of GSM8K's test split, as the trainer's prompts."""
    from podsrl.tasks.gsm8k import load
    from podsrl.train.loop import prompt_ids

    task = load(path=str(data))
    return prompt_ids(tokenizer, task, task.eval[:k])


def sample(policy, engine: str, prompt_ids: list[list[int]], n: int, max_new_tokens: int, seed: int, sampler_dtype: str = "fast") -> tuple[list[list[int]], list[list[float]], list[bool], str]:
    """(completions [K], the sampler's log-prob of each of their tokens, whether each ended on its own
    (end-of-sequence before the limit: the engine's ``truncated``, negated), the sampler's name), K =
    prompts x n."""
    from podsrl.engines import Sampling

    sampling = Sampling(n=n, temperature=RolloutConfig.temperature, top_p=RolloutConfig.top_p, max_new_tokens=max_new_tokens, seed=seed)
    if engine == "vllm":
        from podsrl.engines.vllm import VLLMEngine

        longest = max(map(len, prompt_ids)) + max_new_tokens
        threads = torch.get_num_threads()
        vllm = VLLMEngine.from_config(RolloutConfig(engine="vllm", sampler_dtype=sampler_dtype, max_model_len=max(1024, longest)), policy)
        torch.set_num_threads(threads)  # vLLM may lower it for itself (as podsrl.train.loop.setup restores it)
        try:
            out = vllm.generate(prompt_ids, sampling)
        finally:
            vllm.close()
        return out.completion_ids, out.logprobs, [not t for t in out.truncated], f"vLLM {vllm.sampler_dtype.describe()}"
    from podsrl.engines.hf import TransformersEngine

    sampler = copy.deepcopy(policy.model).to(torch.bfloat16).eval()
    torch.manual_seed(seed)
    out = TransformersEngine(sampler, policy.tokenizer).generate(prompt_ids, sampling)
    rows = [p for p in prompt_ids for _ in range(n)]
    return out.completion_ids, logprobs(sampler, rows, out.completion_ids, policy.tokenizer.pad_token_id), [not t for t in out.truncated], "transformers, a bfloat16 copy of the policy"


@torch.no_grad()
def logprobs(model, prompt_rows: list[list[int]], completions: list[list[int]], pad_id: int, batch: int = 8, *,
             mixed_precision: bool = False) -> list[list[float]]:  # fmt: skip
    """Each completion token's log-prob under ``model`` at temperature 1, computed as the update
    computes pi_old (packed rows, :func:`podsrl.train.sequences.forward_logprobs`; ``mixed_precision``:
    under the update's bfloat16 autocast)."""
    from podsrl.train.sequences import forward_logprobs, pack

    out = []
    for start in range(0, len(completions), batch):
        p, c = prompt_rows[start : start + batch], completions[start : start + batch]
        lp, _ = forward_logprobs(model, pack(p, c, pad_id), temperature=1.0, mixed_precision=mixed_precision)
        out += [lp[i, : len(ids)].float().tolist() for i, ids in enumerate(c)]
    return out


def _padded(rows: list[list[float]], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows cut at ``length`` -> ([K, L] float64 values, 0 on padding; [K, L] bool mask)."""
    L = max(1, max(min(len(r), length) for r in rows))
    values = torch.zeros(len(rows), L, dtype=torch.float64)
    mask = torch.zeros(len(rows), L, dtype=torch.bool)
    for i, r in enumerate(rows):
        k = min(len(r), length)
        values[i, :k] = torch.tensor(r[:k], dtype=torch.float64)
        mask[i, :k] = True
    return values, mask


def summarize(trainer: list[list[float]], sampler: list[list[float]], length: int, ended: list[bool] | None = None, modes: tuple[str, ...] = MODES) -> dict:
    """The figures of one length (see the module docstring) from each completion's trainer and
    sampler log-probs, cut at ``length`` tokens. ``ended[i]``: completion i ended on its own (its last
    token is the end-of-sequence token); it is cut at ``length`` when it is longer, or as long without
    having ended (None: none ended)."""
    ended = ended if ended is not None else [False] * len(trainer)
    t, mask = _padded(trainer, length)
    s, _ = _padded(sampler, length)
    d = (t - s)[mask]  # [tokens]
    seq = torch.where(mask, t - s, 0.0).sum(dim=1)  # [K] log of each sequence ratio
    r = seq.exp()
    q = torch.quantile(r, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    out = {
        "length": length,
        "sequences": len(trainer),
        "mean_tokens": float(mask.sum()) / len(trainer),
        "cut": sum(len(x) > length or (len(x) == length and not e) for x, e in zip(trainer, ended, strict=True)) / len(trainer),
        "logp_diff": float(d.mean()),
        "abs_logp_diff": float(d.abs().mean()),
        "kl": float((d.exp() - 1 - d).mean()),
        "ratio_q10": q[0], "ratio_q50": q[1], "ratio_q90": q[2],
        "ratio_below_0.1": float((r < 0.1).double().mean()),
        "modes": {},
    }  # fmt: skip
    for mode in modes:
        weights, metrics = importance_weights(t, s, mask, ImportanceSettings(mode=mode))
        level = ImportanceSettings(mode=mode).level
        out["modes"][mode] = {"weight_mean": metrics.weight_mean, "ess": metrics.ess(level), "ess_tokens": metrics.ess_tokens,
                              "ess_sequences": metrics.ess_sequences, "zero_tokens": float((weights[mask] == 0).double().mean())}  # fmt: skip
    return out


def tables(rows: list[dict]) -> str:
    """The two Markdown tables of :func:`summarize`'s rows."""
    lines = [
        "| limit L | mean tokens | cut at L | mean d | mean \\|d\\| | KL (k3) | seq. ratio q10 | q50 | q90 | ratio < 0.1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in rows:
        lines.append(
            f"| {x['length']} | {x['mean_tokens']:.0f} | {100 * x['cut']:.0f}% | {x['logp_diff']:+.4f} | {x['abs_logp_diff']:.4f} | {x['kl']:.4f} "
            f"| {x['ratio_q10']:.3g} | {x['ratio_q50']:.3g} | {x['ratio_q90']:.3g} | {100 * x['ratio_below_0.1']:.0f}% |"
        )
    modes = list(rows[0]["modes"]) if rows else []
    lines += ["", "| mode (clip_max 3) | " + " | ".join(f"L={x['length']}: mean w, ESS (other level), w=0" for x in rows) + " |",
              "|---|" + "---|" * len(rows)]  # fmt: skip
    for mode in modes:
        cells = []
        other = "ess_sequences" if ImportanceSettings(mode=mode).level == "token" else "ess_tokens"
        for x in rows:
            m = x["modes"][mode]
            cells.append(f"{m['weight_mean']:.2f}, {m['ess']:.2f} ({m[other]:.2f}), {100 * m['zero_tokens']:.0f}%")
        lines.append(f"| `{mode}`{' (default)' if mode == RolloutConfig.importance_sampling_mode else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="an embedded model's name or a model directory (float32)")
    parser.add_argument("--data", default=str(DATA), help="GSM8K's directory (train.jsonl, test.jsonl), read in place")
    parser.add_argument("--prompts", type=int, default=8, help="the first PROMPTS questions of the test split")
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt")
    parser.add_argument("--lengths", default="64,128,256,512", help="completion limits L, comma-separated")
    parser.add_argument("--engine", choices=("vllm", "transformers"), default="vllm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler-dtype", default="fast", choices=("fast", "auto", "bfloat16", "float16", "float32"),
                        help="vLLM's weights (rollout.sampler_dtype); 'fast' is bfloat16 only on a CPU with native bfloat16")  # fmt: skip
    parser.add_argument("--trainer-mixed-precision", action="store_true", help="the trainer's log-probs under the update's bfloat16 autocast")
    args = parser.parse_args(argv)
    try:
        lengths = sorted({int(x) for x in args.lengths.split(",")})
    except ValueError:
        parser.error(f"--lengths: expected comma-separated integers, got {args.lengths!r}")
    if min(lengths) < 1 or args.prompts < 1 or args.samples < 1:
        parser.error("--lengths, --prompts and --samples must be >= 1")
    if not (Path(args.data) / "test.jsonl").is_file():
        parser.error(f"--data {args.data}: no test.jsonl there; point it at GSM8K's directory")

    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    command = "python bench/importance_gap.py " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.time()
    policy = load_policy(ModelConfig(name=args.model, dtype="float32", device="cpu"))
    prompt_ids = prompts(policy.tokenizer, Path(args.data), args.prompts)
    completions, sampler, ended, name = sample(policy, args.engine, prompt_ids, args.samples, max(lengths), args.seed, args.sampler_dtype)
    rows = [p for p in prompt_ids for _ in range(args.samples)]
    trainer = logprobs(policy.model.eval(), rows, completions, policy.tokenizer.pad_token_id, mixed_precision=args.trainer_mixed_precision)
    arithmetic = "bfloat16 autocast, model.mixed_precision = 'bf16'" if args.trainer_mixed_precision else "float32 arithmetic"
    print(f"# {command}")
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {time.time() - started:.0f} s; model {args.model} (float32 weights, "
          f"{arithmetic}), sampler {name}; {args.prompts} GSM8K test prompts x {args.samples} samples, temperature 1")  # fmt: skip
    print()
    figures = [summarize(trainer, sampler, L, ended) for L in lengths]
    print(tables(figures))
    print()
    print(f"ESS at {lengths[-1]} tokens: " + ", ".join(f"{mode} {m['ess']:.2f}" for mode, m in figures[-1]["modes"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
