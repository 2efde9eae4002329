"""Rows whose advantage is exactly 0 take no forward pass, and the update is the one they would give.

- Skipping equals not skipping (``skip_zero_advantage``): the accumulated gradient (within float32
  summation order's bound, tests/float_bounds.py) and the weights after one AdamW step (within what
  that gradient difference can move them), for every
  loss aggregation, several micro-batch sizes, D3S token selection (|A| x H and entropy-only, a
  fraction that really drops tokens of the rows with a signal: the budget is over those rows) and
  two policy iterations; the same over a few training steps of the whole loop. A wrong token mask
  in the skipping run fails that comparison.
- The skipped rows really take no forward: the scoring pass (|A| x H and entropy-only) sees only
  the rows with a signal, a KL term turns skipping off.
- A step whose rows all have advantage 0 still steps the optimizer (AdamW's weight decay and
  momentum move the weights on a zero gradient), without a forward pass.
- One policy iteration uses the update's own forward as pi_old even when a scoring pass ran (KL):
  the ratio is exactly 1 under dropout.

Two processes (DDP and FSDP) are in tests/test_distributed.py (the ``*_skip`` / ``*_noskip`` cases).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from conftest import ten_rollouts, update_settings
from float_bounds import U32, gradient_rtol, rel_diff, within
from podsrl.core.loss import AGGREGATIONS
from podsrl.core.token_selection import select_tokens, selectable
from podsrl.train import update as update_module
from podsrl.train.update import UpdateBatch, run_update

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The runs here use the tiny model with a 686-token tokenizer, ten times faster a step than
    with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir, one_thread):
    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    torch.manual_seed(0)
    return load_policy(ModelConfig(name=str(tiny_model_dir)))


ZEROS = [0, 2, 3, 5, 6, 8, 9]  # 7 of 10 rows without signal, as in a GRPO step (78% zero-variance groups)
# The rows with a signal (1, 4, 7) hold 14 of the 50 completion tokens: a token fraction of 0.4 keeps
# ceil(0.4 x 14) = 6 of them. (A budget over all 50 tokens, 20, kept all 14 whatever the mask.)
SIGNAL_TOKENS = 14


LR, EPS = 1e-4, 1e-6  # the update's AdamW


class _Recorder(torch.optim.AdamW):
    """AdamW that keeps a copy of the gradients it steps with."""

    def step(self, closure=None):
        self.recorded = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


def _step(model, batch, *, skip: bool, micro_batch_size: int = 4, **options):
    """One update of a copy of ``model``; (weights, gradients, stats, rows per forward call)."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    # eps above float noise: AdamW's first step moves a weight by lr x g / (|g| + eps), so with the
    # default 1e-8 a gradient entry of ~1e-10, which only the summation order decides, would move its
    # weight by a third of lr or two thirds depending on the micro-batching (measured: weights 1.7e-6
    # apart, relative, on a 1e-5 gradient agreement).
    optimizer = _Recorder(params, lr=LR, weight_decay=0.01, eps=EPS)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    settings = dict(pad_id=0, temperature=1.0, eps_low=0.2, eps_high=0.28, aggregation="sequence", max_completion_len=16, grad_clip=0.0)
    settings.update(options)
    forwards: list[int] = []
    real = update_module.forward_logprobs

    def counting(model, packed, **kwargs):
        forwards.append(packed.completion_ids.shape[0])
        return real(model, packed, **kwargs)

    # A KL term's reference: the LoRA base, or a frozen copy for full fine-tuning.
    reference = copy.deepcopy(model) if settings.get("beta") and not hasattr(model, "disable_adapter") else None
    update_module.forward_logprobs = counting
    try:
        stats = run_update(model, optimizer, scheduler, batch, update_settings(micro_batch_size=micro_batch_size, skip_zero_advantage=skip, **settings),
                           reference=reference)  # fmt: skip
    finally:
        update_module.forward_logprobs = real
    return [p.detach().clone() for p in params], optimizer.recorded, stats, forwards


