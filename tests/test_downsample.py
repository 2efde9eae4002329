"""The down-sampling core (podsrl.core.downsample) and the two trainers that call it.

- hand-computed selections, advantages and metrics;
- the regression that made one core necessary: ``d3s_cross`` with Dr. GRPO advantages selected on
  std-scaled advantages in ``podsrl train`` but on the trained ones in ``PODSTrainer``;
- batch std (``std_over="batch"``, TRL's ``scale_rewards="batch"``) and rewards that are missing
  (NaN, ``allow_missing``: TRL's None): hand-computed values, and every rule on ragged groups
  against brute force over the scored rollouts;
- parity: for every rule x DAPO filter x scale_std x std_over x advantage set x schedule, ``podsrl
  train``'s selection step (:func:`podsrl.train.loop.select`) and ``PODSTrainer``'s
  (:meth:`PODSTrainer._pods_downsample`) give identical keep masks, advantages and metrics for the
  same rewards, step and seed.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import podsrl
from podsrl.config import Config, RolloutConfig, SelectConfig, TrainConfig
from podsrl.core.advantages import group_advantages
from podsrl.core.downsample import DownsampleSpec, downsample, selection_generator
from podsrl.core.seeds import step_seed
from podsrl.core.selection import RULES, get_rule
from podsrl.errors import ConfigError
from podsrl.run.checkpoint import TrainState
from podsrl.train import loop

ROOT = Path(__file__).resolve().parent.parent
trl = pytest.importorskip("podsrl.integrations.trl", reason="the TRL side needs the trl extra", exc_type=ImportError)


# ----------------------------------------------------------------------------- the core alone


def test_hand_computed_pods_selection_advantages_and_metrics():
    rewards = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    sel = downsample(rewards, DownsampleSpec(rule="max_variance", m=2), step=3, seed=7)
    assert sel.m == 2 and sel.token_fraction == 1.0
    assert sel.keep.sum(1).tolist() == [2, 2]
    assert sorted(rewards[0][sel.keep[0]].tolist()) == [0.0, 1.0]  # one success, one failure: max variance
    # PODS advantages over the kept pair: (r - 0.5) / std([0, 1]) = +-1/sqrt(2); the constant group gets 0.
    kept0 = sel.advantages[0][sel.keep[0]]
    torch.testing.assert_close(kept0.sort().values, torch.tensor([-(2**-0.5), 2**-0.5]))
    assert sel.advantages[1].abs().sum() == 0 and sel.advantages[~sel.keep].abs().sum() == 0
    m = sel.metrics
    assert m["kept"] == 4 and m["m"] == 2
    assert m["reward_mean"] == pytest.approx(9 / 12)
    assert m["reward_std"] == pytest.approx(float(rewards.std()))
    assert m["reward_kept_mean"] == pytest.approx(3 / 4)
    assert m["zero_variance_groups"] == 0.5
    assert m["kept_adv_var"] == pytest.approx(float(torch.cat([kept0, torch.zeros(2)]).var(unbiased=False)))
    # The same (seed, step) selects the same rows; the generator is the (seed, step) one.
    again = downsample(rewards, DownsampleSpec(rule="max_variance", m=2), step=3, seed=7, generator=selection_generator(7, 3))
    assert torch.equal(again.keep, sel.keep)
    assert step_seed(7, 3, 1) == (7 * 1_000_003 + 3 * 7_919 + 104_729) % (2**31 - 1)


def test_d3s_group_advantages_schedules_and_default_m():
    rewards = torch.arange(32, dtype=torch.float32).view(2, 16) % 5
    spec = DownsampleSpec(rule="d3s_intra", m=4, m_final=8, m_schedule="linear", token_fraction=0.5,
                          token_fraction_final=1.0, token_schedule="linear")  # fmt: skip
    start, middle, end = (downsample(rewards, spec, progress=p) for p in (0.0, 0.5, 1.0))
    assert (start.m, middle.m, end.m) == (4, 6, 8)
    assert (start.token_fraction, middle.token_fraction, end.token_fraction) == (0.5, 0.75, 1.0)
    # D3S: advantages over the full group of 16, not renormalised over the kept.
    full = (rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, keepdim=True)
    torch.testing.assert_close(end.advantages[end.keep], full[end.keep])
    assert DownsampleSpec().m_start(16) == 4 and DownsampleSpec(rule="all").m_start(16) == 16
    assert downsample(rewards, DownsampleSpec(rule="all")).keep.all()


def test_dapo_filter_and_an_empty_selection():
    rewards = torch.ones(3, 4)
    sel = downsample(rewards, DownsampleSpec(m=2, filter_zero_variance=True))
    assert not sel.keep.any() and sel.metrics["kept"] == 0 and math.isnan(sel.metrics["reward_kept_mean"])
    assert sel.metrics["zero_variance_groups"] == 1.0 and sel.metrics["kept_adv_var"] == 0.0


@pytest.mark.parametrize(
    "kwargs, fragments",
    [
        ({"rule": "best"}, ["rule", "'best'", "max_variance"]),
        ({"m": 0}, ["m:", ">= 1"]),
        ({"m": 2, "m_final": 4}, ["m_schedule", "'constant'", "m_final = 4", "linear"]),
        ({"token_fraction": 1.5}, ["token_fraction", "(0, 1]"]),
        ({"advantage_over": "all"}, ["advantage_over", "kept, group"]),
        ({"schedule_steps": 1}, ["schedule_steps", ">= 2"]),
        ({"seed": 1.5}, ["seed", "whole number"]),
    ],
)
def test_spec_validation_names_the_field_in_each_trainer(kwargs, fragments, tmp_path):
    for prefix, build in (
        ("", lambda: DownsampleSpec(**kwargs)),
        ("select.", lambda: SelectConfig(**kwargs)),
        ("pods_", lambda: trl.PODSConfig(**_trl_base(tmp_path), **{f"pods_{k}": v for k, v in kwargs.items()})),
    ):
        with pytest.raises(ConfigError) as err:
            build()
        message = str(err.value)
        assert message.startswith(prefix), message
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} missing from {message!r}"


def test_m_above_n_is_an_error_naming_each_trainers_n(tmp_path):
    with pytest.raises(ConfigError, match=r"select.m = 8 exceeds rollout.n = 4"):
        Config(rollout=RolloutConfig(n=4), select=SelectConfig(m=8))
    with pytest.raises(ConfigError, match=r"pods_m = 16 exceeds num_generations = 8"):
        trl.PODSConfig(**_trl_base(tmp_path), pods_m=16)
    with pytest.raises(ConfigError, match=r"^m = 5 exceeds n = 4"):
        downsample(torch.zeros(2, 4), DownsampleSpec(m=5))


def test_public_api_is_the_core():
    assert podsrl.downsample is downsample and podsrl.DownsampleSpec is DownsampleSpec
    assert set(podsrl.RULES) == set(RULES)
    # TRL's config and podsrl's [select] have the same fields (TRL's scale_rewards sets scale_std and std_over).
    names = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
    spec_fields = names(DownsampleSpec) - {"scale_std", "std_over"}
    # ... and TRL's update settings beside them (podsrl train's [optim] has its twin, skip_zero_advantage).
    assert {f.removeprefix("pods_") for f in names(trl.PODSConfig) if f.startswith("pods_")} == spec_fields | {"skip_zero_advantage"}
    assert names(SelectConfig) == names(DownsampleSpec)
    for name in spec_fields:
        assert trl.PODSConfig.__dataclass_fields__[f"pods_{name}"].default == DownsampleSpec.__dataclass_fields__[name].default


# ----------------------------------------------------------------------------- batch std and missing rewards


def test_batch_std_hand_values():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [2.0, 2.0]])
    # Group means 0.5, 1.5, 2; pooled rewards {0, 1, 0, 3, 2, 2}: mean 4/3, sample variance 22/15.
    std = math.sqrt(22 / 15)
    expected = torch.tensor([[-0.5, 0.5], [-1.5, 1.5], [0.0, 0.0]]) / std
    sel = downsample(rewards, DownsampleSpec(rule="all", std_over="batch"))
    torch.testing.assert_close(sel.advantages, expected)
    torch.testing.assert_close(group_advantages(rewards, std_over="batch"), expected)
    assert downsample(torch.ones(2, 3), DownsampleSpec(rule="all", std_over="batch")).advantages.abs().sum() == 0
    # Without scale_std the scope does not matter: centring only.
    sel = downsample(rewards, DownsampleSpec(rule="all", std_over="batch", scale_std=False))
    torch.testing.assert_close(sel.advantages, torch.tensor([[-0.5, 0.5], [-1.5, 1.5], [0.0, 0.0]]))
    # PODS: each group centred on its kept subset, one std over the kept of every group pooled.
    rewards = torch.tensor([[0.0, 1.0, 5.0, 9.0], [2.0, 2.0, 3.0, 7.0]])
    sel = downsample(rewards, DownsampleSpec(rule="max_variance", m=2, std_over="batch"))
    kept = rewards[sel.keep].view(2, 2)  # the lowest and highest of each group
    assert kept.tolist() == [[0.0, 9.0], [2.0, 7.0]]
    torch.testing.assert_close(sel.advantages[sel.keep].view(2, 2), (kept - kept.mean(1, keepdim=True)) / kept.flatten().std())
    assert Config(select=SelectConfig(std_over="batch")).select.std_over == "batch"  # podsrl train's [select] has it
    with pytest.raises(ConfigError, match=r"select.std_over: unknown value 'step'; valid values: group, batch"):
        SelectConfig(std_over="step")


NAN = math.nan


def test_missing_rewards_hand_values():
    rewards = torch.tensor([[1.0, NAN, 5.0, 3.0], [NAN, NAN, NAN, 2.0], [4.0, 4.0, NAN, 0.0]])
    with pytest.raises(ValueError, match="must be finite"):
        downsample(rewards, DownsampleSpec(rule="all"))  # podsrl train's rewards are never NaN
    # Rule all keeps every rollout; the unscored get advantage 0, the statistics are over the scored.
    sel = downsample(rewards, DownsampleSpec(rule="all", scale_std=False), allow_missing=True)
    assert sel.keep.all()
    torch.testing.assert_close(sel.advantages, torch.tensor([[-2.0, 0, 2, 0], [0, 0, 0, 0], [4 / 3, 4 / 3, 0, -8 / 3]]))
    assert sel.metrics["reward_mean"] == pytest.approx(19 / 7)  # the 7 scored
    assert sel.metrics["zero_variance_groups"] == pytest.approx(1 / 3)  # one scored reward: constant
    # A rule never keeps an unscored rollout; a group with fewer than m scored keeps them all.
    for rule in ("random", "max_reward", "max_variance", "d3s_intra"):
        keep = downsample(rewards, DownsampleSpec(rule=rule, m=2), allow_missing=True).keep
        assert not (keep & rewards.isnan()).any() and keep.sum(1).tolist() == [2, 1, 2], rule
    keep = downsample(rewards, DownsampleSpec(rule="max_variance", m=2), allow_missing=True).keep
    assert keep[0].tolist() == [True, False, True, False] and keep[2, 3]  # {1, 5}, and 0 with one of the 4s
    keep = downsample(rewards, DownsampleSpec(rule="max_reward", m=2), allow_missing=True).keep
    assert keep[0].tolist() == [False, False, True, True]
    keep = downsample(rewards, DownsampleSpec(rule="d3s_cross", m=2), allow_missing=True).keep
    assert int(keep.sum()) == 6 and not (keep & rewards.isnan()).any()  # B*m = 6 of the 7 scored
    # The DAPO filter: a group without two different scored rewards is constant.
    sel = downsample(rewards, DownsampleSpec(rule="all", filter_zero_variance=True), allow_missing=True)
    assert sel.keep.tolist() == [[True] * 4, [False] * 4, [True] * 4]


def _var(values) -> float:
    """Population variance (0 for fewer than two values)."""
    values = torch.as_tensor(values, dtype=torch.float64)
    return values.var(unbiased=False).item() if values.numel() > 1 else 0.0


def _brute_best(values: list[float], k: int) -> float:
    """The maximal population variance over the size-k subsets of ``values``."""
    return max(_var(list(c)) for c in combinations(values, k)) if k else 0.0


@settings(max_examples=120, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**20))
def test_every_rule_on_ragged_groups_against_brute_force(data, seed):
    """Missing rewards (NaN) make ragged groups: each rule keeps min(m, scored) of the scored (all:
    everything), the variance rules a subset of maximal variance among the scored, and the
    advantages are those of the kept scored, computed over them alone."""
    B, n = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 7))
    m = data.draw(st.integers(1, n))
    # Rounded: spreads of ~1e-30 underflow float32's variance (a limit of group_advantages, not of this path).
    values = st.one_of(st.sampled_from([0.0, 1.0, NAN]), st.floats(-3, 3, allow_nan=False).map(lambda x: round(x, 3)))
    rewards = torch.tensor(data.draw(st.lists(st.lists(values, min_size=n, max_size=n), min_size=B, max_size=B)), dtype=torch.float32)
    scored = ~rewards.isnan()
    for rule in sorted(RULES):
        spec = DownsampleSpec(rule=rule, m=None if rule == "all" else m)
        sel = downsample(rewards, spec, step=1, seed=seed, allow_missing=True)
        if rule == "all":
            assert sel.keep.all()
        elif rule == "d3s_cross":
            assert int(sel.keep.sum()) == min(B * m, int(scored.sum()))
        else:
            assert sel.keep.sum(1).tolist() == scored.sum(1).clamp(max=m).tolist(), rule
        assert rule == "all" or not (sel.keep & ~scored).any(), rule
        for b in range(B):
            row = rewards[b][scored[b]].tolist()
            kept = rewards[b][sel.keep[b] & scored[b]].tolist()
            if rule == "max_variance":
                assert _var(kept) == pytest.approx(_brute_best(row, len(kept)), abs=1e-9)
            if rule == "max_reward":
                assert sorted(kept, reverse=True) == sorted(row, reverse=True)[: len(kept)]
            # Advantages: over the kept scored of the group (PODS), 0 elsewhere.
            set_b = sel.keep[b] & scored[b] if not spec.advantages_over_group else scored[b]
            r = rewards[b][set_b].double()
            adv = sel.advantages[b]
            if r.numel() >= 2 and r.max() > r.min():
                expected = (rewards[b].double() - r.mean()) / r.std()
                torch.testing.assert_close(adv[sel.keep[b] & scored[b]].double(), expected[sel.keep[b] & scored[b]], rtol=1e-4, atol=1e-5)
            assert adv[~(sel.keep[b] & scored[b])].abs().sum() == 0
    # d3s_cross: the pooled full-group advantages of the scored, a subset of maximal variance.
    sel = downsample(rewards, DownsampleSpec(rule="d3s_cross", m=m), step=1, seed=seed, allow_missing=True)
    pool = group_advantages(torch.where(scored, rewards, 0.0), scored)[scored].tolist()
    if len(pool) <= 12:
        kept = group_advantages(torch.where(scored, rewards, 0.0), scored)[sel.keep].tolist()
        assert _var(kept) == pytest.approx(_brute_best(pool, len(kept)), abs=1e-6)


# ----------------------------------------------------------------------------- both trainers


def _trl_base(tmp_path, n: int = 8, **more) -> dict:
    return dict(output_dir=str(tmp_path), num_generations=n, per_device_train_batch_size=n, use_cpu=True, bf16=False, report_to="none", **more)


def native_select(fields: dict, rewards: torch.Tensor, *, step: int, max_steps: int, seed: int, scale_std: bool, std_over: str = "group"):
    """``podsrl train``'s selection step for these [select] fields."""
    n = rewards.shape[1]
    cfg = Config(
        rollout=RolloutConfig(n=n),
        select=SelectConfig(scale_std=scale_std, std_over=std_over, **fields),
        train=TrainConfig(max_steps=max_steps, max_seconds=None, seed=seed),
    )
    return loop.select(cfg, TrainState(step=step), rewards)


