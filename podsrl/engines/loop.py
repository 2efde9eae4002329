"""The transformers engine's own decode loop on a CPU: rows that have finished leave the batch
(issue 66).

Why: transformers' ``generate`` keeps every row of a call in the batch until the last one ends. A
call's completions rarely end together: on GSM8K-style tasks the embedded model's answers averaged
about 80 tokens under a 256-token limit, about a tenth of them cut at it (results/compare-long), so
most of a call's decode steps multiplied rows whose completion had already ended. vLLM drops a
finished sequence from its batch; this loop does too. Side by side on the embedded model at 128
rollouts of such lengths (bench/hf_engine.py's ``--ends``, docs/engines.md) the engine sampled 2.47x
``generate``'s tokens a second on this project's 2-core EPYC; at lengths held fixed, 1.00x: the same
loop as ``generate``'s, step for step.

What :func:`sample` does is ``generate``'s decode loop under the engine's arguments (its prefill from
the engine's cache, the positions ``generate`` derives from the left-padded attention mask, a
finished row fed the pad token, processors, then the draw or the argmax), with one change: once
the rows that have finished make up at least :data:`COMPACT_AT` of those still in the batch, they
leave it (the KV cache's ``batch_select_indices``, the mask, the positions). Rows are independent in
a causal LM's forward, so the remaining rows' logits are the same computation on fewer rows (the
products' rounding may differ in the last bits with the row count, as between calls of different
sizes). Under sampling each step draws one uniform a remaining row (podsrl/engines/draw.py), so
under a seed the draws differ from ``generate``'s once a row has left; the law is the same
(tests/test_loop.py and the engines' law test).

Where: :func:`applies` says; the engine keeps ``generate`` elsewhere: on another device than a CPU
(where the cache is not :mod:`podsrl.engines.decode`'s), under FSDP (every forward a collective:
all ranks step together), and where the model's generation config asks ``generate`` for something
this loop does not do (a repetition penalty, bad words, a minimum length, beams: any field outside
:data:`OWN_FIELDS` set away from its default).
"""

from __future__ import annotations

import inspect

import torch

from podsrl.engines.decode import ChunkedLayer
from podsrl.engines.draw import draw

__all__ = ["COMPACT_AT", "OWN_FIELDS", "applies", "sample"]

# finished rows, as a share of the rows in the batch, at which they leave it: each leaving copies the KV
# cache's remaining rows. Not tuned: 0, 0.1, 0.25 and 0.5 took the same time within the rounds' spread at
# 128 rollouts of up to 256 tokens (scratch, 2 rounds each, 2026-11-30: 66-79 s and 85-95 s a call).
COMPACT_AT = 0.25
# generation-config fields that the engine sets itself or that change nothing generate would draw
OWN_FIELDS = frozenset({
    "transformers_version", "_from_model_config", "_commit_hash", "use_cache", "output_attentions", "output_hidden_states",
    "output_scores", "output_logits", "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
    "do_sample", "temperature", "top_p", "top_k", "max_length", "max_new_tokens", "cache_implementation",
})  # fmt: skip


def applies(model: torch.nn.Module, cache) -> bool:
    """Whether the engine decodes with :func:`sample`: ``cache`` is the chunked cache of
    :func:`podsrl.engines.decode.chunked_cache` (a CPU, plain dynamic layers) and the model's
    generation config sets nothing outside :data:`OWN_FIELDS`."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not ChunkedLayer for layer in layers):
        return False
    config = getattr(model, "generation_config", None)
    return config is None or set(config.to_diff_dict()) <= OWN_FIELDS


@torch.no_grad()
def sample(model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor, cache, *, max_new_tokens: int,
           eos: set[int], pad: int, processors=(), greedy: bool, compact_at: float | None = None) -> torch.Tensor:  # fmt: skip
    """input_ids, attention [R, W] (left-padded); ``cache``: empty, or holding the first W - 1
    positions of every row (the engine's shared prefill). ``processors``: callables (sequences [A, W + t],
    scores [A, V] float32) -> scores, applied in order each step; then the argmax (``greedy``) or
    :func:`podsrl.engines.draw.draw`. ``compact_at``: :data:`COMPACT_AT` when None (read at the call).
    Returns [R, T] int64, T <= max_new_tokens: each row's tokens, the pad token after its EOS."""
    compact_at = COMPACT_AT if compact_at is None else compact_at
    rows = input_ids.shape[0]
    device = input_ids.device
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft passes the keywords on
    accepts = inspect.signature(base.forward).parameters
    extra = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}
    with_positions = "position_ids" in accepts
    positions = (attention.long().cumsum(-1) - 1).masked_fill(attention == 0, 1)  # generate's, from the mask
    cached = cache.get_seq_length()
    step_ids, step_positions = input_ids[:, cached:], positions[:, cached:]
    out = torch.full((rows, max_new_tokens), pad, dtype=torch.long, device=device)
    stops = torch.tensor(sorted(eos), device=device)
    active = torch.arange(rows, device=device)  # the batch's rows, as rows of the call
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # of the batch's rows
    sequences = input_ids
    for t in range(max_new_tokens):
        kwargs = {**extra, "position_ids": step_positions} if with_positions else extra
        logits = model(input_ids=step_ids, attention_mask=attention, past_key_values=cache, use_cache=True, **kwargs).logits
        scores = logits[:, -1].to(copy=True, dtype=torch.float32)
        for processor in processors:
            scores = processor(sequences, scores)
        tokens = scores.argmax(-1) if greedy else draw(scores)
        tokens = tokens.masked_fill(finished, pad)  # as generate pads a finished row
        out[active, t] = tokens
        finished = finished | torch.isin(tokens, stops)
        done = int(finished.sum())
        if done == len(active) or t == max_new_tokens - 1:
            return out[:, : t + 1]
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        attention = torch.cat([attention, attention.new_ones(len(active), 1)], dim=1)
        step_positions = step_positions[:, -1:] + 1
        if done >= max(1.0, compact_at * len(active)):
            keep = (~finished).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            active, finished, tokens, sequences = active[keep], finished[keep], tokens[keep], sequences[keep]
            attention, step_positions = attention[keep], step_positions[keep]
        step_ids = tokens[:, None]
    return out
