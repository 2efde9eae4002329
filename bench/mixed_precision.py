"""Benchmark: the update with and without mixed precision (``model.mixed_precision``), side by side.

    python bench/mixed_precision.py                       # the embedded SmolLM2-135M, 40 + 64 and 40 + 256 tokens
    python bench/mixed_precision.py --quick               # a tiny random Llama: checks the machinery
    python bench/mixed_precision.py --logprob-error       # also the log-probs' error against a float64 forward
    python bench/mixed_precision.py --gap-after-updates 4 # the samplers' gap against the update's forward as training moves the weights
    python bench/mixed_precision.py --model smollm2-135m-arch --device cuda --rows 16 --repeats 5   # a GPU, random weights
    python bench/mixed_precision.py --time-table results/mixed-precision/update-*.json        # docs/results.md's table of timing runs
    python bench/mixed_precision.py --threads 2 --rows 16 --attention-bf16   # also the attention in bfloat16 under autocast, as before (a third side)

**Time.** podsrl's own ``run_update`` (forward, loss, backward, clip, AdamW step) on ``--rows`` kept
rollouts of one prompt (40 random tokens, shared by the rows as a group's are), each completion
``C`` random tokens long, C = 64 and 256, advantages alternating +1 / -1, the update one
micro-batch; once with ``UpdateSettings.mixed_precision`` off (float32 arithmetic) and once on
(bfloat16 autocast over the float32 weights, the output layer in float32: podsrl/train/precision.py),
alternating within each round on the same model and optimizer (``--repeats`` rounds after one
warm-up update of each), so that a change in the machine's load hits both alike. Printed per size:
each side's median seconds and the ratio of the medians, mixed precision over float32. Below 1 is a
saving; issue 66's target on a CPU with native bfloat16 is 1 / 1.5 = 0.67 or less. On a CPU without
it (AVX2 only) bfloat16 is converted for float32 arithmetic and the ratio is above 1: why
``model.mixed_precision = "auto"`` leaves such a CPU in float32. The CPU's model and flags are
printed with the result.

**Log-prob error** (``--logprob-error``, the embedded model or a path only): the trainer's log-probs
of sampled completions (8 arithmetic prompts x 2 completions of up to 32 tokens, temperature 1, seed
0) computed in float32, under bfloat16 autocast with the output layer in bfloat16, and with it in
float32 (podsrl's choice), each against the same forward in float64: mean and largest |difference|
per token, the mean k3 estimate of the KL between them, and the mean signed difference.

**The sampler's gap after updates** (``--gap-after-updates N``, the embedded model or a path; no
timing then): what a sampler sees against the update's forward once training has moved the weights.
16 completions to update on and 16 others to score (the prompts of ``--logprob-error``, temperature
1, seed 0); N of podsrl's updates (``run_update`` under mixed precision, podsrl's AdamW at its
default learning rate, advantages +1 / -1) on the first set; before the first and after each, the
scored set's log-probs three ways: the float32 forward (a float32 sampler's: vLLM or the transformers
engine in float32), the update's bfloat16 autocast forward, and a bfloat16 copy of the weights
computing in bfloat16 (a bfloat16 sampler's: ``rollout.sampler_dtype = "bfloat16"``, or ``"fast"``
where bfloat16 is native; its log-softmax in float32). Per pair, per update count: mean |d| a token
and the mean k3 estimate of the KL (podsrl's ``sampler_kl``). Autocast computes with the weights
rounded to bfloat16: a weight's rounded value moves only when an update carries it across a rounding
boundary, so the update's forward misses most of an update that a float32 sampler's weights carry (a
bfloat16 sampler rounds the weights alike, and its activations besides).

The last line: ``update time mixed precision / float32: R64 at 40+64 tokens, R256 at 40+256 (DEVICE; native bfloat16: yes|no)``.

On a loaded machine, ``--threads 1``: two threads then wait on each other, which inflates some
timings more than others. Without native bfloat16 the run takes about 10 minutes (bfloat16 is the
slow side); the figures, their date and machine: docs/results.md, "Mixed precision: what it costs and
changes".
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

PROMPT_LEN = 40
SIZES = (64, 256)
QUESTIONS = [f"What is {a} {op} {b}?" for a, op, b in ((7, "*", 8), (12, "+", 35), (9, "-", 4), (64, "-", 27), (3, "*", 9), (45, "+", 17), (81, "-", 19),
                                                      (6, "*", 7))]  # fmt: skip  (--logprob-error's and --gap-after-updates' prompts)


def _model(name: str, device: str, seed: int):
    """(model, pad id, vocab size): ``tiny`` a random 2-layer Llama; ``smollm2-135m-arch`` SmolLM2-135M's
    architecture with random weights (a GPU machine without the embedded model); else podsrl's model.name."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from podsrl.models import resolve_device

    torch.manual_seed(seed)
    if name in ("tiny", "smollm2-135m-arch"):
        from gpu_check import SMOLLM2_135M

        arch = SMOLLM2_135M if name == "smollm2-135m-arch" else dict(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
        with torch.device(resolve_device(device)):
            model = LlamaForCausalLM(LlamaConfig(**arch))
        return model, 0, arch["vocab_size"], None
    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    policy = load_policy(ModelConfig(name=name, device=device))
    return policy.model, policy.tokenizer.pad_token_id, len(policy.tokenizer), policy.tokenizer


def time_updates(model, pad_id: int, vocab: int, *, rows: int, repeats: int, seed: int, measured=lambda rows: None,
                 attention_bf16: bool = False) -> list[dict]:  # fmt: skip
    """Per completion length: the median seconds of the update with mixed precision off and on,
    alternating within each round; with ``attention_bf16`` also on with the attention in bfloat16 (as
    before podsrl computed it in float32 under autocast on a CPU: podsrl.engines.attention), a third
    side in the same rounds. ``measured`` is called with the rows so far after each length (the JSON is
    written as it goes: a run stopped at its limit keeps what it measured)."""
    import torch

    from podsrl.core.loss import LossSettings
    from podsrl.engines import attention
    from podsrl.train.update import UpdateBatch, UpdateSettings, run_update

    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (PROMPT_LEN,), generator=gen).tolist()
    sides = {"float32": (False, True), "bf16": (True, True)} | ({"bf16_attn_bf16": (True, False)} if attention_bf16 else {})  # (autocast, float32 attention)
    out = []
    try:
        for length in SIZES:
            batch = UpdateBatch(prompt_ids=[prompt] * rows, completion_ids=[torch.randint(3, vocab, (length,), generator=gen).tolist() for _ in range(rows)],
                                advantages=torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(rows)]))  # fmt: skip
            loss = LossSettings(eps_low=0.2, aggregation="sequence", max_completion_len=length)
            times: dict[str, list[float]] = {side: [] for side in sides}

            def update(side: str) -> None:
                mp, attention.FLOAT32_UNDER_CPU_AUTOCAST = sides[side]
                run_update(model, optimizer, scheduler, batch, UpdateSettings(loss=loss, pad_id=pad_id, micro_batch_size=rows, grad_clip=1.0, mixed_precision=mp))

            for side in sides:  # warm-up: gradients, AdamW state, kernels
                update(side)
            for _ in range(repeats):
                for side in sides:
                    sync()
                    start = time.perf_counter()
                    update(side)
                    sync()
                    times[side].append(time.perf_counter() - start)
            med = {side: statistics.median(t) for side, t in times.items()}
            row = {"completion": length, "float32_s": med["float32"], "bf16_s": med["bf16"], "ratio": med["bf16"] / med["float32"],
                   "float32_all": times["float32"], "bf16_all": times["bf16"]}  # fmt: skip
            if attention_bf16:
                row |= {"bf16_attn_bf16_s": med["bf16_attn_bf16"], "bf16_attn_bf16_all": times["bf16_attn_bf16"],
                        "ratio_attn_bf16": med["bf16_attn_bf16"] / med["float32"]}  # fmt: skip
            out.append(row)
            also = (f"; with the attention in bfloat16 {med['bf16_attn_bf16']:7.3f} s, ratio {row['ratio_attn_bf16']:.2f}" if attention_bf16 else "")
            print(f"40 + {length:>3} tokens x {rows} rows: float32 {med['float32']:7.3f} s, mixed precision {med['bf16']:7.3f} s, ratio {row['ratio']:.2f}{also} "
                  f"(rounds: " + "; ".join(f"{side} {', '.join(f'{t:.2f}' for t in times[side])}" for side in sides) + ")", flush=True)  # fmt: skip
            measured(out)
    finally:
        attention.FLOAT32_UNDER_CPU_AUTOCAST = True
    return out


