"""One token a row from processed scores, by inverse transform: the law of ``torch.multinomial`` on
their softmax, at one random number a row instead of one a vocabulary entry.

Why: transformers' ``generate`` samples with ``torch.multinomial(softmax(scores), 1)``, which on a
CPU draws an exponential variate for every entry of the vocabulary (``aten::exponential_``: 18% of a
128 x 64 sampling call of the embedded model under torch's profiler on this project's 2-core EPYC,
issue 66). Inverse transform sampling needs a uniform a row and a cumulative sum; bench/hf_engine.py
measures both side by side (results/hf-engine/, docs/engines.md).

How, for scores [R, V] (float32 logits after every processor; -inf for tokens a processor excluded):

1. ``p = softmax(scores)`` in float32 (as ``generate`` computes it), padded with zeros to a multiple
   of ``BLOCK`` entries and cut into blocks [R, K, BLOCK].
2. The cumulative sums within each block in float32, each block's total (its last one) and the
   cumulative sums of the totals across blocks in float64: the row's CDF in two levels.
3. ``u`` uniform on [0, total) (float64, the global generator); the block whose cumulative range holds
   ``u``, then the entry of that block whose range holds ``u`` minus the block's start.

Exactness: each token's chance is its interval of the two-level CDF, of width p_i up to the float32
rounding of the sums within its block (at most half an ulp of the block's total per entry, so at
most ``BLOCK`` half-ulps, about 1.5e-5 of the block's mass, over a block, in total variation; far
less in practice). A token of probability 0 (excluded) has an empty interval and is never drawn.
``torch.multinomial`` is itself exact only up to float32 rounding. The law test of both transformers
engines (tests/test_static_engine.py) and tests/test_draw.py check it.

Non-finite or all-zero probabilities (a NaN logit, every token excluded) stop the call with an error,
as ``torch.multinomial`` does: checked on the device (``torch._assert_async``), so a GPU's decode
loop is not synchronised for it.
"""

from __future__ import annotations

import torch

__all__ = ["BLOCK", "DrawTokens", "draw", "generate_kwargs", "warpers"]

BLOCK = 256  # vocabulary entries a block of the two-level CDF
CPU_SLICE_BYTES = 8 << 20  # a CPU draws in slices of rows whose float32 scores take about this many bytes


def draw(scores: torch.Tensor) -> torch.Tensor:
    """[R, V] scores (logits after processors; -inf excluded) -> [R] int64: one token a row, drawn from
    softmax(scores) (module docstring). On a CPU in slices of rows of about ``CPU_SLICE_BYTES`` a
    working tensor, which stay in the processor's cache (a scratch run at 256 x 49,152 on this
    project's EPYC: 70 ms at once, 21 ms in slices)."""
    if scores.device.type == "cpu":
        step = max(1, CPU_SLICE_BYTES // (4 * scores.shape[1]))
        if scores.shape[0] > step:
            return torch.cat([_draw(scores[i : i + step]) for i in range(0, scores.shape[0], step)])
    return _draw(scores)


def _draw(scores: torch.Tensor) -> torch.Tensor:
    rows, vocab = scores.shape
    p = torch.softmax(scores.float(), dim=-1)
    pad = (-vocab) % BLOCK
    if pad:
        p = torch.nn.functional.pad(p, (0, pad))
    within = p.view(rows, -1, BLOCK).cumsum(-1)  # [R, K, BLOCK] float32
    totals = within[..., -1].double()  # [R, K]
    ends = totals.cumsum(-1)  # [R, K] float64: where each block's range ends
    total = ends[:, -1:]  # [R, 1]
    torch._assert_async(torch.isfinite(total).all() & (total > 0).all(), "draw: the probabilities are not finite or sum to 0")
    u = torch.rand(rows, 1, dtype=torch.float64, device=scores.device) * total  # [R, 1] in [0, total)
    block = torch.searchsorted(ends, u, right=True).clamp_(max=ends.shape[1] - 1)  # [R, 1]
    start = ends.gather(1, block) - totals.gather(1, block)  # [R, 1]
    inner = within.gather(1, block[:, :, None].expand(rows, 1, BLOCK)).squeeze(1).double()  # [R, BLOCK]
    entry = torch.searchsorted(inner, u - start, right=True)  # [R, 1]
    # u - start can round past the block's own total (by ~1e-16): then the block's last positive entry.
    last = torch.searchsorted(inner, inner[:, -1:].contiguous(), right=False)  # the first index that reaches the total
    entry = torch.minimum(entry, last)
    return (block * BLOCK + entry).squeeze(1)


class DrawTokens:
    """A logits processor that goes last, under greedy decoding (``do_sample=False``): it draws each
    row's token (:func:`draw`) and returns scores that are 0 there and -inf elsewhere, so that
    ``generate``'s argmax picks the drawn token. transformers' decode loop is otherwise unchanged."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        token = draw(scores)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, token[:, None], 0.0)


def generate_kwargs(sampling, recorder=None) -> dict:
    """``generate``'s decoding arguments for :class:`podsrl.engines.base.Sampling`: greedy at temperature
    0; otherwise transformers' own ``TemperatureLogitsWarper`` and ``TopPLogitsWarper`` (in the order
    ``generate`` adds them under sampling), then ``recorder`` (a processor that sees the scores each
    token is drawn from) and :class:`DrawTokens`, under greedy decoding so that ``generate`` adds no
    warper of its own (nor the model's generation_config's top_k) and draws nothing itself."""
    greedy = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    if sampling.temperature == 0:
        return greedy
    from transformers import LogitsProcessorList

    processors = [*warpers(sampling), *([recorder] if recorder is not None else []), DrawTokens()]
    return dict(greedy, logits_processor=LogitsProcessorList(processors))


def warpers(sampling) -> list:
    """transformers' ``TemperatureLogitsWarper`` and ``TopPLogitsWarper`` for ``sampling`` (in the order
    ``generate`` adds them under sampling; none at temperature 0 or where they change nothing): what
    each token is drawn from after them (podsrl/engines/loop.py applies them itself)."""
    if sampling.temperature == 0:
        return []
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    out = [TemperatureLogitsWarper(sampling.temperature)] if sampling.temperature != 1.0 else []
    if sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(sampling.top_p))
    return out
