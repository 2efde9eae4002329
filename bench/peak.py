"""Benchmark: each training phase against the machine's matrix-product peak, in one run (issue 66, item 3).

    python bench/peak.py                       # CPU: the embedded SmolLM2-135M at one thread: about 11 minutes (below)
    python bench/peak.py --threads 2           # the same at two threads (peak and phases at the same count)
    python bench/peak.py --quick               # CPU: a tiny random Llama, seconds: checks the script runs
    python bench/peak.py --threads 2 --rows 16 --update-precision float32 --sampler-rollouts 8,64 --engines vllm
                                               # at training batch sizes, float32 only: about 6 minutes
    python bench/peak.py --threads 2 --update-precision none --sampler-rollouts 8,64,128,256 --engines vllm --profile 128x64
                                               # vLLM at the calls a PODS step makes, no update, and where a call of
                                               # 128 x 64 tokens spends its time (torch's profiler): about 12 minutes
    python3 bench/peak.py --gpu --budget 3.5   # GPU: random-weight Qwen2.5-1.5B and 0.5B, 512-token completions
    python bench/peak.py --gpu --tiny          # the GPU mode's code on this CPU with tiny random Qwen2 models (tests)

Every figure of one run comes from the same process, at the same thread count, side by side: the
ratios (a phase's rate over the peak) are the result; the absolute rates depend on the machine's load.
The CPU run's length, estimated from a shorter run's rates on this project's 2-core AMD EPYC
(2026-11-29, loaded by other jobs, one thread): the updates about 5.5 minutes (the emulated bfloat16
update of 40 + 256 tokens takes about 100 s, timed twice), the samplers about 4.7 (a call of 8
rollouts of 256 tokens about 80 s on the transformers engines, 25 s on vLLM), the peaks under a
minute: about 11 minutes; ``--budget 10`` starts nothing past 10 (a call under way finishes).

**The peak** (per model, per precision: float32 and bfloat16). The product of random [M x K]
inputs and a [N x K] weight in that dtype, as a linear layer computes it (``F.linear``) and, on an
x86-64 CPU, also as oneDNN computes it over the weight reordered for M rows (the transformers engine's
and vLLM's way there: :func:`kernels_for`; a run whose products have no ``kernels`` timed ``F.linear`` alone), for every
product a forward of the model makes: the
attention's projections q (hidden -> heads x head_dim), k and v (hidden -> KV heads x head_dim), o,
the MLP's gate and up (hidden -> intermediate) and down (intermediate -> hidden), and the output
layer (hidden -> vocabulary), at M = the tokens of one micro-batch's completion pass in the update
(rows x completion length, for each length measured). Each product is timed at least 3 times (up to
7, while its samples take under about 2 s in all; on a GPU a sample is enough back-to-back products to
take some milliseconds); its rate is 2MKN over **the median of its 3 fastest samples** with its
faster kernel, and the precision's peak is **the best product's rate**, measured before the phases and again after them:
every fraction is against **the higher of the two** (:func:`settle_peaks`). **The peak beside**
(runs since 2026-12-01): the machine's rate moves within minutes on this project's CPU (its best
product measured 120.6 GFLOP/s before a run's calls and 75.0 after them, 2026-12-01), so a phase's rate
over a peak measured minutes away measures the machine's drift as much as the phase. So the precisions'
best products are timed again, briefly (:class:`Beside`: about ``BESIDE_SECONDS`` each), just before a
phase's first timed round and just after each round; each round is set against the higher of the probes
on either side of it, and **"of the peak beside"** is the median of those fractions over the rounds,
reported beside the fraction of the run's peak. On a CPU without native
bfloat16 (no avx512_bf16 or amx_bf16 in /proc/cpuinfo: :func:`podsrl.engines.dtype.cpu_bf16`) bfloat16 products are converted
for float32 arithmetic: the peak is labelled "emulated", and it is what mixed precision gets there.
On a GPU float32 products run as torch's ``float32_matmul_precision`` says (default "highest": no
TF32), recorded.

**The update** (podsrl's ``run_update``: packing, ``forward_logprobs`` with shared prompts, the loss,
backward, clipping, AdamW), timed by phase with bench/step_split.py's hooks (:class:`PhaseClock`:
the model's forward calls that record gradients, ``Tensor.backward``, the optimizer's step; the
``rest`` is the update less the three: the log-softmax of the kept logits and the loss outside the
model's call, clipping, packing). CPU: ``--rows`` (2) rows of one 40-token random prompt (shared, as a
group's are), completions of 64 and 256 random tokens, advantages +1 and -1 (every row runs), one
micro-batch; with ``mixed_precision`` off (float32) and on (bfloat16 autocast, the output layer in
float32: podsrl/train/precision.py). GPU: GRPO(16) (B = 4 prompts x 16 rows, all kept) and
PODS(16, 4) (B x 4 kept rows), 512-token completions, podsrl's micro-batches of 16 rows, mixed
precision as ``model.mixed_precision = "auto"`` resolves there (bfloat16 on a GPU with native
bfloat16), the update's peak memory (``torch.cuda.max_memory_allocated`` over the timed updates,
absolute and above what was allocated before them). A warm-up update first (on a GPU before each
method, for its kernels; on a CPU before the first of each precision: gradients, AdamW's state),
then ``--repeats`` timed ones; medians per phase.

FLOP of a forward (counted from the config, useful work only: :func:`forward_flop`), for a
micro-batch of N rows whose U distinct prompts of P tokens each run once (shared) and whose
completions have C tokens::

    forward  = 2 x D x (U P + N C)                                  layers' products, D = their parameters
             + 4 x L x d_q x (U P (P + 1) / 2 + N (C P + C (C + 1) / 2))   attention: scores and values, causal
             + 2 x hidden x V x (U + N (C - 1))                     output layer: the logits kept
    backward = 2 x forward                                          (the usual count: grads of inputs and weights)

with D = L x (hidden x (d_q + 2 d_kv) + d_q x hidden + 3 x hidden x intermediate) (no embedding, norms
or biases), L layers, d_q = heads x head_dim, d_kv = KV heads x head_dim, V the vocabulary. The
optimizer (AdamW, elementwise over the weights) makes no products: it is reported in seconds and
tokens a second, without a fraction. **A phase's fraction of the peak** is the time its products
would take at the peak of the precision each runs in, over its measured time: the layers' products
and attention at the compute precision (bfloat16 under mixed precision), the output layer at float32
where its weight is float32 (podsrl keeps it so under mixed precision); backward the same at 2x; the
update's fraction is forward + backward's ideal time over the whole update (optimizer and rest
included: what a step pays). Tokens a second: the update's completion tokens over the phase's seconds.

**The sampler** (CPU: the engines available here, ``transformers`` (today's: the policy itself),
``transformers-static`` (rollout.sampler_dtype "fast") and ``vllm`` (CPU build, eager) where
installed; GPU: ``transformers`` against ``transformers-static`` and ``transformers-static-gqa`` (the
static engine reading the shared key/value heads in place on CUDA too: bench/samplers.py) on
Qwen2.5-0.5B at 128 rollouts; bench/samplers.py --gpu times 512, and the first GPU run of this one at
512 x 512 tokens ran past its budget, 2026-11-30): ``--sampler-rollouts`` rollouts (CPU 8) of exactly C generated tokens (end-of-sequence
suppressed: in place for transformers, bench/_fixed_length.py; vLLM's ``min_tokens``), random prompts
of P - 4 to P + 4 tokens (:func:`prompt_lengths`, P = 40 on a CPU: left-padded, as a real call's), a
warm-up call per engine (on a GPU one per size: the static engine compiles per shape, its seconds
reported), then ``--repeats`` rounds, the engines' order alternating; medians. FLOP of a call
(:func:`sampling_flop`): each distinct prompt's prefill (layers and attention over its P tokens), then per
row G - 1 decode steps (a token through the layers, attention over P + j positions) and G logits;
its fraction of the peak in the sampler's own precision (``transformers``: the policy's float32;
``transformers-static`` and ``vllm``: the resolved sampler dtype). Beside it, **the rate of a decode
step's products** at the call's size (:func:`decode_rate`: every product of a forward at M = the
call's rollouts, one token a row, timed as the peak's; their FLOP over their summed time) and the
engine's rate over it: a decode step multiplies far fewer rows than the update, and this says how much
of the gap to the peak is the call's shape, which no engine escapes, and how much the engine's own
(attention over the cache, sampling, scheduling). vLLM's KV cache is sized to hold the largest call at
once (:func:`kv_cache_gib`). ``--profile RxC`` (CPU) then profiles one call of R rollouts of C tokens
per engine with torch's profiler (:func:`profile_call`): the operators with the most self CPU time,
which names the rest of the gap (the products' kernels, sampling, attention, elementwise work).
Before the sampler, where its model shares key/value heads, **a decode step's attention three ways**
(:func:`attention_ways`, bench/attention.py) at the sampler's calls and precision: the KV cache copied
per query head (transformers' ``sdpa`` with a mask: a GPU's engines today), PyTorch's ``enable_gqa``
(the CPU engines'; on the lent H200 the fastest too), and the query heads grouped, each over every layer.

``--engines none`` times no sampler (the peaks and the update only). The JSON records the process's
``GLIBC_TUNABLES`` (``machine``), and the tables' first line shows it where set: ``podsrl train``
starts with glibc keeping freed memory (podsrl/hostmem.py), a bench as its command line says, so
``GLIBC_TUNABLES=... python bench/peak.py ...`` measures the update as the CLI runs it.

``--budget MINUTES``: the parts run in order (peaks; GPU: the update at 1.5B, at 0.5B, then the
sampler, one size after the other) and one that would start with less than ``MIN_PART_SECONDS`` left
is skipped and recorded as skipped (on a GPU a sampler's warm-up, a compile, with less than
``WARM_UP_SECONDS``); the JSON is rewritten after each part and each sampler row, so a run stopped
from outside leaves one. Output:
one table, the JSON (``results/peak/<machine>-<date>.json``; ``--quick``/``--tiny`` runs under
runs/peak/; ``--out`` elsewhere; ``--table FILE`` prints a saved one's tables for docs/results.md), and
as the last line
``fraction of peak (DEVICE, bfloat16 native|emulated): update U at ..., sampler S ...``.
bench/cost_model.py reads the JSON (``--peak FILE``): the update's fixed and per-token cost, a sampling
call's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # podsrl from this working tree (not installed on a lent GPU); the sibling benches

from gpu_check import SMOLLM2_135M  # noqa: E402  (HuggingFaceTB/SmolLM2-135M's config.json)

# Published configs (Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B, config.json), built with random weights:
# nothing to download or carry. max_position_embeddings does not change the compute (32768 for both).
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)  # fmt: skip
QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)  # fmt: skip
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, tie_word_embeddings=True)  # fmt: skip  (the machinery only)
# name -> (transformers family, config)
ARCHS = {
    "smollm2-135m": ("llama", SMOLLM2_135M),
    "qwen2.5-0.5b": ("qwen2", QWEN25_05B),
    "qwen2.5-1.5b": ("qwen2", QWEN25_15B),
    "tiny-llama": ("llama", TINY),
    "tiny-qwen2-a": ("qwen2", TINY),
    "tiny-qwen2-b": ("qwen2", dict(TINY, hidden_size=96, intermediate_size=192, num_attention_heads=6)),
}
EMBEDDED = "smollm2-135m-instruct"  # the CPU mode's model: its weights, its architecture smollm2-135m

PRECISIONS = ("float32", "bfloat16")
MIN_PART_SECONDS = 20.0  # a part that would start with less of --budget left is skipped
PROMPTS = 16  # distinct prompts of a sampling call, when they divide its rollouts
PROMPT_SPREAD = 4  # the sampler's prompts are P - 4 to P + 4 tokens long: a real call's differ (left padding, a mask)


def prompt_lengths(prompt: int, count: int) -> list[int]:
    """The lengths of the sampler's ``count`` prompts around ``prompt`` tokens: P + 1, P - 3, P + 4, ...
    (every offset in [-PROMPT_SPREAD, PROMPT_SPREAD] before any repeats, so a call of 2 or more prompts
    is padded)."""
    width = 2 * PROMPT_SPREAD + 1
    return [max(1, prompt + (5 * i + PROMPT_SPREAD + 1) % width - PROMPT_SPREAD) for i in range(count)]


def distinct_prompts(rollouts: int) -> int:
    """The distinct prompts of a sampling call of ``rollouts``: ``PROMPTS`` (or fewer, for fewer
    rollouts) when they divide it, else 1."""
    k = min(PROMPTS, rollouts)
    return k if rollouts % k == 0 else 1
# GPU mode: (label, n, m) of the update's methods, B prompts each
METHODS = (("GRPO(16)", 16, 16), ("PODS(16, 4)", 16, 4))


@dataclass(frozen=True)
class Sizes:
    """What one mode measures."""

    models: tuple[str, ...]  # ARCHS names (or EMBEDDED), in the order they run
    prompt: int  # P: prompt tokens
    lengths: tuple[int, ...]  # C: the update's completion lengths
    repeats: int  # timed updates (and sampler rounds) after the warm-up
    rows: int = 2  # CPU: the update's rows (one prompt's group)
    prompts: int = 4  # GPU: B prompts of each method
    micro_batch: int = 16  # GPU: rows a micro-batch (podsrl's optim.micro_batch_size default)
    mixed: tuple[bool, ...] = (False, True)  # the update with mixed precision off and on
    sampler_model: str | None = None  # which model samples (None: every model of the mode)
    sampler_rollouts: tuple[int, ...] = (8,)
    sampler_lengths: tuple[int, ...] = (64, 256)
    engines: tuple[str, ...] = ("transformers", "transformers-static", "vllm")
    sampler_repeats: int = 2


SIZES = {
    # the sampler one round after its warm-up: at one thread a call of 8 rollouts of 256 tokens takes a minute or two per engine
    "cpu": Sizes(models=(EMBEDDED,), prompt=40, lengths=(64, 256), repeats=2, sampler_repeats=1),
    "cpu-quick": Sizes(models=("tiny-llama",), prompt=8, lengths=(8, 16), repeats=1, sampler_rollouts=(2,), sampler_lengths=(8, 16),
                       engines=("transformers", "transformers-static"), sampler_repeats=1),  # fmt: skip
    "gpu": Sizes(models=("qwen2.5-1.5b", "qwen2.5-0.5b"), prompt=40, lengths=(512,), repeats=2, mixed=(True,), sampler_model="qwen2.5-0.5b",
                 sampler_rollouts=(128,), sampler_lengths=(512,), engines=("transformers", "transformers-static", "transformers-static-gqa"),
                 sampler_repeats=1),  # fmt: skip
    "gpu-tiny": Sizes(models=("tiny-qwen2-b", "tiny-qwen2-a"), prompt=8, lengths=(16,), repeats=1, prompts=1, mixed=(True,),
                      sampler_model="tiny-qwen2-a", sampler_rollouts=(4, 8), sampler_lengths=(8,),
                      engines=("transformers", "transformers-static", "transformers-static-gqa"),
                      sampler_repeats=1),  # fmt: skip
}


# ------------------------------------------------------------------------------------ FLOP (pure)


@dataclass(frozen=True)
class Shapes:
    """The dimensions that set a forward's matrix products."""

    hidden: int
    intermediate: int
    vocab: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: dict) -> Shapes:
        """From a transformers config's fields (a dict, or a config's ``to_dict()``)."""
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        return cls(config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["num_hidden_layers"], heads,
                   config.get("num_key_value_heads") or heads, head_dim)  # fmt: skip

    @property
    def d_q(self) -> int:
        return self.heads * self.head_dim

    @property
    def d_kv(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_products(self) -> list[tuple[str, int, int]]:
        """(name, K, N) of one layer's products [tokens x K] x [K x N]."""
        h, i = self.hidden, self.intermediate
        return [("q", h, self.d_q), ("k", h, self.d_kv), ("v", h, self.d_kv), ("o", self.d_q, h), ("gate", h, i), ("up", h, i), ("down", i, h)]

    def products(self) -> list[tuple[str, int, int]]:
        """The distinct products of a forward, the output layer included (k and v share a shape: k)."""
        seen, out = set(), []
        for name, k, n in [*self.layer_products(), ("output", self.hidden, self.vocab)]:
            if (k, n) not in seen:
                seen.add((k, n))
                out.append((name, k, n))
        return out

    @property
    def dense(self) -> int:
        """D: the layers' matrix parameters (no embedding, norms or biases)."""
        return self.layers * sum(k * n for _, k, n in self.layer_products())


@dataclass(frozen=True)
class Flop:
    """Useful FLOP of a computation, by where it runs (module docstring)."""

    layers: float = 0.0  # the layers' products
    attention: float = 0.0  # scores and weighted values
    output: float = 0.0  # the output layer

    @property
    def total(self) -> float:
        return self.layers + self.attention + self.output

    def __add__(self, other: Flop) -> Flop:
        return Flop(self.layers + other.layers, self.attention + other.attention, self.output + other.output)

    def times(self, k: float) -> Flop:
        return Flop(k * self.layers, k * self.attention, k * self.output)

    def ideal_seconds(self, compute_gflops: float, output_gflops: float) -> float:
        """Seconds at the peaks: layers and attention at ``compute_gflops``, the output layer at ``output_gflops`` (GFLOP/s)."""
        return (self.layers + self.attention) / (compute_gflops * 1e9) + self.output / (output_gflops * 1e9)


def _tri(n: int) -> int:
    return n * (n + 1) // 2


def forward_flop(s: Shapes, *, prompt: int, completion: int, rows: int, prompts: int = 1, shared: bool = True) -> Flop:
    """One ``forward_logprobs`` of ``rows`` rows of ``prompts`` distinct prompts of ``prompt`` tokens
    and completions of ``completion`` tokens (module docstring's formula). ``shared``: each prompt runs
    once (podsrl's shared-prompt pass); otherwise every row runs [prompt; completion] whole."""
    if shared:
        through = prompts * prompt + rows * completion
        context = prompts * _tri(prompt) + rows * (completion * prompt + _tri(completion))
        logits = prompts + rows * (completion - 1)
    else:
        through = rows * (prompt + completion)
        context = rows * _tri(prompt + completion)
        logits = rows * completion
    return Flop(2.0 * s.dense * through, 4.0 * s.layers * s.d_q * context, 2.0 * s.hidden * s.vocab * logits)


def sampling_flop(s: Shapes, *, prompt: int, generated: int, rows: int, prompts: int) -> Flop:
    """One sampling call: each of ``prompts`` distinct prompts' prefill over ``prompt`` tokens, then
    per row ``generated - 1`` decode steps (the token at position P + j attends P + j positions) and
    ``generated`` logits."""
    steps = max(generated - 1, 0)
    through = prompts * prompt + rows * steps
    context = prompts * _tri(prompt) + rows * (steps * prompt + _tri(steps))
    return Flop(2.0 * s.dense * through, 4.0 * s.layers * s.d_q * context, 2.0 * s.hidden * s.vocab * rows * generated)


def micro_batches(prompt_ids: list[list[int]], completion_ids: list[list[int]], size: int) -> list[tuple[int, int]]:
    """(distinct prompts, rows) of each micro-batch the update cuts (podsrl's order: prompt groups
    together, :func:`podsrl.train.update.micro_batch_order`)."""
    from podsrl.train.update import micro_batch_order

    order = micro_batch_order(prompt_ids, completion_ids)
    chunks = [order[i : i + size] for i in range(0, len(order), size)]
    return [(len({tuple(prompt_ids[i]) for i in chunk}), len(chunk)) for chunk in chunks]


def fraction(flop: Flop, seconds: float | None, compute_gflops: float | None, output_gflops: float | None) -> float | None:
    """The time ``flop`` takes at the peaks over ``seconds`` (None where something is missing)."""
    if not seconds or not compute_gflops or not output_gflops:
        return None
    return flop.ideal_seconds(compute_gflops, output_gflops) / seconds


# ------------------------------------------------------------------------------------ the machine


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


KERNELS = ("F.linear", "oneDNN")  # the ways a product is timed (kernels_for)


def kernels_for(device) -> list[str]:
    """The kernels a product is timed with (module docstring): ``F.linear`` everywhere (what the update
    computes with); on an x86-64 CPU whose torch has oneDNN's linear ops
    (:func:`podsrl.engines.linear.available`) also ``oneDNN`` over a weight reordered for the product's
    rows, what the transformers engine samples with there and vLLM's CPU build computes with. A
    kernel that refuses the dtype on this CPU (oneDNN's bfloat16 without avx512bw or avx_ne_convert)
    is left out by :func:`best_product`."""
    if device.type != "cpu":
        return ["F.linear"]
    from podsrl.engines.linear import available

    return list(KERNELS) if available() else ["F.linear"]


def product_gflops(m: int, k: int, n: int, dtype, device, *, max_seconds: float = 2.0, kernel: str = "F.linear") -> float:
    """GFLOP/s of the product a linear layer of ``k`` inputs and ``n`` outputs makes on ``m`` tokens in
    ``dtype``, as the model computes it (``F.linear``: the weight [n x k]; on this project's CPU
    ``torch.matmul`` of a [k x n] bfloat16 matrix takes a path 7x slower than the layer's) or, with
    ``kernel="oneDNN"``, as the transformers engine samples on a CPU (``_linear_pointwise`` over the
    weight reordered once for ``m`` rows, outside the timing: podsrl.engines.linear): 2mkn over
    the median of the 3 fastest of 3-7 samples (module docstring); on a GPU a sample is as many
    back-to-back products as take about 5 ms."""
    import torch
    from torch.nn.functional import linear

    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
    weight = torch.randn(n, k, generator=gen).to(device=device, dtype=dtype)
    if kernel == "oneDNN":
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, m)  # raises where oneDNN refuses the dtype

        def product():
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    elif kernel == "F.linear":

        def product():
            return linear(x, weight)
    else:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    product()  # warm-up: the library's kernel choice, the allocator
    _sync(device)
    inner = 1
    if device.type == "cuda":
        start = time.perf_counter()
        for _ in range(10):
            product()
        _sync(device)
        inner = max(1, math.ceil(0.005 / ((time.perf_counter() - start) / 10)))
    samples: list[float] = []
    spent = 0.0
    while len(samples) < 3 or (len(samples) < 7 and spent < max_seconds):
        _sync(device)
        start = time.perf_counter()
        for _ in range(inner):
            product()
        _sync(device)
        took = time.perf_counter() - start
        samples.append(took / inner)
        spent += took
    return 2.0 * m * k * n / statistics.median(sorted(samples)[:3]) / 1e9


