"""The training loop on a tiny random model: weights move, micro-batching is exact, resume is exact,
checkpoints are atomic, failing rewards stop the run, and the D3S / multi-iteration / KL paths run.

The tiny model and configs come from conftest.py; rewards are the length of the completion (see
there), so every group has reward variance and every update has signal.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from podsrl.run import checkpoint as ckpt
from podsrl.train import loop as trainer
from podsrl.errors import CheckpointWriteError, ConfigError, RewardError
from podsrl.run.metrics import read_jsonl
from conftest import function_refs, update_settings
from float_bounds import U32, batch_logprob_atol, gradient_rtol, rel_diff, within
from podsrl.train.update import UpdateBatch, micro_batch_cuts, micro_batch_order, run_update

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The training loop does not depend on the vocabulary: these runs use the tiny model with a
    686-token tokenizer, ten times faster a step than with SmolLM2's 49152 (conftest.py, issue 45)."""
    return make_small_vocab_config

STEP_FIELDS = (
    "reward_mean reward_std reward_kept_mean zero_variance_groups kept_adv_var completion_len truncated "
    "clip_frac_low clip_frac_high entropy grad_norm tokens_kept tokens_total loss lr m kept "
    "time/generate time/reward time/select time/update"
).split()


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _one_step(cfg):
    run = trainer.setup(cfg)
    model = run.policy.model
    model.train()
    optimizer, scheduler = trainer.make_optimizer(cfg, model)
    before = _params(model)
    metrics = trainer.train_step(run, model, optimizer, scheduler, ckpt.TrainState())
    return run, model, optimizer, before, metrics


# ------------------------------------------------------------------------------------ one step


def test_full_finetuning_step_changes_every_weight(make_config):
    cfg = make_config()
    _, model, _, before, metrics = _one_step(cfg)
    assert all(p.requires_grad for p in model.parameters())
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []
    for key in STEP_FIELDS:
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["kept"] == cfg.train.prompts_per_step * cfg.select.m
    assert metrics["kept_adv_var"] > 0 and metrics["grad_norm"] > 0
    assert metrics["tokens_kept"] == metrics["tokens_total"] > 0


def test_lora_step_changes_only_the_adapter(make_config):
    cfg = make_config(**{"model.lora": True, "model.lora_rank": 4, "model.lora_alpha": 8})
    _, model, _, before, metrics = _one_step(cfg)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed <= trainable, f"frozen base weights changed: {sorted(changed - trainable)[:3]}"
    # B starts at zero, so the first step moves every B (A's gradient is B^T(...) = 0 at first).
    lora_b = {n for n in trainable if "lora_B" in n}
    assert lora_b and lora_b <= changed
    assert metrics["grad_norm"] > 0


# ------------------------------------------------------------------- micro-batch invariance


def _rollouts(tokenizer, k: int = 4) -> UpdateBatch:
    """k rollouts with different prompt and completion lengths (so micro-batches pad differently)."""
    g = torch.Generator().manual_seed(0)
    prompts = [tokenizer(f"What is {i} + {i * 7}?{' Please.' * i}")["input_ids"] for i in range(k)]
    completions = [torch.randint(100, 5000, (3 + 2 * i,), generator=g).tolist() for i in range(k)]
    return UpdateBatch(prompt_ids=prompts, completion_ids=completions, advantages=torch.tensor([1.0, -0.5, 0.8, -1.3][:k]))


class _AdamWRecorder(torch.optim.AdamW):
    """AdamW that keeps each parameter's gradient of its first step (``first_grads``, by name order)."""

    def step(self, closure=None):
        if not hasattr(self, "first_grads"):
            self.first_grads = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


def _update(model, batch, micro_batch_size, optimizer_name, **kwargs):
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer_name == "sgd":
        optimizer = torch.optim.SGD(params, lr=0.5)
    else:
        # Adam's first step is about lr * sign(g): float noise in a near-zero gradient entry (an
        # unused token's embedding row, a q_proj entry the loss barely touches) moves it by up to
        # lr, so lr stays small against the tolerance.
        optimizer = _AdamWRecorder(params, lr=1e-4, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    options = dict(
        pad_id=0,
        temperature=1.0,
        eps_low=0.2,
        eps_high=0.28,
        aggregation="sequence",
        max_completion_len=16,
        grad_clip=0.0,
    )
    options.update(kwargs)
    stats = run_update(model, optimizer, scheduler, batch, update_settings(micro_batch_size=micro_batch_size, **options))
    stats.first_grads = getattr(optimizer, "first_grads", None)
    return model, stats



@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir, one_thread):
    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    torch.manual_seed(0)
    return load_policy(ModelConfig(name=str(tiny_model_dir)))