def logprob_error(model, tokenizer) -> None:
    """The trainer's log-probs of sampled completions in float32 and under bfloat16 autocast (output
    layer in bfloat16, and in float32), each against the float64 forward (the module docstring)."""
    import copy

    import torch

    from podsrl.train.precision import autocast
    from podsrl.train.sequences import pack, token_logprobs

    torch.manual_seed(0)
    model = model.float().eval()
    prompts = _prompts(tokenizer, QUESTIONS)
    owners, completions = _sampled(model, tokenizer, prompts, 2)
    packed = pack(owners, completions, tokenizer.pad_token_id or 0)
    P, T = packed.prompt_width, packed.completion_ids.shape[1]
    mask = packed.completion_mask

    def logprobs(m, *, mode: str):
        inputs = dict(input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=(packed.attention_mask.cumsum(-1) - 1).clamp(min=0),
                      logits_to_keep=torch.arange(P - 1, P + T - 1))  # fmt: skip
        with torch.no_grad():
            if mode == "bf16-head":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = m(**inputs).logits
            else:
                with autocast(m, mode == "float32-head"):
                    logits = m(**inputs).logits
            if mode == "float64":
                return torch.log_softmax(logits, -1).gather(-1, packed.completion_ids[..., None])[..., 0]
            lp, _ = token_logprobs(logits.reshape(-1, logits.shape[-1]), packed.completion_ids.reshape(-1))
            return lp.view(len(completions), T).double()

    reference = logprobs(copy.deepcopy(model).double(), mode="float64")
    print(f"log-prob error against a float64 forward, {int(mask.sum())} sampled completion tokens of {len(prompts)} prompts:")
    for label, mode in (("float32", "float32"), ("bf16 autocast, output layer bf16", "bf16-head"), ("bf16 autocast, output layer float32", "float32-head")):
        d = (logprobs(model, mode=mode) - reference)[mask]
        print(f"  {label:<38} mean |d| {float(d.abs().mean()):.2e}  max |d| {float(d.abs().max()):.2e}  mean k3 {float((d.exp() - 1 - d).mean()):.2e}  "
              f"mean d {float(d.mean()):+.2e}", flush=True)  # fmt: skip