def _assert_same_update(a, b, what: str, iterations: int = 1) -> None:
    """The same update up to float32 summation order: the gradients within ``gradient_rtol`` (a later
    iteration's also carries the earlier steps' weight difference: 2^k - 1 times that after k, on
    steps that do not diverge); AdamW's step lr g / (|g| + eps) moves a weight by at most lr / eps
    times the gradient's difference, and each weight's own rounding by U32 of it in each run."""
    (wa, ga, sa, _), (wb, gb, sb, _) = a, b
    rtol = (2**iterations - 1) * gradient_rtol(gb[0].shape[0])  # the first parameter: the embedding, a row per token
    for i, (x, y) in enumerate(zip(ga, gb)):
        err = rel_diff(x, y)
        assert within(err, rtol, f"{what}: gradient {i}"), f"{what}: gradient {i} relative difference {err:.1e}, bound {rtol:.1e}"
    for i, (x, y, g) in enumerate(zip(wa, wb, gb)):
        err, bound = rel_diff(x, y), LR / EPS * rtol * float(g.double().norm()) / float(y.double().norm()) + 2 * iterations * U32
        assert within(err, bound, f"{what}: weights {i}"), f"{what}: weights {i} relative difference {err:.1e}, bound {bound:.1e}"
    assert sa.loss == pytest.approx(sb.loss, abs=1e-6)
    assert sa.grad_norm == pytest.approx(sb.grad_norm, rel=rtol)
    assert (sa.sequences, sa.tokens_total, sa.tokens_kept) == (sb.sequences, sb.tokens_total, sb.tokens_kept)


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="grpo"),
        pytest.param({"token_fraction": 0.4, "temperature": 0.7}, id="d3s-adv-entropy"),
        pytest.param({"token_fraction": 0.4, "token_score": "entropy"}, id="entropy-80-20"),
        pytest.param({"policy_iterations": 2, "grad_clip": 1.0}, id="2-iterations"),
    ],
)
def test_skipping_zero_advantage_rows_gives_the_same_update(tiny_policy, aggregation, extra):
    model, batch = tiny_policy.model, ten_rollouts(tiny_policy.tokenizer, ZEROS)
    full = _step(model, batch, skip=False, micro_batch_size=4, aggregation=aggregation, **extra)
    for micro_batch_size in (1, 3, 16):
        skipped = _step(model, batch, skip=True, micro_batch_size=micro_batch_size, aggregation=aggregation, **extra)
        _assert_same_update(skipped, full, f"{aggregation}, micro-batch {micro_batch_size}", extra.get("policy_iterations", 1))
        stats = skipped[2]
        assert stats.rows_run == 3 and stats.sequences == 10
        assert stats.tokens_run == SIGNAL_TOKENS == sum(len(batch.completion_ids[i]) for i in range(10) if i not in ZEROS)
        if "token_fraction" in extra:  # the mask drops tokens of the rows with a signal
            assert stats.tokens_kept == math.ceil(extra["token_fraction"] * SIGNAL_TOKENS) < SIGNAL_TOKENS
    assert full[2].rows_run == 10 and full[2].tokens_run == full[2].tokens_total


@pytest.mark.parametrize("token_score", ["adv_entropy", "entropy"])
def test_a_wrong_token_mask_fails_the_comparison(tiny_policy, monkeypatch, token_score):
    """The token-selection cases above compare skipping with not skipping, so they guard the mask
    only if it changes the gradient: a skipping run whose mask keeps every token of the rows with a
    signal (selection doing nothing: what the correct mask did when the budget counted the skipped
    rows' tokens) or the lowest-scoring ones must fail the comparison."""
    model, batch = tiny_policy.model, ten_rollouts(tiny_policy.tokenizer, ZEROS)
    options = dict(aggregation="sequence", token_fraction=0.4, token_score=token_score)
    full = _step(model, batch, skip=False, micro_batch_size=4, **options)
    wrong_masks = {
        "every signal token": lambda adv, ent, valid, fraction, score: selectable(valid, adv),
        "the lowest scores": lambda adv, ent, valid, fraction, score: select_tokens(adv, -ent, valid, fraction, score),
    }
    for name, wrong in wrong_masks.items():
        with monkeypatch.context() as patch:
            patch.setattr(update_module, "select_tokens", wrong)
            skipped = _step(model, batch, skip=True, micro_batch_size=3, **options)
        with pytest.raises(AssertionError, match="gradient"):
            _assert_same_update(skipped, full, name)
    _assert_same_update(_step(model, batch, skip=True, micro_batch_size=3, **options), full, "the right mask")