def best_product(m: int, k: int, n: int, dtype, device) -> dict:
    """The product timed with each of :func:`kernels_for` (:func:`product_gflops`): ``{"gflops": the
    best rate, "kernel": its kernel, "kernels": {kernel: rate}}``; a kernel that raises for this dtype
    on this machine is left out (``F.linear``'s errors are not caught)."""
    rates = {}
    for kernel in kernels_for(device):
        try:
            rates[kernel] = product_gflops(m, k, n, dtype, device, kernel=kernel)
        except RuntimeError:
            if kernel == "F.linear":
                raise
    best = max(rates, key=rates.get)
    return {"gflops": rates[best], "kernel": best, "kernels": rates}


def matmul_peak(shapes: Shapes, tokens: list[int], dtype_name: str, device, *, emulated: bool) -> dict:
    """The precision's peak at the model's shapes (module docstring): every product of a forward at
    each of ``tokens`` rows; the best product's rate."""
    import torch

    dtype = getattr(torch, dtype_name)
    rows = []
    for m in sorted(set(tokens)):
        for name, k, n in shapes.products():
            rows.append({"product": name, "M": m, "K": k, "N": n, **best_product(m, k, n, dtype, device)})
    best = max(rows, key=lambda r: r["gflops"])
    return {"gflops": best["gflops"], "best": {k: best[k] for k in ("product", "M", "K", "N", "kernel")}, "emulated": emulated, "products": rows,
            "how": "2MKN over the median of the 3 fastest of 3-7 timed products, each with every kernel of kernels_for; the peak is the best product's"}  # fmt: skip


