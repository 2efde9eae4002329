"""Where the policy runs: ``model.device`` ("auto", "cpu", "cuda", "cuda:N").

Everywhere: a bad value, or a GPU asked for where torch sees none, is a configuration error that
names the field and the fix, and "auto" means the GPU only when there is one. The tests marked
``gpu`` run only where torch sees a GPU (CI has none; ``make gpu-check`` runs them on a lent one):
the same update on the GPU and on the CPU gives the same gradient, and a short run with the
transformers engine trains, checkpoints, resumes and evaluates with everything on the GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch

from podsrl.train import loop as trainer
from podsrl.config import ModelConfig
from podsrl.errors import ConfigError
from podsrl.run.metrics import read_jsonl
from podsrl.models import load_policy, resolve_device
from podsrl.train.update import UpdateBatch, run_update
from conftest import update_settings

gpu = pytest.mark.gpu  # skipped without a GPU (tests/conftest.py)


@pytest.mark.parametrize("value", ["gpu", "cuda0", "cuda:", "CPU", "cuda:-1"])
def test_a_bad_device_names_the_field_and_the_valid_values(value):
    with pytest.raises(ConfigError, match=r"model\.device: unknown value .*auto, cpu, cuda, cuda:N"):
        ModelConfig(device=value)


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_valid_devices_are_accepted_by_the_config(value):
    assert ModelConfig(device=value).device == value  # availability is checked when loading


def test_auto_is_the_gpu_only_when_there_is_one():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where there is no GPU")
@pytest.mark.parametrize("value", ["cuda", "cuda:1"])
def test_a_gpu_that_is_not_there_is_a_config_error_with_the_fix(value):
    with pytest.raises(ConfigError, match=r"model\.device: .*torch sees no GPU.*model\.device = \"cpu\""):
        resolve_device(value)


@gpu
def test_a_gpu_index_out_of_range_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.device: 'cuda:99': torch sees \d+ GPU"):
        resolve_device("cuda:99")


class _GradientRecorder(torch.optim.SGD):
    def step(self, closure=None):
        self.recorded = {id(p): p.grad.detach().clone() for group in self.param_groups for p in group["params"]}
        return super().step(closure)


@gpu
@pytest.mark.parametrize("extra", [{}, {"token_fraction": 0.5, "policy_iterations": 2}], ids=["grpo", "d3s-2-iterations"])
def test_the_update_on_the_gpu_equals_the_update_on_the_cpu(tiny_model_dir, extra):
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name=str(tiny_model_dir), device="cpu"))
    g = torch.Generator().manual_seed(0)
    vocab = policy.model.get_input_embeddings().num_embeddings  # the tiny model's (a few hundred ids)
    prompts = [policy.tokenizer(f"What is {i} + {i * 7}?")["input_ids"] for i in range(3)]
    rows = [0, 0, 1, 1, 2, 2]  # rollouts sharing prompts: the shared-prompt forward runs too
    batch = UpdateBatch(
        prompt_ids=[prompts[r] for r in rows],
        completion_ids=[torch.randint(3, vocab, (2 + i % 4,), generator=g).tolist() for i in range(len(rows))],
        advantages=torch.randn(len(rows), generator=g),
    )
    grads, stats = {}, {}
    for device in ("cpu", "cuda"):
        model = copy.deepcopy(policy.model).to(device)
        opt = _GradientRecorder(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
        options = dict(pad_id=0, temperature=1.0, eps_low=0.2, eps_high=None, aggregation="sequence",
                       max_completion_len=8, grad_clip=1.0) | extra  # fmt: skip
        stats[device] = run_update(model, opt, sched, batch, update_settings(micro_batch_size=4, **options))
        grads[device] = {n: opt.recorded[id(p)].cpu() for n, p in model.named_parameters()}
    for name, want in grads["cpu"].items():
        err = (grads["cuda"][name] - want).norm() / want.norm().clamp(min=1e-12)
        assert err < 1e-4, f"{name}: relative difference {float(err):.1e} between GPU and CPU"
    assert stats["cuda"].loss == pytest.approx(stats["cpu"].loss, abs=1e-5)
    assert stats["cuda"].entropy == pytest.approx(stats["cpu"].entropy, rel=1e-4)
    assert stats["cuda"].tokens_kept == stats["cpu"].tokens_kept


@gpu
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_a_run_trains_checkpoints_resumes_and_evaluates_on_the_gpu(make_config, tmp_path, lora):
    # bfloat16 full fine-tuning is refused (no float32 master weights; issue 32): LoRA over a bf16 base.
    settings = {"model.device": "auto", "model.lora": lora, "model.lora_rank": 4, "model.dtype": "bfloat16" if lora else "float32"}
    logs = []
    run = trainer.train(make_config(**settings, **{"train.max_steps": 2}), run_dir=tmp_path / "run", log=logs.append)
    assert any("model on cuda" in line for line in logs), logs
    trainer.train(make_config(**settings, **{"train.max_steps": 3}), run_dir=run, resume=True, log=logs.append)
    assert any("resumed" in line and "step 2" in line for line in logs)
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["grad_norm"] > 0 and r["tokens_kept"] > 0 for r in rows)
    assert read_jsonl(run / "eval.jsonl")[-1]["step"] == 3