@pytest.mark.parametrize("aggregation", ["sequence", "token", "constant"])
@pytest.mark.parametrize(
    "optimizer_name, extra",
    [
        pytest.param("sgd", {}, id="sgd"),
        pytest.param("adamw", {}, id="adamw"),
        pytest.param("sgd", {"token_fraction": 0.5, "temperature": 0.7}, id="sgd-d3s-tokens"),
        pytest.param("sgd", {"policy_iterations": 2, "grad_clip": 1.0}, id="sgd-2-iterations-clipped"),
    ],
)
def test_micro_batch_size_does_not_change_the_update(tiny_policy, aggregation, optimizer_name, extra):
    model, tokenizer = tiny_policy.model, tiny_policy.tokenizer
    batch = _rollouts(tokenizer)
    a, stats_a = _update(model, batch, 1, optimizer_name, aggregation=aggregation, **extra)  # accumulation 4
    b, stats_b = _update(model, batch, 4, optimizer_name, aggregation=aggregation, **extra)  # accumulation 1
    c, stats_c = _update(model, batch, 3, optimizer_name, aggregation=aggregation, **extra)  # uneven split
    start = dict(model.named_parameters())
    moved = 0
    # The gradients differ by float32 summation order, at most gradient_rtol of their norm (each
    # entry too). SGD moves a weight by lr g: by at most lr gradient_rtol |g| apart, where |g| is the
    # norm applied (the clip when clipping); a second iteration's gradient, at weights that far apart,
    # differs by that again on a step that does not diverge (lr ||Hessian|| <= 1): 2^k - 1 for k
    # iterations. AdamW's first step is lr g / (|g| + eps) (eps = 1e-8): a gradient entry that is
    # float noise may step either way, so its gradients are checked (gradient_rtol) and its weights
    # against the step each run's own gradient gives (float64), plus the step's float32 rounding
    # (m / (1 - b1), sqrt(v / (1 - b2)), + eps, /, x lr: 6 U32 of lr in each run).
    iterations = extra.get("policy_iterations", 1)
    applied = extra["grad_clip"] if extra.get("grad_clip") else stats_b.grad_norm
    lr, rtol = (0.5 if optimizer_name == "sgd" else 1e-4), 4 * iterations * U32  # rtol: each weight's own rounding, in both
    grad_rtol = gradient_rtol(model.get_input_embeddings().weight.shape[0])
    adam_step = lambda g: lr * g.double() / (g.double().abs() + 1e-8)  # noqa: E731
    for i, ((name, pa), pb, pc) in enumerate(zip(a.named_parameters(), b.parameters(), c.parameters())):
        for other, stats, what in ((pa, stats_a, "mb 1 vs 4"), (pc, stats_c, "mb 3 vs 4")):
            if optimizer_name == "sgd":
                atol = lr * (2**iterations - 1) * grad_rtol * applied
            else:
                g, g_b = stats.first_grads[i], stats_b.first_grads[i]
                assert within(rel_diff(g, g_b), grad_rtol, f"{name} {what} gradient"), f"{name} gradient differs ({what})"
                atol = (adam_step(g) - adam_step(g_b)).abs() + 12 * U32 * lr
            util = float(((other - pb).abs() / (atol + rtol * pb.abs())).max().detach())
            assert within(util, 1.0, f"{name} {what} (error / bound)"), f"{name} differs ({what}): {util:.2f} of the bound"
        moved += not torch.equal(pb, start[name])
    assert moved == len(start), "every weight should receive gradient"
    # pi / pi_old: both log-probs from another packing, each within logprob_atol; the loss sums the
    # clipped ratio (at most 1 + eps_high) times |A| over tokens, with weights that add up to 1 at most.
    ratio_rtol = math.expm1(2 * batch_logprob_atol(model, batch, extra.get("temperature", 1.0)))
    entropy_atol = batch_logprob_atol(model, batch, extra.get("temperature", 1.0), entropy=True)
    loss_atol = ratio_rtol * 1.28 * float(batch.advantages.abs().max())
    for stats in (stats_a, stats_c):
        assert stats.loss == pytest.approx(stats_b.loss, abs=loss_atol)
        assert stats.grad_norm == pytest.approx(stats_b.grad_norm, rel=gradient_rtol(model.get_input_embeddings().weight.shape[0]))
        assert within(abs(stats.entropy - stats_b.entropy), entropy_atol, "entropy")
        assert stats.ratio_mean == pytest.approx(stats_b.ratio_mean, rel=ratio_rtol)
        assert stats.clip_frac_low == pytest.approx(stats_b.clip_frac_low, abs=1e-6)
        assert stats.clip_frac_high == pytest.approx(stats_b.clip_frac_high, abs=1e-6)
        assert (stats.tokens_total, stats.tokens_kept) == (stats_b.tokens_total, stats_b.tokens_kept)
    assert stats_b.tokens_total == sum(len(c) for c in batch.completion_ids)
    if "token_fraction" in extra:
        assert stats_b.tokens_kept < stats_b.tokens_total