def decode_rate(shapes: Shapes, rows: int, dtype_name: str, device) -> dict:
    """The rate the machine multiplies one decode step's products at: ``rows`` tokens (one a row)
    through every product of a forward in ``dtype_name`` (a layer's L times, the output layer once),
    their FLOP over the time they take, each product timed as the peak's are (:func:`best_product`: its
    best kernel).
    What an engine could reach at that call size if it did nothing but those products."""
    import torch

    dtype = getattr(torch, dtype_name)
    rates: dict[tuple[int, int], float] = {}
    flop = seconds = 0.0
    for k, n, count in [*((k, n, shapes.layers) for _, k, n in shapes.layer_products()), (shapes.hidden, shapes.vocab, 1)]:
        if (k, n) not in rates:
            rates[(k, n)] = best_product(rows, k, n, dtype, device)["gflops"]
        f = 2.0 * rows * k * n * count
        flop, seconds = flop + f, seconds + f / (rates[(k, n)] * 1e9)
    return {"rows": rows, "dtype": dtype_name, "gflops": flop / seconds / 1e9,
            "how": "a forward's products at M = the call's rollouts, each timed as the peak's (its best kernel); FLOP over their summed time"}  # fmt: skip


def settle_peaks(entry: dict, after: dict) -> None:
    """The peaks measured again after the phases (``after``): each precision's higher of the two is the
    peak every fraction is against, and the rows' fractions are recomputed. The machine reached that
    rate; a peak measured low (the machine slowed or busy for that minute: this project's runs measured
    144-177 GFLOP/s on the same CPU and day) would flatter every fraction."""
    before = entry["peak"]
    entry["peak_before"], entry["peak_after"] = before, after
    entry["peak"] = {p: max(before[p], after[p], key=lambda v: v["gflops"]) for p in before}
    for row in entry["update"]:
        figures = update_figures(row, Flop(**row["flop"]["forward_parts"]), row["tokens"], entry["peak"], mixed=row["mixed_precision"])
        row["fraction"] = figures["fraction"]
    for row in entry["sampler"]:
        peak = entry["peak"].get(row["dtype"], {}).get("gflops")
        row["fraction"] = row["gflops"] / peak if peak else None


BESIDE_SECONDS = 0.5  # a probe of the peak beside a round: product_gflops's max_seconds (3 samples at least)


