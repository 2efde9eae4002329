"""model.mixed_precision (podsrl/train/precision.py): bfloat16 arithmetic over float32 weights in the update.

- "auto" resolves by the hardware of the model's device (the CPU's flags, the GPU's native bfloat16;
  weights that are not float32 keep their dtype), "bf16" and "none" as set.
- With it on, the model's matrix products run in bfloat16 in every pass of the update (the scoring
  pass, the measure pass of a step without a signal, the policy iteration), the output layer in
  float32, while the log-probs, the loss, the importance weights and the advantages are float32
  tensors and the weights, gradients and AdamW state stay float32; LoRA over a float32 or a bfloat16
  base trains.
- One update's gradient lies further from a float64 reference than float32 arithmetic can put it (it
  did compute in bfloat16) and within the bound derived for bfloat16 (tests/float_bounds.py,
  ``autocast_gradient_rtol``); skipping the zero-advantage rows gives the same update within it.
- A run with it trains, checkpoints, resumes and exports float32 files, as a float32 run does; the
  start-up line says what it resolved to and why, config.toml records "auto"'s resolution.
- The configuration: the old ``distributed.mixed_precision`` (FSDP's alone) still loads, meaning
  what it did; every committed run's config.toml loads; the TRL arms of ``podsrl compare`` are told
  the same (GRPOConfig's bf16).

One process against two (DDP and FSDP, gloo) under mixed precision: tests/test_distributed.py
(``MP_CASES``).
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import ten_rollouts, update_settings
from float_bounds import autocast_gradient_rtol, gradient_rtol, rel_diff, within
from podsrl.config import ConfigError, from_dict, load
from podsrl.core.importance import ImportanceSettings
from podsrl.train import loop as trainer
from podsrl.train import precision as precision_module
from podsrl.train import update as update_module
from podsrl.train.precision import MixedPrecision, resolve_mixed_precision
from podsrl.train.update import UpdateBatch, run_update
from test_sampler_dtype import ARM_BF16, ARM_NO_BF16, X86_AMX_ONLY, X86_BF16, X86_HYBRID, X86_NO_BF16

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The tiny model with the 686-token tokenizer: what these tests check does not depend on it."""
    return make_small_vocab_config


@pytest.fixture(scope="module")
def tiny(small_vocab_model_dir, one_thread):
    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    return load_policy(ModelConfig(name=str(small_vocab_model_dir)))


# ------------------------------------------------------------------------------------ "auto"


@pytest.mark.parametrize(
    "machine, cpuinfo, native",
    [("x86_64", X86_BF16, True), ("AMD64", X86_AMX_ONLY, True), ("x86_64", X86_NO_BF16, False), ("x86_64", X86_HYBRID, False),
     ("aarch64", ARM_BF16, True), ("arm64", ARM_NO_BF16, False), ("ppc64le", X86_BF16, False)],
)  # fmt: skip
def test_auto_is_bf16_on_a_cpu_with_native_bfloat16(machine, cpuinfo, native):
    choice = resolve_mixed_precision("auto", CPU, torch.float32, cpuinfo=cpuinfo, machine=machine)
    assert choice.enabled is native and choice.name == ("bf16" if native else "none")
    if native:
        assert choice.reason.startswith("the CPU has native bfloat16 arithmetic, ") and "/proc/cpuinfo" in choice.reason
        assert choice.describe() == f"update in bfloat16 (autocast over float32 weights; model.mixed_precision = 'auto': {choice.reason})"
    else:
        assert choice.describe() == f"update in float32 (model.mixed_precision = 'auto': {choice.reason})"


@pytest.mark.parametrize("native", [True, False])
def test_auto_on_a_gpu_follows_its_native_bfloat16(monkeypatch, native):
    calls = []

    def is_bf16_supported(**kwargs):
        calls.append(kwargs)
        return native or kwargs.get("including_emulation", True)  # pre-Ampere: emulated only

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    choice = resolve_mixed_precision("auto", torch.device("cuda", 0), torch.float32)
    assert choice.enabled is native and calls == [{"including_emulation": False}]
    assert ("has native bfloat16" if native else "has no native bfloat16") in choice.reason


