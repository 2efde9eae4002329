"""The transformers engine's linear layers on oneDNN while it samples on a CPU (issue 66).

Why: a decode step multiplies one token a rollout by every weight, tens to a few hundred rows a
product. At those shapes PyTorch's ``F.linear`` (MKL on x86-64) ran the embedded model's layer
products at 68-103 GFLOP/s and its output layer at 41-55 on this project's 2-core EPYC, against
84-130 and 104-115 for oneDNN over a weight reordered once into its own blocked layout (timed alone,
scratch, 64 and 128 rows, 2026-11-30). vLLM's CPU build computes its products this way. Side by side
in the whole sampling call of the embedded model, the transformers engine sampled 1.22x the tokens a
second at 128 rollouts x 64 tokens and 1.23x at 64 x 256 (bench/hf_engine.py's ``mkl linear`` way,
results/hf-engine/cpu-amd-epyc-2026-11-30-linear*.json, docs/engines.md). The output layer alone on
oneDNN, its weight read as it is (commit 4118664), had not been faster in the call.

What: :func:`onednn_linears` is a context manager under which every plain ``torch.nn.Linear`` of a
model whose weight is a float32 CPU tensor computes with ``torch.ops.mkldnn._linear_pointwise`` over
that weight reordered for the call (``torch.ops.mkldnn._reorder_linear_weight``; PyTorch's own
inductor uses the pair for CPU linear layers). The weights are read at entry: the block must not
change them (the engine samples under ``torch.no_grad`` between updates). Leaving the block, also on
an error, restores the layers. Nothing changes where it does not apply (:func:`applies`): another
device, another dtype (a bfloat16 sampler: unmeasured), a torch without oneDNN or these ops, a
processor other than x86-64 (unmeasured), a layer that is a subclass of ``Linear`` (quantized
layers), whose weight is not a plain tensor (a sharded ``DTensor``) or whose ``forward`` is already
replaced (accelerate's hooks).

Cost and difference: a copy of the layers' weights for the length of the call (0.54 GB for the
embedded model, beside its 0.54 GB) and the reorder (about half a second a call of the embedded
model, against tens of seconds of sampling). oneDNN sums in another order than MKL: the logits
differ from ``F.linear``'s in the last bits (tests/test_linear.py bounds the difference by the
products' rounding), so under a seed the engine draws other tokens than it would with ``F.linear``,
from the same law. The trainer computes the log-probs it updates with in its own forward, as before.
"""

from __future__ import annotations

import contextlib
import platform

import torch

__all__ = ["DEVICES", "applies", "available", "onednn_linears"]

DEVICES = frozenset({"cpu"})  # device types where onednn_linears switches layers (measured on a CPU only)
DTYPES = frozenset({torch.float32})  # measured in float32 only
MACHINES = frozenset({"x86_64", "amd64"})  # platform.machine(), lower-cased: measured on x86-64 only


def available() -> bool:
    """Whether this torch can compute linear layers with oneDNN over a reordered weight."""
    ops = torch.ops.mkldnn
    return (platform.machine().lower() in MACHINES and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))  # fmt: skip


def applies(layer: torch.nn.Module) -> bool:
    """Whether :func:`onednn_linears` switches ``layer`` (the module docstring)."""
    weight = getattr(layer, "weight", None)
    return (type(layer) is torch.nn.Linear and type(weight) in (torch.nn.Parameter, torch.Tensor)
            and weight.device.type in DEVICES and weight.dtype in DTYPES and weight.dim() == 2
            and "forward" not in layer.__dict__)  # fmt: skip


@contextlib.contextmanager
def onednn_linears(model: torch.nn.Module, rows: int):
    """Within the block, each layer of ``model`` that :func:`applies` computes ``x W^T + b`` with oneDNN
    over ``W`` reordered for ``rows`` rows a product (the call's rollouts: a decode step's M; other row
    counts compute alike, only the layout's tuning is for ``rows``). x [..., in] -> [..., out], as the
    layer's own forward. Restored on leaving."""
    layers = [layer for layer in model.modules() if applies(layer)] if available() else []
    try:
        for layer in layers:
            layer.forward = _onednn_forward(layer, rows)
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def _onednn_forward(layer: torch.nn.Linear, rows: int):
    weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), max(1, rows))
    bias = None if layer.bias is None else layer.bias.detach()

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != weight.dtype or torch.is_autocast_enabled(x.device.type):
            # Autocast (TRL's bf16 wraps the model's forward in it) or an input of another dtype: the
            # layer's own arithmetic. oneDNN refuses a bfloat16 input over a float32 reordered weight.
            return torch.nn.functional.linear(x, layer.weight, layer.bias)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    return forward