class Beside:
    """The peak's best product timed again beside every timed round (module docstring, "the peak
    beside"). ``probe(precisions)`` times each precision's best product of the run's peak (its shape and
    kernel) for about ``BESIDE_SECONDS``; :meth:`rounds` turns the probes taken before a run of
    consecutive rounds and after each of them into each round's peak beside it: the higher of the probe
    just before and the one just after, per precision."""

    def __init__(self, peaks: dict, device):
        self.best = {p: v["best"] for p, v in peaks.items()}
        self.device = device

    def probe(self, precisions) -> dict[str, float]:
        import torch

        return {p: product_gflops(self.best[p]["M"], self.best[p]["K"], self.best[p]["N"], getattr(torch, p), self.device,
                                  max_seconds=BESIDE_SECONDS, kernel=self.best[p].get("kernel", "F.linear"))
                for p in precisions}  # fmt: skip

    @staticmethod
    def rounds(probes: list[dict[str, float]]) -> list[dict[str, float]]:
        """[before round 1, after round 1, after round 2, ...] -> each round's peak beside it."""
        return [{p: max(a[p], b[p]) for p in b} for a, b in zip(probes, probes[1:])]


def machine(device, threads: int) -> dict:
    """What the run ran on: the device, the CPU's model and bfloat16 support (podsrl's reading), versions."""
    import torch
    import transformers

    from podsrl.engines.dtype import cpu_bf16, cpu_model, gpu_bf16

    info = {"device": device.type, "cpu": cpu_model(), "cpus": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES")}  # fmt: skip  # podsrl's CLI sets podsrl.hostmem.KEPT
    if device.type == "cuda":
        native = gpu_bf16()
        info.update(gpu=torch.cuda.get_device_name(device), native_bf16=native,
                    bf16_reason="torch.cuda.is_bf16_supported(including_emulation=False)" + ("" if native else " is false"))  # fmt: skip
        info["name"] = _slug(info["gpu"])
    else:
        native, why = cpu_bf16()
        info.update(native_bf16=native, bf16_reason=why, name=_slug(f"cpu {info['cpu']}"))
    return info


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ------------------------------------------------------------------------------------ models


def build_model(name: str, device, seed: int = 0):
    """(model in float32 on ``device``, its Shapes, pad id, tokenizer or None, model path or None):
    the embedded model (EMBEDDED: its weights and tokenizer) or an ARCHS one with random weights."""
    import torch

    if name == EMBEDDED:
        from podsrl.config import ModelConfig
        from podsrl.models import load_policy, resolve_model_path

        policy = load_policy(ModelConfig(name=name, dtype="float32", device=device.type))
        config = policy.model.config.to_dict()
        return policy.model, Shapes.of(config), policy.tokenizer.pad_token_id, policy.tokenizer, resolve_model_path(name)
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    family, arch = ARCHS[name]
    config = (LlamaConfig if family == "llama" else Qwen2Config)(**arch)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model, Shapes.of(arch), 0, None, None


def _optimizer(model):
    """podsrl's AdamW (fused where torch has it) and schedule, at the default settings."""
    from podsrl.config import Config
    from podsrl.train.loop import make_optimizer

    return make_optimizer(Config(), model)


# ------------------------------------------------------------------------------------ the update


def time_update(model, optimizer, scheduler, batch, settings, *, repeats: int, device, warm_up: bool = True, beside: Beside | None = None,
                precisions=()) -> dict:  # fmt: skip
    """A warm-up update (``warm_up``), then ``repeats`` timed ones: median seconds per phase (forward,
    backward, optimizer, rest, update) and, on a GPU, the peak memory of the timed ones. With ``beside``,
    ``precisions``' best products probed before the first timed update and after each (``beside``: each
    round's peak beside it, :meth:`Beside.rounds`)."""
    import torch

    from podsrl.train.update import run_update
    from step_split import PhaseClock

    model.train()
    clock = PhaseClock()
    remove = clock.install(model)
    try:
        if warm_up:
            run_update(model, optimizer, scheduler, batch, settings)
        cuda = device.type == "cuda"
        if cuda:
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        runs = []
        probes = [beside.probe(precisions)] if beside else []
        for _ in range(repeats):
            clock.current = {}
            _sync(device)
            start = time.perf_counter()
            run_update(model, optimizer, scheduler, batch, settings)
            _sync(device)
            total = time.perf_counter() - start
            p = clock.current
            clock.current = None
            forward = p.get("prompt_fwd", 0.0) + p.get("completion_fwd", 0.0) + p.get("sequence_fwd", 0.0)
            backward, step = p.get("backward", 0.0), p.get("optimizer", 0.0)
            runs.append({"forward": forward, "backward": backward, "optimizer": step, "rest": total - forward - backward - step, "update": total})
            if beside:
                probes.append(beside.probe(precisions))
        out = {"seconds": {k: statistics.median(r[k] for r in runs) for k in runs[0]}, "rounds": runs, "peak_mib": None, "peak_above_base_mib": None}
        if beside:
            out["beside"] = Beside.rounds(probes)
        if cuda:
            peak = torch.cuda.max_memory_allocated(device)
            out.update(peak_mib=peak / 2**20, peak_above_base_mib=(peak - base) / 2**20)
        return out
    finally:
        remove()


def update_figures(measured: dict, flop: Flop, tokens: int, peaks: dict, *, mixed: bool) -> dict:
    """Tokens and FLOP a second per phase, and each phase's fraction of the peak for the precision it
    runs in (module docstring)."""
    compute = peaks.get("bfloat16" if mixed else "float32", {}).get("gflops")
    output = peaks.get("float32", {}).get("gflops")  # the output layer: float32 weights, float32 under autocast too
    s = measured["seconds"]
    backward = flop.times(2.0)
    return {
        "flop": {"forward": flop.total, "backward": backward.total, "forward_parts": dataclasses.asdict(flop)},
        "tokens_per_second": {k: tokens / s[k] if s[k] else None for k in ("forward", "backward", "optimizer", "update")},
        "gflops": {"forward": flop.total / s["forward"] / 1e9 if s["forward"] else None,
                   "backward": backward.total / s["backward"] / 1e9 if s["backward"] else None,
                   "update": (flop + backward).total / s["update"] / 1e9},  # fmt: skip
        "fraction": {"forward": fraction(flop, s["forward"], compute, output), "backward": fraction(backward, s["backward"], compute, output),
                     "update": fraction(flop + backward, s["update"], compute, output)},  # fmt: skip
        "precision": {"compute": "bfloat16" if mixed else "float32", "output": "float32"},
        **({"fraction_beside": fractions_beside(measured, flop, mixed=mixed)} if measured.get("beside") else {}),
    }


def fractions_beside(measured: dict, flop: Flop, *, mixed: bool) -> dict:
    """Each phase's fraction of the peak beside it (module docstring): per timed round, against that
    round's peaks beside it (``measured["beside"]``, :meth:`Beside.rounds`); the median over the rounds."""
    compute = "bfloat16" if mixed else "float32"
    out = {}
    for phase, counted in (("forward", flop), ("backward", flop.times(2.0)), ("update", flop + flop.times(2.0))):
        values = [fraction(counted, r[phase], peaks[compute], peaks["float32"]) for r, peaks in zip(measured["rounds"], measured["beside"])]
        values = [v for v in values if v is not None]
        out[phase] = statistics.median(values) if values else None
    return out


def _batch(prompts: list[list[int]], rows_each: int, completion: int, vocab: int, gen):
    """An UpdateBatch of ``rows_each`` rows per prompt, random full-length completions, advantages +1 / -1."""
    import torch

    from podsrl.train.update import UpdateBatch

    prompt_ids = [p for p in prompts for _ in range(rows_each)]
    completions = [torch.randint(3, vocab - 1, (completion,), generator=gen).tolist() for _ in prompt_ids]
    return UpdateBatch(prompt_ids=prompt_ids, completion_ids=completions, advantages=torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(prompt_ids))]))


def _settings(completion: int, pad_id: int, micro_batch: int, mixed: bool):
    from podsrl.core.loss import LossSettings
    from podsrl.train.update import UpdateSettings

    return UpdateSettings(loss=LossSettings(eps_low=0.2, aggregation="sequence", max_completion_len=completion), pad_id=pad_id,
                          micro_batch_size=micro_batch, grad_clip=1.0, mixed_precision=mixed)  # fmt: skip


# ------------------------------------------------------------------------------------ the sampler


class _FixedLength:
    """Every completion exactly ``length`` tokens: the transformers engine and the static engine's
    ``generate`` suppress end-of-sequence in place (bench/_fixed_length.py: not ``min_new_tokens``, whose
    ``torch.where`` over the scores real calls do not pay), vLLM's SamplingParams get ``min_tokens``."""

    def __init__(self):
        self.length = 0

    def wrap_generate(self, model) -> None:
        from _fixed_length import hold_length

        hold_length(model)

    @staticmethod
    def hold_engine(engine) -> None:
        """The transformers engine: its own processors (its decode loop on a CPU is not ``generate``)."""
        from _fixed_length import SuppressEos

        engine.logits_processors = [SuppressEos(sorted(engine._eos_ids()))]

    @staticmethod
    def patch_vllm() -> None:
        import podsrl.engines.vllm as podsrl_vllm

        plain = podsrl_vllm._import_vllm

        def with_min_tokens():
            vllm, LLM, SamplingParams = plain()
            return vllm, LLM, lambda *a, **k: SamplingParams(*a, **{**k, "min_tokens": k.get("max_tokens", 0)})

        podsrl_vllm._import_vllm = with_min_tokens


