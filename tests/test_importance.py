"""Importance correction of the sampler's gap (podsrl/core/importance.py) and the update that uses it.

- The pure function: hand numbers for each mode, a per-token / per-row loop over random inputs
  (brute force), the metrics (and that micro-batches combine to the whole), NaN and padding, bad
  input.
- ``policy_loss(is_weights=...)``: the weight multiplies the surrogate only, no normaliser, no KL.
- The update (``run_update``) on the tiny model against a hand-weighted loss written from the
  formula (-1/N sum_i 1/|o_i| sum_t w_{i,t} A_i log pi): every mode and aggregation, with rows of
  advantage 0 skipped; a zero gap is a no-op, bit for bit; rows of advantage 0 with a huge gap change
  nothing; two policy iterations compute the weight once, from pi_old; D3S token selection (the
  sequence ratio over every token, the metrics over the selected ones); the metrics are global.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from conftest import script_module, ten_rollouts, update_settings
from float_bounds import gradient_rtol, logprob_atol, rel_diff, within
from podsrl.core.importance import MODES, ImportanceMetrics, ImportanceSettings, importance_weights
from podsrl.core.loss import LossSettings, policy_loss
from podsrl.train import update as update_module
from podsrl.train.update import UpdateBatch, run_update

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------ the pure function


def _hand_case():
    """Two rows of 3 tokens, the second with 2 completion tokens; d = log pi_old - log pi_sampler."""
    d = torch.tensor([[math.log(2.0), math.log(0.5), math.log(4.0)], [math.log(1.5), math.log(0.25), 0.0]])
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -3.0, 123.0]])  # 123: garbage on padding
    sampler = trainer - d
    sampler[1, 2] = float("nan")  # garbage on padding
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return trainer, sampler, mask


@pytest.mark.parametrize(
    "mode, clip_min, expected, clipped",
    [
        # token: ratios 2, 0.5, 4 | 1.5, 0.25
        ("token_truncate", None, [[2.0, 0.5, 3.0], [1.5, 0.25, 0.0]], 1),
        ("token_truncate", 0.4, [[2.0, 0.5, 3.0], [1.5, 0.4, 0.0]], 2),
        ("token_mask", None, [[2.0, 0.5, 0.0], [1.5, 0.25, 0.0]], 1),
        ("token_mask", 0.4, [[2.0, 0.5, 0.0], [1.5, 0.0, 0.0]], 2),
        # sequence: 2 x 0.5 x 4 = 4 | 1.5 x 0.25 = 0.375
        ("sequence_truncate", None, [[3.0, 3.0, 3.0], [0.375, 0.375, 0.0]], 3),
        ("sequence_truncate", 0.5, [[3.0, 3.0, 3.0], [0.5, 0.5, 0.0]], 5),
        ("sequence_mask", None, [[0.0, 0.0, 0.0], [0.375, 0.375, 0.0]], 3),
        ("sequence_mask", 0.3, [[0.0, 0.0, 0.0], [0.375, 0.375, 0.0]], 3),
        # geometric: (2 x 0.5 x 4)^(1/3) = 4^(1/3) | (1.5 x 0.25)^(1/2) = 0.375^(1/2)
        ("geometric_truncate", None, [[4 ** (1 / 3)] * 3, [0.375**0.5] * 2 + [0.0]], 0),
        ("geometric_truncate", 0.7, [[4 ** (1 / 3)] * 3, [0.7, 0.7, 0.0]], 2),
        ("geometric_truncate", 0.5, [[1.5, 1.5, 1.5], [0.375**0.5] * 2 + [0.0]], 3),  # clip_max 1.5
        ("geometric_mask", 0.7, [[4 ** (1 / 3)] * 3, [0.0, 0.0, 0.0]], 2),
        ("geometric_mask", None, [[0.0, 0.0, 0.0], [0.375**0.5] * 2 + [0.0]], 3),  # clip_max 1.5
        # reject (verl's rollout_rs): 1 inside the bounds, 0 outside; the lower bound 1 / clip_max = 1/3 unless clip_min
        ("token_reject", None, [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], 2),
        ("token_reject", 0.6, [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], 3),
        ("sequence_reject", None, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]], 3),
        ("geometric_reject", None, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], 0),  # 1.59 and 0.61 within [1/3, 3]
        ("geometric_reject", 0.7, [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], 2),
    ],
)
def test_hand_numbers(mode, clip_min, expected, clipped):
    trainer, sampler, mask = _hand_case()
    clip_max = 1.5 if mode.startswith("geometric") and clipped == 3 else 3.0
    weights, metrics = importance_weights(trainer, sampler, mask, ImportanceSettings(mode=mode, clip_max=clip_max, clip_min=clip_min))
    torch.testing.assert_close(weights, torch.tensor(expected), rtol=1e-6, atol=1e-7)
    ratios = {"token": [2.0, 0.5, 4.0, 1.5, 0.25], "sequence": [4.0] * 3 + [0.375] * 2, "geometric": [4 ** (1 / 3)] * 3 + [0.375**0.5] * 2}[mode.split("_")[0]]
    assert metrics.tokens == 5 and metrics.clipped == clipped
    assert metrics.ratio_mean == pytest.approx(sum(ratios) / 5, rel=1e-6)
    assert metrics.ratio_min == pytest.approx(min(ratios), rel=1e-6) and metrics.ratio_max == pytest.approx(max(ratios), rel=1e-6)
    assert metrics.clip_frac == clipped / 5
    w = [sum(expected[0]) / 3, sum(expected[1]) / 2]  # each sequence's mean weight
    assert metrics.sequences == 2 and metrics.weight_mean == pytest.approx(sum(w) / 2, rel=1e-6)
    assert metrics.ess_sequences == (pytest.approx(sum(w) ** 2 / (2 * sum(x * x for x in w)), rel=1e-6) if any(w) else 0.0)
    tw = expected[0] + expected[1][:2]  # each counted token's own weight
    assert metrics.ess_tokens == (pytest.approx(sum(tw) ** 2 / (5 * sum(x * x for x in tw)), rel=1e-6) if any(tw) else 0.0)
    level = mode.split("_")[0]
    assert metrics.ess(level) == (metrics.ess_tokens if level == "token" else metrics.ess_sequences)


def test_ess_by_hand():
    """Kish's ESS at both levels, written out for the hand case: under token_truncate the token
    weights 2, 0.5, 3 | 1.5, 0.25 give (7.25)^2 / (5 x 15.5625) = 0.6755 over the tokens, the
    sequence means 11/6 and 7/8 give (65/24)^2 / (2 x 4.12674) = 0.8887 over the sequences, and
    is_ess is the token one; under sequence_truncate (weights 3 x 3 | 0.375 x 2) is_ess is the
    sequence one, (3.375)^2 / (2 x 9.140625) = 0.6231, the tokens' (9.75)^2 / (5 x 27.28125) = 0.6969."""
    trainer, sampler, mask = _hand_case()
    _, token = importance_weights(trainer, sampler, mask, ImportanceSettings("token_truncate"))
    assert token.ess_tokens == pytest.approx(7.25**2 / (5 * 15.5625), rel=1e-6) == pytest.approx(0.67550, abs=1e-5)
    assert token.ess_sequences == pytest.approx((65 / 24) ** 2 / (2 * ((11 / 6) ** 2 + (7 / 8) ** 2)), rel=1e-6) == pytest.approx(0.88873, abs=1e-5)
    assert token.ess("token") == token.ess_tokens
    _, seq = importance_weights(trainer, sampler, mask, ImportanceSettings("sequence_truncate"))
    assert seq.ess("sequence") == seq.ess_sequences == pytest.approx(3.375**2 / (2 * (9 + 0.140625)), rel=1e-6) == pytest.approx(0.62308, abs=1e-5)
    assert seq.ess_tokens == pytest.approx(9.75**2 / (5 * 27.28125), rel=1e-6) == pytest.approx(0.69691, abs=1e-5)
    with pytest.raises(ValueError, match="unknown importance sampling level 'tokens'"):
        token.ess("tokens")