def test_auto_keeps_weights_that_are_not_float32_and_the_others_are_as_set():
    bf16_base = resolve_mixed_precision("auto", CPU, torch.bfloat16, cpuinfo=X86_BF16, machine="x86_64")
    assert not bf16_base.enabled and bf16_base.reason == "the weights are bfloat16 (model.dtype)"
    assert bf16_base.describe().startswith("update in bfloat16 (model.mixed_precision = 'auto'")
    assert resolve_mixed_precision("bf16", CPU, cpuinfo=X86_BF16, machine="x86_64") == MixedPrecision("bf16", True, "as set")
    # forced on where it is emulated: on, and the start-up line says what it costs there
    forced = resolve_mixed_precision("bf16", CPU, cpuinfo=X86_NO_BF16, machine="x86_64")
    assert forced.enabled and forced.reason.startswith("as set, though the CPU has no native bfloat16 arithmetic")
    assert "several times slower than float32" in forced.describe()
    assert resolve_mixed_precision("bf16", CPU, torch.bfloat16, cpuinfo=X86_NO_BF16, machine="x86_64").reason == "as set"  # computes in its own dtype
    assert resolve_mixed_precision("none", CPU, cpuinfo=X86_BF16, machine="x86_64") == MixedPrecision("none", False, "as set")
    assert not resolve_mixed_precision("auto", torch.device("meta")).enabled  # a device podsrl does not read


# ------------------------------------------------------------------------------------ configuration


def test_the_setting_is_checked_and_the_old_fsdp_setting_loads_as_it_meant(make_config, small_vocab_model_dir, reward_file):
    from conftest import tiny_config_dict

    with pytest.raises(ConfigError, match="model.mixed_precision: unknown value 'fp16'; valid values: auto, bf16, none"):
        make_config(**{"model.mixed_precision": "fp16"})
    assert make_config().model.mixed_precision == "auto"

    def old(**settings):
        with pytest.warns(FutureWarning, match="distributed.mixed_precision .* is read as model.mixed_precision"):
            return from_dict(tiny_config_dict(small_vocab_model_dir, reward_file, **settings)).model.mixed_precision

    # Before issue 66 it chose FSDP's compute dtype alone: one process and "ddp" computed in float32.
    assert old(**{"distributed.mixed_precision": "auto"}) == "none"
    assert old(**{"distributed.mixed_precision": "bf16"}) == "none"
    assert old(**{"distributed.mixed_precision": "bf16", "distributed.parallel": "fsdp"}) == "bf16"
    assert old(**{"distributed.mixed_precision": "auto", "distributed.parallel": "fsdp"}) == "auto"
    assert old(**{"distributed.mixed_precision": "auto", "model.mixed_precision": "bf16"}) == "bf16"  # its old default says nothing
    assert old(**{"distributed.mixed_precision": "none", "model.mixed_precision": "none"}) == "none"
    with pytest.raises(ConfigError, match="distributed.mixed_precision: = 'bf16' disagrees with model.mixed_precision = 'none'"):
        from_dict(tiny_config_dict(small_vocab_model_dir, reward_file, **{"distributed.mixed_precision": "bf16", "model.mixed_precision": "none"}))
    with pytest.raises(ConfigError, match="distributed.mixed_precision: unknown value 'fp8'"):
        from_dict(tiny_config_dict(small_vocab_model_dir, reward_file, **{"distributed.mixed_precision": "fp8"}))
    with pytest.raises(ConfigError, match="--distributed.mixed_precision: distributed.mixed_precision is now model.mixed_precision"):
        load(None, ["--distributed.mixed_precision=bf16"])
    cfg = make_config(**{"model.mixed_precision": "bf16"})  # written and read back under the new name only
    assert "mixed_precision" not in cfg.to_dict()["distributed"] and from_dict(cfg.to_dict()) == cfg


