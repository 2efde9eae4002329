"""Rollouts with transformers ``generate`` on a sampler of the engine's own: a copy of the policy's
weights in the sampler dtype, a static KV cache, compiled decoding on a GPU, and each sampled token's
log-prob for the importance correction (``rollout.engine = "transformers-static"``; the GPU's
default when vLLM is not installed, docs/engines.md).

Why: :class:`podsrl.engines.hf.TransformersEngine` samples with the policy itself, in calls of
``rollout.generation_batch_size`` sequences, with the dynamic cache and eager kernels. On a GPU a
small model's decode step is then Python and kernel-launch overhead, nearly flat in the batch (issue
66: 135M, 64 tokens, 128 rollouts in 1.5 s and 512 in 7.9 s on an H100), so four calls cost four
times one. This engine does what vLLM does, with transformers alone:

- **Weights**: a plain transformers model of the policy's config (no LoRA layers, no FSDP) on the
  policy's device, in ``rollout.sampler_dtype`` resolved as for vLLM
  (:func:`podsrl.engines.dtype.resolve_sampler_dtype`: ``"fast"`` is bfloat16 on a GPU with native
  bfloat16). :meth:`StaticCacheEngine.sync_weights` copies the policy's current weights into it after
  every optimizer step (:func:`podsrl.models.merged_state_dict`: LoRA merged; FSDP's shards gathered
  one tensor at a time, every rank in the same order).
- **Calls**: a step's B x n rollouts in as few ``generate`` calls as memory allows. On a GPU, as many
  sequences a call as one sequence's static KV cache, its share of a decode step's logits and of the
  prefill's activations (:func:`bytes_per_row`) fit in ``MEMORY_SHARE`` of the memory free on the
  device (:func:`rows_that_fit`); on a CPU, ``rollout.generation_batch_size`` (there the arithmetic,
  not the number of calls, is the cost).
- **Decoding**: transformers' static cache (``cache_implementation="static"``). On a GPU transformers
  compiles the decode step itself (``torch.compile``, its ``CompileConfig``: mode "reduce-overhead",
  CUDA graphs; ``_valid_auto_compile_criteria`` in transformers 5.17 and 5.19), and the cache length
  is rounded up to ``CACHE_BUCKET`` tokens so that a batch of other prompt lengths reuses the compiled
  step (transformers keeps the longest cache length it has seen); on a CPU it runs eager (transformers
  compiles only on accelerators, and inductor's C++ build of a 30-layer model takes many minutes on a
  small CPU), its attention reading the static cache's shared key/value heads in place
  (:func:`podsrl.engines.attention.shared_kv_heads`). Transformers' continuous batching (``generate_batch``, paged attention) was tried
  too: far slower on this project's CPU in a scratch run, and its internals moved between
  transformers 5.17 and 5.19 (docs/engines.md: why, and what a GPU run must still measure).
- **The law**: the decode loop of ``generate`` that TransformersEngine runs, with the same processors
  in the same order (:func:`podsrl.engines.draw.generate_kwargs`): the model's own (its
  generation_config), then ``TemperatureLogitsWarper`` and ``TopPLogitsWarper``, then
  :class:`SampledLogprobs` (which sees the scores each token is drawn from), then
  :class:`podsrl.engines.draw.DrawTokens`, which draws each token from the softmax of those scores
  (the law of transformers' own ``torch.multinomial``, at a uniform a row instead of an exponential a
  vocabulary entry) under greedy decoding, so that transformers adds no warper of its own.
- **Log-probs**: ``Rollouts.logprobs`` holds each completion token's log-prob under the distribution
  it was drawn from: log softmax(logits / T), for top_p < 1 renormalised over the nucleus (vLLM's
  ``processed_logprobs``), of the sampler's float32 copy of its logits; what
  ``forward_logprobs(model, packed, temperature=T)`` recomputes when top_p = 1 and the dtypes agree.
  Greedy decoding (temperature 0: evaluation) draws from no distribution and returns none.

The sampler's RNG is the global one, seeded per call when ``Sampling.seed`` is given, inside
``torch.random.fork_rng`` so that the trainer's stream is left as it was.
"""

from __future__ import annotations

import copy
import math
import time

import torch

from podsrl.engines.attention import shared_kv_heads
from podsrl.engines.base import Rollouts, Sampling
from podsrl.engines.draw import generate_kwargs
from podsrl.engines.dtype import SamplerDtype, resolve_sampler_dtype
from podsrl.engines.hf import cut_at_eos, eos_ids

__all__ = ["CACHE_BUCKET", "MEMORY_SHARE", "SampledLogprobs", "StaticCacheEngine", "bytes_per_row", "rows_that_fit"]

