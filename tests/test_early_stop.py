"""Exact early stopping (podsrl.core.early_stop): the kept set has the law of fixed-n sampling.

Two kinds of evidence: exact probabilities by brute force over every outcome sequence on small n
(with the rule's tie law, itself checked against the real rule), and a seeded statistical test of
the real downsample() over many simulated groups, with labels attached to the rollouts.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction
from functools import lru_cache

import pytest
import torch

from podsrl.core.downsample import DownsampleSpec, downsample
from podsrl.core.early_stop import check_values, stop_criterion, variance_threshold, why_not_exact
from podsrl.core.selection import max_variance
from podsrl.errors import RewardError

# ----------------------------------------------------------------------------- references


@lru_cache(maxsize=None)
def variance_tie_law(K: int, L: int, m: int) -> dict[int, Fraction]:
    """Law of h (highs kept) when max_variance keeps m of K highs and L lows (K + L >= m): the m + 1
    candidates j (m - j lowest, j highest), uniform among those of maximal variance h(m - h)."""
    hs = [min(j, K) + max(0, m - j - L) for j in range(m + 1)]
    best = max(h * (m - h) for h in hs)
    tied = [h for h in hs if h * (m - h) == best]
    return {h: Fraction(c, len(tied)) for h, c in Counter(tied).items()}


def hypergeometric(K: int, c: int, m: int) -> dict[int, Fraction]:
    """Law of the highs among m drawn uniformly from c rollouts holding K highs."""
    total = math.comb(c, m)
    return {h: Fraction(math.comb(K, h) * math.comb(c - K, m - h), total) for h in range(m + 1) if math.comb(K, h) * math.comb(c - K, m - h)}


def kept_law(rule: str, prefix: tuple, m: int, values: tuple, dapo: bool) -> dict:
    """Exact law of the kept reward multiset (a sorted tuple; 'dropped' for a filtered group) when
    ``rule`` runs on the rewards ``prefix``."""
    if dapo and len(set(prefix)) == 1:
        return {"dropped": Fraction(1)}
    if rule == "max_reward":
        return {tuple(sorted(prefix)[-m:]): Fraction(1)}
    K = sum(r == values[-1] for r in prefix)
    law = variance_tie_law(K, len(prefix) - K, m) if rule == "max_variance" else hypergeometric(K, len(prefix), m)
    return {(values[0],) * (m - h) + (values[-1],) * h: q for h, q in law.items()}


def brute_force(rule: str, n: int, m: int, round_size: int, probs: dict, dapo=False, threshold=None):
    """(early, fixed): exact laws of the kept reward multiset over every outcome sequence of n."""
    values = tuple(sorted(probs))
    seqs = list(itertools.product(values, repeat=n))
    rewards = torch.tensor(seqs, dtype=torch.float64)  # [S, n]
    criterion = stop_criterion(rule, m, values=values, filter_zero_variance=dapo)
    if threshold is not None:  # a deliberately wrong max_variance threshold, to show the test's power
        hi, lo = values[-1], values[0]
        criterion = lambda r: ((r == hi).sum(1) >= threshold) & ((r == lo).sum(1) >= threshold)  # noqa: E731
    stop = torch.full((len(seqs),), n)
    for c in range(round_size, n, round_size):
        prefix = torch.where(torch.arange(n) < c, rewards, torch.nan)
        stop = torch.where((stop == n) & criterion(prefix), c, stop)
    early: Counter = Counter()
    fixed: Counter = Counter()
    for seq, c in zip(seqs, stop.tolist()):
        weight = math.prod((probs[r] for r in seq), start=Fraction(1))
        for out, q in kept_law(rule, seq[:c], m, values, dapo).items():
            early[out] += weight * q
        for out, q in kept_law(rule, seq, m, values, dapo).items():
            fixed[out] += weight * q
    return dict(early), dict(fixed)


BINARY = {0.0: Fraction(2, 3), 1.0: Fraction(1, 3)}


# ----------------------------------------------------------------------------- exact, brute force


def test_variance_threshold_values():
    assert [variance_threshold(m) for m in range(1, 10)] == [1, 1, 3, 2, 4, 3, 5, 4, 6]


def test_tie_law_matches_the_rule():
    # The reference tie law is the real rule's (statistically): 20000 identical rows per case.
    gen = torch.Generator().manual_seed(0)
    for K, L, m in [(2, 5, 3), (3, 3, 3), (5, 2, 3), (4, 4, 5), (3, 6, 5), (1, 1, 1), (3, 1, 2)]:
        row = torch.tensor([1.0] * K + [0.0] * L)
        keep = max_variance(row.expand(20_000, -1).contiguous(), m, generator=gen)
        h = (keep & (row == 1)).sum(1)
        for value, q in variance_tie_law(K, L, m).items():
            assert abs(float((h == value).double().mean()) - float(q)) < 0.02, (K, L, m, value)
        assert set(h.unique().tolist()) == set(variance_tie_law(K, L, m))


@pytest.mark.parametrize("rule", ["random", "max_reward", "max_variance"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("round_size", [1, 2, 3])
def test_brute_force_exact(rule, m, round_size):
    early, fixed = brute_force(rule, 9, m, round_size, BINARY)
    assert early == fixed


@pytest.mark.parametrize("rule", ["max_reward", "max_variance"])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_brute_force_exact_with_dapo_filter(rule, m):
    early, fixed = brute_force(rule, 7, m, 1, BINARY, dapo=True)
    assert early == fixed


@pytest.mark.parametrize("m", [1, 2, 3])
def test_brute_force_max_reward_three_values(m):
    probs = {0.0: Fraction(1, 2), 0.5: Fraction(1, 4), 1.0: Fraction(1, 4)}
    early, fixed = brute_force("max_reward", 6, m, 1, probs)
    assert early == fixed


@pytest.mark.parametrize("m", [2, 3, 4, 5])
def test_brute_force_lower_variance_threshold_is_biased(m):
    # t(m) is tight: one fewer high and low and the kept law changes (the test has the power to see it).
    early, fixed = brute_force("max_variance", 9, m, 1, BINARY, threshold=variance_threshold(m) - 1)
    assert early != fixed


def test_brute_force_saves_rollouts():
    # Sanity: the criteria do stop early (expected rollouts < n).
    rewards = torch.tensor(list(itertools.product((0.0, 1.0), repeat=9)), dtype=torch.float64)
    prefix = torch.where(torch.arange(9) < 6, rewards, torch.nan)
    for rule, m in [("random", 4), ("max_reward", 2), ("max_variance", 4), ("max_variance", 3)]:
        assert stop_criterion(rule, m, values=(0.0, 1.0))(prefix).any()


# ----------------------------------------------------------------------------- statistical, real downsample


def _simulate(spec: DownsampleSpec, n: int, m: int, round_size: int, *, early: bool, seed: int, groups=20_000, threshold=None):
    """Per-group categories (kept highs, sum of kept labels) from the real downsample(), with
    Bernoulli(0.35) rewards and labels drawn given the reward (highs 0..2, lows 1..3)."""
    gen = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(groups, n, generator=gen) < 0.35).double()  # [G, n]
    labels = torch.randint(0, 3, (groups, n), generator=gen) + (rewards == 0).long()  # [G, n]
    if early:
        criterion = stop_criterion(spec.rule, m, values=(0.0, 1.0), filter_zero_variance=spec.filter_zero_variance)
        if threshold is not None:
            criterion = lambda r: ((r == 1).sum(1) >= threshold) & ((r == 0).sum(1) >= threshold)  # noqa: E731
        sampled = torch.zeros(groups, dtype=torch.long)  # [G] rollouts sampled so far
        running = torch.ones(groups, dtype=torch.bool)
        while running.any():
            sampled = torch.where(running, (sampled + round_size).clamp(max=n), sampled)
            seen = torch.where(torch.arange(n) < sampled[:, None], rewards, torch.nan)  # [G, n]
            running &= (sampled < n) & ~criterion(seen)
        rewards = seen
    sel = downsample(rewards, spec, step=seed, seed=1, allow_missing=early)
    highs = (sel.keep & (rewards == 1)).sum(1)  # [G]
    label_sum = (labels * sel.keep).sum(1)  # [G]
    dropped = ~sel.keep.any(1)
    adv = torch.where(sel.keep, sel.advantages, 0.0).abs().sum(1).round(decimals=6)  # [G]: pins the advantages too
    return Counter(zip(highs.tolist(), label_sum.tolist(), dropped.tolist(), adv.tolist())), int((~rewards.isnan()).sum())


def _chi_square_same(a: Counter, b: Counter) -> tuple[float, float]:
    """Two-sample chi-square homogeneity statistic and its 0.1% critical value (Wilson-Hilferty)."""
    keys = sorted(set(a) | set(b), key=lambda k: a[k] + b[k])
    cells, pending = [], [0, 0]
    for k in keys:  # merge rare categories so every cell expects >= 10 per sample
        pending = [pending[0] + a[k], pending[1] + b[k]]
        if sum(pending) >= 20:
            cells.append(pending)
            pending = [0, 0]
    if cells:
        cells[-1] = [cells[-1][0] + pending[0], cells[-1][1] + pending[1]]
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for x, y in cells:
        total = x + y
        ea, eb = total * na / (na + nb), total * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    df = max(1, len(cells) - 1)
    z = 3.090  # the 99.9% normal quantile
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


CASES = [
    ("random", 4, 3, False),
    ("max_reward", 3, 2, False),
    ("max_reward", 3, 2, True),
    ("max_variance", 4, 2, False),
    ("max_variance", 5, 3, False),
    ("max_variance", 5, 1, True),
]


@pytest.mark.parametrize("rule,m,round_size,dapo", CASES)
def test_statistical_kept_law_matches_fixed_n(rule, m, round_size, dapo):
    spec = DownsampleSpec(rule=rule, m=m, filter_zero_variance=dapo)
    fixed, generated_fixed = _simulate(spec, 12, m, round_size, early=False, seed=11)
    early, generated_early = _simulate(spec, 12, m, round_size, early=True, seed=12)
    stat, critical = _chi_square_same(fixed, early)
    assert stat < critical, (stat, critical)
    assert generated_early < generated_fixed


def test_statistical_test_detects_a_biased_stop():
    spec = DownsampleSpec(rule="max_variance", m=5)
    fixed, _ = _simulate(spec, 12, 5, 1, early=False, seed=11)
    biased, _ = _simulate(spec, 12, 5, 1, early=True, seed=12, threshold=variance_threshold(5) - 1)
    stat, critical = _chi_square_same(fixed, biased)
    assert stat > critical


# ----------------------------------------------------------------------------- where there is no criterion


@pytest.mark.parametrize(
    "rule,kwargs,needle",
    [
        ("all", {}, "depends on all n"),
        ("d3s_intra", {}, "no exact early stop"),
        ("d3s_cross", {}, "no exact early stop"),
        ("max_variance", {"values": (0.0, 0.5, 1.0)}, "binary"),
        ("max_variance", {"values": None}, "undeclared"),
        ("max_reward", {"values": None}, "maximum must be known"),
        ("random", {"filter_zero_variance": True}, "DAPO"),
        ("max_variance", {"advantages_over_group": True}, "full group"),
    ],
)
def test_no_exact_criterion(rule, kwargs, needle):
    kwargs = {"values": (0.0, 1.0), **kwargs}
    assert needle in why_not_exact(rule, **kwargs)
    assert stop_criterion(rule, 2, **kwargs) is None


def test_random_needs_no_declared_values():
    assert why_not_exact("random", values=None) is None
    done = stop_criterion("random", 3)(torch.tensor([[0.3, 0.7, torch.nan, torch.nan], [0.1, 0.2, 0.5, torch.nan]]))
    assert done.tolist() == [False, True]


def test_check_values():
    check_values(torch.tensor([[0.0, 1.0, torch.nan]]), (0.0, 1.0))
    check_values(torch.tensor([[1.1]], dtype=torch.float32), (0.0, 1.1))  # float32 rounding is tolerated
    with pytest.raises(RewardError, match=r"outside the declared values \[0.0, 1.0\]"):
        check_values(torch.tensor([[0.0, 0.5]]), (0.0, 1.0))


# ----------------------------------------------------------------------------- the trainer, tiny random model

PARITY_REWARD = '''
def parity(completion, example):
    """Binary, about half and half on a random model's completions."""
    return float(len(completion) % 2)


