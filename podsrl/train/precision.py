"""Mixed precision in the update: bfloat16 arithmetic over float32 weights (``model.mixed_precision``).

One setting for every training path (one process, DDP, FSDP). With mixed precision on:

- **What computes in bfloat16**: the model's forward, and so its backward, in every pass of the
  update (the scoring pass, the measure pass of a step without a signal, each policy iteration; FSDP's
  empty padding forwards too) runs under ``torch.autocast(device_type, dtype=torch.bfloat16)``
  (:func:`autocast`): matrix products take bfloat16 inputs and accumulate in float32 (the kernels'
  own choice), the residual stream stays float32 (a float32 embedding plus bfloat16 block outputs).
  On a CPU the attention itself computes in float32 where podsrl's attention function runs (every
  pass of the update over rows, not under gradient checkpointing): PyTorch's bfloat16 flash attention backward
  is the slower one there (:mod:`podsrl.engines.attention`).
  Under ``distributed.parallel = "fsdp"`` FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)`` casts the gathered parameters to bfloat16 as well
  (:func:`podsrl.train.distributed.fsdp_wrap`) and reduce-scatters the gradients in float32.
- **What stays float32**: the weights, their gradients and AdamW's state (the parameters are never
  cast: autocast casts copies per operation), so an update below bfloat16's resolution is not rounded
  away (the reason bfloat16 full fine-tuning is refused: :func:`podsrl.models.check_training_dtype`);
  and everything after the logits: the log-softmax, log-probs and entropies
  (:func:`podsrl.train.sequences.token_logprobs` works in float32), the loss, the clipped ratio, the
  importance ratio against the sampler and the advantages, which :func:`autocast` does not cover.
  Which rows are skipped (advantage exactly 0) and which rollouts are kept read the rewards and
  advantages alone: the same as in float32. D3S's token selection reads float32 entropies computed
  from the bfloat16 forward's logits: exact over those, which differ from float32's by the
  forward's rounding, so a token at the threshold may be chosen otherwise.
- **The output layer in float32.** The logits' final matrix product (``get_output_embeddings()``)
  runs in float32 on the float32 hidden state (a forward pre-hook turns autocast off around it),
  where its weight is float32; FSDP's bfloat16 parameters and a bfloat16 base (``model.dtype``) keep
  it in bfloat16. A logit stored in bfloat16 is off by up to 2^-8 of itself (1/16 of a nat for a
  logit of 16-32), and a log-prob takes that error whole: against a float64 forward, the output
  layer in float32 about halves the log-probs' error of a bfloat16 forward, for the output layer's
  share of the arithmetic (its 28M of SmolLM2-135M's parameters, at the completion positions only:
  a sixth to a fifth of the update's products). The figures, their command and date:
  docs/results.md, "Mixed precision: what it costs and changes".
- **The sampler's gap** (``sampler_kl``) is not closed by a bfloat16 update: a bfloat16 sampler and
  the update round the weights alike, but their activations, kernels and output layers round
  differently, and the update's own bfloat16 error adds to the sampler's (measured with
  bench/importance_gap.py ``--trainer-mixed-precision``: the same docs section). The importance
  correction corrects towards the update's own log-probs, whatever they were computed in.

``"auto"`` (the default) chooses by the hardware the model trains on, as ``rollout.sampler_dtype =
"fast"`` does and with the same evidence (:mod:`podsrl.engines.dtype`): bfloat16 on a GPU with native
bfloat16 (``torch.cuda.is_bf16_supported(including_emulation=False)``: Ampere and later) and on a CPU
with native bfloat16 arithmetic (``avx512_bf16`` or ``amx_bf16`` in /proc/cpuinfo on x86-64, ``bf16``
on aarch64), float32 elsewhere: without native support bfloat16 is converted for float32 arithmetic,
several times slower than float32 itself (bench/mixed_precision.py; docs/results.md). On a CPU with
native bfloat16 the choice was checked on the default job at equal training time (configs/compare-demo-mixed.toml,
docs/results.md "What should "auto" choose on such a CPU?"): with the attention in float32 under
autocast (podsrl.engines.attention) the bfloat16 update bought more steps in its minutes and no
accuracy change was resolved. Weights that are
not float32 (``model.dtype = "bfloat16"``: a LoRA adapter over a bfloat16 base) compute in their own
dtype already, and "auto" leaves them so. ``"bf16"`` forces it on (where bfloat16 is emulated the
start-up line says so and what it costs), ``"none"`` off. The start-up line says which and why, and
config.toml records what "auto" resolved to.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from podsrl.engines.dtype import cpu_bf16, gpu_bf16

__all__ = ["SETTINGS", "MixedPrecision", "autocast", "resolve_mixed_precision"]

SETTINGS = ("auto", "bf16", "none")


class MixedPrecision(NamedTuple):
    """What ``model.mixed_precision`` (``setting``) resolved to: bfloat16 autocast on or off
    (``enabled``), and why (``reason``)."""

    setting: str
    enabled: bool
    reason: str
    weights: str = "float32"  # the weights' dtype (model.dtype)

    @property
    def name(self) -> str:
        """What it resolved to, as the setting names it: "bf16" or "none"."""
        return "bf16" if self.enabled else "none"

    def describe(self) -> str:
        """For the start-up line: ``update in bfloat16 (autocast over float32 weights; model.mixed_precision = 'auto': <reason>)``."""
        what = f"bfloat16 (autocast over {self.weights} weights; " if self.enabled else f"{self.weights} ("
        return f"update in {what}model.mixed_precision = {self.setting!r}: {self.reason})"


def resolve_mixed_precision(setting: str, device: torch.device, weights: torch.dtype = torch.float32, *, cpuinfo: str | None = None,
                            machine: str | None = None) -> MixedPrecision:  # fmt: skip
    """What ``model.mixed_precision = setting`` does for a model on ``device`` whose weights are
    ``weights`` (``model.dtype``). ``cpuinfo``: the text of /proc/cpuinfo (None: read it, when "auto"
    asks on a CPU); ``machine``: ``platform.machine()`` (None: this one's)."""
    if setting not in SETTINGS:
        raise ValueError(f"model.mixed_precision: unknown value {setting!r}; valid values: {', '.join(SETTINGS)}")
    name = str(weights).removeprefix("torch.")
    if setting == "none":
        return MixedPrecision(setting, False, "as set", name)
    if setting == "bf16":
        if weights != torch.float32 or device.type not in ("cuda", "cpu"):
            return MixedPrecision(setting, True, "as set", name)
        native, why = native_bf16(device, cpuinfo=cpuinfo, machine=machine)
        # forced on where bfloat16 is emulated: said at start-up, since it is then several times slower than float32
        return MixedPrecision(setting, True, "as set" if native else f"as set, though {why}: bfloat16 is converted for float32 arithmetic there, "
                              f"several times slower than float32 (docs/results.md, \"Mixed precision: what it costs and changes\")", name)  # fmt: skip
    if weights != torch.float32:
        return MixedPrecision(setting, False, f"the weights are {name} (model.dtype)", name)
    if device.type in ("cuda", "cpu"):
        native, why = native_bf16(device, cpuinfo=cpuinfo, machine=machine)
        return MixedPrecision(setting, native, why, name)
    return MixedPrecision(setting, False, f"podsrl reads native bfloat16 support on CUDA GPUs and CPUs only, and the model is on {device.type}", name)


def native_bf16(device: torch.device, *, cpuinfo: str | None = None, machine: str | None = None) -> tuple[bool, str]:
    """Whether ``device`` (a CUDA GPU or a CPU) computes bfloat16 natively, and the evidence in words."""
    if device.type == "cuda":
        if gpu_bf16():
            return True, "the GPU has native bfloat16 (torch.cuda.is_bf16_supported())"
        return False, "the GPU has no native bfloat16 (torch.cuda.is_bf16_supported() is false)"
    native, why = cpu_bf16(cpuinfo, machine)
    return native, f"the CPU has native bfloat16 arithmetic, {why}" if native else why


@contextlib.contextmanager
def autocast(model: torch.nn.Module, enabled: bool = True):
    """Run ``model``'s forward calls inside the block under bfloat16 autocast (on the device type of
    its parameters), its output layer in float32 where that layer's weight is float32 (the module
    docstring says why). Nothing when not ``enabled``. Only the model's calls belong inside: what is
    computed from the logits (log-softmax, loss, ratios) must stay outside, in float32."""
    if not enabled:
        yield
        return
    device_type = next(model.parameters()).device.type
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    handles = []
    if head is not None:
        resumed: list[bool] = []  # autocast's state before the output layer, restored after it

        def before(module, args):
            if getattr(module, "weight", None) is None or module.weight.dtype != torch.float32:
                return None  # FSDP's bfloat16 parameters, a bfloat16 base: autocast computes it in bfloat16
            resumed.append(torch.is_autocast_enabled(device_type))
            torch.set_autocast_enabled(device_type, False)
            return (args[0].float(), *args[1:])

        def after(module, args, output):
            if resumed:
                torch.set_autocast_enabled(device_type, resumed.pop())

        handles = [head.register_forward_pre_hook(before), head.register_forward_hook(after)]
    try:
        # The block's exit restores autocast's state even if the output layer raised between the hooks.
        with torch.autocast(device_type, dtype=torch.bfloat16):
            yield
    finally:
        for handle in handles:
            handle.remove()