def _brute_force(trainer, sampler, mask, settings: ImportanceSettings, token_mask):
    """A loop over rows and tokens in float64, written from the formulas."""
    N, T = trainer.shape
    weights = torch.zeros(N, T, dtype=torch.float64)
    ratios, clipped = [], 0
    low = -math.inf if settings.clip_min is None else settings.clip_min
    if settings.constraint == "reject" and settings.clip_min is None:
        low = 1 / settings.clip_max  # verl's rollout_rs default
    for i in range(N):
        d = [float(trainer[i, t]) - float(sampler[i, t]) for t in range(T) if mask[i, t]]
        d = [0.0 if math.isnan(x) else x for x in d]
        seq = math.exp(sum(d))
        geo = math.exp(sum(d) / len(d)) if d else 1.0
        for k, t in enumerate(t for t in range(T) if mask[i, t]):
            r = {"token": math.exp(d[k]), "sequence": seq, "geometric": geo}[settings.level]
            outside = r > settings.clip_max or r < low
            if settings.constraint == "truncate":
                w = min(max(r, low), settings.clip_max)
            else:
                w = 0.0 if outside else (1.0 if settings.constraint == "reject" else r)
            weights[i, t] = w
            if token_mask[i, t]:
                ratios.append(r)
                clipped += outside
    return weights, ratios, clipped


def _sequence_weights(weights, mask, token_mask) -> list[float]:
    """Each sequence's weight: the mean of its counted tokens' weights (sequences with a counted token)."""
    counted = mask & token_mask
    return [float(weights[i][counted[i]].mean()) for i in range(len(weights)) if counted[i].any()]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(6))
def test_brute_force(mode, seed):
    g = torch.Generator().manual_seed(seed)
    N, T = 7, 9
    trainer = -torch.rand(N, T, generator=g) * 4
    sampler = trainer - torch.randn(N, T, generator=g) * (0.1 if mode.startswith("sequence") else 0.6)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    token_mask = torch.rand(N, T, generator=g) < 0.7
    sampler[0, 0] = float("nan")  # a token the sampler could not score: no correction
    settings = ImportanceSettings(mode=mode, clip_max=1.0 + float(torch.rand(1, generator=g)) * 2, clip_min=[None, 0.8][seed % 2])
    weights, metrics = importance_weights(trainer, sampler, mask, settings, token_mask=token_mask)
    want, ratios, clipped = _brute_force(trainer, sampler, mask, settings, token_mask)
    torch.testing.assert_close(weights.double(), want, rtol=1e-5, atol=1e-7)
    assert metrics.tokens == len(ratios) and metrics.clipped == clipped
    if ratios:
        assert metrics.ratio_mean == pytest.approx(sum(ratios) / len(ratios), rel=1e-5)
        assert metrics.ratio_min == pytest.approx(min(ratios), rel=1e-5) and metrics.ratio_max == pytest.approx(max(ratios), rel=1e-5)
    w = _sequence_weights(want, mask, token_mask)
    assert metrics.sequences == len(w)
    if w:
        assert metrics.weight_mean == pytest.approx(sum(w) / len(w), rel=1e-5)
        assert metrics.ess_sequences == (pytest.approx(sum(w) ** 2 / (len(w) * sum(x * x for x in w)), rel=1e-5) if any(w) else 0.0)
    tw = [float(x) for x in want[mask & token_mask]]  # each counted token's own weight
    if tw:
        assert metrics.ess_tokens == (pytest.approx(sum(tw) ** 2 / (len(tw) * sum(x * x for x in tw)), rel=1e-5) if any(tw) else 0.0)
    # Rows are independent: any split into micro-batches gives the same weights and, combined, the same metrics.
    parts = [importance_weights(trainer[s], sampler[s], mask[s], settings, token_mask=token_mask[s]) for s in (slice(0, 3), slice(3, N))]
    torch.testing.assert_close(torch.cat([w for w, _ in parts]), weights, rtol=0, atol=0)
    combined = ImportanceMetrics.combine([m for _, m in parts])
    assert (combined.tokens, combined.clipped, combined.ratio_min, combined.ratio_max) == (metrics.tokens, metrics.clipped, metrics.ratio_min, metrics.ratio_max)
    assert combined.ratio_sum == pytest.approx(metrics.ratio_sum, rel=1e-12)
    assert combined.sequences == metrics.sequences
    assert (combined.weight_sum, combined.weight_sq_sum) == (pytest.approx(metrics.weight_sum, rel=1e-12), pytest.approx(metrics.weight_sq_sum, rel=1e-12))
    assert (combined.token_weight_sum, combined.token_weight_sq_sum) == (pytest.approx(metrics.token_weight_sum, rel=1e-12),
                                                                         pytest.approx(metrics.token_weight_sq_sum, rel=1e-12))  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_zero_gap_is_exactly_one(mode):
    g = torch.Generator().manual_seed(0)
    trainer = -torch.rand(4, 6, generator=g) * 3
    mask = torch.rand(4, 6, generator=g) < 0.8
    weights, metrics = importance_weights(trainer, trainer.clone(), mask, ImportanceSettings(mode=mode, clip_max=1.0, clip_min=1.0))
    assert torch.equal(weights, mask.float())  # 1 on every completion token (bounds at 1 included), 0 elsewhere
    assert metrics.clipped == 0 and metrics.ratio_min == metrics.ratio_max == 1.0
    assert metrics.sequences == int(mask.any(dim=1).sum()) and metrics.weight_mean == 1.0 and metrics.ess_sequences == metrics.ess_tokens == 1.0


def test_padding_and_overflow_never_give_nan():
    trainer = torch.tensor([[0.0, -1.0, float("nan")], [-1.0, -1.0, -1.0]])
    sampler = torch.tensor([[-200.0, -1.0, float("inf")], [-1.0, -1.0, -1.0]])  # a 200-nat gap: exp overflows float32
    mask = torch.tensor([[True, True, False], [True, True, True]])
    for mode in MODES:
        weights, metrics = importance_weights(trainer, sampler, mask, ImportanceSettings(mode=mode))
        assert torch.isfinite(weights).all(), mode
        assert float(weights[0, 0]) == (3.0 if mode.endswith("truncate") else 0.0), mode
        gap = 200.0 / 2 if mode.startswith("geometric") else 200.0  # the geometric mean over the row's 2 tokens
        assert weights[0, 2] == 0 and math.isfinite(metrics.ratio_max) and metrics.ratio_max == pytest.approx(math.exp(gap), rel=1e-6)


def test_no_token_counted():
    trainer = torch.zeros(2, 3)
    weights, metrics = importance_weights(trainer, trainer, torch.zeros(2, 3, dtype=torch.bool))
    assert torch.equal(weights, torch.zeros(2, 3))
    assert metrics.tokens == 0 and metrics.ratio_mean is None and metrics.clip_frac is None
    assert metrics.sequences == 0 and metrics.weight_mean is None and metrics.ess_sequences is None and metrics.ess_tokens is None
    assert metrics.ess("token") is None and metrics.ess("sequence") is None
    assert ImportanceMetrics.combine([metrics, metrics]).tokens == 0


def test_ess_of_a_batch_masked_whole_is_zero():
    """Every sequence masked (ratio far above clip_max): the weights are all 0, and so is the ESS."""
    trainer = torch.zeros(3, 4)
    weights, metrics = importance_weights(trainer, trainer - 2.0, torch.ones(3, 4, dtype=torch.bool), ImportanceSettings("sequence_mask"))
    assert torch.equal(weights, torch.zeros(3, 4))
    assert (metrics.sequences, metrics.weight_mean, metrics.ess_sequences, metrics.ess_tokens) == (3, 0.0, 0.0, 0.0)