parity.reward_values = (0.0, 1.0)


def undeclared_parity(completion, example):
    return float(len(completion) % 2)


def half(completion, example):
    return 0.5
'''


@pytest.fixture(scope="module")
def parity_file(write_module):
    return write_module("parity_rewards", PARITY_REWARD)


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The runs here use the tiny model with a 686-token tokenizer, ten times faster a step than
    with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config


def _early_config(make_config, parity_file, **overrides):
    settings = {
        "reward.names": [f"{parity_file}:parity"],
        "rollout.n": 8,
        "rollout.early_stop": "exact",
        "rollout.round_size": 2,
        "select.rule": "max_variance",
        "select.m": 2,
        "train.max_steps": 2,
        "eval.at_start": False,
        "eval.at_end": False,
        "train.export_model": False,
        **overrides,
    }
    return make_config(**settings)


@pytest.mark.usefixtures("one_thread")
def test_trainer_with_early_stop_runs_and_is_deterministic(make_config, parity_file, tmp_path):
    from podsrl.run.metrics import read_jsonl
    from podsrl.train import loop as trainer

    cfg = _early_config(make_config, parity_file)
    runs = [read_jsonl(trainer.train(cfg, run_dir=tmp_path / f"run{i}", log=lambda *_: None) / "metrics.jsonl") for i in range(2)]
    for row in runs[0]:
        B, n = cfg.train.prompts_per_step, cfg.rollout.n
        assert 2 * B <= row["rollouts_generated"] <= B * n and 1 <= row["sample_rounds"] <= n // 2
        assert row["kept"] == B * 2 and math.isfinite(row["loss"])
    assert sum(row["rollouts_generated"] for row in runs[0]) < 2 * cfg.train.prompts_per_step * cfg.rollout.n  # it did stop early
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "rank_time/")) and k != "train_seconds"} for r in rows]  # noqa: E731
    for a, b in zip(strip(runs[0]), strip(runs[1])):
        assert a == b, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}


@pytest.mark.usefixtures("one_thread")
def test_trainer_refuses_rewards_outside_the_declared_values(make_config, parity_file, tmp_path):
    from podsrl.train import loop as trainer

    cfg = _early_config(make_config, parity_file, **{"reward.names": [f"{parity_file}:half"], "reward.values": [0.0, 1.0]})
    with pytest.raises(RewardError, match="outside the declared values"):
        trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"select.rule": "all", "select.m": 8}, "no exact early stop"),
        ({"select.rule": "d3s_intra"}, "no exact early stop"),
        ({"select.advantage_over": "group"}, "full group"),
        ({"reward.names": ["PARITY:undeclared_parity"]}, "undeclared"),
        ({"reward.names": ["PARITY:undeclared_parity", "correctness"], "reward.weights": [1.0, 1.0], "reward.values": [0, 1, 2]}, "binary"),
    ],
)
def test_trainer_refuses_where_no_criterion_is_exact(make_config, parity_file, overrides, needle):
    from podsrl.errors import ConfigError
    from podsrl.train import loop as trainer

    if "reward.names" in overrides:
        overrides["reward.names"] = [name.replace("PARITY", str(parity_file)) for name in overrides["reward.names"]]
    cfg = _early_config(make_config, parity_file, **overrides)
    with pytest.raises(ConfigError, match=needle):
        trainer._reward_values(cfg, trainer.resolve_specs(list(zip(cfg.reward.names, cfg.reward.weights))))


def test_config_checks_early_stop_settings(make_config):
    from podsrl.errors import ConfigError

    with pytest.raises(ConfigError, match="rollout.early_stop"):
        make_config(**{"rollout.early_stop": "maybe"})
    with pytest.raises(ConfigError, match="rollout.round_size"):
        make_config(**{"rollout.round_size": 0})
    # A round of n (or more) samples every rollout at once: nothing could stop early (issue 36).
    for size in (4, 32):
        with pytest.raises(ConfigError, match=rf"rollout.round_size: = {size} is not below rollout.n = 4"):
            make_config(**{"rollout.early_stop": "exact", "rollout.round_size": size})
    assert make_config(**{"rollout.early_stop": "exact", "rollout.round_size": 3}).rollout.round_size == 3
    with pytest.raises(ConfigError, match="reward.values"):
        make_config(**{"reward.values": []})


# ----------------------------------------------------------------------------- what the metrics report (issue 36)


def _early_stopped_groups(p: torch.Tensor, n: int, m: int, size: int, seed: int):
    """(groups record, fixed-n rewards): Bernoulli(p_g) groups sampled with max_variance's exact
    criterion in rounds of ``size``; a completion's length is 10 + 5 x its reward."""
    from podsrl.train.sampling import Groups

    G = p.shape[0]
    gen = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(G, n, generator=gen) < p[:, None]).float()  # [G, n]
    criterion = stop_criterion("max_variance", m, values=(0.0, 1.0))
    count, running = torch.zeros(G, dtype=torch.long), torch.ones(G, dtype=torch.bool)
    while running.any():
        count = torch.where(running, (count + size).clamp(max=n), count)
        seen = torch.where(torch.arange(n) < count[:, None], rewards, torch.nan)
        running &= (count < n) & ~criterion(seen)
    g = Groups.unsampled(list(range(G)), n, rank=0, batch=0, rewards=["r"], timed=[])
    sampled = ~seen.isnan()
    g.reward, g.per_reward["r"] = seen, seen
    g.round = torch.where(sampled, (torch.arange(n) // size).float().expand(G, n), torch.nan)
    g.length, g.truncated = 10 + 5 * seen, seen
    return g, rewards


def test_sampling_metrics_have_the_fixed_n_expectation_under_early_stopping():
    """reward_mean, reward/<name>, completion_len and truncated are over each group's first round:
    their expectation is a fixed-n run's. The pooled mean (podsrl before issue 36) and the mean of
    per-group means are biased in opposite directions (bench/metric_basis.py prints the figures)."""
    from podsrl.train.sampling import StepSample, sample_metrics

    p = torch.linspace(0.02, 0.98, 40_000) ** 0.4  # [G] success probabilities, mostly high (mean 0.71)
    g, fixed = _early_stopped_groups(p, 16, 4, 4, seed=3)
    metrics = sample_metrics(StepSample(g, g, gen_batches=1, rollouts=int(g.sampled.sum()), rounds=4, timeouts=0, surplus=0), ["r"])
    truth = float(fixed.mean())
    sd = math.sqrt(truth * (1 - truth) / (40_000 * 4))  # the first round: 4 rollouts of each group
    for key in ("reward_mean", "reward/r", "truncated"):
        assert abs(metrics[key] - truth) < 4 * sd, (key, metrics[key], truth)
    assert metrics["completion_len"] == pytest.approx(10 + 5 * metrics["reward_mean"], rel=1e-5)
    assert float(g.sampled.float().mean()) < 0.8  # groups did stop early
    assert float(g.reward.nanmean()) - truth > 20 * sd  # pooled: the groups that ran to n (mostly all-correct) outweigh
    assert truth - float(g.reward.nanmean(dim=1).mean()) > 10 * sd  # per-group means: stopped groups are pulled to 1/2
    # Without early stopping every group's first round is all n: the pooled mean, as before.
    whole, _ = _early_stopped_groups(p[:100], 16, 4, 16, seed=4)
    assert sample_metrics(StepSample(whole, whole, 1, 1600, 1, 0, 0), ["r"])["reward_mean"] == pytest.approx(float(whole.reward.mean()))


SLEEPY_REWARD = '''
import os, time