def test_every_committed_run_config_loads_as_the_update_it_trained():
    """Each results/*/runs/**/config.toml of the CPU's comparisons (written with
    distributed.mixed_precision = "auto", none under FSDP) reads as model.mixed_precision = "none";
    the GPU's comparison (results/compare-gpu) trained with "auto" (bfloat16 autocast on the H200), and
    results/compare-mixed (issue 66, item 5) and results/compare-demo-mixed with "none" and "bf16", their arms' one difference. Each shipped comparison that has committed runs pins its runs' setting, so that its report still
    checks its runs against it."""
    paths = sorted(ROOT.glob("results/*/runs/**/config.toml"))
    assert paths
    settings: dict[str, set[str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for p in paths:
            settings.setdefault(p.relative_to(ROOT / "results").parts[0], set()).add(load(p).model.mixed_precision)
    assert settings.pop("compare-gpu") == {"auto"}
    assert settings.pop("compare-mixed") == {"none", "bf16"}
    assert settings.pop("compare-demo-mixed") == {"none", "bf16"}  # its float32 and bf16 arms (before-float32-attention/ is not globbed)
    assert set().union(*settings.values()) == {"none"}
    for name in settings:
        assert 'mixed_precision = "none"' in (ROOT / "configs" / f"{name}.toml").read_text(), name
    assert 'mixed_precision = "auto"' in (ROOT / "configs" / "compare-gpu.toml").read_text()


@pytest.mark.parametrize("setting", ["bf16", "none", "auto"])
def test_the_trl_arms_are_told_the_update_arithmetic(make_config, tmp_path, setting):
    from podsrl.compare.trl_arm.mapping import grpo_config

    cfg = make_config(**{"model.mixed_precision": setting})
    args = grpo_config(cfg, "trl", tmp_path, device="cpu")
    assert args["bf16"] is resolve_mixed_precision(setting, CPU).enabled and args["fp16"] is False


# ------------------------------------------------------------------------------------ what computes in what


class _Recorder(torch.optim.AdamW):
    """AdamW that keeps the gradients it steps with."""

    def step(self, closure=None):
        self.recorded = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


def _update(model, batch, *, mixed_precision: bool, skip: bool = True, **options):
    """One update of a copy of ``model``: (the copy, its optimizer, the gradients, stats)."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _Recorder(params, lr=1e-4, eps=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    settings = dict(pad_id=0, temperature=1.0, eps_low=0.2, eps_high=0.28, aggregation="sequence", max_completion_len=16, grad_clip=0.0,
                    micro_batch_size=4, mixed_precision=mixed_precision, skip_zero_advantage=skip, importance=ImportanceSettings())  # fmt: skip
    stats = run_update(model, optimizer, scheduler, batch, update_settings(**{**settings, **options}))
    return model, optimizer, optimizer.recorded, stats


def _with_sampler(batch: UpdateBatch, seed: int = 0) -> UpdateBatch:
    """``batch`` with made-up sampling log-probs (the importance correction and the sampler gap then run)."""
    g = torch.Generator().manual_seed(seed)
    logprobs = [(-1.0 - torch.rand(len(c), generator=g)).tolist() for c in batch.completion_ids]
    return UpdateBatch(batch.prompt_ids, batch.completion_ids, batch.advantages, sampler_logprobs=logprobs)


def _watch(model, monkeypatch) -> dict[str, list]:
    """Record what the update computes in: each Linear's output dtype per pass (with or without
    gradients), and the dtypes of what the loss and the importance correction are given and return."""
    seen: dict[str, list] = {"linear": [], "loss": [], "importance": []}
    head = next(name for name, module in model.named_modules() if module is model.get_output_embeddings())
    for name, module in model.named_modules():  # (the hooks go along when the update deep-copies the model)
        if isinstance(module, torch.nn.Linear):
            hook = lambda m, args, out, name=name: seen["linear"].append((torch.is_grad_enabled(), name == head, name, out.dtype))  # noqa: E731
            module.register_forward_hook(hook)
    real_loss, real_weights = update_module.policy_loss, update_module.importance_weights

    def policy_loss(logprobs, old, advantages, mask, settings, **kwargs):
        loss, metrics = real_loss(logprobs, old, advantages, mask, settings, **kwargs)
        given = {"logprobs": logprobs, "old": old, "advantages": advantages, "is_weights": kwargs.get("is_weights"), "loss": loss}
        seen["loss"].append({k: v.dtype for k, v in given.items() if v is not None})
        return loss, metrics

    def importance_weights(logprobs, sampler, *args, **kwargs):
        weights, metrics = real_weights(logprobs, sampler, *args, **kwargs)
        seen["importance"].append((logprobs.dtype, weights.dtype))
        return weights, metrics

    monkeypatch.setattr(update_module, "policy_loss", policy_loss)
    monkeypatch.setattr(update_module, "importance_weights", importance_weights)
    return seen


def _passes(seen) -> dict[tuple[bool, bool], set]:
    """(with gradients, the output layer) -> the dtypes its Linear outputs had."""
    out: dict[tuple[bool, bool], set] = {}
    for grad, is_head, _, dtype in seen["linear"]:
        out.setdefault((grad, is_head), set()).add(dtype)
    return out


@pytest.mark.parametrize("zeros", [[0, 2, 3, 5, 6, 8, 9], []], ids=["3-rows-of-3-prompts", "10-rows-sharing-prompts"])
def test_the_model_computes_in_bfloat16_and_the_rest_stays_float32(tiny, monkeypatch, zeros):
    """A D3S step (its scoring pass, then the policy iteration) with the sampler's log-probs, on rows
    of distinct prompts (the plain forward) and on rows sharing them (the shared-prompt forward): every
    projection of the decoder layers outputs bfloat16 in both passes, the output layer float32; the
    loss is given float32 log-probs, pi_old, advantages and importance weights and returns a float32
    loss; the gradients, the weights and AdamW's moments are float32."""
    model = copy.deepcopy(tiny.model)
    batch = _with_sampler(ten_rollouts(tiny.tokenizer, zeros, max_id=600))
    seen = _watch(model, monkeypatch)
    trained, optimizer, grads, stats = _update(model, batch, mixed_precision=True, token_fraction=0.4)
    assert _passes(seen) == {(False, False): {torch.bfloat16}, (False, True): {torch.float32},  # the scoring pass
                             (True, False): {torch.bfloat16}, (True, True): {torch.float32}}  # fmt: skip
    assert seen["loss"] and all(set(d.values()) == {torch.float32} and set(d) >= {"logprobs", "old", "is_weights"} for d in seen["loss"])
    assert seen["importance"] and set(seen["importance"]) == {(torch.float32, torch.float32)}
    assert all(g.dtype == torch.float32 for g in grads) and all(p.dtype == torch.float32 for p in trained.parameters())
    moments = [t for state in optimizer.state.values() for k, t in state.items() if k in ("exp_avg", "exp_avg_sq")]
    assert moments and all(t.dtype == torch.float32 for t in moments)
    assert math.isfinite(stats.loss) and stats.sampler_kl is not None and stats.is_ess is not None and stats.rows_run == 10 - len(zeros)


def test_a_step_without_a_signal_measures_the_sampler_gap_in_bfloat16(tiny, monkeypatch):
    """Every advantage 0: no row runs, the measure pass (no gradients) computes in bfloat16, the
    output layer in float32; FSDP's padding forward does too."""
    model = copy.deepcopy(tiny.model)
    seen = _watch(model, monkeypatch)
    _, _, _, stats = _update(model, _with_sampler(ten_rollouts(tiny.tokenizer, list(range(10)), max_id=600)), mixed_precision=True)
    assert stats.rows_run == 0 and stats.sampler_kl is not None
    assert _passes(seen) == {(False, False): {torch.bfloat16}, (False, True): {torch.float32}}
    seen["linear"].clear()
    out = update_module._empty_forward(model, 0, CPU, True)
    assert out.dtype == torch.float32 and float(out.detach()) == 0.0
    assert _passes(seen) == {(True, False): {torch.bfloat16}, (True, True): {torch.float32}}


def test_without_mixed_precision_nothing_is_bfloat16(tiny, monkeypatch):
    model = copy.deepcopy(tiny.model)
    seen = _watch(model, monkeypatch)
    _update(model, _with_sampler(ten_rollouts(tiny.tokenizer, [0, 2], max_id=600)), mixed_precision=False, token_fraction=0.4)
    assert {dtype for *_, dtype in seen["linear"]} == {torch.float32}


def test_the_output_layer_hook_leaves_nothing_behind(tiny):
    """Outside the block the model is as it was: no hook left on the output layer, autocast off."""
    model = copy.deepcopy(tiny.model)
    head = model.get_output_embeddings()
    hooks = (len(head._forward_pre_hooks), len(head._forward_hooks))
    with precision_module.autocast(model):
        assert torch.is_autocast_enabled("cpu")
        logits = model(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert logits.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    assert (len(head._forward_pre_hooks), len(head._forward_hooks)) == hooks


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lora_trains_under_mixed_precision(make_config, dtype):
    """The adapter's weights (what AdamW updates) stay float32 over a float32 or a bfloat16 base."""
    cfg = make_config(**{"model.lora": True, "model.lora_rank": 4, "model.lora_alpha": 8, "model.dtype": dtype, "model.mixed_precision": "bf16"})
    run = trainer.setup(cfg)
    assert run.precision.enabled
    model = run.policy.model
    model.train()
    optimizer, scheduler = trainer.make_optimizer(cfg, model)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    from podsrl.run import checkpoint as ckpt

    metrics = trainer.train_step(run, model, optimizer, scheduler, ckpt.TrainState())
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(p.dtype == torch.float32 for p in trained.values())
    assert all(not torch.equal(p, before[n]) for n, p in trained.items() if "lora_B" in n)
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0


# ------------------------------------------------------------------------------------ how close


def test_one_update_is_within_the_bfloat16_bound_of_float64(tiny):
    """The gradient of one update (PODS-like: 3 of 10 rows with a signal) with mixed precision lies
    further from a float64 copy of the model than float32 arithmetic can (gradient_rtol: it did
    compute in bfloat16) and within the bound derived for bfloat16 arithmetic (autocast_gradient_rtol),
    per parameter; float32 within its own bound."""
    batch = ten_rollouts(tiny.tokenizer, [0, 2, 3, 5, 6, 8, 9], max_id=600)
    _, _, reference, _ = _update(copy.deepcopy(tiny.model).double(), batch, mixed_precision=False)
    _, _, single, _ = _update(tiny.model, batch, mixed_precision=False)
    _, _, mixed, _ = _update(tiny.model, batch, mixed_precision=True)
    vocab, layers = len(tiny.tokenizer), tiny.model.config.num_hidden_layers
    bf16_bound, f32_bound = autocast_gradient_rtol(layers), gradient_rtol(vocab) / 2  # one computation: half the two-computation bound
    errors = [rel_diff(g, r) for g, r in zip(mixed, reference)]
    for i, (err, f32) in enumerate(zip(errors, (rel_diff(g, r) for g, r in zip(single, reference)))):
        assert within(err, bf16_bound, f"mixed precision: gradient {i}"), f"gradient {i}: {err:.2e} from float64, bound {bf16_bound:.2e}"
        assert within(f32, f32_bound, f"float32: gradient {i}"), f"gradient {i} (float32): {f32:.2e}, bound {f32_bound:.2e}"
    assert max(errors) > 2 * gradient_rtol(vocab), "the mixed-precision gradient is as close as float32's: no bfloat16 arithmetic ran"


def test_skipping_zero_advantage_rows_under_mixed_precision_gives_the_same_update(tiny):
    """Which rows run is decided by the advantages alone; their gradient, micro-batched otherwise,
    is the same within twice the bfloat16 bound (two bfloat16 computations)."""
    batch = ten_rollouts(tiny.tokenizer, [0, 2, 3, 5, 6, 8, 9], max_id=600)
    _, _, skipped, a = _update(tiny.model, batch, mixed_precision=True, skip=True)
    _, _, full, b = _update(tiny.model, batch, mixed_precision=True, skip=False)
    assert (a.rows_run, b.rows_run, a.tokens_kept, a.sequences) == (3, 10, b.tokens_kept, b.sequences)
    bound = 2 * autocast_gradient_rtol(tiny.model.config.num_hidden_layers)
    for i, (x, y) in enumerate(zip(skipped, full)):
        err = rel_diff(x, y)
        assert within(err, bound, f"skip vs no skip, mixed precision: gradient {i}"), f"gradient {i}: {err:.2e}, bound {bound:.2e}"


# ------------------------------------------------------------------------------------ a run


def _files(run: Path) -> dict[str, dict[str, torch.dtype]]:
    """The dtypes of the tensors a run wrote: its newest checkpoint's weights and optimizer state, its export."""
    step = sorted((run / "checkpoints").glob("step-*"))[-1]
    state = torch.load(step / "state.pt", weights_only=False)
    return {
        "weights": {k: v.dtype for k, v in load_file(str(step / "weights.safetensors")).items()},
        "optimizer": {f"{i}.{k}": v.dtype for i, s in state["optimizer"]["state"].items() for k, v in s.items() if torch.is_tensor(v) and v.dim()},
        "export": {k: v.dtype for k, v in load_file(str(run / "model" / "model.safetensors")).items()},
    }


def test_a_mixed_precision_run_checkpoints_resumes_and_exports_float32_files(make_config, tmp_path):
    """bf16 forced: the start-up line says so, config.toml keeps the setting; the checkpoint, the
    resumed run's checkpoint and the export hold the float32 tensors a float32 run's hold. Resuming
    may change the setting (it is how the run computes, as the device is). "auto" is noted in
    config.toml with what it resolved to."""
    lines: list[str] = []
    common = {"train.max_steps": 2, "eval.at_start": False, "train.export_model": True}
    mixed = trainer.train(make_config(**common, **{"model.mixed_precision": "bf16"}), run_dir=tmp_path / "bf16", log=lines.append)
    said = resolve_mixed_precision("bf16", CPU).describe()  # "as set", and on a CPU without native bfloat16 what it costs there
    assert said.startswith("update in bfloat16 (autocast over float32 weights; model.mixed_precision = 'bf16': as set")
    assert any(said in line for line in lines), lines
    assert 'mixed_precision = "bf16"\n' in (mixed / "config.toml").read_text()
    auto = trainer.train(make_config(**common), run_dir=tmp_path / "auto", log=lines.append)
    resolved = resolve_mixed_precision("auto", CPU)
    assert f'mixed_precision = "auto"  # {resolved.name} where the run last started: {resolved.reason}' in (auto / "config.toml").read_text()
    baseline = trainer.train(make_config(**common, **{"model.mixed_precision": "none"}), run_dir=tmp_path / "none", log=lines.append)
    files = _files(mixed)
    assert files == _files(baseline) and {d for kind in files.values() for d in kind.values()} == {torch.float32}
    resumed = make_config(**{**common, "train.max_steps": 3}, **{"model.mixed_precision": "none"})
    trainer.train(resumed, run_dir=mixed, resume=True, log=lines.append)
    assert json.loads((mixed / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
    assert json.loads((mixed / "config_changes.jsonl").read_text())["changes"]["model.mixed_precision"] == {"run": "bf16", "now": "none"}
    assert _files(mixed) == files