def kv_cache_gib(shapes: Shapes, *, rollouts: int, max_len: int, dtype_bytes: int = 4) -> float:
    """vLLM's KV cache for a call of ``rollouts`` sequences of ``max_len`` tokens to run at once (keys
    and values of every layer, a quarter more for the blocks' rounding): at least bench/samplers.py's
    2 GiB. At 2 GiB 256 rollouts of 40 + 256 float32 tokens of SmolLM2-135M would not fit, and vLLM
    would run fewer at a time: another measurement than the call's."""
    need = 2 * shapes.layers * shapes.d_kv * dtype_bytes * rollouts * max_len * 1.25
    return max(2.0, need / (1 << 30))


def make_engines(names, model, tokenizer, path, *, max_len: int, threads: int | None, fixed: _FixedLength,
                 kv_gib: float | None = None) -> tuple[dict, dict, list]:  # fmt: skip
    """(engine name -> engine, engine name -> its precision name, skipped parts): bench/samplers.py's
    construction (vLLM's KV cache ``kv_gib``, default 2), each engine's completions held at ``fixed.length``."""
    import importlib.util

    import torch

    import samplers

    if "vllm" in names:
        fixed.patch_vllm()
    skipped, kept = [], []
    for name in names:
        if name == "vllm" and (importlib.util.find_spec("vllm") is None or path is None):
            skipped.append({"part": "sampler vllm", "why": "vLLM is not installed here, or the model is not on disk"})
            continue
        kept.append(name)
    args = argparse.Namespace(engines=",".join(kept), batch_size=128, sampler_dtype="fast", max_new_tokens=max_len, threads=threads,
                              kv_cache_gib=kv_gib)  # fmt: skip
    engines = samplers.make_engines(args, model, tokenizer, [[0] * 40], path)
    if "transformers" in engines:
        fixed.hold_engine(engines["transformers"])
    for name in ("transformers-static", "transformers-static-gqa"):
        if name in engines:
            fixed.wrap_generate(engines[name].sampler)
    from podsrl.engines.dtype import resolve_sampler_dtype

    sampler = resolve_sampler_dtype("fast", torch.float32).name
    dtypes = {name: ("float32" if name == "transformers" else sampler) for name in engines}
    return engines, dtypes, skipped


WARM_UP_SECONDS = 45.0  # GPU: a sampler's warm-up compiles its shape (about a minute expected, docs/engines.md): started only with this much left


