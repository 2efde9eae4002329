"""Completions of exactly the length asked for, for the samplers' benchmarks (bench/peak.py,
bench/hf_engine.py): a transformers model's ``generate`` wrapped to suppress end-of-sequence with
:class:`SuppressEos`, a logits processor that writes -inf into the EOS columns of each step's scores
in place (a few entries a row).

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