def test_skipped_rows_take_no_forward(tiny_policy):
    model, batch = tiny_policy.model, ten_rollouts(tiny_policy.tokenizer, ZEROS)
    *_, forwards = _step(model, batch, skip=True, micro_batch_size=16)
    assert forwards == [3]  # the update's one micro-batch: the three rows with a signal
    *_, forwards = _step(model, batch, skip=True, micro_batch_size=16, token_fraction=0.5)
    assert forwards == [3, 3]  # D3S |A| x H: the scoring pass needs only those rows too
    *_, forwards = _step(model, batch, skip=True, micro_batch_size=16, token_fraction=0.5, token_score="entropy")
    assert forwards == [3, 3]  # entropy-only too: a row with A = 0 is never selected, so it needs no entropies
    *_, forwards = _step(model, batch, skip=True, micro_batch_size=16, policy_iterations=2)
    assert forwards == [3, 3, 3]  # pi_old, then two iterations
    _, _, stats, forwards = _step(model, batch, skip=True, micro_batch_size=16, beta=0.1)
    assert forwards == [10, 10, 10] and stats.rows_run == 10  # a KL term needs every row: nothing skipped (+ reference)
    *_, forwards = _step(model, batch, skip=False, micro_batch_size=16)
    assert forwards == [10]


def test_a_step_without_signal_still_steps_the_optimizer(tiny_policy):
    """Every advantage 0 (GRPO's first steps on a hard task): no forward, but AdamW still moves the
    weights by its momentum and weight decay, exactly as with the zero gradient of a full pass."""
    model, tokenizer = tiny_policy.model, tiny_policy.tokenizer
    first, silent = ten_rollouts(tokenizer, [0, 1]), ten_rollouts(tokenizer, list(range(10)))
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    settings = dict(pad_id=0, micro_batch_size=4, temperature=1.0, grad_clip=0.0)
    run_update(m, optimizer, scheduler, first, update_settings(**settings))  # momentum to carry
    results = []
    for skip in (False, True):
        m2 = copy.deepcopy(m)
        params2 = [p for p in m2.parameters() if p.requires_grad]
        optimizer2 = torch.optim.AdamW(params2, lr=1e-3, weight_decay=0.1)
        optimizer2.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # its own moments
        scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, lambda i: 1.0)
        stats = run_update(m2, optimizer2, scheduler2, silent, update_settings(skip_zero_advantage=skip, **settings))
        assert stats.grad_norm == 0.0 and stats.loss == 0.0
        assert stats.rows_run == (0 if skip else 10)
        assert (stats.entropy is None) == skip and stats.metrics()["entropy"] == stats.entropy  # no forward: not measured (null), not 0
        assert all(not torch.equal(b, p) for b, p in zip(params, params2))  # it moved
        results.append([p.detach().clone() for p in params2])
    for a, b in zip(*results):  # zero gradients both ways: the same AdamW step, bit for bit
        assert torch.equal(a, b)


def test_one_iteration_with_a_kl_term_uses_its_own_forward_as_pi_old(tiny_model_dir):
    """Under dropout the scoring pass's forward differs from the update's: pi_old must be the
    update's own (detached), so that the on-policy ratio is exactly 1."""
    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name=str(tiny_model_dir), lora=True, lora_rank=4, lora_alpha=8, lora_dropout=0.5))
    model, batch = policy.model, ten_rollouts(policy.tokenizer, [])
    model.train()
    _, _, stats, forwards = _step(model, batch, skip=True, micro_batch_size=16, beta=0.1)
    assert len(forwards) == 3  # scoring pass, reference, update
    assert stats.ratio_mean == 1.0 and stats.clip_frac_low == 0.0 and stats.clip_frac_high == 0.0
    assert stats.kl is not None


def test_training_steps_give_the_same_weights_with_and_without_skipping(make_config, reward_spec):
    """Three steps of the whole loop (sampling, rewards, GRPO, update) on the tiny model, with a reward
    that leaves the groups of even answers without signal."""
    from podsrl.run import checkpoint as ckpt
    from podsrl.train import loop as trainer

    weights, rows = [], []
    for skip in (False, True):
        cfg = make_config(**{"optim.skip_zero_advantage": skip, "select.rule": "all", "select.m": None, "train.prompts_per_step": 4, "model.mixed_precision": "none",
                             "reward.names": [reward_spec("half_silent_reward")]})  # fmt: skip
        run = trainer.setup(cfg)
        model = run.policy.model
        model.train()
        optimizer, scheduler = trainer.make_optimizer(cfg, model)
        state = ckpt.TrainState()
        ran = 0
        for _ in range(3):
            metrics = trainer.train_step(run, model, optimizer, scheduler, state)
            state.step += 1
            ran += metrics["rows_run"]
            assert metrics["rows_run"] <= metrics["kept"]
        run.close()
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
        rows.append(ran)
    for name, want in weights[0].items():
        err = float((weights[1][name] - want).norm() / want.norm().clamp(min=1e-12))
        assert err < 1e-6, f"{name}: relative difference {err:.1e}"
    assert rows[1] < rows[0] == 3 * 4 * 4  # the groups of even answers were skipped


