"""Completions of exactly the length asked for, for the samplers' benchmarks (bench/peak.py,
bench/hf_engine.py): a transformers model's ``generate`` wrapped to suppress end-of-sequence with
:class:`SuppressEos`, a logits processor that writes -inf into the EOS columns of each step's scores
in place (a few entries a row); the transformers engine takes it as one of its own
(``TransformersEngine.logits_processors``: its decode loop is not ``generate``). And completions of
varied lengths that every way of a call gives the same rows (:class:`EndAt`).

Why not transformers' ``min_new_tokens``: its processor (``MinNewTokensLengthLogitsProcessor``)
rebuilds the whole [rows, vocabulary] scores with ``torch.where`` at every step, about 10% of a 128 x
64 call of the embedded model on a CPU (results/peak/cpu-amd-epyc-2026-11-29-transformers-today.log,
``aten::where``): a cost that real calls, which stop at EOS, never pay, and that these benchmarks'
runs before commit 9a86a53 counted in the engines' time."""

from __future__ import annotations

from typing import Callable

import torch


class SuppressEos:
    """Logits processor: the scores of ``eos_ids`` set to -inf, in place (``generate`` hands each step's
    processors a float32 copy of the model's logits)."""

    def __init__(self, eos_ids):
        self.ids = sorted({eos_ids} if isinstance(eos_ids, int) else set(eos_ids))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.ids] = float("-inf")
        return scores


def hold_length(model) -> Callable:
    """Wrap ``model.generate`` so that every call generates its ``max_new_tokens`` tokens a row (EOS
    suppressed). Returns the plain ``generate``, to restore with ``model.generate = plain``."""
    from transformers import LogitsProcessorList

    plain = model.generate

    def generate(*args, **kwargs):
        eos = kwargs.get("eos_token_id", model.generation_config.eos_token_id)
        processors = LogitsProcessorList([SuppressEos(eos), *(kwargs.get("logits_processor") or [])])
        return plain(*args, **{**kwargs, "logits_processor": processors})

    model.generate = generate
    return plain


class EndAt(SuppressEos):
    """Logits processor: each row ends (EOS forced) when it reaches ``table[its first token]`` tokens,
    EOS suppressed before. ``width``: the call's prompt width (the processors see prompt and
    completion). The first token is drawn before any row could have ended, so ways of sampling that
    differ only after a row has ended (podsrl/engines/loop.py's rows leaving the batch) give every row
    the same length under one seed: the same tokens to time."""

    def __init__(self, eos_ids, width: int, table: torch.Tensor):
        super().__init__(eos_ids)
        self.width, self.table = width, table

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = super().__call__(input_ids, scores)
        made = input_ids.shape[1] - self.width  # tokens generated before this one
        if made >= 1:
            rows = (self.table[input_ids[:, self.width]] == made + 1).nonzero().squeeze(1)
            if len(rows):
                scores[rows] = float("-inf")
                scores[rows, self.ids[0]] = 0.0
        return scores


def ends_table(vocab: int, max_len: int, seed: int = 0) -> torch.Tensor:
    """[vocab] int64 lengths for :class:`EndAt`: a tenth ``max_len`` (cut at the limit), the rest
    log-normal (median 0.215 x max_len, log-sd 0.5) within [min(8, max_len), max_len]. At max_len 256
    (median 55) they average about 80 tokens: the embedded model's completions on GSM8K-style tasks
    averaged 65-115 tokens, 6-17% cut at 256 (results/compare-long)."""
    g = torch.Generator().manual_seed(seed)
    median = 0.215 * max_len
    lengths = (median * torch.exp(0.5 * torch.randn(vocab, generator=g))).round().long().clamp(min(8, max_len), max_len)
    lengths[torch.rand(vocab, generator=g) < 0.1] = max_len
    return lengths