def _prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    """Each question as the chat template's user turn asking for the final number alone, token ids."""
    return [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": q + "\nGive only the final number."}], tokenize=False,
                                                    add_generation_prompt=True), add_special_tokens=False)["input_ids"] for q in questions]  # fmt: skip


def _sampled(model, tokenizer, prompts: list[list[int]], samples: int, *, max_new_tokens: int = 32) -> tuple[list[list[int]], list[list[int]]]:
    """``samples`` completions of each prompt at temperature 1: (prompts, completions), one row each."""
    import torch

    owners, completions = [], []
    with torch.no_grad():
        for p in prompts:
            for _ in range(samples):
                out = model.generate(torch.tensor([p]), do_sample=True, max_new_tokens=max_new_tokens, temperature=1.0, top_k=0,
                                     pad_token_id=tokenizer.eos_token_id)  # fmt: skip
                completions.append(out[0, len(p) :].tolist())
                owners.append(p)
    return owners, completions


GAP_PAIRS = (("update bf16 - sampler float32", "bf16", "float32"), ("update bf16 - sampler bfloat16", "bf16", "bfloat16"),
             ("update float32 - sampler bfloat16", "float32", "bfloat16"))  # fmt: skip


def gap_after_updates(model, tokenizer, updates: int, *, questions: int = len(QUESTIONS), samples: int = 2, max_new_tokens: int = 32) -> list[dict]:
    """The module docstring's "sampler's gap after updates": per update count, per pair of forwards, the
    scored set's mean |d| a token and mean k3 (d = the first's log-prob less the second's)."""
    import copy

    import torch

    from podsrl.config import Config
    from podsrl.core.loss import LossSettings
    from podsrl.train.loop import make_optimizer
    from podsrl.train.sequences import forward_logprobs, pack
    from podsrl.train.update import UpdateBatch, UpdateSettings, run_update

    torch.manual_seed(0)
    model = model.float().eval()
    prompts = _prompts(tokenizer, QUESTIONS[:questions])
    train_prompts, train_completions = _sampled(model, tokenizer, prompts, samples, max_new_tokens=max_new_tokens)
    score_prompts, score_completions = _sampled(model, tokenizer, prompts, samples, max_new_tokens=max_new_tokens)
    pad = tokenizer.pad_token_id or 0
    scored = pack(score_prompts, score_completions, pad)
    mask = scored.completion_mask
    batch = UpdateBatch(prompt_ids=train_prompts, completion_ids=train_completions,
                        advantages=torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(train_prompts))]))  # fmt: skip
    settings = UpdateSettings(loss=LossSettings(eps_low=0.2, aggregation="sequence", max_completion_len=max_new_tokens), pad_id=pad,
                              micro_batch_size=len(train_prompts), grad_clip=1.0, mixed_precision=True)  # fmt: skip
    optimizer, scheduler = make_optimizer(Config(), model)
    out = []
    for done in range(updates + 1):
        model.eval()
        with torch.no_grad():
            lp = {"float32": forward_logprobs(model, scored)[0], "bf16": forward_logprobs(model, scored, mixed_precision=True)[0]}
            sampler = copy.deepcopy(model).to(torch.bfloat16)  # a bfloat16 sampler's copy, computing in bfloat16
            lp["bfloat16"] = forward_logprobs(sampler, scored)[0]
            del sampler
        row = {"updates": done, "tokens": int(mask.sum())}
        for label, a, b in GAP_PAIRS:
            d = (lp[a] - lp[b])[mask].double()
            row[label] = {"mean_abs": float(d.abs().mean()), "k3": float((d.exp() - 1 - d).mean())}
        out.append(row)
        print(f"after {done} update(s): " + "; ".join(f"{label} |d| {row[label]['mean_abs']:.4f} k3 {row[label]['k3']:.1e}" for label, _, _ in GAP_PAIRS),
              flush=True)  # fmt: skip
        if done < updates:
            model.train()
            run_update(model, optimizer, scheduler, batch, settings)
    return out