def test_the_bounds_are_trls_the_mode_podsrls():
    """TRL's clip_max and clip_min; podsrl's mode is token_truncate where TRL's is sequence_mask (issue
    59: a sequence ratio's weights fall with the completion's length; the module docstring)."""
    trl = pytest.importorskip("trl", reason="the TRL integration needs the trl extra (make test installs it)")
    GRPOConfig = trl.GRPOConfig

    fields = GRPOConfig.__dataclass_fields__
    s = ImportanceSettings()
    assert (s.mode, fields["vllm_importance_sampling_mode"].default) == ("token_truncate", "sequence_mask")
    assert (s.clip_max, s.clip_min) == (
        fields["vllm_importance_sampling_clip_max"].default,
        fields["vllm_importance_sampling_clip_min"].default,
    )
    assert fields["vllm_importance_sampling_correction"].default is True
    from podsrl.config import RolloutConfig

    r = RolloutConfig()
    assert r.importance_sampling_correction is True
    assert (r.importance_sampling_mode, r.importance_sampling_clip_max, r.importance_sampling_clip_min) == (s.mode, s.clip_max, s.clip_min)


def test_trl_refuses_the_geometric_modes(tmp_path):
    """TRL 1.16 computes PODSTrainer's correction itself and has no geometric level: PODSConfig says
    so at construction (TRL would fail mid-training), and takes TRL's own modes, which are podsrl's others."""
    pytest.importorskip("trl", reason="the TRL integration needs the trl extra (make test installs it)")
    from podsrl.integrations.trl import TRL_IMPORTANCE_MODES, PODSConfig

    assert set(TRL_IMPORTANCE_MODES) == {m for m in MODES if not m.startswith("geometric") and not m.endswith("reject")}
    common = dict(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4, report_to=[], use_cpu=True, bf16=False)
    for mode in ("geometric_truncate", "geometric_mask", "token_reject"):
        with pytest.raises(ValueError, match=f"vllm_importance_sampling_mode = '{mode}': TRL's GRPOTrainer .* knows token_truncate"):
            PODSConfig(**common, vllm_importance_sampling_mode=mode)
    assert PODSConfig(**common, vllm_importance_sampling_mode="token_truncate").vllm_importance_sampling_mode == "token_truncate"


def test_bad_input():
    x = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="sampler_logprobs must be a floating tensor of shape"):
        importance_weights(x, torch.zeros(2, 4), mask)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        importance_weights(x, x, mask.float())
    with pytest.raises(ValueError, match="token_mask must be a bool tensor"):
        importance_weights(x, x, mask, token_mask=mask[:, :2])
    with pytest.raises(ValueError, match="unknown importance sampling mode 'token'; valid modes: token_truncate"):
        ImportanceSettings(mode="token")
    with pytest.raises(ValueError, match="clip_max must be a finite number >= 1"):
        ImportanceSettings(clip_max=0.9)
    with pytest.raises(ValueError, match="clip_min must be in"):
        ImportanceSettings(clip_min=1.1)


def test_config_fields_are_checked(make_config):
    from podsrl.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout.importance_sampling_mode: unknown value 'sequence'; valid values: geometric_mask, geometric_reject, geometric_truncate, "):
        make_config(**{"rollout.importance_sampling_mode": "sequence"})
    with pytest.raises(ConfigError, match="rollout.importance_sampling_clip_max: must be >= 1"):
        make_config(**{"rollout.importance_sampling_clip_max": 0.5})
    with pytest.raises(ConfigError, match="rollout.importance_sampling_clip_min: must be in"):
        make_config(**{"rollout.importance_sampling_clip_min": 1.5})
    from podsrl.train.update import UpdateSettings

    cfg = make_config(**{"rollout.importance_sampling_mode": "token_truncate", "rollout.importance_sampling_clip_min": 0.5})
    assert UpdateSettings.from_config(cfg, pad_id=0).importance == ImportanceSettings("token_truncate", 3.0, 0.5)
    cfg = make_config(**{"rollout.importance_sampling_mode": "geometric_mask", "rollout.importance_sampling_clip_max": 1.01})
    assert UpdateSettings.from_config(cfg, pad_id=0).importance == ImportanceSettings("geometric_mask", 1.01, None)
    cfg = make_config(**{"rollout.importance_sampling_correction": False})
    assert UpdateSettings.from_config(cfg, pad_id=0).importance is None


def test_a_low_ess_is_warned_once():
    """A step whose is_ess falls below the bound gets one warning per run, naming the mode and the
    figures; a step without the metric (no correction, no engine log-probs) or above the bound, none."""
    from podsrl.config import load
    from podsrl.run.watch import ESS_BOUND, RunWatch

    watch = RunWatch(load(None, []))
    assert watch.step({"step": 1, "is_ess": 0.9, "is_weight_mean": 0.95}) == []
    assert watch.step({"step": 2}) == []
    notes = watch.step({"step": 3, "is_ess": ESS_BOUND - 0.01, "is_ess_sequences": 0.97, "is_weight_mean": 0.3, "sampler_kl": 0.012})
    assert len(notes) == 1
    assert "step 3" in notes[0] and "is_ess = 0.49 of the step's completion tokens (below 0.5; over the sequences, 0.97)" in notes[0]
    assert "sampler_kl 0.0120" in notes[0]
    assert "'token_truncate'; under a per-token or geometric ratio that means a large gap per token" in notes[0]
    assert watch.step({"step": 4, "is_ess": 0.1, "is_weight_mean": 0.1}) == []  # once per run
    # Under a sequence mode the warning points at the per-token one.
    notes = RunWatch(load(None, ["--rollout.importance_sampling_mode=sequence_mask"])).step({"step": 1, "is_ess": 0.2, "is_weight_mean": 0.3})
    assert "is_ess = 0.20 of the step's sequences (below 0.5)," in notes[0]  # no is_ess_tokens logged: not named
    assert "'sequence_mask'; a sequence ratio is a product over the tokens" in notes[0] and "'token_truncate' (the default)" in notes[0]


# ------------------------------------------------------------------------------ the loss


def test_the_weight_multiplies_the_surrogate_only():
    g = torch.Generator().manual_seed(1)
    N, T = 4, 5
    logprobs = (-torch.rand(N, T, generator=g) * 3).requires_grad_()
    old = logprobs.detach() + torch.randn(N, T, generator=g) * 0.3
    ref = logprobs.detach() + torch.randn(N, T, generator=g) * 0.3
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    token_mask = torch.rand(N, T, generator=g) < 0.7
    w = torch.rand(N, T, generator=g) * 2
    for aggregation in ("sequence", "token", "constant"):
        settings = LossSettings(aggregation=aggregation, beta=0.1, max_completion_len=T)
        loss, metrics = policy_loss(logprobs, old, adv, mask, settings, token_mask=token_mask, ref_logprobs=ref, is_weights=w)
        rho = (logprobs - old).exp()
        surrogate = torch.minimum(rho * adv[:, None], rho.clamp(0.8, 1.2) * adv[:, None])
        pg = torch.where(mask & token_mask, -surrogate * w, 0.0)
        k3 = torch.where(mask, (ref - logprobs).exp() - (ref - logprobs) - 1, 0.0)
        norm = {
            "sequence": lambda x: (x.sum(1) / mask.sum(1)).sum() / N,
            "token": lambda x: x.sum() / mask.sum(),
            "constant": lambda x: x.sum() / (N * T),
        }[aggregation]
        torch.testing.assert_close(loss, norm(pg) + 0.1 * norm(k3))
        unweighted_loss, unweighted = policy_loss(logprobs, old, adv, mask, settings, token_mask=token_mask, ref_logprobs=ref)
        assert (metrics.kl, metrics.ratio_mean, metrics.tokens) == (unweighted.kl, unweighted.ratio_mean, unweighted.tokens)
        ones_loss, _ = policy_loss(logprobs, old, adv, mask, settings, token_mask=token_mask, ref_logprobs=ref, is_weights=torch.ones(N, T))
        assert torch.equal(ones_loss, unweighted_loss)  # weight 1 changes nothing, bit for bit
    with pytest.raises(ValueError, match="is_weights must have shape"):
        policy_loss(logprobs, old, adv, mask, is_weights=torch.ones(N, T + 1))


