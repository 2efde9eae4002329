"""The transformers engine's linear layers on oneDNN on a CPU (podsrl/engines/linear.py): within the
products' rounding of the exact result, only plain float32 CPU layers switched, restored after the
block, and switched while the engine samples."""

from __future__ import annotations

import contextlib

import pytest
import torch

import podsrl.engines.linear as linear
from float_bounds import U32
from podsrl.engines import Sampling
from podsrl.engines.hf import TransformersEngine
from podsrl.engines.linear import applies, onednn_linears
from test_static_engine import prompts, tokenizer, varied_model  # noqa: F401 (tokenizer: a fixture)

pytestmark = pytest.mark.skipif(not linear.available(), reason="needs x86-64 and a torch with oneDNN's linear ops")


def _bound(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """Elementwise, the most rounding moves a float32 x W^T + b of K products from the exact value:
    K u sum_k |x_k W_jk| + u |b_j| (tests/float_bounds.py's sum_bound, per output), as float64."""
    k = layer.in_features
    size = x.abs().double() @ layer.weight.abs().double().T
    bias = layer.bias.abs().double() if layer.bias is not None else 0.0
    return (k + 1) * U32 * (size + bias)


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_a_layer_on_onednn_is_within_its_products_rounding(rows):
    """x [2, rows, 96] through Linear(96, 200) with a bias, for a call's row hint of ``rows``: oneDNN's
    result within the sum bound of the exact (float64) one, as F.linear's is, and the layer is itself
    again after the block."""
    g = torch.Generator().manual_seed(rows)
    layer = torch.nn.Linear(96, 200)
    x = torch.randn(2, rows, 96, generator=g)
    exact = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    with torch.no_grad():
        plain = layer(x)
        with onednn_linears(layer, rows):
            assert "forward" in layer.__dict__
            ours = layer(x)
    assert "forward" not in layer.__dict__
    assert ours.shape == plain.shape == (2, rows, 200) and ours.dtype == torch.float32
    bound = _bound(x, layer)
    assert ((ours.double() - exact).abs() <= bound).all()
    assert ((plain.double() - exact).abs() <= bound).all()


def test_under_autocast_a_switched_layer_computes_as_its_own_forward():
    """Under bfloat16 autocast (TRL's bf16 wraps the model's forward in it, and podsrl's evaluation
    samples through it) a switched layer computes exactly as its own forward does there, bfloat16
    products: oneDNN's reordered float32 weight refused the bfloat16 input on a CPU with native
    bfloat16 ("could not create a primitive descriptor"), and computing in float32 instead would not
    be the layer's arithmetic under autocast."""
    layer = torch.nn.Linear(96, 200)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            own = layer(x)
            with onednn_linears(layer, 3):
                switched = layer(x)
        assert switched.dtype == torch.bfloat16 and torch.equal(switched, own)


def test_only_plain_float32_cpu_layers_switch_and_all_come_back_after_an_error():
    class Quantized(torch.nn.Linear):  # a subclass: its own forward, left alone
        pass

    hooked = torch.nn.Linear(4, 4)
    hooked.forward = lambda x: x  # as accelerate's hooks replace a module's forward
    model = torch.nn.ModuleDict({"plain": torch.nn.Linear(4, 4), "no_bias": torch.nn.Linear(4, 3, bias=False),
                                 "bf16": torch.nn.Linear(4, 4).to(torch.bfloat16), "float64": torch.nn.Linear(4, 4).double(),
                                 "subclass": Quantized(4, 4), "hooked": hooked, "conv": torch.nn.Conv1d(4, 4, 1)})  # fmt: skip
    switched = {name for name, layer in model.items() if applies(layer)}
    assert switched == {"plain", "no_bias"}
    with pytest.raises(RuntimeError, match="inside"):
        with onednn_linears(model, 8):
            assert {name for name, layer in model.items() if "forward" in layer.__dict__} == {"plain", "no_bias", "hooked"}
            raise RuntimeError("inside")
    assert {name for name, layer in model.items() if "forward" in layer.__dict__} == {"hooked"}
    assert model["hooked"](torch.ones(1, 4)).equal(torch.ones(1, 4))  # its own replacement kept


def test_nothing_switches_where_onednn_is_not_available(monkeypatch):
    monkeypatch.setattr(linear.platform, "machine", lambda: "aarch64")  # unmeasured there
    assert not linear.available()
    layer = torch.nn.Linear(4, 4)
    with onednn_linears(layer, 8):
        assert "forward" not in layer.__dict__


def test_the_engine_samples_with_its_layers_on_onednn(tokenizer, one_thread, monkeypatch):
    """Every linear layer of the model computes on oneDNN at each step of the engine's call (its
    forward replaced, seen from a hook), and none after it; with the switch made a no-op the call
    samples from the same model (its greedy completions: the same tokens where no two logits are
    within rounding of each other, which this model's peaked scores make the case here)."""
    model = varied_model(tokenizer)
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    seen: list[bool] = []
    for layer in layers:
        layer.register_forward_hook(lambda module, args, out: seen.append("forward" in module.__dict__))
    ps = prompts(len(tokenizer))
    greedy = Sampling(n=2, temperature=0.0, top_p=1.0, max_new_tokens=12, seed=0)
    got = TransformersEngine(model, tokenizer, batch_size=8).generate(ps, greedy)
    assert seen and all(seen) and len(seen) >= len(layers) * 12
    assert not any("forward" in layer.__dict__ for layer in layers)
    seen.clear()
    import podsrl.engines.hf as hf

    monkeypatch.setattr(hf, "onednn_linears", lambda model, rows: contextlib.nullcontext())
    want = TransformersEngine(model, tokenizer, batch_size=8).generate(ps, greedy)
    assert seen and not any(seen)
    assert got.completion_ids == want.completion_ids


def test_a_lora_model_computes_its_base_layers_on_onednn(tokenizer, one_thread):
    """peft's LoRA layers wrap a plain Linear (``base_layer``), which switches, as the adapters' own small
    layers do; each base layer's output in a forward of the LoRA model is within its products' rounding
    of the exact one."""
    peft = pytest.importorskip("peft")
    model = varied_model(tokenizer, 0.02)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    bases = [m.base_layer for m in lora.modules() if hasattr(m, "base_layer") and type(m.base_layer) is torch.nn.Linear]
    assert len(bases) == 2 * model.config.num_hidden_layers
    seen = []
    for base in bases:
        base.register_forward_hook(lambda module, args, out: seen.append((module, args[0], out, "forward" in module.__dict__)))
    with torch.no_grad(), onednn_linears(lora, 1):
        lora(input_ids=torch.tensor([prompts(len(tokenizer))[3]]))
    assert len(seen) == len(bases) and all(switched for *_, switched in seen)
    for layer, x, out, _ in seen:
        exact = torch.nn.functional.linear(x.double(), layer.weight.double(), None if layer.bias is None else layer.bias.double())
        assert ((out.double() - exact).abs() <= _bound(x, layer)).all()