MEMORY_SHARE = 0.8  # of the device's free memory (and torch's cached, unused blocks) one call may fill
CACHE_BUCKET = 256  # GPU: the static cache's length is a multiple of this, so compiled steps are reused
# Bytes per vocabulary entry and sequence that a decode step holds at its peak: the float32 copy of
# the logits (4), temperature's output (4), top-p's sorted values (4), int64 indices (8), softmax and
# cumulative sum (8) and masked scores (4), the log-prob recorder's scores (4) and sampling's softmax
# (4), and the model's own logits (up to 4): 44, rounded up.
LOGIT_BYTES = 48


def bytes_per_row(config, dtype: torch.dtype, cache_len: int, prompt_len: int) -> int:
    """The device memory one sequence of a ``generate`` call takes at its peak, in bytes: its static KV
    cache of ``cache_len`` tokens (keys and values of every layer, in ``dtype``) plus the larger of
    the prefill's activations over ``prompt_len`` tokens (about 5 hidden and 4 intermediate vectors a
    token, in ``dtype``) and a decode step's working set over the vocabulary (``LOGIT_BYTES`` an entry).
    ``config``: the model's (text) config. An estimate for sizing calls, not an allocator's count."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    intermediate = getattr(text, "intermediate_size", None) or 4 * text.hidden_size
    size = torch.finfo(dtype).bits // 8
    kv_cache = 2 * text.num_hidden_layers * kv_heads * head_dim * size * cache_len
    prefill = prompt_len * (5 * text.hidden_size + 4 * intermediate) * size
    step = text.vocab_size * LOGIT_BYTES
    return kv_cache + max(prefill, step)


def rows_that_fit(budget: int, per_row: int, rows: int) -> int:
    """How many of ``rows`` sequences one call takes within ``budget`` bytes at ``per_row`` bytes a
    sequence: at least 1 (a call of one sequence that does not fit fails as it would anyway, with
    torch's out-of-memory error), at most ``rows``."""
    return max(1, min(rows, budget // max(1, per_row)))


def device_budget(device: torch.device) -> int | None:
    """``MEMORY_SHARE`` of the memory a call may use on ``device``: what the driver reports free plus
    what torch's allocator holds cached but unused (the trainer's freed activations). None off a GPU."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(MEMORY_SHARE * (free + cached))


class SampledLogprobs:
    """A logits processor that goes last: it records the log-prob of each sampled token under the
    scores it was drawn from, and changes nothing.

    ``generate`` calls it once a step with the ids so far [rows, width + t] and the processed scores
    [rows, V] of step t; the token drawn from step t's scores is the last id of the next call, or, for
    the last step, of the returned sequences (:meth:`columns`). It holds one step's scores meanwhile."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []  # [rows] the log-prob of step t's token, per step
        self.pending: torch.Tensor | None = None  # [rows, V] the last step's log-softmax

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self.steps.append(self.pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self.pending = torch.log_softmax(scores, dim=-1)
        return scores

    def columns(self, new_ids: torch.Tensor) -> torch.Tensor:
        """[rows, S] log-probs of the generated ids ``new_ids`` [rows, S]. ``generate`` may have run
        steps past the ones it returns (its deferred stop check undoes them): those are dropped."""
        steps = self.steps[: new_ids.shape[1]]
        if len(steps) < new_ids.shape[1]:  # the last returned token was drawn from the pending scores
            steps.append(self.pending.gather(1, new_ids[:, len(steps) : len(steps) + 1]).squeeze(1))
        return torch.stack(steps, dim=1) if steps else new_ids.new_zeros(new_ids.shape, dtype=torch.float32)


class StaticCacheEngine:
    """The engine of the module docstring. ``model``: the policy (a transformers causal LM, under
    peft or FSDP or not); ``sampler_dtype``: what ``rollout.sampler_dtype`` resolved to;
    ``batch_size``: sequences a call off a GPU (``rollout.generation_batch_size``)."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, sampler_dtype: SamplerDtype, batch_size: int = 128):
        self.tokenizer = tokenizer
        self.sampler_dtype = sampler_dtype
        self.batch_size = batch_size
        self.device = _device(model)
        self.sampler = _plain_copy(model, sampler_dtype.dtype, self.device)
        self.eos = eos_ids(tokenizer, self.sampler)
        self.compiled = self.device.type == "cuda"  # transformers compiles a static cache's decoding there
        self.calls: list[int] = []  # sequences per generate call of the last generate (tests, bench)
        self.last_sync_seconds: float | None = None
        # Set under FSDP by podsrl.train.loop for TransformersEngine; this engine's sampler is whole on
        # every rank, so its generate runs no collective and needs no lockstep.
        self.synced_gpus = False
        self.sync_weights(model)

    @classmethod
    def from_config(cls, cfg, policy) -> StaticCacheEngine:
        """``cfg``: :class:`podsrl.config.RolloutConfig`; ``policy``: :class:`podsrl.models.Policy`."""
        sampler = resolve_sampler_dtype(cfg.sampler_dtype, _dtype(policy.model))
        return cls(policy.model, policy.tokenizer, sampler_dtype=sampler, batch_size=cfg.generation_batch_size)

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollouts:
        repeated = [ids for ids in prompt_ids for _ in range(sampling.n)]  # group-major
        width = max(len(ids) for ids in repeated)
        cache_len = width + sampling.max_new_tokens
        if self.compiled:
            cache_len = CACHE_BUCKET * math.ceil(cache_len / CACHE_BUCKET)
        size = self._call_size(len(repeated), cache_len, width)
        calls = math.ceil(len(repeated) / size)
        size = math.ceil(len(repeated) / calls)  # calls as even as can be (GPU: fewer compiled shapes)
        completions: list[list[int]] = []
        logprobs: list[list[float]] | None = None if sampling.temperature == 0 else []
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        self.calls = []
        with torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(repeated), size):
                chunk = repeated[start : start + size]
                self.calls.append(len(chunk))
                ids, lps = self._generate_call(chunk, sampling, cache_len)
                for row, row_lps in zip(ids, lps if lps is not None else [None] * len(ids)):
                    kept = cut_at_eos(row, self.eos)
                    completions.append(kept)
                    if logprobs is not None:
                        logprobs.append(row_lps[: len(kept)])
        truncated = [not (ids and ids[-1] in self.eos) for ids in completions]
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        return Rollouts(prompt_ids=prompt_ids, completion_ids=completions, texts=texts, truncated=truncated, logprobs=logprobs)

    def _call_size(self, rows: int, cache_len: int, prompt_len: int) -> int:
        """Sequences a call: all that fit on a GPU (module docstring), ``batch_size`` elsewhere."""
        budget = device_budget(self.device)
        if budget is None:
            return min(rows, self.batch_size)
        per_row = bytes_per_row(self.sampler.config, self.sampler_dtype.dtype, cache_len, prompt_len)
        return rows_that_fit(budget, per_row, rows)

    def _generate_call(self, chunk: list[list[int]], sampling: Sampling, cache_len: int):
        """One ``generate`` call over ``chunk`` (left-padded): the new ids [rows] (padding after EOS
        included) and, when sampling, their log-probs [rows]."""
        from transformers import CompileConfig

        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in chunk)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in chunk], device=self.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk], device=self.device)
        recorder = None if sampling.temperature == 0 else SampledLogprobs()
        with shared_kv_heads(self.sampler):  # on a CPU: no copy of the KV cache per query head
            out = self.sampler.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=pad,
                eos_token_id=sorted(self.eos),
                cache_implementation="static",
                max_cache_len=cache_len,
                compile_config=self._compile_config(CompileConfig) if self.compiled else None,
                **generate_kwargs(sampling, recorder),
            )
        new_ids = out[:, width:]
        lps = None if recorder is None else recorder.columns(new_ids).float().tolist()
        return new_ids.tolist(), lps

    def _compile_config(self, CompileConfig):
        """transformers' defaults: mode "reduce-overhead" (CUDA graphs), fullgraph off."""
        return CompileConfig()

    # ------------------------------------------------------------------ weight sync

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the policy's current weights (LoRA merged, FSDP shards gathered) into the sampler, cast
        to its dtype."""
        from podsrl.models import merged_state_dict

        start = time.perf_counter()
        targets = self.sampler.state_dict()
        state = merged_state_dict(model)
        missing = sorted(set(targets) - set(state))
        unknown = sorted(set(state) - set(targets))
        if missing or unknown:  # the copy is built from the policy's own config: a bug, not a user's mistake
            raise RuntimeError(f"the sampler's weights do not match the policy's: missing {missing[:5]}, unexpected {unknown[:5]}")
        for name, value in state.items():  # the policy's order: under FSDP every rank gathers in step
            if type(value).__name__ == "DTensor" and hasattr(value, "full_tensor"):
                value = value.full_tensor()
            targets[name].copy_(value)
        self.last_sync_seconds = time.perf_counter() - start

    def close(self) -> None:
        self.sampler = None


def _device(model: torch.nn.Module) -> torch.device:
    """Where the policy's weights are (a DTensor shard's local device under FSDP)."""
    param = next(model.parameters())
    local = getattr(param, "to_local", None)
    return local().device if callable(local) else param.device


def _dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _plain_copy(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A transformers causal LM of the policy's config and generation config on ``device`` in
    ``dtype``, without peft's layers or FSDP's sharding; its weights are set by ``sync_weights``."""
    from transformers import AutoModelForCausalLM

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    with torch.device(device):
        sampler = AutoModelForCausalLM.from_config(copy.deepcopy(base.config), dtype=dtype)
    sampler.generation_config = copy.deepcopy(base.generation_config)
    return sampler.eval().requires_grad_(False)