# ------------------------------------------------------------------------------ the update


@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir, one_thread):
    from podsrl.config import ModelConfig
    from podsrl.models import load_policy

    torch.manual_seed(0)
    return load_policy(ModelConfig(name=str(tiny_model_dir)))


ZEROS = [0, 2, 3, 5, 6, 8, 9]  # advantage 0: skipped by default
TEMPERATURE = 0.7


def _batch(tokenizer, zeros: list[int] = ZEROS) -> UpdateBatch:
    """conftest.ten_rollouts: 10 rollouts of 3 prompts, ids within the small vocabulary."""
    return ten_rollouts(tokenizer, zeros, max_id=600)


def _own_logprobs(model, batch: UpdateBatch) -> list[torch.Tensor]:
    """The trainer's log-probs of each row, one row per forward (as the update packs a micro-batch of one)."""
    from podsrl.train.sequences import forward_logprobs, pack

    with torch.no_grad():
        return [forward_logprobs(model, pack([p], [c], 0), temperature=TEMPERATURE)[0][0, : len(c)] for p, c in zip(batch.prompt_ids, batch.completion_ids)]


def _with_sampler(batch: UpdateBatch, sampler: list[torch.Tensor] | None) -> UpdateBatch:
    return UpdateBatch(batch.prompt_ids, batch.completion_ids, batch.advantages, None if sampler is None else [s.tolist() for s in sampler])


class _Recorder(torch.optim.AdamW):
    """AdamW that keeps a copy of the gradients of every step."""

    def step(self, closure=None):
        self.recorded = getattr(self, "recorded", []) + [[p.grad.detach().clone() for group in self.param_groups for p in group["params"]]]
        return super().step(closure)


def _step(model, batch, **options):
    """One update of a copy of ``model``: (weights after, gradients of each optimizer step, stats)."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _Recorder(params, lr=1e-4, eps=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    settings = dict(pad_id=0, temperature=TEMPERATURE, max_completion_len=16, grad_clip=0.0, micro_batch_size=3,
                    aggregation="sequence")  # the hand formulas' default, GRPO's 1/|o| (podsrl's default is "token")
    settings.update(options)
    stats = run_update(model, optimizer, scheduler, batch, update_settings(**settings))
    return [p.detach().clone() for p in params], optimizer.recorded, stats


def _hand_ratio(d: torch.Tensor, level: str) -> torch.Tensor:
    """One row's ratio at each token from its log-ratios d [len], from the formula."""
    return {"token": d.exp(), "sequence": d.sum().exp().expand_as(d), "geometric": d.mean().exp().expand_as(d)}[level]


def _hand_weights(own: list[torch.Tensor], sampler: list[torch.Tensor], s: ImportanceSettings) -> list[torch.Tensor]:
    """The weights from the formula, row by row (not through importance_weights)."""
    out = []
    low = -math.inf if s.clip_min is None else s.clip_min
    for o, q in zip(own, sampler):
        d = (o - q).double()
        r = _hand_ratio(d, s.level)
        inside = r if s.constraint == "mask" else torch.ones_like(r)  # reject: 1 inside the bounds
        out.append(r.clamp(min=low, max=s.clip_max) if s.constraint == "truncate" else torch.where((r > s.clip_max) | (r < low), 0.0, inside))
    return out


def _hand_gradient(model, batch, weights: list[torch.Tensor], aggregation: str, token_masks=None, max_len: int = 16) -> list[torch.Tensor]:
    """The gradient of -(1/N) sum_i 1/|o_i| sum_t m_{i,t} w_{i,t} A_i log pi (aggregation "sequence"; the
    others' normalisers likewise), the on-policy step's gradient, from one forward of every row."""
    from podsrl.train.sequences import forward_logprobs, pack

    model = copy.deepcopy(model)
    logprobs, _ = forward_logprobs(model, pack(batch.prompt_ids, batch.completion_ids, 0), temperature=TEMPERATURE)
    N, total = len(weights), sum(len(w) for w in weights)
    loss = 0.0
    for i, w in enumerate(weights):
        n = len(w)
        m = torch.ones(n) if token_masks is None else token_masks[i].float()
        term = (m * w.float() * batch.advantages[i] * logprobs[i, :n]).sum()
        loss = loss - {"sequence": term / (n * N), "token": term / total, "constant": term / (N * max_len)}[aggregation]
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]


def _vocab(model) -> int:
    return model.get_input_embeddings().weight.shape[0]


def _logprob_atol(model, own: list[torch.Tensor]) -> float:
    """How far the update's log-prob of a token (its rows packed) may lie from ``own``'s (one row per forward)."""
    return logprob_atol(_vocab(model), float(torch.cat(own).abs().max()) / TEMPERATURE)


def _ratio_rtol(model, own: list[torch.Tensor], level: str) -> float:
    """How far a ratio from the update's log-probs may lie from one from ``own``'s, relative: a
    sequence ratio adds the log-prob differences of its tokens."""
    tokens = max(len(o) for o in own) if level == "sequence" else 1
    return math.expm1(tokens * _logprob_atol(model, own))


def _close(grads, want, what: str, weights_moved=None) -> None:
    """The gradients ``grads`` equal ``want`` up to float32 summation order (``gradient_rtol``) plus,
    where the weights that multiply each token's term differ between the two by float noise, the most
    that moves the gradient (``weights_moved``: absolute, one per parameter, ``_weight_noise``)."""
    vocab = grads[0].shape[0]  # the embedding's rows
    for i, (x, y) in enumerate(zip(grads, want)):
        err = rel_diff(x, y)
        tol = gradient_rtol(vocab) + (0.0 if weights_moved is None else float(weights_moved[i]) / float(y.double().norm()))
        assert within(err, tol, f"{what}: gradient {i}"), f"{what}: gradient {i} relative difference {err:.1e} (bound {tol:.1e})"


@pytest.fixture(scope="module")
def token_gradient_norms(tiny_policy):
    """||grad_p (A_i log pi_{i,t})|| for every completion token t of every row i and every parameter p
    ([rows] of [tokens, params]): the magnitudes of the terms the update's gradient sums."""
    from podsrl.train.sequences import forward_logprobs, pack

    model, batch = copy.deepcopy(tiny_policy.model), _batch(tiny_policy.tokenizer)
    params = [p for p in model.parameters() if p.requires_grad]
    logprobs, _ = forward_logprobs(model, pack(batch.prompt_ids, batch.completion_ids, 0), temperature=TEMPERATURE)
    out = []
    for i, c in enumerate(batch.completion_ids):
        norms = torch.zeros(len(c), len(params), dtype=torch.float64)
        for t in range(len(c) if batch.advantages[i] != 0 else 0):
            grads = torch.autograd.grad(batch.advantages[i] * logprobs[i, t], params, retain_graph=True, allow_unused=True)
            norms[t] = torch.tensor([0.0 if g is None else float(g.double().norm()) for g in grads])
        out.append(norms)
    return out


def _weight_noise(norms, weights: list[torch.Tensor], rel: float, aggregation: str = "sequence", token_masks=None, max_len: int = 16) -> torch.Tensor:
    """The most the gradient of -(1/N) sum_i c_i sum_t w_{i,t} A_i log pi_{i,t} moves when every weight
    moves by ``rel`` of itself: rel sum_{i,t} c_i |w_{i,t}| ||grad (A_i log pi_{i,t})||, per parameter."""
    N, total = len(weights), sum(len(w) for w in weights)
    moved = torch.zeros(norms[0].shape[1], dtype=torch.float64)
    for i, w in enumerate(weights):
        m = torch.ones(len(w)) if token_masks is None else token_masks[i].float()
        c = {"sequence": 1 / (len(w) * N), "token": 1 / total, "constant": 1 / (N * max_len)}[aggregation]
        moved += c * ((m * w.abs().float()).double()[:, None] * norms[i]).sum(0)
    return rel * moved