def test_the_sampler_trainer_gap_is_logged_over_the_rows_that_ran(tiny_policy):
    """The engine's log-probs against the trainer's own (pi_old): ~0 when they agree, the shift when
    they are off by one, and only over the rows that ran (issue 32: vLLM's log-probs were unused)."""
    from podsrl.train.sequences import forward_logprobs, pack

    model, batch = tiny_policy.model, ten_rollouts(tiny_policy.tokenizer, ZEROS)
    with torch.no_grad():
        own, _ = forward_logprobs(model, pack(batch.prompt_ids, batch.completion_ids, 0), temperature=0.7)
    lengths = [len(c) for c in batch.completion_ids]
    same = [own[i, :n].tolist() for i, n in enumerate(lengths)]
    shifted = [[x - 0.1 for x in row] for row in same]
    for sampler, diff in ((same, 0.0), (shifted, 0.1)):
        b = UpdateBatch(batch.prompt_ids, batch.completion_ids, batch.advantages, sampler_logprobs=sampler)
        _, _, stats, _ = _step(model, b, skip=True, micro_batch_size=4, temperature=0.7)
        assert stats.sampler_logp_diff == pytest.approx(diff, abs=1e-5)
        assert stats.sampler_kl == pytest.approx(math.exp(diff) - 1 - diff, abs=1e-5)
        assert {"sampler_logp_diff", "sampler_kl"} <= stats.metrics().keys()
    _, _, stats, _ = _step(model, batch, skip=True, micro_batch_size=4)
    assert "sampler_logp_diff" not in stats.metrics()  # the transformers engine gives none


def test_a_step_that_kept_no_rollout_logs_the_sampler_gap(tiny_model_dir, reward_file, tmp_path, monkeypatch):
    """The DAPO filter drops every group (the random model's rewards are all 0): no rollout is kept
    and no update runs, and the step still logs the gap between the engine's log-probs and the
    trainer's and the correction's metrics (measured on a sample of the sampled rollouts). The
    engine here is the transformers one with log-probs attached, each 0.5 below the trainer's
    (a stand-in for vLLM's)."""
    from conftest import tiny_config_dict
    from podsrl.config import from_dict
    from podsrl.engines.hf import TransformersEngine
    from podsrl.run.metrics import read_jsonl
    from podsrl.train.loop import train
    from podsrl.train.sequences import forward_logprobs, pack

    generate = TransformersEngine.generate

    def with_logprobs(self, prompt_ids, sampling):
        out = generate(self, prompt_ids, sampling)
        n = len(out.completion_ids) // len(prompt_ids)
        prompts = [p for p in prompt_ids for _ in range(n)]
        with torch.no_grad():
            own, _ = forward_logprobs(self.model, pack(prompts, out.completion_ids, 0), temperature=sampling.temperature)
        out.logprobs = [(own[i, : len(c)] - 0.5).tolist() for i, c in enumerate(out.completion_ids)]
        return out

    monkeypatch.setattr(TransformersEngine, "generate", with_logprobs)
    cfg = from_dict(tiny_config_dict(tiny_model_dir, reward_file, **{
        "reward.names": ["correctness"], "train.max_steps": 1, "eval.at_start": False, "eval.at_end": False,
        "train.checkpoint_every": 0, "rollout.max_new_tokens": 4, "select.filter_zero_variance": True,
        "rollout.importance_sampling_mode": "token_truncate"}))  # fmt: skip
    (row,) = read_jsonl(train(cfg, run_dir=tmp_path / "run", log=lambda *a: None) / "metrics.jsonl")
    assert row["kept"] == 0 and "rows_run" not in row  # no update
    assert row["sampler_logp_diff"] == pytest.approx(0.5, abs=1e-3)  # the trainer's log-probs 0.5 above the engine's
    assert row["is_ratio_mean"] == pytest.approx(math.exp(0.5), rel=1e-2) and row["is_ess"] == pytest.approx(1.0, abs=1e-6)