def trl_select(fields: dict, rewards: torch.Tensor, *, step: int, max_steps: int, seed: int, scale_std: bool, tmp_path, std_over: str = "group"):
    """``PODSTrainer``'s selection step for the same settings as PODSConfig arguments (TRL's
    scale_rewards: "none" without scale_std, where the std's scope does not matter)."""
    n = rewards.shape[1]
    scale_rewards = "none" if not scale_std else "batch" if std_over == "batch" else "group"
    args = trl.PODSConfig(
        **_trl_base(tmp_path, n, seed=seed, scale_rewards=scale_rewards),
        **{f"pods_{k}": v for k, v in fields.items()},
    )
    stand_in = SimpleNamespace(args=args, state=SimpleNamespace(global_step=step, max_steps=max_steps))
    return trl.PODSTrainer._pods_downsample(stand_in, rewards)


def test_regression_d3s_cross_selects_on_the_advantages_it_trains_on(tmp_path):
    """The divergence issue 24 reported: with Dr. GRPO advantages (scale_std off), podsrl train kept
    [[1,0,0,1],[1,0,0,1]] (selecting on std-scaled advantages); both now keep what the trained
    advantages r - mean(r) say: [-3, -1, 1, 3] of the second group has variance 5, no other four
    of the pool come close."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 2.0, 4.0, 6.0]])
    fields = {"rule": "d3s_cross", "m": 2}
    expected = torch.tensor([[False] * 4, [True] * 4])
    for select in (native_select, lambda *a, **k: trl_select(*a, **k, tmp_path=tmp_path)):
        sel = select(fields, rewards, step=0, max_steps=10, seed=0, scale_std=False)
        assert torch.equal(sel.keep, expected)
        torch.testing.assert_close(sel.advantages[1], torch.tensor([-3.0, -1.0, 1.0, 3.0]))
    # With std scaling (A = [-0.5, -0.5, -0.5, 1.5] and [-1.16, -0.39, 0.39, 1.16]) both keep 1.5, 1.16,
    # -1.16 and one of group 0's three tied -0.5 (variance 1.24, the best of the Lemma's candidates).
    keeps = []
    for select in (native_select, lambda *a, **k: trl_select(*a, **k, tmp_path=tmp_path)):
        keep = select(fields, rewards, step=0, max_steps=10, seed=0, scale_std=True).keep
        assert keep[0, 3] and keep[0, :3].sum() == 1 and keep[1].tolist() == [True, False, False, True]
        keeps.append(keep)
    assert torch.equal(*keeps)


SCHEDULES = st.sampled_from([
    {},
    {"m_final": 6, "m_schedule": "linear"},
    {"m_final": 3, "m_schedule": "cosine"},
    {"m_final": 6, "m_schedule": "step", "schedule_steps": 3},
    {"token_fraction": 0.5, "token_fraction_final": 1.0, "token_schedule": "linear"},
    {"token_fraction": 0.3, "token_score": "entropy"},
])  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    rule=st.sampled_from(sorted(RULES)),
    filter_zero_variance=st.booleans(),
    scale_std=st.booleans(),
    std_over=st.sampled_from(["group", "batch"]),
    advantage_over=st.sampled_from(["auto", "kept", "group"]),
    schedule=SCHEDULES,
    binary=st.booleans(),
    step=st.integers(0, 20),
    seed=st.integers(0, 2**20),
    data=st.data(),
)
def test_parity_of_the_native_and_trl_paths(rule, filter_zero_variance, scale_std, std_over, advantage_over, schedule, binary, step, seed, data, tmp_path_factory):
    n = 8
    B = data.draw(st.integers(1, 5))
    values = st.sampled_from([0.0, 1.0]) if binary else st.floats(-3, 3, allow_nan=False, width=32)
    rewards = torch.tensor(data.draw(st.lists(st.lists(values, min_size=n, max_size=n), min_size=B, max_size=B)), dtype=torch.float32)
    fields = {"rule": rule, "filter_zero_variance": filter_zero_variance, "advantage_over": advantage_over, **schedule}
    if rule == "all":
        fields = {k: v for k, v in fields.items() if not k.startswith("m_")}
    else:
        fields["m"] = 2
    common = dict(step=step, max_steps=20, seed=seed, scale_std=scale_std, std_over=std_over)
    native = native_select(fields, rewards, **common)
    via_trl = trl_select(fields, rewards, **common, tmp_path=tmp_path_factory.getbasetemp())
    assert torch.equal(native.keep, via_trl.keep)
    assert torch.equal(native.advantages, via_trl.advantages)
    assert (native.m, native.token_fraction) == (via_trl.m, via_trl.token_fraction)
    assert native.metrics.keys() == via_trl.metrics.keys()
    for key, value in native.metrics.items():
        assert value == via_trl.metrics[key] or (math.isnan(value) and math.isnan(via_trl.metrics[key])), key
    # And both are the core's: the rule's own mask on the (seed, step) generator.
    m = native.m
    # (A batch-wide std scales every advantage alike: the D3S rules select on the centred ones then.)
    keep = get_rule(rule)(rewards, m, generator=selection_generator(seed, step), scale_std=scale_std and std_over == "group")
    if filter_zero_variance:
        keep &= (rewards != rewards[:, :1]).any(1, keepdim=True)
    assert torch.equal(native.keep, keep)


# ----------------------------------------------------------------------------- the example loop


def test_the_plain_pytorch_example_runs(tmp_path):
    """examples/plain_loop.py (docs/integrating.md): a hand-written loop on the public API only."""
    script = ROOT / "examples" / "plain_loop.py"
    assert len(script.read_text().splitlines()) <= 60
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("step")]
    assert len(lines) == 20
    first, last = (float(line.split("reward")[1].split()[0]) for line in (lines[0], lines[-1]))
    assert last > first  # the toy policy learns


def test_all_lists_only_the_current_api():
    """downsample's ``__all__`` is what the module defines for its callers; the seed helpers live in
    podsrl.core.seeds (``step_seed``, ``Stream.SELECTION``), not re-exported here under older names."""
    from podsrl.core import downsample as module

    assert sorted(module.__all__) == sorted(
        ["DownsampleSpec", "Selection", "downsample", "selection_generator", "has_signal", "group_signal", "groups_with_signal"]
    )
    for name in module.__all__:
        assert getattr(module, name).__module__ == module.__name__, f"{name} is re-exported from {getattr(module, name).__module__}"
    for legacy in ("step_seed", "SELECTION_STREAM"):
        assert not hasattr(module, legacy), f"podsrl.core.downsample.{legacy}: import it from podsrl.core.seeds"