def _gapped_sampler(own: list[torch.Tensor], scale: float, seed: int = 5) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [o - torch.randn(len(o), generator=g) * scale for o in own]


@pytest.mark.parametrize("aggregation", ["sequence", "token", "constant"])
@pytest.mark.parametrize("mode", MODES)
def test_update_equals_the_hand_weighted_loss(tiny_policy, token_gradient_norms, mode, aggregation):
    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer)
    own = _own_logprobs(model, batch)
    sampler = _gapped_sampler(own, 0.25 if mode.startswith("sequence") else 0.5)
    # A geometric mean of 2-8 tokens' ratios spreads less: tighter bounds, so that they act.
    settings = ImportanceSettings(mode=mode, clip_max=1.5, clip_min=0.7) if not mode.startswith("geometric") else ImportanceSettings(mode=mode, clip_max=1.1, clip_min=0.9)
    weights = _hand_weights(own, sampler, settings)
    ran = [i for i in range(10) if i not in ZEROS]
    flat = torch.cat([weights[i] for i in ran])
    high, low = settings.clip_max, settings.clip_min
    assert (flat == 0).any() if mode.endswith(("mask", "reject")) else ((flat == high).any() or (flat == low).any())  # the bounds act
    assert ((flat > low) & (flat < high)).any()  # and some ratios pass unchanged
    _, grads, stats = _step(model, _with_sampler(batch, sampler), importance=settings, aggregation=aggregation)
    # The update's weights come from its packed forward, the hand ones from one row per forward.
    rtol = _ratio_rtol(model, own, settings.level)
    _close(grads[0], _hand_gradient(model, batch, weights, aggregation), f"{mode}, {aggregation}", _weight_noise(token_gradient_norms, weights, rtol, aggregation))
    # Without the correction, the gradient is another one.
    _, plain, _ = _step(model, _with_sampler(batch, sampler), aggregation=aggregation)
    with pytest.raises(AssertionError, match="relative difference"):
        _close(plain[0], _hand_gradient(model, batch, weights, aggregation), "uncorrected")
    # Metrics: over the tokens of the rows that ran (advantage != 0), from the formula.
    ratios = torch.cat([_hand_ratio((own[i] - sampler[i]).double(), mode.split("_")[0]) for i in ran])
    assert stats.is_ratio_mean == pytest.approx(float(ratios.mean()), rel=rtol)
    assert stats.is_ratio_min == pytest.approx(float(ratios.min()), rel=rtol)
    assert stats.is_ratio_max == pytest.approx(float(ratios.max()), rel=rtol)
    assert stats.is_clip_frac == pytest.approx(float(((ratios > high) | (ratios < low)).double().mean()))
    w = torch.tensor([float(weights[i].mean()) for i in ran], dtype=torch.float64)  # each sequence's weight
    tw = torch.cat([weights[i] for i in ran]).double()  # each token's own weight
    # The weights come from ratios within rtol of the hand ones (above); the ESS, a ratio of their sums, within 3 rtol.
    assert stats.is_weight_mean == pytest.approx(float(w.mean()), rel=rtol)
    assert stats.is_ess_sequences == (pytest.approx(float(w.sum() ** 2 / (len(w) * (w * w).sum())), rel=3 * rtol) if w.any() else 0.0)
    assert stats.is_ess_tokens == (pytest.approx(float(tw.sum() ** 2 / (len(tw) * (tw * tw).sum())), rel=3 * rtol) if tw.any() else 0.0)
    assert stats.is_ess == (stats.is_ess_tokens if mode.startswith("token") else stats.is_ess_sequences)
    keys = {"is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_clip_frac", "is_weight_mean", "is_ess", "is_ess_tokens", "is_ess_sequences"}
    assert keys <= stats.metrics().keys()


@pytest.mark.parametrize("micro_batch_size", [1, 4])
def test_a_zero_gap_is_a_no_op(tiny_policy, micro_batch_size):
    """The sampler's log-probs equal to the trainer's pi_old: the same update, bit for bit. With one
    row per micro-batch pi_old is each row's own forward; with several it is the forward of the
    micro-batch's pack (the 3 rows that run, in the update's order), which differs from each row's
    own by float noise, so the sampler's log-probs are taken from that pack. No log-probs (the
    transformers engine): no correction, no metric."""
    from podsrl.train.sequences import forward_logprobs, pack

    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer)
    own = _own_logprobs(model, batch)
    if micro_batch_size > 1:  # one micro-batch of the rows that run
        ran = [i for i in range(10) if i not in ZEROS]
        rows = [ran[k] for k in update_module.micro_batch_order([batch.prompt_ids[i] for i in ran], [batch.completion_ids[i] for i in ran])]
        with torch.no_grad():
            packed, _ = forward_logprobs(model, pack([batch.prompt_ids[i] for i in rows], [batch.completion_ids[i] for i in rows], 0),
                                         temperature=TEMPERATURE, with_entropy=True)  # fmt: skip
        for q, i in enumerate(rows):
            own[i] = packed[q, : len(own[i])]
    plain_w, plain_g, plain = _step(model, batch, micro_batch_size=micro_batch_size, importance=ImportanceSettings())
    assert plain.is_ratio_mean is None and "is_ratio_mean" not in plain.metrics()
    for mode in MODES:
        w, g, stats = _step(model, _with_sampler(batch, own), micro_batch_size=micro_batch_size, importance=ImportanceSettings(mode=mode))
        assert all(torch.equal(a, b) for a, b in zip(w, plain_w)), mode
        assert all(torch.equal(a, b) for a, b in zip(g[0], plain_g[0])), mode
        assert stats.is_ratio_min == stats.is_ratio_max == 1.0 and stats.is_clip_frac == 0.0
        assert stats.is_ess == stats.is_ess_tokens == stats.is_ess_sequences == 1.0


def test_a_degraded_token_correction_is_warned(tiny_policy):
    """Issue 67: under token_truncate (the default) a step whose tokens' log-ratios spread 2 nats
    (d ~ N(-2, 2^2), so that E[exp(d)] = 1) weighs its tokens very unequally: their ESS is about
    0.27 (a lognormal truncated at 3), and the update logs it as is_ess, so the run warns. The ESS of
    each sequence's mean weight, what is_ess was before, averages 64 tokens' weights and stays above
    0.9: it could not see this."""
    from podsrl.config import load
    from podsrl.run.watch import ESS_BOUND, RunWatch
    from podsrl.train.update import UpdateBatch

    g = torch.Generator().manual_seed(0)
    vocab = _vocab(tiny_policy.model)
    prompts = [tiny_policy.tokenizer(f"What is {i} + {i}?")["input_ids"] for i in range(2)]
    batch = UpdateBatch(prompt_ids=[prompts[i // 4] for i in range(8)],
                        completion_ids=[torch.randint(100, min(vocab, 600), (64,), generator=g).tolist() for _ in range(8)],
                        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5] * 2))  # fmt: skip
    own = _own_logprobs(tiny_policy.model, batch)
    d = [torch.randn(64, generator=g, dtype=torch.float64) * 2.0 - 2.0 for _ in range(8)]
    sampler = [o - x.float() for o, x in zip(own, d)]
    settings = ImportanceSettings()  # token_truncate, clip_max 3: the default
    _, _, stats = _step(tiny_policy.model, _with_sampler(batch, sampler), importance=settings, micro_batch_size=4, max_completion_len=64)
    hand = [w.double() for w in _hand_weights(own, sampler, settings)]
    tw, w = torch.cat(hand), torch.stack([x.mean() for x in hand])
    rtol = _ratio_rtol(tiny_policy.model, own, "token")
    assert stats.is_ess_tokens == pytest.approx(float(tw.sum() ** 2 / (len(tw) * (tw * tw).sum())), rel=3 * rtol)
    assert stats.is_ess_sequences == pytest.approx(float(w.sum() ** 2 / (len(w) * (w * w).sum())), rel=3 * rtol)
    assert stats.is_ess == stats.is_ess_tokens < 0.35 and stats.is_ess_sequences > 0.9  # 0.28 and 0.98 here
    notes = RunWatch(load(None, [])).step({"step": 7, **stats.metrics()})
    assert len(notes) == 1 and f"is_ess = {stats.is_ess:.2f} of the step's completion tokens (below {ESS_BOUND}; over the sequences, " in notes[0]
    assert "'token_truncate'; under a per-token or geometric ratio that means a large gap per token" in notes[0]
    # The same step read by its sequences' mean weights, as before issue 67: no warning.
    assert RunWatch(load(None, [])).step({"step": 7, **stats.metrics(), "is_ess": stats.is_ess_sequences}) == []