class _GradientRecorder(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it steps with (the accumulated gradient itself)."""

    def step(self, closure=None):
        self.recorded = {id(p): p.grad.detach().clone() for group in self.param_groups for p in group["params"]}
        return super().step(closure)


def test_micro_batch_gradient_equals_full_batch_gradient(tiny_policy):
    """The accumulated gradient itself (not only the step), for every loss aggregation."""
    model, batch = tiny_policy.model, _rollouts(tiny_policy.tokenizer)
    for aggregation in ("sequence", "token", "constant"):
        grads = []
        for mb in (1, 4):
            m = copy.deepcopy(model)
            opt = _GradientRecorder(m.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
            run_update(m, opt, sched, batch, update_settings(pad_id=0, micro_batch_size=mb, temperature=1.0, eps_low=0.2,
                       eps_high=None, aggregation=aggregation, max_completion_len=16, grad_clip=0.0))
            grads.append({n: opt.recorded[id(p)] for n, p in m.named_parameters()})
        for name, want in grads[1].items():
            # Relative to the gradient's norm: the summation order differs between micro-batch
            # sizes, and a near-zero entry can differ by float noise far above its own size.
            err, bound = rel_diff(grads[0][name], want), gradient_rtol(model.get_input_embeddings().weight.shape[0])
            assert within(err, bound, f"{name} {aggregation}"), f"{name}: relative difference {err:.1e} ({aggregation}), bound {bound:.1e}"
        assert any(g.abs().sum() > 0 for g in grads[1].values())


def test_micro_batches_by_tokens_give_the_full_batch_gradient(tiny_policy, monkeypatch):
    """optim.micro_batch_tokens: the rows cut by a token budget (here into three micro-batches of
    different row counts) accumulate the gradient of the whole batch in one micro-batch."""
    import podsrl.train.update as update_mod

    model, batch = tiny_policy.model, _rollouts(tiny_policy.tokenizer)
    lengths = sorted(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids))
    budget = 2 * lengths[1]  # the two shortest rows together, then the others alone
    cuts = []

    def recorded(*args):
        cuts.append(micro_batch_cuts(*args))
        return cuts[-1]

    monkeypatch.setattr(update_mod, "micro_batch_cuts", recorded)
    grads = []
    for options in ({"micro_batch_size": 4}, {"micro_batch_size": 1, "micro_batch_tokens": budget}):
        m = copy.deepcopy(model)
        opt = _GradientRecorder(m.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
        run_update(m, opt, sched, batch, update_settings(pad_id=0, temperature=1.0, eps_low=0.2, eps_high=None, aggregation="token",
                                                         max_completion_len=16, grad_clip=0.0, **options))  # fmt: skip
        grads.append({n: opt.recorded[id(p)] for n, p in m.named_parameters()})
    assert [len(c) for c in cuts] == [1, 3] and [b - a for a, b in cuts[1]] == [2, 1, 1]  # micro_batch_size ignored under a budget
    for name, want in grads[0].items():
        err, bound = rel_diff(grads[1][name], want), gradient_rtol(model.get_input_embeddings().weight.shape[0])
        assert within(err, bound, name), f"{name}: relative difference {err:.1e}, bound {bound:.1e}"
    assert any(g.abs().sum() > 0 for g in grads[0].values())


def test_a_token_budget_cuts_rows_while_their_padded_size_fits():
    """Rows x (the longest prompt + the longest completion) within the budget; a row alone over it is
    a micro-batch of its own; no budget: runs of micro_batch_size rows."""
    rows = [(40, 10), (40, 12), (40, 20), (30, 100), (30, 5)]
    assert micro_batch_cuts(rows, 2) == [(0, 2), (2, 4), (4, 5)]
    assert micro_batch_cuts(rows, 2, 120) == [(0, 2), (2, 3), (3, 4), (4, 5)]  # 2 x 52 fits; 3 x 60 not; 130 alone
    assert micro_batch_cuts(rows, 2, 10_000) == [(0, 5)]
    assert micro_batch_cuts([], 16, 8192) == [] and micro_batch_cuts([], 16) == []
    assert micro_batch_cuts([(50, 14)] * 300, 16, 8192) == [(0, 128), (128, 256), (256, 300)]  # 128 x 64 = 8192


@pytest.mark.parametrize("extra", [{}, {"token_fraction": 0.5, "temperature": 0.7}], ids=["grpo", "d3s-tokens"])
def test_shared_prompts_do_not_change_the_update(tiny_policy, extra):
    """Groups of rollouts on one prompt: running each prompt once gives the same gradient and stats."""
    model, tokenizer = tiny_policy.model, tiny_policy.tokenizer
    base = _rollouts(tokenizer)
    g = torch.Generator().manual_seed(1)
    rows = [0, 0, 0, 2, 2, 1, 0, 2]  # three prompts, repeated and interleaved
    batch = UpdateBatch(
        prompt_ids=[base.prompt_ids[r] for r in rows],
        completion_ids=[torch.randint(100, 5000, (2 + i % 5,), generator=g).tolist() for i in range(len(rows))],
        advantages=torch.randn(len(rows), generator=g),
    )
    results = []
    for share in (False, True):
        m = copy.deepcopy(model)
        opt = _GradientRecorder(m.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
        options = dict(pad_id=0, temperature=1.0, eps_low=0.2, eps_high=None, aggregation="sequence",
                       max_completion_len=16, grad_clip=0.0) | extra  # fmt: skip
        stats = run_update(m, opt, sched, batch, update_settings(micro_batch_size=3, share_prompts=share, **options))
        results.append(({n: opt.recorded[id(p)] for n, p in m.named_parameters()}, stats))
    (plain, plain_stats), (shared, shared_stats) = results
    for name, want in plain.items():
        # Float noise (another summation order): gradient_rtol; a wrong gradient path is O(1).
        err, bound = rel_diff(shared[name], want), gradient_rtol(model.get_input_embeddings().weight.shape[0])
        assert within(err, bound, name), f"{name}: relative difference {err:.1e}, bound {bound:.1e}"
    # The loss and the entropy: as in test_micro_batch_size_does_not_change_the_update (another packing's log-probs).
    temperature = extra.get("temperature", 1.0)
    loss_atol = math.expm1(2 * batch_logprob_atol(model, batch, temperature)) * 1.28 * float(batch.advantages.abs().max())
    assert within(abs(shared_stats.loss - plain_stats.loss), loss_atol, "loss")
    assert within(abs(shared_stats.entropy - plain_stats.entropy), batch_logprob_atol(model, batch, temperature, entropy=True), "entropy")
    assert (shared_stats.tokens_total, shared_stats.tokens_kept) == (plain_stats.tokens_total, plain_stats.tokens_kept)


def test_micro_batches_keep_a_prompts_rollouts_together():
    prompts = [[1], [2, 2, 2], [1], [3, 3], [2, 2, 2], [1]]
    completions = [[9] * k for k in (5, 1, 2, 1, 4, 1)]
    order = micro_batch_order(prompts, completions)
    assert sorted(order) == list(range(6))
    # Groups by their longest sequence (3, 6, 7 tokens), rollouts within a group by length.
    assert order == [3, 5, 2, 0, 1, 4]


# ------------------------------------------------------------------------------ resume


def _untimed(row: dict) -> dict:
    """A metrics row without its wall-clock fields, which differ between any two runs."""
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "train_seconds"}


def _assert_rows_equal(rows_a, rows_b):
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    for ra, rb in zip(rows_a, rows_b):
        a, b = _untimed(ra), _untimed(rb)
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], (int, float)):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-5), f"step {ra['step']} {key}"
            else:
                assert a[key] == b[key], key


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(ckpt.latest(run_dir) / "weights.safetensors"))


RESUME_SETTINGS = {"train.max_steps": 4, "model.lora": True, "model.lora_rank": 4, "eval.at_start": False}


@pytest.fixture(scope="module", params=[True, False], ids=["lora", "full"])
def resume_case(request, make_config, tmp_path_factory, one_thread):
    """(settings, run A): 4 uninterrupted steps, LoRA or full fine-tuning."""
    settings = {**RESUME_SETTINGS, "model.lora": request.param}
    run_a = trainer.train(make_config(**settings), run_dir=tmp_path_factory.mktemp("run-a"), log=lambda *_: None)
    return settings, run_a


def test_resume_continues_exactly(resume_case, make_config, tmp_path):
    settings, run_a = resume_case
    cfg = make_config(**settings)
    short = make_config(**{**settings, "train.max_steps": 2})
    run_b = trainer.train(short, run_dir=tmp_path / "b", log=lambda *_: None)
    assert [r["step"] for r in read_jsonl(run_b / "metrics.jsonl")] == [1, 2]
    logs = []
    trainer.train(cfg, run_dir=run_b, resume=True, log=logs.append)
    assert any("resumed" in line and "step 2" in line for line in logs)
    rows_a, rows_b = read_jsonl(run_a / "metrics.jsonl"), read_jsonl(run_b / "metrics.jsonl")
    _assert_rows_equal(rows_a, rows_b)
    wa, wb = _weights(run_a), _weights(run_b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=1e-5)
    assert ckpt.latest(run_b).name == "step-000004"


def test_interrupted_run_resumes_from_its_checkpoint(resume_case, make_config, tmp_path, monkeypatch):
    settings, run_a = resume_case
    cfg = make_config(**{**settings, "train.checkpoint_every": 2})

    real_step = trainer.train_step

    def crash_at_step_4(s, model, optimizer, scheduler, state):
        if state.step == 3:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C during step 4
        return real_step(s, model, optimizer, scheduler, state)

    monkeypatch.setattr(trainer, "train_step", crash_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(cfg, run_dir=tmp_path / "b", log=lambda *_: None)
    monkeypatch.setattr(trainer, "train_step", real_step)
    run_b = tmp_path / "b"
    # Three steps were logged, but the last checkpoint is at step 2 and is complete.
    assert [r["step"] for r in read_jsonl(run_b / "metrics.jsonl")] == [1, 2, 3]
    last = ckpt.latest(run_b)
    assert last.name == "step-000002"
    assert (last / "weights.safetensors").is_file() and (last / "state.pt").is_file()
    assert not list((run_b / "checkpoints").glob(".tmp-*"))
    # A kill in the middle of writing a metrics line leaves it torn; that must not block resuming.
    with open(run_b / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "reward_mean": 0.')

    trainer.train(cfg, run_dir=run_b, resume=True, log=lambda *_: None)
    rows_b = read_jsonl(run_b / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == [1, 2, 3, 4]  # step 3's first row was dropped, not duplicated
    _assert_rows_equal(read_jsonl(run_a / "metrics.jsonl"), rows_b)
    wa, wb = _weights(run_a), _weights(run_b)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=1e-5)


def test_resuming_a_finished_run_changes_nothing(resume_case, make_config, tmp_path):
    settings, run_a = resume_case
    run = tmp_path / "finished"
    shutil.copytree(run_a, run)
    files = {p.name: p.read_bytes() for p in (run / "metrics.jsonl", run / "eval.jsonl")}
    logs = []
    trainer.train(make_config(**settings), run_dir=run, resume=True, log=logs.append)
    assert {p.name: p.read_bytes() for p in (run / "metrics.jsonl", run / "eval.jsonl")} == files
    assert any("already reached its budget" in line for line in logs)


def test_resuming_a_cosine_run_with_another_max_steps_is_refused(make_config, tmp_path):
    """A cosine rate decays to 0 at train.max_steps: a longer run resumed would follow a schedule
    neither length has, so the length of a cosine run is fixed (a constant rate's may be raised)."""
    from podsrl.config import to_toml
    from podsrl.run.rundir import prepare

    cosine = {"optim.lr_schedule": "cosine", "train.max_steps": 4}
    (tmp_path / "config.toml").write_text(to_toml(make_config(**cosine)))
    with pytest.raises(ConfigError) as err:
        prepare(tmp_path, make_config(**{**cosine, "train.max_steps": 8}), resume=True)
    for fragment in ("train.max_steps (4 -> 8)", "optim.lr_schedule = 'cosine'", "--train.max_steps=8 --out NEW_DIR"):
        assert fragment in str(err.value)
    assert prepare(tmp_path, make_config(**{**cosine, "train.max_seconds": 1e6}), resume=True).changes  # the clock is free
    (tmp_path / "config.toml").write_text(to_toml(make_config(**{"train.max_steps": 4})))
    assert prepare(tmp_path, make_config(**{"train.max_steps": 8}), resume=True).changes == {"train.max_steps": (4, 8)}


@pytest.mark.parametrize(
    "settings, factors",
    [
        ({"optim.warmup_steps": 2}, [1 / 3, 2 / 3, 1.0]),  # (i + 1) / (warmup + 1), then optim.lr
        ({"optim.lr_schedule": "cosine"}, [1.0, 0.75, 0.25]),  # 0.5 (1 + cos(pi i / 3))
    ],
)
def test_metrics_log_the_learning_rate_each_step_used(make_config, tmp_path, settings, factors):
    cfg = make_config(**{"train.max_steps": 3, "eval.at_start": False, "eval.at_end": False, "train.checkpoint_every": 0, **settings})
    rows = read_jsonl(trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None) / "metrics.jsonl")
    assert all("loss" in row for row in rows)  # every step updated (the scheduler moved once per step)
    assert [row["lr"] for row in rows] == pytest.approx([cfg.optim.lr * f for f in factors])


# ------------------------------------------------------------------------ checkpoint atomicity


class Crash(RuntimeError):
    pass


def _small_state():
    """A model with tied weights (like the tiny LM), an AdamW state and a scheduler."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, torch.nn.Linear(4, 4), head)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    return model, opt, sched


def _train_once(model, opt, sched):
    loss = model(torch.tensor([1, 2, 3])).square().mean()
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def _half_write(path, *_, **__):
    Path(path).write_bytes(b"partial")
    raise Crash("disk full")


FAILURES = {
    # where the save dies: (monkeypatch target, attribute, replacement factory)
    "weights": lambda mp: mp.setattr(ckpt, "save_file", lambda tensors, path, *a, **k: _half_write(path)),
    "state": lambda mp: mp.setattr(ckpt.torch, "save", lambda obj, path, *a, **k: _half_write(path)),
    "rename": lambda mp: mp.setattr(ckpt.os, "replace", _fail_on_directory(os.replace)),
    "pointer": lambda mp: mp.setattr(ckpt, "_write_atomic", _raise),
    "delete-old": lambda mp: mp.setattr(ckpt.shutil, "rmtree", _half_rmtree),
}


def _raise(*_, **__):
    raise Crash("killed")


def _fail_on_directory(real):
    def replace(src, dst):
        if Path(src).is_dir():
            raise Crash("killed while renaming")
        return real(src, dst)

    return replace


def _half_rmtree(path, *_, **__):
    (Path(path) / "weights.safetensors").unlink()
    raise Crash("killed while deleting")


@pytest.mark.parametrize(
    "where, same_step",
    # Only a checkpoint that replaces one of the same step (the trainer's final save right after a
    # periodic one) deletes anything before its new copy is in place.
    [(where, same) for where in sorted(FAILURES) for same in (False, True) if same or where != "delete-old"],
    ids=lambda v: v if isinstance(v, str) else ("same-step" if v else "next-step"),
)
def test_failed_checkpoint_write_keeps_a_valid_latest(tmp_path, monkeypatch, where, same_step):
    model, opt, sched = _small_state()
    _train_once(model, opt, sched)
    first = ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=1, train_seconds=1.5), policy=ckpt.SavePolicy(keep=1))
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train_once(model, opt, sched)

    with monkeypatch.context() as mp:
        FAILURES[where](mp)
        with pytest.raises((Crash, CheckpointWriteError)):  # a failed write is reported as CheckpointWriteError
            ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=1 if same_step else 2), policy=ckpt.SavePolicy(keep=1))

    last = ckpt.latest(tmp_path)
    assert last is not None, "no resumable checkpoint left"
    fresh, fresh_opt, fresh_sched = _small_state()
    state = ckpt.load(last, fresh, fresh_opt, fresh_sched)
    if last == first and not (same_step and where in ("pointer", "rename", "delete-old")):
        # The previous checkpoint, untouched.
        assert state == ckpt.TrainState(step=1, train_seconds=1.5)
        for name, p in fresh.named_parameters():
            torch.testing.assert_close(p, saved[name], atol=0, rtol=0)
    else:  # the failure came after the new checkpoint was complete: either copy is fine
        assert state.step in (1, 2)
    assert fresh_opt.state_dict()["state"], "optimizer state restored"

    # The next save succeeds and clears what the failed one left behind.
    ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=3), policy=ckpt.SavePolicy(keep=1))
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".latest")) == ["latest", "step-000003"]
    assert ckpt.latest(tmp_path) == root / "step-000003"


def test_checkpoint_keeps_the_newest_and_round_trips(tmp_path):
    model, opt, sched = _small_state()
    for step in (1, 2, 3):
        _train_once(model, opt, sched)
        ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=step, train_seconds=step * 2.0), policy=ckpt.SavePolicy(keep=2))
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-000002", "step-000003"]
    fresh, fresh_opt, fresh_sched = _small_state()
    state = ckpt.load(ckpt.latest(tmp_path), fresh, fresh_opt, fresh_sched)
    assert state == ckpt.TrainState(step=3, train_seconds=6.0)
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0)
    assert fresh[0].weight is fresh[2].weight  # tied weights stay tied after loading
    assert fresh_sched.last_epoch == sched.last_epoch == 3
    # Identical next steps: the optimizer moments came back too.
    _train_once(model, opt, sched)
    _train_once(fresh, fresh_opt, fresh_sched)
    for p, q in zip(model.parameters(), fresh.parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


def test_latest_ignores_a_pointer_to_an_incomplete_directory(tmp_path):
    model, opt, sched = _small_state()
    ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=1), policy=ckpt.SavePolicy(keep=3))
    ckpt.save(tmp_path, model, opt, sched, ckpt.TrainState(step=2), policy=ckpt.SavePolicy(keep=3))
    (tmp_path / "checkpoints" / "step-000002" / "weights.safetensors").unlink()
    assert ckpt.latest(tmp_path).name == "step-000001"
    assert ckpt.latest(tmp_path / "nowhere") is None


# -------------------------------------------------------------------------- failing rewards


@pytest.mark.parametrize("reward, detail", [("raising_reward", "boom from the test reward"), ("nan_reward", "nan")])
def test_failing_reward_stops_training_with_the_prompt(make_config, reward_spec, tmp_path, reward, detail):
    cfg = make_config(**{"reward.names": [reward_spec(reward)], "eval.at_start": False})
    with pytest.raises(RewardError) as err:
        trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    message = str(err.value)
    assert reward in message and detail in message
    assert "prompt: 'What is" in message and "completion:" in message
    assert read_jsonl(tmp_path / "run" / "metrics.jsonl") == []  # nothing was scored 0 and logged


TIMEOUT_REWARDS = """
def binary(completion, example):
    return float(len(completion) % 2)


binary.reward_values = (0.0, 1.0)


def scalar(completion, example):
    return 1.0


scalar.reward_values = 1.0
"""


@pytest.fixture(scope="module")
def declared_reward(write_module):
    return function_refs(write_module("declared_rewards", TIMEOUT_REWARDS))


@pytest.mark.parametrize(
    "settings, fragments",
    [
        ({"reward.values": [0.0, 1.0]}, ["reward.timeout_score = -1: ", "total rewards [-1.0]", "reward.values [0.0, 1.0]"]),
        ({}, ["reward.timeout_score = -1: ", "binary rewards", "[-1.0, 0.0, 1.0]"]),  # declared by the function
    ],
)
def test_a_timeout_score_early_stopping_cannot_take_is_refused_at_the_start_naming_it(make_config, declared_reward, settings, fragments):
    early = {"reward.names": [declared_reward("binary")], "rollout.early_stop": "exact", "select.rule": "max_variance",
             "reward.timeout_seconds": 5.0, **settings}  # fmt: skip
    with pytest.raises(ConfigError) as err:
        trainer.preflight(make_config(**early, **{"reward.timeout_score": -1.0}))
    for fragment in fragments:
        assert fragment in str(err.value)
    assert trainer.preflight(make_config(**early, **{"reward.timeout_score": 0.0}))[1] == (0.0, 1.0)


def test_a_scalar_reward_values_is_one_line_naming_the_function(declared_reward, tmp_path):
    from test_cli import assert_user_error, run_cli

    code, _, err = run_cli(["train", "--out", str(tmp_path / "run"), "--no-plot", f"--reward.names={declared_reward('scalar')}"])
    assert_user_error(code, err, f"reward {declared_reward('scalar')!r}: reward_values = 1.0 is not a list", "(0.0, 1.0)")


# ------------------------------------------------------------------- D3S, iterations, KL


def test_d3s_token_selection_keeps_fewer_tokens_on_a_schedule(make_config, tmp_path):
    cfg = make_config(
        **{
            "select.rule": "d3s_intra",
            "select.m": 2,
            "select.m_final": 4,
            "select.m_schedule": "linear",
            "select.token_fraction": 0.5,
            "select.token_fraction_final": 1.0,
            "select.token_schedule": "linear",
            "train.max_steps": 2,
            "eval.at_start": False,
            "eval.at_end": False,
        }
    )
    assert cfg.select.uses_token_selection and cfg.select.advantages_over_group
    logs = []
    rows = read_jsonl(trainer.train(cfg, run_dir=tmp_path / "run", log=logs.append) / "metrics.jsonl")
    # The start-up lines say the schedules and what drives them: here both budgets (train.max_seconds has a default).
    (line,) = [line for line in logs if line.startswith("podsrl: schedule: ")]
    assert "select.m 2 -> 4 (linear), token fraction 0.5 -> 1 (linear)" in line and "train.max_seconds = 240 s" in line
    first, second = rows
    # The schedules start at the first step and end at the last one (issue 32: the last step had
    # progress (max_steps - 1) / max_steps, so m_final and token_fraction_final were never used).
    assert (first["m"], first["token_fraction"]) == (2, 0.5) and (second["m"], second["token_fraction"]) == (4, 1.0)
    assert first["tokens_kept"] < first["tokens_total"]
    assert first["tokens_kept"] == pytest.approx(0.5 * first["tokens_total"], abs=1)
    assert first["tokens_kept"] < second["tokens_kept"] <= second["tokens_total"]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rows)


def test_progress_runs_from_the_first_step_to_the_last(make_config):
    progress = lambda cfg, step, seconds=0.0: trainer.progress(cfg, ckpt.TrainState(step=step, train_seconds=seconds))  # noqa: E731
    steps = make_config(**{"train.max_steps": 5, "train.max_seconds": None})
    assert [progress(steps, k) for k in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]  # step 4 is the last one taken
    assert progress(make_config(**{"train.max_steps": 1, "train.max_seconds": None}), 0) == 0.0  # one step: the start
    # A time budget: steps of 10 s in 100 s start at 0, 10, ..., 90 s; the one at 90 s is the last.
    timed = make_config(**{"train.max_steps": None, "train.max_seconds": 100.0})
    assert [progress(timed, k, 10.0 * k) for k in range(10)] == pytest.approx([k / 9 for k in range(10)])
    assert progress(timed, 0, 0.0) == 0.0 and progress(timed, 1, 150.0) == 1.0  # a first step longer than the budget
    both = make_config(**{"train.max_steps": 11, "train.max_seconds": 100.0})  # the further of the two
    assert progress(both, 5, 10.0 * 5) == pytest.approx(max(5 / 10, 50 / 90))


def test_the_start_up_line_says_what_drives_a_schedule(make_config):
    """m reached its end at step 2 of max_steps = 4 because train.max_seconds was set too (issue 45):
    the run says, when a schedule moves, whether steps, time or the further of both drive it."""
    moving = {"select.m": 2, "select.m_final": 4, "select.m_schedule": "linear"}
    both = trainer.schedule_line(make_config(**moving, **{"train.max_steps": 4, "train.max_seconds": 60.0}))
    assert both.startswith("podsrl: schedule: select.m 2 -> 4 (linear); progress follows the further of the steps")
    assert "train.max_steps = 4" in both and "train.max_seconds = 60 s" in both and "before step 4" in both
    steps = trainer.schedule_line(make_config(**moving, **{"train.max_steps": 4, "train.max_seconds": None}))
    assert steps.endswith("progress follows the steps: its end at step 4 (train.max_steps)")
    timed = trainer.schedule_line(make_config(**moving, **{"train.max_steps": None, "train.max_seconds": 60.0}))
    assert timed.endswith("progress follows the training time: its end at train.max_seconds = 60 s (evaluation excluded)")
    assert trainer.schedule_line(make_config(**{"train.max_steps": 4})) is None  # nothing moves: no line
    assert trainer.schedule_line(make_config(**{"select.m": 2, "select.m_final": 2, "select.m_schedule": "linear"})) is None


@pytest.mark.parametrize(
    "settings, fragments",
    [
        ({"model.dtype": "bfloat16"}, ["model.dtype = 'bfloat16'", "full fine-tuning", "no float32 master copy", "model.dtype = 'float32'", "model.lora = true"]),
        ({"model.dtype": "bfloat16", "distributed.parallel": "fsdp"}, ["model.dtype = 'bfloat16'", "model.mixed_precision = 'bf16'"]),
        ({"model.dtype": "float16"}, ["model.dtype = 'float16'", "GradScaler", "'bfloat16'", "'float32'"]),
        ({"model.dtype": "float16", "model.lora": True}, ["model.dtype = 'float16'", "GradScaler"]),
    ],
    ids=["bf16-full", "bf16-fsdp", "fp16-full", "fp16-lora"],
)
def test_low_precision_that_would_train_wrongly_is_refused(make_config, tmp_path, settings, fragments):
    # Issue 32: bf16 full fine-tuning ran AdamW on bf16 weights (no float32 master copy: small
    # updates round away), and float16 trained without loss scaling. Refused before anything loads.
    cfg = make_config(**settings)
    with pytest.raises(ConfigError) as err:  # wherever the optimizer is made
        trainer.make_optimizer(cfg, torch.nn.Linear(2, 2))
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    if cfg.distributed.parallel != "fsdp":  # (fsdp needs torchrun)
        with pytest.raises(ConfigError) as early:  # before the model loads
            trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
        assert str(early.value) == str(err.value)
        assert not (tmp_path / "run").exists()


def test_lora_on_a_bfloat16_base_trains_float32_adapter_weights(make_config):
    cfg = make_config(**{"model.dtype": "bfloat16", "model.lora": True, "model.lora_rank": 4})
    _, model, optimizer, before, metrics = _one_step(cfg)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(p.dtype == torch.float32 for p in trained.values())  # what AdamW updates
    assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if not p.requires_grad)
    assert all(not torch.equal(p, before[n]) for n, p in trained.items() if "lora_B" in n)
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0


def test_policy_iterations_take_several_optimizer_steps_per_batch(make_config):
    cfg = make_config(**{"loss.policy_iterations": 2, "optim.lr": 1e-2})
    _, model, optimizer, before, metrics = _one_step(cfg)
    states = [optimizer.state[p] for p in model.parameters() if p.requires_grad]
    assert all(int(st["step"]) == 2 for st in states)
    # The second iteration sees pi_theta != pi_old, so the ratio moves away from 1.
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-7)
    assert all(math.isfinite(metrics[k]) for k in STEP_FIELDS)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_kl_penalty_runs_and_reports_kl(make_config, tmp_path, lora):
    cfg = make_config(
        **{"loss.beta": 0.1, "model.lora": lora, "model.lora_rank": 4, "train.max_steps": 2, "eval.at_start": False, "eval.at_end": False}
    )
    rows = read_jsonl(trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None) / "metrics.jsonl")
    assert all("kl" in r and math.isfinite(r["kl"]) and r["kl"] >= 0 for r in rows)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts at the reference
    assert rows[1]["kl"] > 1e-8  # and has moved away from it after one step


def test_no_kl_without_beta(make_config):
    _, _, _, _, metrics = _one_step(make_config())
    assert "kl" not in metrics


def test_filtered_out_step_skips_the_update(tiny_model_dir, reward_file):
    # A constant reward gives every group zero variance; the DAPO filter drops them all. SmolLM2's
    # tokenizer: the small one's random completions end in a number too often (then skipped).
    from podsrl.config import from_dict

    from conftest import tiny_config_dict

    cfg = from_dict(tiny_config_dict(tiny_model_dir, reward_file, **{"reward.names": ["format"], "select.filter_zero_variance": True,
                                                                     "train.max_steps": 1, "eval.at_start": False, "eval.at_end": False}))  # fmt: skip
    s, model, optimizer, before, metrics = _one_step(cfg)
    if metrics["zero_variance_groups"] < 1:
        pytest.skip("the random model happened to produce a number at the end")
    assert metrics["kept"] == 0 and "loss" not in metrics
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_eval_schedule_and_files(make_config, tmp_path):
    cfg = make_config(**{"train.max_steps": 3, "eval.every_steps": 2, "train.checkpoint_every": 0})
    run = trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    evals = read_jsonl(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 3]
    assert all(e["problems"] == cfg.eval.max_problems and 0 <= e["accuracy"] <= 1 for e in evals)
    # checkpoint_every = 0: only the final checkpoint.
    assert [p.name for p in (run / "checkpoints").glob("step-*")] == ["step-000003"]
    from podsrl.config import load

    assert load(run / "config.toml") == cfg
