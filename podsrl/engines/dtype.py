"""The vLLM sampler's weights dtype: what ``rollout.sampler_dtype`` resolves to on this machine.

``"auto"`` is the policy's dtype (``model.dtype``), a dtype name is that dtype, and ``"fast"`` is
bfloat16 where the sampler runs bfloat16 faster than float32, else the policy's dtype:

- **On a GPU** (``torch.cuda.is_available()``: vLLM's CUDA/ROCm build samples there): bfloat16,
  vLLM's usual set-up, when ``torch.cuda.is_bf16_supported(including_emulation=False)``; the
  policy's dtype otherwise (a GPU before Ampere only emulates bfloat16).
- **On a CPU** (vLLM's CPU build): bfloat16 when the CPU has native bfloat16 arithmetic, read from
  the flags Linux lists in ``/proc/cpuinfo``: ``avx512_bf16`` or ``amx_bf16`` on x86-64 (oneDNN runs
  bfloat16 matrix products natively with either; without, it converts bfloat16 for float32
  arithmetic, a case not measured here), ``bf16`` among the ``Features`` on aarch64. Every CPU
  listed must have it (a hybrid CPU whose cores differ counts as without). Another machine, another
  operating system, or a ``/proc/cpuinfo`` that cannot be read: the policy's dtype, with the reason.
- A float16 policy keeps float16 under ``"fast"``: as fast as bfloat16 where either is, and the
  sampler then matches the trainer.

The flags say what the CPU can do, not what a call costs; they were chosen over timing a call at start
because they cost nothing and decide the same on this project's CPU (avx512_bf16 and amx_bf16:
bfloat16 0.216 s + 12.8 ms a rollout against float32's 0.320 s + 20.0 ms, docs/vllm.md).

Only the vLLM engine reads this: the transformers engine samples with the policy itself, so
``"fast"`` (like ``"auto"``) changes nothing there. The update's ``model.mixed_precision = "auto"``
reads the same evidence (:func:`cpu_bf16`, :func:`gpu_bf16`; :mod:`podsrl.train.precision`). :func:`resolve_sampler_dtype` is pure but for
``torch.cuda`` and, when ``cpuinfo`` is not given, reading ``/proc/cpuinfo``; tests pass both.
"""

from __future__ import annotations

import contextlib
import platform
from typing import NamedTuple

import torch

__all__ = ["CPUINFO", "NOT_NAMED", "SamplerDtype", "cpu_bf16", "cpu_model", "gpu_bf16", "resolve_sampler_dtype"]

CPUINFO = "/proc/cpuinfo"
NOT_NAMED = ("auto", "fast")  # the settings that name no dtype: an engine that samples with the policy itself takes them
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # either one: oneDNN runs bfloat16 matrix products natively
ARM_BF16_FLAG = "bf16"  # FEAT_BF16 (Armv8.6): BFDOT, BFMMLA


class SamplerDtype(NamedTuple):
    """What ``rollout.sampler_dtype`` (``setting``) resolved to, and why (``reason``, in words that
    follow the setting after a colon in :meth:`describe`)."""

    setting: str
    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        """For the start-up line: ``bfloat16 (rollout.sampler_dtype = 'fast': <reason>)``."""
        return f"{self.name} (rollout.sampler_dtype = {self.setting!r}: {self.reason})"


def resolve_sampler_dtype(setting: str, policy_dtype: torch.dtype, *, cpuinfo: str | None = None, machine: str | None = None) -> SamplerDtype:
    """What ``rollout.sampler_dtype = setting`` samples in beside a policy in ``policy_dtype``.

    ``cpuinfo``: the text of /proc/cpuinfo (None: read it, when "fast" asks on a CPU); ``machine``:
    ``platform.machine()`` (None: this one's)."""
    if setting == "auto":
        return SamplerDtype(setting, policy_dtype, "the policy's dtype")
    if setting != "fast":
        return SamplerDtype(setting, getattr(torch, setting), "as set")
    if policy_dtype == torch.float16:
        return SamplerDtype(setting, policy_dtype, "the policy's float16, as fast as bfloat16 and the trainer's own")
    if torch.cuda.is_available():
        if gpu_bf16():
            return SamplerDtype(setting, torch.bfloat16, "the GPU has native bfloat16 (torch.cuda.is_bf16_supported())")
        return SamplerDtype(setting, policy_dtype, "the policy's dtype; the GPU has no native bfloat16 (torch.cuda.is_bf16_supported() is false)")
    native, why = cpu_bf16(cpuinfo, machine)
    if native:
        return SamplerDtype(setting, torch.bfloat16, f"the CPU has native bfloat16 arithmetic, {why}")
    return SamplerDtype(setting, policy_dtype, f"the policy's dtype; {why}")


def gpu_bf16() -> bool:
    """``torch.cuda.is_bf16_supported()`` without emulation: since torch 2.3 it counts a GPU that
    emulates bfloat16 (before Ampere) unless asked not to, and emulated bfloat16 is not faster."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.3: native support only
        return bool(torch.cuda.is_bf16_supported())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo's "model name" line (the benchmarks' records), else what
    ``platform`` says."""
    with contextlib.suppress(OSError, StopIteration):
        with open(CPUINFO, encoding="utf-8", errors="replace") as f:
            return next(line.partition(":")[2].strip() for line in f if line.startswith("model name"))
    return platform.processor() or platform.machine()


def cpu_bf16(cpuinfo: str | None = None, machine: str | None = None) -> tuple[bool, str]:
    """Whether the CPU has native bfloat16 arithmetic, and the evidence in words.

    ``cpuinfo``: the text of /proc/cpuinfo (None: read it); ``machine``: ``platform.machine()``."""
    machine = (machine if machine is not None else platform.machine()).lower()
    if machine in ("x86_64", "amd64"):
        wanted, key = X86_BF16_FLAGS, "flags"
    elif machine in ("aarch64", "arm64"):
        wanted, key = (ARM_BF16_FLAG,), "features"
    else:
        return False, f"podsrl reads native bfloat16 support on x86-64 and aarch64 Linux only, and this CPU is {machine or 'unnamed'}"
    if cpuinfo is None:
        try:
            with open(CPUINFO, encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError as err:
            return False, f"whether the CPU has native bfloat16 arithmetic is unknown: {CPUINFO} cannot be read ({type(err).__name__})"
    # One "flags" (x86) or "Features" (aarch64) line per logical CPU; every one must list the flag.
    per_cpu = [set(value.split()) for name, _, value in (line.partition(":") for line in cpuinfo.splitlines()) if name.strip().lower() == key]
    if not per_cpu:
        return False, f"whether the CPU has native bfloat16 arithmetic is unknown: {CPUINFO} has no {key!r} line"
    found = [flag for flag in wanted if all(flag in flags for flags in per_cpu)]
    if found:
        return True, f"{' and '.join(found)} in {CPUINFO}"
    listed = " or ".join(wanted)
    return False, f"the CPU has no native bfloat16 arithmetic (no {listed} in {CPUINFO})"