@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])
def test_a_step_without_signal_still_logs_the_gap(tiny_policy, mode):
    """Every advantage 0: no row runs the update, and the sampler gap and the correction's metrics are
    still logged, over a sample of the kept rows (update.measured_rows: rows 0, 2, 5, 7 of 10, a
    forward without gradients), equal to the formula's; the weights move as they would without the
    engine's log-probs (AdamW's decay on a zero gradient)."""
    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer, zeros=list(range(10)))
    own = _own_logprobs(model, batch)
    sampler = _gapped_sampler(own, 0.3)
    settings = ImportanceSettings(mode=mode, clip_max=1.5, clip_min=0.7)
    weights_after, _, stats = _step(model, _with_sampler(batch, sampler), importance=settings, micro_batch_size=4)
    plain_after, _, plain = _step(model, batch, importance=settings, micro_batch_size=4)
    assert stats.rows_run == 0 and all(torch.equal(a, b) for a, b in zip(weights_after, plain_after))
    assert plain.sampler_kl is None and plain.is_ess is None  # no engine log-probs: nothing to log
    sample = update_module.measured_rows(len(own))
    assert sample == [0, 2, 5, 7]
    own, sampler = [own[i] for i in sample], [sampler[i] for i in sample]
    d = torch.cat([(o - q).double() for o, q in zip(own, sampler)])
    ratios = torch.cat([_hand_ratio((o - q).double(), settings.level) for o, q in zip(own, sampler)])
    hand = _hand_weights(own, sampler, settings)
    w = torch.tensor([float(x.mean()) for x in hand], dtype=torch.float64)
    tw = torch.cat(hand).double()
    # Float noise only: the update's forward packs rows, _own_logprobs one: each log-prob within atol,
    # so |d| and d's KL term (slope |e^d - 1| < 1 here) within atol, each ratio within rtol (float_bounds.py).
    atol, rtol = _logprob_atol(model, own), _ratio_rtol(model, own, settings.level)
    assert stats.sampler_logp_diff == pytest.approx(float(d.abs().mean()), abs=atol)
    assert stats.sampler_kl == pytest.approx(float((d.exp() - 1 - d).mean()), abs=atol)
    assert stats.is_ratio_mean == pytest.approx(float(ratios.mean()), rel=rtol)
    assert stats.is_clip_frac == pytest.approx(float(((ratios > 1.5) | (ratios < 0.7)).double().mean()))
    assert stats.is_weight_mean == pytest.approx(float(w.mean()), rel=rtol)
    assert stats.is_ess_sequences == pytest.approx(float(w.sum() ** 2 / (len(w) * (w * w).sum())), rel=3 * rtol)
    assert stats.is_ess_tokens == pytest.approx(float(tw.sum() ** 2 / (len(tw) * (tw * tw).sum())), rel=3 * rtol)
    assert stats.is_ess == (stats.is_ess_tokens if mode == "token_truncate" else stats.is_ess_sequences)
    assert {"sampler_kl", "is_ratio_mean", "is_ess", "is_ess_tokens", "is_ess_sequences", "is_weight_mean"} <= stats.metrics().keys()
    assert stats.entropy > 0  # the rows had a forward


def test_a_step_that_kept_no_rollout_still_logs_the_gap(tiny_policy):
    """No rollout kept (the DAPO filter, dynamic sampling's cap): no update runs, and the loop still
    logs the gap and the correction's metrics, measured on a sample of the sampled rollouts
    (update.measure_sampler_gap): the same numbers as a step whose kept rows all had advantage 0
    (the same rows, the same forward), the weights untouched and no gradient left."""
    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer, zeros=list(range(10)))
    sampler = _gapped_sampler(_own_logprobs(model, batch), 0.3)
    settings = ImportanceSettings(mode="sequence_mask", clip_max=1.5, clip_min=0.7)
    _, _, silent = _step(model, _with_sampler(batch, sampler), importance=settings, micro_batch_size=4)
    copy_ = copy.deepcopy(model)
    before = [p.detach().clone() for p in copy_.parameters()]
    options = dict(pad_id=0, temperature=TEMPERATURE, max_completion_len=16, grad_clip=0.0, micro_batch_size=4, importance=settings)
    measured = update_module.measure_sampler_gap(copy_, _with_sampler(batch, sampler), update_settings(**options))
    keys = ("sampler_logp_diff", "sampler_kl", "is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_clip_frac", "is_weight_mean", "is_ess",
            "is_ess_tokens", "is_ess_sequences")  # fmt: skip
    assert set(measured) == set(keys)
    assert all(measured[k] == getattr(silent, k) for k in keys), {k: (measured[k], getattr(silent, k)) for k in keys}
    assert all(torch.equal(a, b) for a, b in zip(before, copy_.parameters()))
    assert all(p.grad is None for p in copy_.parameters())
    # Without the engine's log-probs (the transformers engine) there is nothing to measure.
    assert update_module.measure_sampler_gap(copy_, batch, update_settings(**options)) == {}


@pytest.mark.parametrize("kept", [1, 3, 4, 5, 7, 10, 15, 64, 512])
def test_a_step_without_signal_measures_a_bounded_sample(kept):
    """The rows a step without a signal measures: at most MEASURE_ROWS, distinct, from several groups
    (evenly spaced), whatever the kept rows; the skipped update stays the saving of such a step."""
    rows = update_module.measured_rows(kept)
    assert len(rows) == min(kept, update_module.MEASURE_ROWS) and len(set(rows)) == len(rows)
    assert all(0 <= r < kept for r in rows) and rows == sorted(rows)
    m = len(rows)  # spread over the batch, not its first group: steps of kept // m, the last in the last m-th
    assert all(b - a >= kept // m for a, b in zip(rows, rows[1:])) and rows[-1] >= (m - 1) * kept // m


def test_rows_of_advantage_zero_stay_neutral(tiny_policy):
    """A huge gap on the rows of advantage 0 changes nothing, skipped or run (their surrogate is 0
    whatever its weight), and skipping still gives the update of not skipping."""
    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer)
    own = _own_logprobs(model, batch)
    sampler = _gapped_sampler(own, 0.3)
    wild = [s - 100.0 if i in ZEROS else s for i, s in enumerate(sampler)]  # ratio e^100 (past float32) on the rows without signal
    for mode in MODES:
        settings = ImportanceSettings(mode=mode, clip_min=0.5)
        _, calm, _ = _step(model, _with_sampler(batch, sampler), importance=settings)
        _, skipped, stats_skip = _step(model, _with_sampler(batch, wild), importance=settings)
        _, run, stats_run = _step(model, _with_sampler(batch, wild), importance=settings, skip_zero_advantage=False)
        _close(skipped[0], calm[0], f"{mode}: skipped")
        _close(run[0], calm[0], f"{mode}: run")
        assert stats_skip.rows_run == 3 and stats_run.rows_run == 10
        assert stats_skip.is_ratio_max < 1e10 < stats_run.is_ratio_max  # the metrics cover the rows that ran