def sleepy(completion, example):
    """Sleeps forever on the first call of the run (PODSRL_TEST_SLEEP_ONCE: a file it creates)."""
    try:
        os.close(os.open(os.environ["PODSRL_TEST_SLEEP_ONCE"], os.O_CREAT | os.O_EXCL))
        time.sleep(3600)
    except FileExistsError:
        pass
    return len(completion) / 40.0
'''


@pytest.mark.usefixtures("one_thread")
def test_reward_timeouts_are_checked_over_the_step_not_each_round(make_config, tmp_path, monkeypatch):
    """Rounds of one rollout for 2 groups: the first round scores 2 completions, one times out (half
    of the round, over reward.max_timeout_fraction = 0.25), but the step scores 4: one quarter,
    within it, so the run goes on (issue 36: it stopped). Over the fraction the step stops, whatever
    the rounds, on every rank alike (the counts are the gathered step's)."""
    from podsrl.run.metrics import read_jsonl
    from podsrl.train import loop as trainer

    reward = tmp_path / "sleepy.py"
    reward.write_text(SLEEPY_REWARD)
    monkeypatch.setenv("PODSRL_TEST_SLEEP_ONCE", str(tmp_path / "slept"))
    cfg = make_config(**{"reward.names": [f"{reward}:sleepy"], "reward.timeout_seconds": 1.0, "reward.max_timeout_fraction": 0.25,
                         "rollout.n": 8, "rollout.early_stop": "exact", "rollout.round_size": 1, "select.rule": "random",
                         "select.m": 2, "train.max_steps": 1, "eval.at_start": False, "eval.at_end": False,
                         "train.export_model": False})  # fmt: skip
    (row,) = read_jsonl(trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None) / "metrics.jsonl")
    assert (tmp_path / "slept").exists() and row["reward/timeouts"] == 1 and row["rollouts_generated"] == 4
    assert row["sample_rounds"] == 2
    from podsrl.grading.pool import check_timeouts

    with pytest.raises(RewardError, match=r"'f' timed out .* on 2 of the step's 4 completions, more than reward.max_timeout_fraction = 0.25"):
        check_timeouts({"g": 1, "f": 2}, 4, max_fraction=0.25, timeout=1.0)


def test_declared_values_of_weighted_rewards(parity_file):
    from podsrl.grading.rewards import RewardSpec, declared_values

    assert declared_values([RewardSpec("correctness")]) == (0.0, 1.0)
    assert declared_values([RewardSpec("correctness"), RewardSpec("format", 0.5)]) == (0.0, 0.5, 1.0, 1.5)
    assert declared_values([RewardSpec(f"{parity_file}:parity", 2.0)], extra={f"{parity_file}:parity": -1.0}) == (-2.0, 0.0, 2.0)
    assert declared_values([RewardSpec("correctness"), RewardSpec(f"{parity_file}:undeclared_parity")]) is None


def test_batched_reward_keeps_its_declared_values():
    from podsrl.grading.user import from_batched

    def batched(completions, **kwargs):
        return [1.0 for _ in completions]

    batched.reward_values = (0.0, 1.0)
    assert from_batched(batched).reward_values == (0.0, 1.0)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_engine_samples_in_rounds(tmp_path):
    """The embedded model with vLLM, correctness (0 or 1, declared by the built-in), max_variance."""
    pytest.importorskip("vllm")
    from podsrl.config import from_dict
    from podsrl.run.metrics import read_jsonl
    from podsrl.train import loop as trainer

    cfg = from_dict({
        # The policy's float32 in vLLM too (not the default "fast", bfloat16 on a CPU with it), so that
        # the sampler's log-probs agree with the trainer's to float error.
        "rollout": {"engine": "vllm", "n": 8, "early_stop": "exact", "round_size": 2, "kv_cache_gib": 0.25, "max_new_tokens": 8,
                    "sampler_dtype": "auto"},
        "select": {"rule": "max_variance", "m": 2},
        "optim": {"skip_zero_advantage": False},  # every kept row runs the update, so the sampler gap is measured
        "task": {"options": {"num_train": 20, "num_eval": 4}},
        "eval": {"at_start": False, "at_end": False},
        "train": {"max_steps": 1, "max_seconds": None, "prompts_per_step": 4, "progress": False, "export_model": False},
    })  # fmt: skip
    (row,) = read_jsonl(trainer.train(cfg, run_dir=tmp_path / "run", log=lambda *_: None) / "metrics.jsonl")
    assert 4 * 2 <= row["rollouts_generated"] <= 4 * 8 and 1 <= row["sample_rounds"] <= 4 and row["kept"] == 4 * 2
    # vLLM's log-probs came through the rounds to the update: on the weights that sampled they agree
    # with the trainer's (tests/test_vllm.py's on-policy bound).
    assert row["rows_run"] == 8 and row["sampler_logp_diff"] < 0.02 and row["sampler_kl"] < 0.02
