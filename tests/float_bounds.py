"""Float bounds derived from the computation, not tuned to one CPU's kernels (tests/README.md, "How a
float bound is chosen"). A bound here is what float32 arithmetic can promise for the computation,
from the data in the test, so that it holds with any x86-64 kernel (AVX2, AVX-512, AVX512-BF16, AMX).
"""

from __future__ import annotations

import math
import os

import torch

U32 = 2.0**-24  # float32's unit roundoff: one rounding moves a value by at most U32 of itself
U64 = 2.0**-53


def sum_bound(terms, u: float = U32) -> float:
    """The most rounding can move a float sum of ``terms`` from the exact one, in any order (any
    kernel's blocking): (n - 1) u sum |x_i| (Higham, Accuracy and Stability, 4.2; first order), and
    u of the result for storing it."""
    t = torch.as_tensor(terms, dtype=torch.float64).flatten()
    n = t.numel()
    return (max(n - 1, 0) + 1) * u * float(t.abs().sum())


def gradient_rtol(vocab_size: int) -> float:
    """The relative difference (in norm) two float32 computations of the tiny model's gradient may
    show when they differ only in summation order (micro-batching, packing, ranks, kernels): 4 U32
    sqrt(V). The longest reduction of the gradient is over the vocabulary (the log-softmax and the
    output layer's backward, V terms), and rounding errors of n terms grow like sqrt(n) U32 of their
    magnitude; each computation is within 2 U32 sqrt(V) of the exact gradient, and two of them
    within twice that (measured: 0.14-0.41 U32 sqrt(V) from a float64 copy of the model at V = 686
    and V = 49152, two float32 ones up to 0.5 U32 sqrt(V) apart; tests/README.md)."""
    return 4 * U32 * math.sqrt(vocab_size)


UBF16 = 2.0**-8  # bfloat16's unit roundoff (8 significant bits)
# The bfloat16 roundings on the gradient's path through one decoder layer of a Llama under autocast
# (podsrl.train.precision): forward, the q/k/v projections' input, weight and output (3), the
# attention's rotated q and k and its output (2), o_proj's weight and output (2), the MLP's gate/up
# input, weight and output (3), SiLU and the gate x up product (2), down_proj's weight and output (2);
# the backward as many again (each product's incoming gradient and its two outgoing ones).
BF16_ROUNDINGS_PER_LAYER = 2 * 14
# FSDP's MixedPrecisionPolicy(param_dtype=bfloat16) rounds besides: each layer's input (the residual
# stream, cast_forward_inputs) and each gradient before its float32 reduce-scatter.
FSDP_BF16_EXTRA_ROUNDINGS = 2


def autocast_gradient_rtol(num_layers: int, *, fsdp: bool = False) -> float:
    """How far (relative, in norm, per parameter) one gradient computed under bfloat16 autocast may
    lie from the exact one: 2 sqrt(n) UBF16, n the bfloat16 roundings on the longest path from a
    parameter to the loss and back (:data:`BF16_ROUNDINGS_PER_LAYER` per decoder layer, and FSDP's
    :data:`FSDP_BF16_EXTRA_ROUNDINGS` per layer with ``fsdp``). Each rounding moves a value by at most
    UBF16 of itself, independent roundings add like a random walk (the growth gradient_rtol takes
    for float32 sums), and the factor 2 is that rule's for one computation. The float32 arithmetic
    beside them (U32) is negligible. Measured on the tiny model (2 layers, V = 686, against a float64
    copy through run_update): 1.3-2.2 UBF16 per parameter, 0.15 of this bound (tests/README.md)."""
    n = num_layers * (BF16_ROUNDINGS_PER_LAYER + (FSDP_BF16_EXTRA_ROUNDINGS if fsdp else 0))
    return 2 * math.sqrt(n) * UBF16


def rel_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y|| / ||y|| in float64."""
    x, y = x.double(), y.double()
    return float((x - y).norm() / y.norm().clamp(min=1e-300))


def logprob_atol(vocab_size: int, magnitude: float) -> float:
    """How far (in nats) two float32 computations of one token's log-prob, z_y / T - logsumexp(z / T),
    may lie apart: each is within 2 U32 (|log p| + sqrt(V)) of the exact value (the rounding of
    values of magnitude |log p|, and the log-sum-exp's sum of V exponentials, whose relative error
    becomes its absolute error after the log), so two within twice that. ``magnitude``: the largest
    |log p| (or |z / T|, |logsumexp|) in the test's data."""
    return 4 * U32 * (magnitude + math.sqrt(vocab_size))


def entropy_atol(vocab_size: int, magnitude: float) -> float:
    """How far two float32 computations of one token's entropy, logsumexp(z / T) - sum_i p_i z_i / T,
    may lie apart: two V-term reductions of values of that magnitude, each as a log-prob's
    log-sum-exp (:func:`logprob_atol`), so twice its bound. A mean over tokens is within the largest."""
    return 2 * logprob_atol(vocab_size, magnitude)


def within(err: float, bound: float, what: str) -> bool:
    """err <= bound; with FLOAT_BOUNDS_LOG set, appends "what err bound" to that file (to see each
    bound's margin on a CPU: tests/README.md)."""
    log = os.environ.get("FLOAT_BOUNDS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}\t{what}\t{err:.3e}\t{bound:.3e}\n")
    return err <= bound


def batch_logprob_atol(model, batch, temperature: float = 1.0, *, entropy: bool = False) -> float:
    """``logprob_atol`` for ``model``'s log-probs of ``batch``'s completions (an UpdateBatch), their
    magnitude read from one forward; with ``entropy``, :func:`entropy_atol` at the same magnitude."""
    from podsrl.train.sequences import forward_logprobs, pack

    with torch.no_grad():
        logprobs, _ = forward_logprobs(model, pack(batch.prompt_ids, batch.completion_ids, 0), temperature=temperature)
    vocab = model.get_input_embeddings().weight.shape[0]
    mask = torch.arange(logprobs.shape[1])[None, :] < torch.tensor([len(c) for c in batch.completion_ids])[:, None]
    magnitude = float(logprobs[mask].abs().max())
    return entropy_atol(vocab, magnitude) if entropy else logprob_atol(vocab, magnitude)