def test_two_policy_iterations_weight_with_pi_old_once(tiny_policy, token_gradient_norms, monkeypatch):
    """With two iterations the weight is computed once, in the first, from the scoring pass's pi_old
    (the weights that sampled), and the second iteration reuses it although the policy has moved."""
    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer)
    own = _own_logprobs(model, batch)
    sampler = _gapped_sampler(own, 0.4)
    settings = ImportanceSettings(mode="token_truncate", clip_max=1.4, clip_min=0.8)
    calls, weights_seen = [], []
    real_weights, real_loss = update_module.importance_weights, update_module.policy_loss

    def spy_weights(trainer_logprobs, *args, **kwargs):
        calls.append(trainer_logprobs.clone())
        return real_weights(trainer_logprobs, *args, **kwargs)

    def spy_loss(*args, is_weights=None, **kwargs):
        weights_seen.append(is_weights.clone())
        return real_loss(*args, is_weights=is_weights, **kwargs)

    monkeypatch.setattr(update_module, "importance_weights", spy_weights)
    monkeypatch.setattr(update_module, "policy_loss", spy_loss)
    _, grads, stats = _step(model, _with_sampler(batch, sampler), importance=settings, policy_iterations=2, micro_batch_size=16)
    assert len(calls) == 1 and len(weights_seen) == 2 and len(grads) == 2  # one micro-batch of the 3 rows that ran
    assert torch.equal(weights_seen[0], weights_seen[1])  # the second iteration reuses the first's weights
    ran = [i for i in range(10) if i not in ZEROS]
    want = _hand_weights(own, sampler, settings)
    order = update_module.micro_batch_order([batch.prompt_ids[i] for i in ran], [batch.completion_ids[i] for i in ran])
    for q, i in enumerate(ran[k] for k in order):  # the micro-batch's rows, in the update's order
        torch.testing.assert_close(weights_seen[0][q, : len(own[i])].double(), want[i], rtol=_ratio_rtol(model, own, "token"), atol=0)
    moved = _weight_noise(token_gradient_norms, want, _ratio_rtol(model, own, "token"))
    _close(grads[0], _hand_gradient(model, batch, want, "sequence"), "first iteration", moved)
    assert stats.is_ratio_mean is not None


def test_token_selection_keeps_the_sequence_ratio_whole(tiny_policy, token_gradient_norms, monkeypatch):
    """D3S: the sequence ratio is over every completion token (the probability of what was sampled),
    the weight multiplies the selected tokens' surrogate, and the metrics count the selected tokens."""
    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer)
    own = _own_logprobs(model, batch)
    sampler = _gapped_sampler(own, 0.3)
    settings = ImportanceSettings(mode="sequence_truncate", clip_max=1.3, clip_min=0.8)
    masks = []
    real = update_module.select_tokens

    def spy(*args, **kwargs):
        masks.append(real(*args, **kwargs))
        return masks[-1]

    monkeypatch.setattr(update_module, "select_tokens", spy)
    _, grads, stats = _step(model, _with_sampler(batch, sampler), importance=settings, token_fraction=0.4)
    token_masks = [masks[0][i, : len(c)] for i, c in enumerate(batch.completion_ids)]
    ran = [i for i in range(10) if i not in ZEROS]
    assert 0 < sum(int(token_masks[i].sum()) for i in ran) < sum(len(own[i]) for i in ran)  # selection drops tokens
    weights = _hand_weights(own, sampler, settings)
    rtol = _ratio_rtol(model, own, "sequence")
    moved = _weight_noise(token_gradient_norms, weights, rtol, token_masks=token_masks)
    _close(grads[0], _hand_gradient(model, batch, weights, "sequence", token_masks=token_masks), "D3S", moved)
    ratios = torch.cat([(own[i] - sampler[i]).double().sum().exp().expand(len(own[i]))[token_masks[i]] for i in ran])
    assert stats.is_ratio_mean == pytest.approx(float(ratios.mean()), rel=rtol)
    assert stats.is_clip_frac == pytest.approx(float(((ratios > 1.3) | (ratios < 0.8)).double().mean()))
    assert stats.tokens_kept == len(ratios)


def test_metrics_are_global_over_micro_batches_and_ranks(tiny_policy):
    """The micro-batching changes no metric, and _Sums reduces the extremes by a maximum over ranks
    (here a stand-in for two ranks: one with tokens, one without)."""
    from podsrl.train.update import _Sums

    model, batch = tiny_policy.model, _batch(tiny_policy.tokenizer)
    sampler = _gapped_sampler(_own_logprobs(model, batch), 0.5)
    settings = ImportanceSettings(mode="token_mask", clip_max=1.5)
    results = [_step(model, _with_sampler(batch, sampler), importance=settings, micro_batch_size=m)[2] for m in (1, 2, 16)]
    rtol = _ratio_rtol(model, _own_logprobs(model, batch), "token")  # two packings: two float32 computations of each ratio
    for stats in results[1:]:
        for key in ("is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_clip_frac"):
            assert getattr(stats, key) == pytest.approx(getattr(results[0], key), rel=rtol), key

    class TwoRanks:
        """Rank 0 holds ``mine``; the other rank ``theirs`` (sums added, maxima taken)."""

        active = True

        def __init__(self, theirs):
            self.theirs = theirs

        def sum(self, values):
            return values + torch.tensor(list(vars(self.theirs).values()), dtype=torch.float64)

        def max(self, values):
            return torch.maximum(values, torch.tensor([self.theirs.is_ratio_max, -self.theirs.is_ratio_min], dtype=torch.float64))

    mine, theirs, empty = _Sums(), _Sums(), _Sums()
    mine.add_importance(ImportanceMetrics(tokens=3, ratio_sum=3.3, ratio_min=0.9, ratio_max=1.2, clipped=1, sequences=1, weight_sum=0.8,
                                          weight_sq_sum=0.64, token_weight_sum=2.5, token_weight_sq_sum=2.25))  # fmt: skip
    theirs.add_importance(ImportanceMetrics(tokens=2, ratio_sum=1.5, ratio_min=0.5, ratio_max=1.0, clipped=0, sequences=1, weight_sum=0.75,
                                            weight_sq_sum=0.5625, token_weight_sum=1.5, token_weight_sq_sum=1.25))  # fmt: skip
    out = mine.reduced(TwoRanks(theirs))
    assert (out.is_tokens, out.is_clipped, out.is_ratio, out.is_ratio_min, out.is_ratio_max) == (5, 1, pytest.approx(4.8), 0.5, 1.2)
    # Both ESS from the summed sums: tokens 4^2 / (5 x 3.5), sequences 1.55^2 / (2 x 1.2025); is_ess the mode's level's.
    ess = update_module._ess(out, ImportanceSettings("token_mask"))
    assert ess == {"is_weight_mean": pytest.approx(0.775), "is_ess": pytest.approx(16 / 17.5), "is_ess_tokens": pytest.approx(16 / 17.5),
                   "is_ess_sequences": pytest.approx(1.55**2 / 2.405)}  # fmt: skip
    assert update_module._ess(out, ImportanceSettings("geometric_mask"))["is_ess"] == pytest.approx(1.55**2 / 2.405)
    out = empty.reduced(TwoRanks(theirs))  # a rank that ran no row joins with the identity elements
    assert (out.is_tokens, out.is_ratio_min, out.is_ratio_max) == (2, 0.5, 1.0)


# ------------------------------------------------------------------------------ torchrun

# tests/dist_worker.py's one step per case, its engine returning a sampling log-prob for every token
# (a function of the completion alone: the same at any world size), as vLLM's does.
_DIST_WRAPPER = """
import math, random, sys
sys.path.insert(0, {tests!r})
import dist_worker

generate = dist_worker.FixedEngine.generate


def with_logprobs(self, prompt_ids, sampling):
    rollouts = generate(self, prompt_ids, sampling)
    base = -math.log(len(self.tokenizer))
    rollouts.logprobs = []
    for ids in rollouts.completion_ids:
        rng = random.Random(hash(tuple(ids)) % (2**31))
        rollouts.logprobs.append([base + rng.gauss(0.0, 0.3) for _ in ids])
    return rollouts


dist_worker.FixedEngine.generate = with_logprobs
dist_worker.hold_collectives_to_placement()
dist_worker.main(sys.argv[1])
dist_worker.exit_without_teardown()
"""

