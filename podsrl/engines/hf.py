"""Rollouts with transformers on the policy model itself (no weight sync needed): ``generate``, or
on a CPU a decode loop of its own.

Prompts are left-padded, each repeated n times, and generated in chunks of ``batch_size``
sequences. A prompt's n rows share one prefill: its KV cache is computed once and copied to them
(:meth:`TransformersEngine._shared_prefill`), as vLLM's prefix caching does, instead of each row
running its prompt through the model again. On a CPU the cache grows in chunks instead of being
concatenated at every step (:mod:`podsrl.engines.decode`), and the engine decodes with a loop of
its own in which rows that have finished leave the batch (:mod:`podsrl.engines.loop`; ``generate``
keeps every row to the call's last step). Tokens are drawn by :mod:`podsrl.engines.draw` (softmax of the scores after
temperature and top-p, transformers' own warpers; the law of ``generate``'s ``torch.multinomial`` at
a fraction of its cost on a CPU). On a CPU its attention reads the KV cache's shared key/value heads
in place (:func:`podsrl.engines.attention.shared_kv_heads`) where transformers' ``sdpa`` would copy
them to every query head at every step, and its linear layers compute with oneDNN over weights
reordered once a call (:func:`podsrl.engines.linear.onednn_linears`). Sampling log-probs are not returned (``logprobs=None``): the
trainer recomputes them in its own forward pass, which it needs anyway.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

import podsrl.engines.loop as loop  # the module (tests switch loop.applies), not through the package: no import cycle
from podsrl.engines.attention import shared_kv_heads
from podsrl.engines.base import Rollouts, Sampling
from podsrl.engines.decode import chunked_cache
from podsrl.engines.draw import generate_kwargs, warpers
from podsrl.engines.linear import onednn_linears


class TransformersEngine:
    def __init__(self, model: torch.nn.Module, tokenizer, *, batch_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # FSDP: every forward is a collective, so all ranks keep stepping until the last one has
        # finished (transformers' ``synced_gpus``); podsrl.train.distributed sets it.
        self.synced_gpus = False
        # logits processors applied before the sampling ones, every step (the benchmarks hold a completion's
        # length with one: bench/_fixed_length.py)
        self.logits_processors: list = []

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollouts:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        eos = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        repeated = [ids for ids in prompt_ids for _ in range(sampling.n)]  # group-major
        completions: list[list[int]] = []
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            # On a CPU: no copy of the KV cache per query head (attention.py), the linear layers on oneDNN
            # (linear.py; not under FSDP, whose sharded weights it would not switch anyway).
            linears = contextlib.nullcontext() if self.synced_gpus else onednn_linears(self.model, min(self.batch_size, len(repeated)))
            with shared_kv_heads(self.model), linears:
                for start in range(0, len(repeated), self.batch_size):
                    chunk = repeated[start : start + self.batch_size]
                    width = max(len(ids) for ids in chunk)
                    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in chunk], device=device)
                    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk], device=device)
                    new = self._decode(input_ids, attention, self._cache(chunk, input_ids, attention), sampling, eos, pad)
                    for row in new.tolist():
                        completions.append(cut_at_eos(row, eos))
        finally:
            self.model.train(was_training)
        truncated = [not (ids and ids[-1] in eos) for ids in completions]
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompt_ids, completion_ids=completions, texts=texts, truncated=truncated)

    def _decode(self, input_ids: torch.Tensor, attention: torch.Tensor, cache, sampling: Sampling, eos: set[int], pad: int) -> torch.Tensor:
        """[R, T] the new tokens of a call's rows (pad after a row's EOS): the engine's own loop, in which
        finished rows leave the batch (podsrl/engines/loop.py), where it applies; ``generate`` elsewhere."""
        if not self.synced_gpus and loop.applies(self.model, cache):
            processors = [*self.logits_processors, *warpers(sampling)]
            return loop.sample(self.model, input_ids, attention, cache, max_new_tokens=sampling.max_new_tokens, eos=eos, pad=pad,
                               processors=processors, greedy=sampling.temperature == 0)  # fmt: skip
        kwargs = generate_kwargs(sampling)
        if self.logits_processors:
            from transformers import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList([*self.logits_processors, *kwargs.get("logits_processor", [])])
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, past_key_values=cache, max_new_tokens=sampling.max_new_tokens,
                                  pad_token_id=pad, eos_token_id=sorted(eos), synced_gpus=self.synced_gpus, **kwargs)  # fmt: skip
        return out[:, input_ids.shape[1] :]

    def _cache(self, chunk: list[list[int]], input_ids: torch.Tensor, attention: torch.Tensor):
        """The KV cache ``generate`` starts from: the shared prefill's (or None), its layers made
        :class:`podsrl.engines.decode.ChunkedLayer` s on a CPU (or an empty cache of them where there is
        no shared prefill); None leaves ``generate`` to build its own."""
        cache = self._shared_prefill(chunk, input_ids, attention)
        chunked = chunked_cache(self.model, cache)
        return chunked if chunked is not None else cache  # not ``or``: a cache's truth is its __len__

    def _shared_prefill(self, chunk: list[list[int]], input_ids: torch.Tensor, attention: torch.Tensor):
        """The KV cache of the call's rows [R, width - 1] (every token but the last), computed once per
        distinct prompt and copied to its rows; None where no prompt repeats, where the prompts are one
        token wide, under FSDP (a forward is a collective: every rank must run the same ones) or where the
        model's cache has other than plain dynamic layers (sliding windows, linear attention).
        ``generate`` then runs only the last prompt token through the model before decoding: its
        documented way to start from a cache ("prefix caching"), with the positions it derives from the
        attention mask, which this prefill uses too."""
        from transformers import DynamicCache

        from podsrl.engines.decode import DynamicLayer  # None before transformers 4.54: no layer is one, no shared prefill

        seen: dict[tuple[int, ...], int] = {}
        index = [seen.setdefault(tuple(ids), len(seen)) for ids in chunk]  # each row's distinct prompt
        if len(seen) == len(chunk) or input_ids.shape[1] < 2 or self.synced_gpus:
            return None
        cache = DynamicCache(config=self.model.config)
        if any(type(layer) is not DynamicLayer for layer in getattr(cache, "layers", [None])):
            return None
        first = torch.tensor([index.index(i) for i in range(len(seen))], device=input_ids.device)
        ids, mask = input_ids[first, :-1], attention[first, :-1]
        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # peft: whose generate runs
        accepts = inspect.signature(model.forward).parameters
        extra = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}  # the prefill's logits are not used
        if "position_ids" in accepts:  # as generate decides
            extra["position_ids"] = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # generate's, from the mask
        model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, **extra)
        cache.reorder_cache(torch.tensor(index, device=input_ids.device))  # index_select on the batch: distinct -> rows
        return cache

    def sync_weights(self, model: torch.nn.Module) -> None:
        pass  # generates with the live policy

    def close(self) -> None:
        pass

    def _eos_ids(self) -> set[int]:
        return eos_ids(self.tokenizer, self.model)


def eos_ids(tokenizer, model: torch.nn.Module) -> set[int]:
    """The ids that end a completion: the tokenizer's EOS and the model's generation_config's."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(extra)
    return {i for i in ids if i is not None}


def cut_at_eos(row: list[int], eos: set[int]) -> list[int]:
    """Keep tokens up to and including the first EOS (the rest is padding)."""
    for i, token in enumerate(row):
        if token in eos:
            return row[: i + 1]
    return row