def gap_table(data: dict) -> str:
    """docs/results.md's table of a ``--gap-after-updates`` JSON: per update count, each pair's mean
    |d| a token and k3."""
    rows = data["gap"]
    lines = ["| updates | " + " | ".join(f"{label}: mean \\|d\\| | k3" for label, _, _ in GAP_PAIRS) + " |", "|---:|" + "---:|---:|" * len(GAP_PAIRS)]
    lines += [f"| {r['updates']} | " + " | ".join(f"{r[label]['mean_abs']:.4f} | {r[label]['k3']:.1e}" for label, _, _ in GAP_PAIRS) + " |" for r in rows]
    return "\n".join(lines)


def time_table(runs: list[dict]) -> str:
    """docs/results.md's table of timing JSONs (``--out`` without ``--gap-after-updates``), one row per
    run and completion length: rows, tokens, each side's median seconds (its rounds beside it), the
    ratio of the medians and the speed-up it means; where any run timed ``--attention-bf16``, that side
    and its ratio too ("-" in a run without it)."""

    def rounds(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    third = any("bf16_attn_bf16_s" in r for run in runs for r in run["sizes"])
    head = ["rows x (prompt + completion)", "float32, median (rounds)", "bfloat16 autocast, median (rounds)", "ratio", "speed-up"]
    if third:
        head += ["bfloat16 autocast, attention in bfloat16, median (rounds)", "its ratio"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for run in runs:
        for r in run["sizes"]:
            cells = [f"{run['rows']} x ({run['prompt']} + {r['completion']})", f"{r['float32_s']:.2f} s ({rounds(r['float32_all'])})",
                     f"{r['bf16_s']:.2f} s ({rounds(r['bf16_all'])})", f"{r['ratio']:.2f}", f"{1 / r['ratio']:.2f}x"]  # fmt: skip
            if third:
                cells += [f"{r['bf16_attn_bf16_s']:.2f} s ({rounds(r['bf16_attn_bf16_all'])})", f"{r['ratio_attn_bf16']:.2f}"] if "bf16_attn_bf16_s" in r else ["-", "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_line() -> tuple[str, bool]:
    """The CPU's model name and flags that matter, and whether it has native bfloat16 (podsrl's reading)."""
    from podsrl.engines.dtype import cpu_bf16, cpu_model

    native, why = cpu_bf16()
    return f"{cpu_model()}, {why}", native


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="podsrl model name/path, 'tiny' or 'smollm2-135m-arch' (random weights)")
    parser.add_argument("--device", default="cpu", help="podsrl's model.device")
    parser.add_argument("--rows", type=int, default=2, help="kept rollouts updated (one prompt's group)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (each: one update of each side)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="the tiny random model: the machinery only")
    parser.add_argument("--logprob-error", action="store_true", help="also the log-probs' error against float64 (a real model)")
    parser.add_argument("--gap-after-updates", type=int, default=0, metavar="N",
                        help="instead of timing: the sampler's gap against the update's forward before and after each of N updates (a real model)")
    parser.add_argument("--attention-bf16", action="store_true",
                        help="also time mixed precision with the attention in bfloat16 (before podsrl computed it in float32 on a CPU), in the same rounds")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here (the update's: after each length)")
    parser.add_argument("--gap-table", type=Path, default=None, metavar="FILE", help="measure nothing: print a --gap-after-updates JSON's table")
    parser.add_argument("--time-table", type=Path, nargs="+", default=None, metavar="FILE", help="measure nothing: print timing JSONs' table (one row a run and length)")
    args = parser.parse_args(argv)
    if args.time_table:
        print(time_table([json.loads(path.read_text()) for path in args.time_table]))
        return
    if args.gap_table:
        print(gap_table(json.loads(args.gap_table.read_text())))
        return
    import torch

    if args.quick:
        args.model, args.repeats = "tiny", 1
    if args.threads:
        torch.set_num_threads(args.threads)
    model, pad_id, vocab, tokenizer = _model(args.model, args.device, args.seed)
    device = next(model.parameters()).device
    cpu, native = cpu_line()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {cpu}"
    print(f"model {args.model} on {device} ({where}; {torch.get_num_threads()} threads), torch {torch.__version__}")
    if args.logprob_error:
        if tokenizer is None:
            sys.exit("mixed_precision: --logprob-error needs a real model (the embedded one, or a path)")
        logprob_error(model, tokenizer)
    if device.type == "cuda":
        from podsrl.engines.dtype import gpu_bf16

        native = gpu_bf16()
    machine = {"device": device.type, "name": where, "native_bf16": native, "threads": torch.get_num_threads(), "torch": torch.__version__}
    command = "python bench/mixed_precision.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.gap_after_updates:
        if tokenizer is None:
            sys.exit("mixed_precision: --gap-after-updates needs a real model (the embedded one, or a path)")
        rows = gap_after_updates(model, tokenizer, args.gap_after_updates)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"benchmark": "mixed_precision --gap-after-updates", "command": command, "machine": machine, "model": args.model,
                                            "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "gap": rows}, indent=1) + "\n")  # fmt: skip
        last = rows[-1]
        print(f"sampler gap (mean |d| a token) after {last['updates']} update(s): " + ", ".join(f"{label} {last[label]['mean_abs']:.4f}" for label, _, _ in GAP_PAIRS))
        return

    def write(rows_so_far: list[dict]) -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            report = {"benchmark": "mixed_precision", "command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                      "machine": machine, "model": args.model, "rows": args.rows, "prompt": PROMPT_LEN, "sizes": rows_so_far}  # fmt: skip
            args.out.write_text(json.dumps(report, indent=1) + "\n")

    rows = time_updates(model, pad_id, vocab, rows=args.rows, repeats=args.repeats, seed=args.seed, measured=write, attention_bf16=args.attention_bf16)
    by = {r["completion"]: r["ratio"] for r in rows}
    print(f"update time mixed precision / float32: {by[64]:.2f} at 40+64 tokens, {by[256]:.2f} at 40+256 "
          f"({device.type}; native bfloat16: {'yes' if native else 'no'})")  # fmt: skip


if __name__ == "__main__":
    main()