_DIST_CASES = {
    "is_token_truncate": {"rollout.importance_sampling_mode": "token_truncate", "rollout.importance_sampling_clip_max": 1.2,
                          "rollout.importance_sampling_clip_min": 0.8},
    "is_sequence_mask_d3s": {"rollout.importance_sampling_clip_max": 1.5, "select.rule": "d3s_intra", "select.token_fraction": 0.5},
    "fsdp_is_token_mask": {"distributed.parallel": "fsdp", "rollout.importance_sampling_mode": "token_mask", "rollout.importance_sampling_clip_max": 1.2},
}  # fmt: skip


@pytest.mark.slow
def test_two_ranks_correct_as_one(tmp_path, tiny_model_dir, reward_file):
    """torchrun with 2 processes: the same weights after a corrected step as 1 process, and the
    same correction metrics (the minimum and maximum reduced over ranks)."""
    import json
    import subprocess
    import sys

    from safetensors.torch import load_file
    from test_distributed import BASE, _env, _torchrun, worker_spec

    wrapper = tmp_path / "is_worker.py"
    wrapper.write_text(_DIST_WRAPPER.format(tests=str(Path(__file__).parent)))
    cases = {name: {"overrides": {**BASE, **overrides}} for name, overrides in _DIST_CASES.items()}
    single = {k: v for k, v in cases.items() if not k.startswith("fsdp")}
    alone = subprocess.run([sys.executable, str(wrapper), str(worker_spec(tmp_path / "s1.json", tiny_model_dir, reward_file, tmp_path, single))],
                           env=_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    fsdp = {k: v for k, v in cases.items() if k.startswith("fsdp")}
    one = _torchrun(str(wrapper), str(worker_spec(tmp_path / "sf.json", tiny_model_dir, reward_file, tmp_path, fsdp)), nproc=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun(str(wrapper), str(worker_spec(tmp_path / "s2.json", tiny_model_dir, reward_file, tmp_path, cases)), nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    for case in cases:
        w1, w2 = load_file(str(tmp_path / f"{case}-w1.safetensors")), load_file(str(tmp_path / f"{case}-w2.safetensors"))
        diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        assert diff <= 1e-5, f"{case}: max abs weight difference {diff:.2e}"
        m1, m2 = (json.loads((tmp_path / f"{case}-w{w}.json").read_text()) for w in (1, 2))
        assert 0 < m1["is_clip_frac"] < 1 and m1["is_ratio_min"] < m1["is_ratio_max"], case  # the correction acted, not everywhere
        for key in ("is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_clip_frac", "is_weight_mean", "is_ess", "is_ess_tokens", "is_ess_sequences",
                    "sampler_logp_diff"):  # fmt: skip
            assert m2[key] == pytest.approx(m1[key], rel=1e-5), f"{case}: {key}"


# ------------------------------------------------------------------------------ bench/importance_gap.py


def _bench():
    with script_module(Path(__file__).resolve().parents[1] / "bench" / "importance_gap.py") as module:
        return module


def test_bench_figures_are_the_formulas():
    """The bench's figures of one length: the prefix of each completion, the gap, the sequence ratio
    and each mode's weights (through importance_weights), against a hand computation."""
    bench = _bench()
    trainer = [[-1.0, -2.0, -0.5], [-0.7, -3.0]]
    sampler = [[-1.0 - math.log(2.0), -2.0, -0.5 + 5.0], [-0.7 - math.log(0.5), -3.0]]  # d = ln 2, 0, -5 | ln 0.5, 0
    x = bench.summarize(trainer, sampler, 2)  # cut at 2 tokens: d = ln 2, 0 | ln 0.5, 0
    d = [math.log(2.0), 0.0, math.log(0.5), 0.0]
    assert (x["mean_tokens"], x["cut"]) == (2.0, 1.0)
    assert x["logp_diff"] == pytest.approx(0.0, abs=1e-12) and x["abs_logp_diff"] == pytest.approx(math.log(2.0) / 2)
    assert x["kl"] == pytest.approx(sum(math.exp(v) - 1 - v for v in d) / 4)
    assert x["ratio_q50"] == pytest.approx(1.25) and x["ratio_below_0.1"] == 0.0  # sequence ratios 2 and 0.5
    seq_ess, token_ess = 2.5**2 / (2 * 4.25), 5.0**2 / (4 * 8.5)  # sequence weights 2, 0.5 (each over 2 tokens)
    assert x["modes"]["sequence_mask"] == {"weight_mean": pytest.approx(1.25), "ess": pytest.approx(seq_ess), "ess_tokens": pytest.approx(token_ess),
                                           "ess_sequences": pytest.approx(seq_ess), "zero_tokens": 0.0}  # fmt: skip
    assert x["modes"]["token_mask"]["zero_tokens"] == 0.0 and x["modes"]["geometric_truncate"]["weight_mean"] == pytest.approx((2**0.5 + 0.5**0.5) / 2)
    y = bench.summarize(trainer, sampler, 3)["modes"]["token_mask"]  # the third token's ratio e^-5 is kept (no clip_min), none above 3
    assert y["zero_tokens"] == 0.0
    assert bench.summarize(trainer, sampler, 3)["modes"]["sequence_mask"]["weight_mean"] == pytest.approx((2 * math.exp(-5) + 0.5) / 2)
    table = bench.tables([x])
    assert "| 2 | 2 | 100% |" in table and "| `sequence_mask` | 1.25, 0.74 (0.74), 0% |" in table and "| `token_truncate` (default) | " in table
    # the second completion ended with its second token: at L = 2 it is not cut, the first (longer) is
    assert bench.summarize(trainer, sampler, 2, ended=[False, True])["cut"] == 0.5
    assert bench.summarize(trainer, sampler, 3, ended=[False, True])["cut"] == 0.5  # the first reached L = 3 without ending
    assert bench.summarize(trainer, sampler, 3, ended=[True, True])["cut"] == 0.0


def test_bench_runs_tiny(tiny_model_dir, tmp_path, capsys):
    """bench/importance_gap.py end to end on the tiny model (the transformers stand-in sampler) and
    two made-up GSM8K-format questions: both tables, every mode, each length."""
    import json

    bench = _bench()
    (tmp_path / "test.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}) + "\n" for i in (3, 4)))
    (tmp_path / "train.jsonl").write_text((tmp_path / "test.jsonl").read_text())
    assert bench.main(["--model", str(tiny_model_dir), "--data", str(tmp_path), "--engine", "transformers", "--prompts", "2",
                       "--samples", "2", "--lengths", "4,8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "sampler transformers, a bfloat16 copy of the policy; 2 GSM8K test prompts x 2 samples" in out
    assert "| 4 | " in out and "| 8 | " in out
    assert all(f"| `{mode}`" in out for mode in MODES)
    assert out.strip().splitlines()[-1].startswith("ESS at 8 tokens: token_truncate ")


def test_every_committed_gap_run_is_in_the_vllm_page_as_its_tables():
    """A committed bench/importance_gap.py run (results/importance-gap/*.md, its stdout) appears in
    docs/vllm.md table for table, so the page's ESS figures cannot drift from the file (issue 67)."""
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "vllm.md").read_text()
    runs = sorted((root / "results" / "importance-gap").glob("*.md"))
    assert runs, "results/importance-gap/ holds no run"
    for path in runs:
        text = path.read_text()
        assert text.startswith("# python bench/importance_gap.py "), f"{path.name}: not the bench's output"
        blocks = [b.strip() for b in text.split("\n\n") if b.lstrip().startswith("|")]
        assert len(blocks) == 2, f"{path.name}: expected the gap table and the modes table"
        for block in blocks:
            assert block in page, f"docs/vllm.md lacks a table of {path.name}: paste it from the file"