def time_sampler(engines: dict, dtypes: dict, shapes: Shapes, prompts: list[list[int]], *, sizes, lengths, repeats: int, device, peaks: dict,
                 fixed: _FixedLength, deadline: float, skipped: list, warm_each_size: bool, out: list, beside: Beside | None = None) -> None:  # fmt: skip
    """Rollouts and tokens a second of each engine at each size and length, and its fraction of the
    peak in its precision (module docstring), one size after the other (a budget that runs out leaves
    whole sizes): each size's rows appended to ``out`` as soon as they are measured. With ``beside``,
    the engines' precisions' best products probed before each size's first timed call and after every
    timed call: each call's fraction of the peak beside it, their median the row's."""
    from podsrl.engines import Sampling

    def call(engine, size: int, length: int, seed: int) -> tuple[float, int, list[int]]:
        k = distinct_prompts(size)
        fixed.length = length
        _sync(device)
        start = time.perf_counter()
        result = engine.generate(prompts[:k], Sampling(n=size // k, temperature=1.0, top_p=1.0, max_new_tokens=length, seed=seed))
        _sync(device)
        seconds, tokens = time.perf_counter() - start, sum(map(len, result.completion_ids))
        if tokens != size * length:  # the FLOP counts assume every row its length (_FixedLength)
            raise RuntimeError(f"peak.py: {type(engine).__name__} made {tokens} tokens, not {size} x {length}: the fixed length did not hold")
        return seconds, tokens, list(getattr(engine, "calls", []))

    warm: dict[tuple[str, int], float] = {}
    rates: dict[tuple[int, str], dict] = {}  # (rollouts, dtype) -> decode_rate
    for size in sizes:
        for name, engine in engines.items():
            if not (warm_each_size or size == sizes[0]):  # a GPU compiles per shape; a CPU only warms its allocator
                continue
            if deadline - time.monotonic() < (WARM_UP_SECONDS if warm_each_size else 0.0):
                skipped.append({"part": f"sampler warm-up {name} {size}", "why": "budget"})
                continue
            warm[(name, size)], _, calls = call(engine, size, min(lengths), seed=100)
            print(f"  sampler warm-up {name:>19} {size:4d} rollouts: {warm[(name, size)]:7.2f} s" + (f" (calls of {calls})" if calls else ""), flush=True)
        times: dict[tuple[str, int], list[tuple[float, int, list[int]]]] = {}
        precisions = sorted(set(dtypes.values()))
        last = None  # the probe just before the next timed call (none yet: the warm-ups ran since)
        around: dict[tuple[str, int], list[dict[str, float]]] = {}  # each timed call's peaks beside it
        for rep in range(repeats):
            for length in lengths:
                order = list(engines.items()) if rep % 2 == 0 else list(engines.items())[::-1]
                for name, engine in order:
                    if (name, size) not in warm and warm_each_size:
                        continue  # its warm-up (a GPU's compile for the shape) did not fit the budget
                    if time.monotonic() > deadline:
                        skipped.append({"part": f"sampler {name} {size}x{length} round {rep + 1}", "why": "budget"})
                        continue
                    if beside and last is None:
                        last = beside.probe(precisions)
                    seconds, tokens, calls = call(engine, size, length, seed=rep)
                    times.setdefault((name, length), []).append((seconds, tokens, calls))
                    if beside:
                        after = beside.probe(precisions)
                        around.setdefault((name, length), []).extend(Beside.rounds([last, after]))
                        last = after
                    print(f"  sampler round {rep + 1} {name:>19} {size:4d} x {length:3d} tokens: {tokens:6d} tokens in {seconds:7.2f} s", flush=True)
        for (name, length), values in times.items():
            seconds = statistics.median(v[0] for v in values)
            tokens = statistics.median(v[1] for v in values)
            k = distinct_prompts(size)
            flop = sum((sampling_flop(shapes, prompt=len(p), generated=length, rows=size // k, prompts=1) for p in prompts[:k]), Flop())
            peak = peaks.get(dtypes[name], {}).get("gflops")
            if (size, dtypes[name]) not in rates:
                rates[(size, dtypes[name])] = decode_rate(shapes, size, dtypes[name], device)
            decode = rates[(size, dtypes[name])]["gflops"]
            row = {"engine": name, "dtype": dtypes[name], "rollouts": size, "completion": length, "prompt": statistics.mean(len(p) for p in prompts[:k]),
                   "prompts": k, "seconds": seconds, "call_seconds": [v[0] for v in values], "tokens": tokens, "calls": values[-1][2] or None, "warmup_seconds": warm.get((name, size)),
                   "tokens_per_second": tokens / seconds, "rollouts_per_second": size / seconds, "flop": flop.total,
                   "gflops": flop.total / seconds / 1e9, "fraction": fraction(flop, seconds, peak, peak),
                   "decode_gflops": decode, "of_decode_rate": flop.total / seconds / 1e9 / decode}  # fmt: skip
            if (name, length) in around:  # each timed call against the peak beside it (module docstring)
                beside_peaks = [peaks_by[dtypes[name]] for peaks_by in around[(name, length)]]
                row.update(beside_gflops=beside_peaks, fraction_beside=statistics.median(fraction(flop, v[0], b, b) for v, b in zip(values, beside_peaks)))
            out.append(row)


PROFILE_OPS = 12  # the operators a profiled call lists, by their own (self) CPU time


def profile_call(engine, name: str, prompts: list[list[int]], *, rollouts: int, length: int, fixed: _FixedLength) -> dict:
    """Where one sampling call's time goes (``--profile RxC``, CPU): torch's profiler around a call of
    ``rollouts`` x ``length`` tokens, the operators with the most self CPU time (summed over threads:
    shares of the profiled total, not of the wall clock)."""
    from torch.profiler import ProfilerActivity, profile

    from podsrl.engines import Sampling

    k = distinct_prompts(rollouts)
    fixed.length = length
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompts[:k], Sampling(n=rollouts // k, temperature=1.0, top_p=1.0, max_new_tokens=length, seed=7))
    seconds = time.perf_counter() - start
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    ops = [{"op": e.key, "self_seconds": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total, "calls": e.count}
           for e in events[:PROFILE_OPS]]  # fmt: skip
    print(f"  profile {name} {rollouts} x {length}: " + ", ".join(f"{o['op']} {o['share']:.0%}" for o in ops[:5]), flush=True)
    return {"engine": name, "rollouts": rollouts, "completion": length, "seconds": seconds, "profiled_cpu_seconds": total / 1e6, "ops": ops}


class _Rows(list):
    """A list that rewrites the report whenever a row is appended."""

    def __init__(self, report: Report):
        super().__init__()
        self.report = report

    def append(self, row) -> None:
        super().append(row)
        self.report.write()


# ------------------------------------------------------------------------------------ the run


class Report:
    """The JSON file, rewritten after every part."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def attention_ways(name: str, shapes: Shapes, sizes: Sizes, device, deadline: float) -> list[dict]:
    """A decode step's attention over the sampler's calls (rollouts x prompt + completion positions) in the
    sampler's precision, three ways (bench/attention.py: the KV cache copied per query head, as
    transformers' ``sdpa`` does with a mask; PyTorch's ``enable_gqa``; the query heads grouped)."""
    import torch

    import attention

    from podsrl.engines.dtype import resolve_sampler_dtype

    heads = attention.Heads(name, shapes.heads, shapes.kv_heads, shapes.head_dim, shapes.layers)
    dtype = resolve_sampler_dtype("fast", torch.float32).name
    rows = attention.measure(heads, list(sizes.sampler_rollouts), [sizes.prompt + c for c in sizes.sampler_lengths], dtype, device, deadline=deadline)
    for r in rows:
        print(f"{name}: attention of a decode step at {r['rows']} x {r['positions']} ({dtype}): "
              + ", ".join(f"{way} {1e3 * f['step_seconds']:.3g} ms ({f['vs_copied']:.2f}x)" for way, f in r["ways"].items()), flush=True)  # fmt: skip
    return rows


def run(args: argparse.Namespace, sizes: Sizes, report: Report, deadline: float) -> None:
    """Every model of ``sizes`` in order: its peaks, the update per length and precision (CPU) or per
    method (GPU), then the sampler where this model samples."""
    import torch

    device = torch.device("cuda" if args.gpu and not args.tiny else "cpu")
    gpu = args.gpu
    gen = torch.Generator().manual_seed(args.seed)
    for name in sizes.models:
        entry = report.data["models"].setdefault(name, {"update": [], "sampler": [], "skipped": []})
        skipped = entry["skipped"]

        def left(part: str) -> bool:
            if deadline - time.monotonic() < MIN_PART_SECONDS:
                skipped.append({"part": part, "why": f"budget: under {MIN_PART_SECONDS:.0f} s of --budget left"})
                report.write()
                return False
            return True

        if not left(f"{name}: every part"):
            continue
        model, shapes, pad_id, tokenizer, path = build_model(name, device, args.seed)
        entry.update(arch=dataclasses.asdict(shapes), dense_parameters=shapes.dense, parameters=sum(p.numel() for p in model.parameters()),
                     weights="embedded" if name == EMBEDDED else "random")  # fmt: skip
        # The peaks at the update's micro-batch tokens (module docstring).
        tokens = [min(sizes.rows, sizes.micro_batch) * c for c in sizes.lengths] if not gpu else [sizes.micro_batch * c for c in sizes.lengths]
        native = report.data["machine"]["native_bf16"]
        entry["peak"] = {p: matmul_peak(shapes, tokens, p, device, emulated=p == "bfloat16" and not native) for p in PRECISIONS}
        rates = ", ".join(f"{p} {v['gflops']:.1f} GFLOP/s" for p, v in entry["peak"].items())
        print(f"{name}: peak {rates}", flush=True)
        report.write()
        beside = Beside(entry["peak"], device)
        optimizer, scheduler = _optimizer(model)
        vocab = shapes.vocab
        if gpu:
            prompts = [torch.randint(3, vocab - 1, (sizes.prompt,), generator=gen).tolist() for _ in range(sizes.prompts)]
            jobs = [(label, mixed, completion, _batch(prompts, m, completion, vocab, gen)) for completion in sizes.lengths for mixed in sizes.mixed
                    for label, n, m in METHODS]  # fmt: skip
            labels = {label: (n, m) for label, n, m in METHODS}
        else:
            prompt = torch.randint(3, vocab - 1, (sizes.prompt,), generator=gen).tolist()
            jobs = [(f"{sizes.rows} rows", mixed, completion, _batch([prompt], sizes.rows, completion, vocab, gen)) for completion in sizes.lengths
                    for mixed in sizes.mixed]  # fmt: skip
        warmed: set[bool] = set()
        for label, mixed, completion, batch in jobs:
            if not left(f"{name}: update {label} {completion} tokens mixed_precision={mixed}"):
                continue
            micro = sizes.micro_batch if gpu else len(batch.completion_ids)
            # A warm-up update before each job on a GPU (kernels per shape); on a CPU before the first of each
            # precision only (gradients, AdamW's state): there an emulated bfloat16 update of 256 tokens takes minutes.
            warm_up = gpu or mixed not in warmed
            warmed.add(mixed)
            measured = time_update(model, optimizer, scheduler, batch, _settings(completion, pad_id, micro, mixed), repeats=sizes.repeats,
                                   device=device, warm_up=warm_up, beside=beside, precisions=("bfloat16", "float32") if mixed else ("float32",))  # fmt: skip
            flop = Flop()
            for prompts_in, rows_in in micro_batches(batch.prompt_ids, batch.completion_ids, micro):
                flop = flop + forward_flop(shapes, prompt=sizes.prompt, completion=completion, rows=rows_in, prompts=prompts_in)
            row_tokens = sum(map(len, batch.completion_ids))
            row = {"label": label, "completion": completion, "prompt": sizes.prompt, "rows": len(batch.completion_ids),
                   "prompts": len({tuple(p) for p in batch.prompt_ids}), "micro_batch": micro, "mixed_precision": mixed, "tokens": row_tokens,
                   **measured, **update_figures(measured, flop, row_tokens, entry["peak"], mixed=mixed)}  # fmt: skip
            if gpu:
                row["n"], row["m"] = labels[label]
            entry["update"].append(row)
            f = row["fraction"]
            print(f"{name}: update {label}, {sizes.prompt} + {completion} tokens, mixed precision {'on' if mixed else 'off'}: "
                  f"{measured['seconds']['update']:.3f} s, fraction of peak forward {f['forward']:.2f} backward {f['backward']:.2f} "
                  f"update {f['update']:.2f}" + (f" (beside {row['fraction_beside']['update']:.2f})" if row.get("fraction_beside") else "")
                  + (f", peak {row['peak_mib']:.0f} MiB" if row["peak_mib"] else ""), flush=True)  # fmt: skip
            report.write()
        optimizer.zero_grad(set_to_none=True)
        del optimizer, scheduler
        if sizes.sampler_model in (None, name) and shapes.kv_heads < shapes.heads and left(f"{name}: attention"):
            try:
                entry["attention"] = attention_ways(name, shapes, sizes, device, deadline - MIN_PART_SECONDS)
            except Exception as err:  # noqa: BLE001 - a way a kernel refuses (or that disagrees) must not cost the sampler's part
                skipped.append({"part": f"{name}: attention", "why": f"{type(err).__name__}: {err}"})
                print(f"{name}: attention three ways failed, recorded as skipped: {type(err).__name__}: {err}", flush=True)
            report.write()
        if sizes.engines and sizes.sampler_model in (None, name) and left(f"{name}: sampler"):
            fixed = _FixedLength()
            if tokenizer is None:
                import samplers

                tokenizer = samplers.StubTokenizer(pad=pad_id, eos=vocab - 1)
                model.generation_config.eos_token_id = tokenizer.eos_token_id
            model.eval()
            max_len = max(sizes.sampler_lengths) + sizes.prompt
            engines, dtypes, more = make_engines(sizes.engines, model, tokenizer, path, max_len=max_len, threads=args.threads or None, fixed=fixed,
                                                 kv_gib=kv_cache_gib(shapes, rollouts=max(sizes.sampler_rollouts), max_len=max_len))  # fmt: skip
            skipped += more
            sample_prompts = [torch.randint(3, vocab - 1, (n,), generator=gen).tolist() for n in prompt_lengths(sizes.prompt, PROMPTS)]
            entry["sampler"] = rows = _Rows(report)  # a list to JSON; the report rewritten at each row
            time_sampler(engines, dtypes, shapes, sample_prompts, sizes=list(sizes.sampler_rollouts), lengths=list(sizes.sampler_lengths),
                         repeats=sizes.sampler_repeats, device=device, peaks=entry["peak"], fixed=fixed, deadline=deadline, skipped=skipped,
                         warm_each_size=gpu, out=rows, beside=beside)  # fmt: skip
            if args.profile:
                rollouts, length = args.profile
                entry["profile"] = [profile_call(engine, name, sample_prompts, rollouts=rollouts, length=length, fixed=fixed)
                                    for name, engine in engines.items()]  # fmt: skip
            for engine in engines.values():
                engine.close()
            del engines
            report.write()
        if left(f"{name}: the peaks again after the phases"):
            settle_peaks(entry, {p: matmul_peak(shapes, tokens, p, device, emulated=p == "bfloat16" and not native) for p in PRECISIONS})
            print(f"{name}: peak again " + ", ".join(f"{p} {v['gflops']:.1f} GFLOP/s" for p, v in entry["peak_after"].items())
                  + "; the fractions are against each precision's higher", flush=True)  # fmt: skip
            report.write()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def table(data: dict) -> str:
    """The run's one table (README layout)."""
    lines = ["| model | part | precision | completion | rows | tokens | seconds | tokens / s | GFLOP/s | of peak | of the peak beside |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for name, entry in data["models"].items():
        for precision, peak in entry.get("peak", {}).items():
            label = precision + (" (emulated)" if peak["emulated"] else "")
            b = peak["best"]
            lines.append(f"| {name} | peak: [{b['M']} x {b['K']}] x [{b['K']} x {b['N']}] ({b['product']}) | {label} | - | - | - | - | - | "
                         f"{peak['gflops']:.1f} | 1.00 | - |")  # fmt: skip
        for r in entry["update"]:
            precision = "bfloat16 + float32 output" if r["mixed_precision"] else "float32"
            for phase in ("forward", "backward", "optimizer", "update"):
                gflops = r["gflops"].get(phase)
                lines.append(f"| {name} | {r['label']}: {phase}{'' if phase != 'update' else ' (all)'} | {precision} | {r['completion']} | {r['rows']} | "
                             f"{r['tokens']} | {r['seconds'][phase]:.3f} | {num(r['tokens_per_second'][phase], '.0f')} | {num(gflops, '.1f')} | "
                             f"{num(r['fraction'].get(phase), '.2f')} | {num(r.get('fraction_beside', {}).get(phase), '.2f')} |")  # fmt: skip
            if r.get("peak_mib") is not None:
                lines.append(f"| {name} | {r['label']}: peak memory | - | {r['completion']} | {r['rows']} | - | - | - | - | "
                             f"{r['peak_mib']:.0f} MiB ({r['peak_above_base_mib']:.0f} above the weights and state) | |")  # fmt: skip
        for r in entry["sampler"]:
            lines.append(f"| {name} | sampler: {r['engine']} ({r['rollouts']} rollouts, {r['rollouts_per_second']:.1f} / s) | {r['dtype']} | "
                         f"{r['completion']} | {r['rollouts']} | {r['tokens']:.0f} | {r['seconds']:.3f} | {r['tokens_per_second']:.0f} | "
                         f"{r['gflops']:.1f} | {num(r['fraction'], '.2f')} | {num(r.get('fraction_beside'), '.2f')} |")  # fmt: skip
        for s in entry["skipped"]:
            lines.append(f"| {name} | skipped: {s['part']} | {s['why']} | | | | | | | | |")
    return "\n".join(lines)


def kernel_bests(peaks: dict) -> dict:
    """{precision: {kernel: its best product's GFLOP/s}} of a run's peaks, for runs that timed each
    kernel (:func:`best_product`); {} for older runs (``F.linear`` alone)."""
    out = {}
    for precision, peak in peaks.items():
        rows = [r for r in peak.get("products", []) if "kernels" in r]
        kernels = dict.fromkeys(k for r in rows for k in r["kernels"])
        if rows:
            out[precision] = {k: max(r["kernels"][k] for r in rows if k in r["kernels"]) for k in kernels}
    return out


def results_tables(data: dict) -> str:
    """The tables for docs/results.md, per model (``--table FILE``): the peaks; the update's phases
    (rows: phase and precision; columns: each batch and length: tokens a second and fraction of the
    peak; on a GPU the peak memory); the samplers (rows: engine; columns: rollouts x length)."""
    m = data["machine"]
    out = [f"{m.get('gpu') or m['cpu']}, {m['threads']} threads, torch {m['torch']}, bfloat16 {'native' if m['native_bf16'] else 'emulated'}"
           + (f", GLIBC_TUNABLES={m['glibc_tunables']}" if m.get("glibc_tunables") else "")  # runs since 2026-11-30 record it; podsrl's CLI sets one
           + f"; {data['date'][:10]}; `{data['command']}`"]  # fmt: skip
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for name, entry in data["models"].items():
        peaks = ", ".join(f"{p} {v['gflops']:.1f} GFLOP/s" + (" (emulated)" if v["emulated"] else "") for p, v in entry.get("peak", {}).items())
        if "peak_before" in entry:  # runs since 2026-11-29: measured before and after the phases
            peaks += " (each the higher of two measurements, before the phases and after: " + "; ".join(
                f"{p} {entry['peak_before'][p]['gflops']:.1f} and {entry['peak_after'][p]['gflops']:.1f}" for p in entry["peak"]) + ")"  # fmt: skip
        out += ["", f"**{name}** ({entry.get('weights', '?')} weights): matrix-product peak {peaks or '-'}", ""]
        by_kernel = kernel_bests(entry.get("peak", {}))
        if by_kernel:  # runs since the peak is timed with each kernel (kernels_for)
            out[-1:] = ["", "The best product with each kernel: " + "; ".join(
                f"{p} " + ", ".join(f"{kernel} {rate:.1f}" for kernel, rate in rates.items()) + " GFLOP/s" for p, rates in by_kernel.items()) + ".", ""]  # fmt: skip
        beside = any("fraction_beside" in r for r in [*entry["update"], *entry["sampler"]])  # runs since 2026-12-01 (Beside)
        if beside:
            probed = [b for r in entry["update"] for rnd in r.get("beside", []) for b in rnd.items()]
            probed += [(r["dtype"], b) for r in entry["sampler"] for b in r.get("beside_gflops", [])]
            spans = {p: [b for q, b in probed if q == p] for p in dict.fromkeys(q for q, _ in probed)}
            out[-1:] = ["", "The peak beside each timed round (the best product timed just before and just after it, the higher of the two): "
                        + "; ".join(f"{p} {min(v):.1f}-{max(v):.1f} GFLOP/s over {len(v)} rounds" for p, v in spans.items())
                        + "; \"of the peak beside\" is the median over the rounds of each round against it.", ""]  # fmt: skip
        extra = " | of the peak beside" if beside else ""
        columns = list(dict.fromkeys((r["label"], r["prompt"], r["completion"]) for r in entry["update"]))
        if columns:
            out.append("| update phase | precision | " + " | ".join(f"{label}, {p}+{c}: tokens/s | of peak{extra}" for label, p, c in columns) + " |")
            out.append("|---|---|" + ("---:|---:|" + "---:|" * bool(beside)) * len(columns))
            for mixed in dict.fromkeys(r["mixed_precision"] for r in entry["update"]):
                for phase in ("forward", "backward", "optimizer", "update"):
                    cells = []
                    for key in columns:
                        row = next((r for r in entry["update"] if (r["label"], r["prompt"], r["completion"]) == key and r["mixed_precision"] == mixed), None)
                        cells += ["-", "-"] if row is None else [num(row["tokens_per_second"][phase], ".0f"), num(row["fraction"].get(phase), ".2f")]
                        if beside:
                            cells.append("-" if row is None else num(row.get("fraction_beside", {}).get(phase), ".2f"))
                    label = "whole update" if phase == "update" else phase
                    out.append(f"| {label} | {'bfloat16 autocast' if mixed else 'float32'} | " + " | ".join(cells) + " |")
            memory = [next((r["peak_mib"] for r in entry["update"] if (r["label"], r["prompt"], r["completion"]) == key), None) for key in columns]
            if any(v is not None for v in memory):
                out.append("| peak memory (MiB) | | " + " | ".join(f"{num(v, '.0f')} | " + " | " * bool(beside) for v in memory).rstrip(" |") + " |")
        calls = list(dict.fromkeys((r["rollouts"], r["completion"]) for r in entry["sampler"]))
        if calls:
            out += [""] * (out[-1] != "") + ["| sampler | precision | " + " | ".join(f"{k} x {c}: tokens/s | of peak{extra}" for k, c in calls) + " |",
                                              "|---|---|" + ("---:|---:|" + "---:|" * bool(beside)) * len(calls)]  # fmt: skip
            for engine in dict.fromkeys(r["engine"] for r in entry["sampler"]):
                rows = {(r["rollouts"], r["completion"]): r for r in entry["sampler"] if r["engine"] == engine}
                dtype = next(iter(rows.values()))["dtype"]
                cells = []
                for key in calls:
                    row = rows.get(key)
                    cells += ["-", "-"] if row is None else [num(row["tokens_per_second"], ".0f"), num(row["fraction"], ".2f")]
                    if beside:
                        cells.append("-" if row is None else num(row.get("fraction_beside"), ".2f"))
                out.append(f"| {engine} | {dtype} | " + " | ".join(cells) + " |")
            decode = [r for r in entry["sampler"] if r.get("decode_gflops")]
            if decode:  # runs since 2026-11-29 (bench/peak.py's decode_rate)
                out += ["", "| sampler | call | GFLOP/s | a decode step's products at its rollouts: GFLOP/s | of that rate |", "|---|---|---:|---:|---:|"]
                out += [f"| {r['engine']} | {r['rollouts']} x {r['completion']} | {r['gflops']:.1f} | {r['decode_gflops']:.1f} | {r['of_decode_rate']:.2f} |"
                        for r in decode]  # fmt: skip
        if entry.get("attention"):  # runs since bench/attention.py (its three ways)
            import attention

            out += ["", "A decode step's attention over every layer, three ways (bench/attention.py):", "", attention.table({"rows": entry["attention"]})]
        for prof in entry.get("profile", []):  # --profile (runs since 2026-11-29)
            out += ["", f"Where a call of {prof['rollouts']} x {prof['completion']} tokens goes, **{prof['engine']}** (torch's profiler, "
                        f"self CPU time over all threads, {prof['profiled_cpu_seconds']:.1f} s in a call of {prof['seconds']:.1f} s):", "",
                    "| operator | self CPU s | share | calls |", "|---|---:|---:|---:|"]  # fmt: skip
            out += [f"| `{o['op']}` | {o['self_seconds']:.2f} | {o['share']:.1%} | {o['calls']} |" for o in prof["ops"]]
        if entry["skipped"]:
            out += ["", "Skipped: " + "; ".join(f"{s['part']} ({s['why']})" for s in entry["skipped"])]
    return "\n".join(out)


def headline(data: dict) -> str:
    """The last line (module docstring)."""
    m = data["machine"]
    where = f"{m.get('gpu') or 'cpu'}, bfloat16 {'native' if m['native_bf16'] else 'emulated'}"
    parts = []
    for name, entry in data["models"].items():
        for r in entry["update"]:
            f = r["fraction"]["update"]
            if f is not None:
                near = r.get("fraction_beside", {}).get("update")
                parts.append(f"{name} update {r['label']} {r['prompt']}+{r['completion']} {'mixed' if r['mixed_precision'] else 'float32'} {f:.2f}"
                             + (f" (beside {near:.2f})" if near is not None else ""))  # fmt: skip
        by = {}
        for r in entry["sampler"]:
            key = (r["rollouts"], r["completion"])
            if r["fraction"] is not None and (key not in by or r["fraction"] > by[key]["fraction"]):
                by[key] = r
        parts += [f"{name} sampler {r['engine']} {r['rollouts']}x{r['completion']} {r['fraction']:.2f}"
                  + (f" (beside {r['fraction_beside']:.2f})" if r.get("fraction_beside") is not None else "") for r in by.values()]  # fmt: skip
    return f"fraction of peak ({where}): " + ("; ".join(parts) or "nothing measured")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="the GPU mode: random-weight Qwen2.5-1.5B and 0.5B")
    parser.add_argument("--tiny", action="store_true", help="with --gpu: the GPU mode's code on this CPU, tiny random Qwen2 models")
    parser.add_argument("--quick", action="store_true", help="the CPU mode with a tiny random Llama: checks the script runs")
    parser.add_argument("--budget", type=float, default=None, help="minutes for the whole run (parts that would start past it are skipped)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default 1 on the CPU: the machine is shared; torch's on a GPU)")
    parser.add_argument("--rows", type=int, default=None, help="CPU: the update's rows of one prompt (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed updates and sampler rounds after the warm-up")
    parser.add_argument("--sampler-rollouts", default=None, help="comma-separated rollouts per sampling call")
    parser.add_argument("--lengths", default=None, help="comma-separated completion lengths, the update's and the sampler's (a shorter check)")
    parser.add_argument("--update-precision", choices=("both", "float32", "mixed", "none"), default=None,
                        help="the update with mixed precision off (float32), on (mixed) or both (the default; the GPU mode: mixed); "
                             "float32 alone skips the emulated bfloat16 update, minutes at 16 rows, on a CPU without native bfloat16; "
                             "none times no update (the peaks and the samplers only)")
    parser.add_argument("--engines", default=None, help="comma-separated samplers (default: transformers, transformers-static, vllm on the CPU); "
                                                        "none: no sampler (the peaks and the update only)")
    parser.add_argument("--profile", type=_call_size, default=None, metavar="RxC",
                        help="CPU: after the timed calls, profile one call of R rollouts of C tokens per engine (where its time goes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default results/peak/<machine>-<date>.json; quick runs: runs/peak/)")
    parser.add_argument("--out-dir", type=Path, default=None, help="the JSON file's directory, named as by default")
    parser.add_argument("--table", type=Path, default=None, help="measure nothing: print docs/results.md's tables of this JSON file")
    args = parser.parse_args(argv)
    if args.table:
        data = json.loads(args.table.read_text())
        print(results_tables(data))
        return data
    if args.profile and args.gpu:
        parser.error("--profile is the CPU mode's: torch's CPU profiler would not see a GPU's kernels")
    if args.tiny and not args.gpu:
        parser.error("--tiny is the GPU mode's code on the CPU: give --gpu too (the CPU mode's quick check is --quick)")
    import torch

    if args.gpu and not args.tiny and not torch.cuda.is_available():
        raise SystemExit("peak: --gpu: torch sees no GPU (torch.cuda.is_available() is false); on this CPU, --gpu --tiny runs its code")
    key = "gpu-tiny" if args.gpu and args.tiny else "gpu" if args.gpu else "cpu-quick" if args.quick else "cpu"
    sizes = SIZES[key]
    overrides = {}
    if args.rows:
        overrides["rows"] = args.rows
    if args.repeats:
        overrides.update(repeats=args.repeats, sampler_repeats=args.repeats)
    if args.sampler_rollouts:
        overrides["sampler_rollouts"] = tuple(int(x) for x in args.sampler_rollouts.split(","))
    if args.lengths:
        overrides["lengths"] = overrides["sampler_lengths"] = tuple(int(x) for x in args.lengths.split(","))
    if args.update_precision:
        overrides["mixed"] = {"both": (False, True), "float32": (False,), "mixed": (True,), "none": ()}[args.update_precision]
    if args.engines:
        overrides["engines"] = () if args.engines == "none" else tuple(x.strip() for x in args.engines.split(",") if x.strip())
    sizes = dataclasses.replace(sizes, **overrides)
    on_gpu = args.gpu and not args.tiny
    args.threads = args.threads if args.threads is not None else (None if on_gpu else 1)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.monotonic()
    deadline = started + 60 * args.budget if args.budget else math.inf
    device = torch.device("cuda" if on_gpu else "cpu")
    info = machine(device, torch.get_num_threads())
    now = datetime.datetime.now(datetime.timezone.utc)
    if args.out:
        path = args.out
    else:
        where = args.out_dir or (ROOT / ("runs/peak" if key in ("cpu-quick", "gpu-tiny") else "results/peak"))
        path = Path(where) / f"{info['name']}-{now:%Y-%m-%d}{'' if key in ('cpu', 'gpu') else '-' + key}.json"
    from podsrl.train.precision import resolve_mixed_precision

    auto = resolve_mixed_precision("auto", device)
    data = {"benchmark": "bench/peak.py", "command": "python bench/peak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": now.isoformat(timespec="seconds"), "mode": key, "machine": info, "mixed_precision_auto": auto.name,
            "mixed_precision_auto_reason": auto.reason, "sizes": dataclasses.asdict(sizes), "models": {}}  # fmt: skip
    report = Report(path, data)
    print(f"peak: {key} mode on {info.get('gpu') or info['cpu']} ({info['threads']} threads; bfloat16 "
          f"{'native' if info['native_bf16'] else 'emulated'}: {info['bf16_reason']}); writing {path}", flush=True)  # fmt: skip
    with _quiet():
        run(args, sizes, report, deadline)
    data["seconds"] = time.monotonic() - started
    report.write()
    print()
    print(table(data))
    print(f"\n# {data['command']}\n# {data['date']}, {data['seconds']:.0f} s; {path}")
    print(headline(data))
    return data


def _call_size(text: str) -> tuple[int, int]:
    """``--profile RxC``: rollouts and completion tokens of the profiled call."""
    try:
        rollouts, length = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give rollouts x tokens, e.g. 128x64") from None
    if rollouts < 1 or length < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: rollouts and tokens must be at least 1")
    return rollouts, length


@contextlib.contextmanager
def _quiet():
    """transformers' warnings about generation settings, once per call, are noise here."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from transformers.utils import logging as hf_logging

            before = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
        except ImportError:  # pragma: no cover
            before = None
        try:
            yield
        finally:
            if before is not None:
                hf_logging.set_verbosity(before)


if __name__ == "__main__":
    main()
