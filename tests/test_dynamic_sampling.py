"""Dynamic sampling (``rollout.dynamic_sampling``, podsrl/train/sampling.py): a step samples further
batches of prompts until B groups have a signal, for every rule.

- The signal test (podsrl.core.downsample.groups_with_signal), every rule, by hand and against the
  selection a step then makes over the groups that pass.
- One process, the tiny model and a reward that leaves about half the groups silent: every rule
  fills its B groups; the cap trains on what it has (none: no optimizer step) and warns once; a
  resumed run equals an uninterrupted one; exact early stopping inside each batch, whose
  signal law is fixed-n's (statistical).
- torchrun, 2 gloo ranks: one step equals one process's when rank 1's groups are all silent (rank 1
  trains nothing; "ddp" and "fsdp"); ``podsrl train`` with early stopping keeps the ranks in step.
- Configuration: nonsense is refused with the field's name.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from podsrl.core.downsample import DownsampleSpec, downsample, group_signal, groups_with_signal, has_signal
from podsrl.core.early_stop import stop_criterion
from podsrl.core.selection import RULES
from podsrl.errors import ConfigError
from podsrl.run import checkpoint as ckpt
from podsrl.run.metrics import read_jsonl
from podsrl.train import loop as trainer

from conftest import SAMPLING_RUN, dist_step_cases
from test_early_stop import _chi_square_same

nan = math.nan
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The one-process runs use the tiny model with a 686-token tokenizer, ten times faster a step
    than with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config

# ------------------------------------------------------------------------- the signal test


SIGNAL_REWARDS = torch.tensor([
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # all equal: no rule has a signal
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],  # varied, the 2 highest equal
    [0.0, 1.0, 0.0, 0.0, 1.0, 0.0],  # varied, the 2 highest equal
    [0.0, 0.5, 1.0, 0.0, 0.0, 0.0],  # varied, the 2 highest differ
    [0.5, 0.5, nan, nan, nan, nan],  # stopped early (not sampled: NaN), equal so far
    [0.0, 1.0, nan, nan, nan, nan],  # stopped early, varied
])  # fmt: skip
VARIED = [False, True, True, True, False, True]


@pytest.mark.parametrize(
    "rule,options,want",
    [
        ("all", {"m": 6}, VARIED),
        ("max_variance", {}, VARIED),
        ("d3s_intra", {}, VARIED),
        ("d3s_cross", {}, VARIED),  # alone, its pool is the group
        ("max_reward", {}, [False, False, False, True, False, True]),  # the 2 kept must differ
        ("max_reward", {"advantage_over": "group"}, VARIED),  # the highest is above the group's mean
        ("max_variance", {"m": 1}, [False] * 6),  # one kept rollout: advantage 0 over itself
        ("max_variance", {"m": 1, "advantage_over": "group"}, VARIED),
        ("max_variance", {"std_over": "batch"}, VARIED),
        ("d3s_cross", {"scale_std": False}, VARIED),
    ],
)
def test_signal_of_each_group_alone(rule, options, want):
    spec = DownsampleSpec(rule=rule, **{"m": 2, **options})
    got = groups_with_signal(SIGNAL_REWARDS, spec, generator=torch.Generator().manual_seed(0), allow_missing=True)
    assert got.tolist() == want


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("std_over", ["group", "batch"])
def test_the_step_selection_agrees_with_the_signal_test(rule, std_over):
    """Over random rewards: a group that fails the test never has a signal in a batch's selection
    (any rule), and for every per-group rule, ``random`` included, every group that passes keeps
    one when the step trains on the groups that passed with the rows the test read (the selection
    is decided once: so B groups that pass are B groups with signal)."""
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 2, (200, 6), generator=gen).float()  # [G, n] binary: many groups all equal or with equal subsets
    rewards[::7] = 1.0  # some all equal for sure
    spec = DownsampleSpec(rule=rule, m=6 if rule == "all" else 2, std_over=std_over)
    tested = downsample(rewards, spec, generator=torch.Generator().manual_seed(2))
    passed = group_signal(rewards, tested, spec)
    assert 0 < int(passed.sum()) < len(passed)
    in_batch = has_signal(downsample(rewards, spec, step=3, seed=0))  # another draw
    if rule != "random":  # the verdict is the kept multiset's, whatever the tie-breaks
        assert not bool((in_batch & ~passed).any())
    assert torch.equal(passed, groups_with_signal(rewards, spec, generator=torch.Generator().manual_seed(2)))
    if rule != "d3s_cross":
        step = downsample(rewards[passed], spec, step=3, seed=0, keep=tested.keep[passed])
        assert bool(has_signal(step).all()) and torch.equal(step.keep, tested.keep[passed])


def _simulate_signal(rule: str, m: int, *, early: bool, seed: int, groups: int = 3000, n: int = 8, round_size: int = 2):
    """(share of groups with a signal, Counter of the kept reward multiset of those groups) when
    Bernoulli(0.3) groups are sampled with (early) or without exact early stopping."""
    from collections import Counter

    gen = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(groups, n, generator=gen) < 0.3).float()  # [G, n]
    if early:
        criterion = stop_criterion(rule, m, values=(0.0, 1.0))
        count, running = torch.zeros(groups, dtype=torch.long), torch.ones(groups, dtype=torch.bool)
        while running.any():
            count = torch.where(running, (count + round_size).clamp(max=n), count)
            seen = torch.where(torch.arange(n) < count[:, None], rewards, nan)
            running &= (count < n) & ~criterion(seen)
        rewards = seen
    spec = DownsampleSpec(rule=rule, m=m)
    tested = downsample(rewards, spec, generator=torch.Generator().manual_seed(seed + 1), allow_missing=True)
    signal = group_signal(rewards, tested, spec)  # the test and the rows trained on: one decision
    sel = downsample(rewards[signal], spec, step=seed, seed=0, allow_missing=True, keep=tested.keep[signal])
    kept = torch.where(sel.keep, rewards[signal], 0.0).sum(1)  # [S] highs kept
    return float(signal.float().mean()), Counter(kept.tolist())


@pytest.mark.parametrize("rule,m", [("max_variance", 2), ("max_variance", 3), ("max_reward", 2), ("max_reward", 3), ("random", 2), ("random", 3)])
def test_early_stopping_keeps_the_signal_law_of_fixed_n(rule, m):
    """Dynamic sampling's test runs on the early-stopped groups: the share of groups with a signal
    and the kept rewards of those groups have the law of fixed-n sampling (the test is a function
    of the kept set, whose law early stopping preserves: podsrl/core/early_stop.py). ``random``
    too, now that the rows trained on are the ones tested (a uniform m-subset either way)."""
    share_fixed, kept_fixed = _simulate_signal(rule, m, early=False, seed=11)
    share_early, kept_early = _simulate_signal(rule, m, early=True, seed=12)
    sd = math.sqrt(share_fixed * (1 - share_fixed) * 2 / 3000)
    assert abs(share_fixed - share_early) < 4 * sd, (share_fixed, share_early)
    stat, critical = _chi_square_same(kept_fixed, kept_early)
    assert stat < critical


# ------------------------------------------------------------------------- the trainer, one process

CONSTANT = "def constant(completion, example):\n    return 0.5\n\n\nconstant.reward_values = (0.5,)\n"


def _dynamic(make_config, reward_spec, **overrides):
    settings = {
        "reward.names": [reward_spec("half_silent_reward")],
        "rollout.dynamic_sampling": True,
        "train.prompts_per_step": 4,
        "train.max_steps": 3,
        "eval.at_start": False,
        "eval.at_end": False,
        "train.export_model": False,
        **overrides,
    }
    return make_config(**settings)


def _steps(cfg, steps: int) -> list[dict]:
    run = trainer.setup(cfg)
    model = run.policy.model
    model.train()
    optimizer, scheduler = trainer.make_optimizer(cfg, model)
    state, rows = ckpt.TrainState(), []
    try:
        for _ in range(steps):
            rows.append(trainer.train_step(run, model, optimizer, scheduler, state))
            state.step += 1
    finally:
        run.close()
    return rows


@pytest.mark.parametrize("rule", list(RULES))
def test_every_rule_fills_the_step_with_groups_that_have_a_signal(make_config, reward_spec, rule):
    m = None if rule == "all" else 2
    cfg = _dynamic(make_config, reward_spec, **{"select.rule": rule, "select.m": m})
    B, n, cap = 4, cfg.rollout.n, cfg.rollout.max_gen_batches
    rows = _steps(cfg, 2)
    for row in rows:
        assert 1 <= row["gen_batches"] <= cap and row["prompts_sampled"] == B * row["gen_batches"]
        assert row["rollouts_generated"] == row["prompts_sampled"] * n and row["sample_rounds"] == row["gen_batches"]
        if rule not in ("random", "d3s_cross"):  # the step's selection keeps a signal in every group that passed
            assert row["groups_with_signal"] == B and row["kept"] == B * cfg.select.m_start(n)
        assert row["groups_with_signal"] <= B and row["rows_run"] <= row["kept"]
    assert any(row["gen_batches"] > 1 for row in rows)  # about half the groups are silent: it had to sample more
    plain = _steps(_dynamic(make_config, reward_spec, **{"select.rule": rule, "select.m": m, "rollout.dynamic_sampling": False}), 2)
    assert plain[0]["reward_mean"] == rows[0]["reward_mean"]  # the first batch is a plain step's
    assert any(r["groups_with_signal"] < B for r in plain)  # which would have trained on fewer groups with a signal


def test_the_cap_trains_on_what_it_has_and_warns_once(make_config, reward_spec, tmp_path):
    reward = tmp_path / "constant.py"
    reward.write_text(CONSTANT)
    logs: list[str] = []
    cfg = _dynamic(make_config, reward_spec, **{"reward.names": [f"{reward}:constant"], "rollout.max_gen_batches": 2, "train.max_steps": 2})
    setup = trainer.setup(cfg)
    before = {k: v.clone() for k, v in setup.policy.model.state_dict().items()}
    setup.close()
    run = trainer.train(cfg, run_dir=tmp_path / "run", log=logs.append)
    rows = read_jsonl(run / "metrics.jsonl")
    assert [(r["gen_batches"], r["prompts_sampled"], r["groups_with_signal"], r["kept"]) for r in rows] == [(2, 8, 0, 0)] * 2
    assert all("loss" not in r for r in rows)  # no signal: no optimizer step, as with the DAPO filter
    after = load_file(str(ckpt.latest(run) / "weights.safetensors"))
    assert all(torch.equal(after[k], before[k]) for k in after)
    warnings = [line for line in logs if "rollout.max_gen_batches = 2" in line]
    assert len(warnings) == 1 and "step 1: 0 of 4 groups had a signal" in warnings[0]
    # Some signal at the cap: the step trains on the groups it found, fewer than B.
    rows = _steps(_dynamic(make_config, reward_spec, **{"rollout.max_gen_batches": 1, "select.m": 2}), 3)
    assert all(r["gen_batches"] == 1 for r in rows) and any(0 < r["groups_with_signal"] < 4 for r in rows)
    assert all(r["kept"] == 2 * r["groups_with_signal"] for r in rows)


def test_resume_equals_an_uninterrupted_run(make_config, reward_spec, tmp_path):
    """Nothing is carried between steps (the surplus is dropped; batch j's prompts come from (seed,
    step, j)), so a run resumed at step 2 logs and trains what an uninterrupted one does."""
    from test_trainer import _assert_rows_equal, _weights

    settings = {"select.m": 2, "train.checkpoint_every": 1}
    full = trainer.train(_dynamic(make_config, reward_spec, **settings), run_dir=tmp_path / "a", log=lambda *_: None)
    short = _dynamic(make_config, reward_spec, **settings, **{"train.max_steps": 2})
    part = trainer.train(short, run_dir=tmp_path / "b", log=lambda *_: None)
    trainer.train(_dynamic(make_config, reward_spec, **settings), run_dir=part, resume=True, log=lambda *_: None)
    rows = read_jsonl(full / "metrics.jsonl")
    _assert_rows_equal(rows, read_jsonl(part / "metrics.jsonl"))
    assert any(r["gen_batches"] > 1 for r in rows)
    wa, wb = _weights(full), _weights(part)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=1e-5)


def test_early_stopping_inside_dynamic_sampling(make_config, reward_spec, tmp_path):
    reward = tmp_path / "parity.py"
    reward.write_text("def parity(completion, example):\n    return float(len(completion) % 2)\n\n\nparity.reward_values = (0.0, 1.0)\n")
    cfg = _dynamic(make_config, reward_spec, **{"reward.names": [f"{reward}:parity"], "rollout.n": 8, "rollout.early_stop": "exact",
                                                "rollout.round_size": 2, "select.m": 2})  # fmt: skip
    rows = _steps(cfg, 3)
    cap = cfg.rollout.max_gen_batches
    for row in rows:
        _assert_the_groups_add_up(row, B=4, cap=cap)
        assert row["groups_with_signal"] == row["groups_passed"]  # max_variance: every group that passed trains with its signal
        assert row["rollouts_generated"] <= row["prompts_sampled"] * 8 and row["sample_rounds"] >= row["gen_batches"]
    assert sum(r["rollouts_generated"] for r in rows) < sum(r["prompts_sampled"] for r in rows) * 8  # groups did stop early
    assert _untimed(rows) == _untimed(_steps(cfg, 3))  # reproducible


def _assert_the_groups_add_up(row: dict, *, B: int, cap: int) -> None:
    """A dynamic-sampling step's counts: every group sampled passed or was silent; the step trains on
    B that passed unless it stopped at the cap, and drops a surplus only when it has B."""
    assert row["groups_passed"] + row["groups_surplus"] + row["groups_silent"] == row["prompts_sampled"]
    assert row["groups_passed"] <= B and 1 <= row["gen_batches"] <= cap
    if row["gen_batches"] < cap or row["groups_surplus"]:
        assert row["groups_passed"] == B
    if row["groups_passed"] < B:
        assert row["gen_batches"] == cap and row["groups_surplus"] == 0


def test_random_with_dynamic_sampling_is_exact_with_early_stopping(make_config, reward_spec):
    """The test and the step's rows are one draw, so ``random`` keeps a uniform m-subset whose
    signal is the one tested: exact early stopping no longer refuses it (the law: above)."""
    from podsrl.core.early_stop import why_not_exact

    cfg = _dynamic(make_config, reward_spec, **{"select.rule": "random", "select.m": 2, "rollout.n": 8, "rollout.early_stop": "exact"})
    trainer._reward_values(cfg, trainer.resolve_specs(list(zip(cfg.reward.names, cfg.reward.weights))))  # no ConfigError
    assert why_not_exact("random", values=None) is None
    assert why_not_exact("random", values=None, filter_zero_variance=True) is not None  # the DAPO filter still needs all n


@pytest.mark.parametrize("rule", ["random", "max_reward"])
def test_a_step_trains_on_the_rows_its_signal_test_read(make_config, reward_spec, tmp_path, rule):
    """A binary reward, n = 4, m = 2: a random subset of a mixed group is often constant. Every group
    that passed dynamic sampling's test trains with a signal, in the rows the test read (issue 44:
    the step used to draw its random subset again, and 629 of 1,041 simulated groups that passed
    trained on a subset without one)."""
    reward = tmp_path / "parity.py"
    reward.write_text("def parity(completion, example):\n    return float(len(completion) % 2)\n\n\nparity.reward_values = (0.0, 1.0)\n")
    cfg = _dynamic(make_config, reward_spec, **{"reward.names": [f"{reward}:parity"], "rollout.n": 4, "select.rule": rule, "select.m": 2,
                                                "rollout.max_gen_batches": 6})  # fmt: skip
    rows = _steps(cfg, 3)
    for row in rows:
        _assert_the_groups_add_up(row, B=4, cap=6)
        assert row["groups_with_signal"] == row["groups_passed"] > 0


def _untimed(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_the_progress_bar_shows_what_was_sampled(make_config, tmp_path):
    from podsrl.run.metrics import RunLogger

    logger = RunLogger(tmp_path, make_config(**{"train.progress": True}))
    row = {"step": 1, "reward_mean": 0.5, "reward_kept_mean": 0.5, "completion_len": 7.0, "time/step": 1.0, "gen_batches": 3,
           "prompts_sampled": 12, "groups_with_signal": 4, "rollouts_generated": 48}  # fmt: skip
    logger.log_step(row, ckpt.TrainState(step=1))
    assert "signal 4/4 of 12 prompts (3 batches) 48 rollouts" in logger.bar.postfix
    logger.log_step({**row, "gen_batches": 1, "prompts_sampled": 4, "groups_with_signal": 3, "rollouts_generated": 16}, ckpt.TrainState(step=2))
    assert "signal 3/4 16 rollouts" in logger.bar.postfix
    logger.close()


# ------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "overrides,field,needle",
    [
        ({"select.filter_zero_variance": True}, "select.filter_zero_variance", "would change nothing"),
        # m = 1 over the kept subset: refused for every run that trains (select.check_signal), dynamic sampling or not
        ({"select.m": 1}, "select.m", "nothing would be learned"),
        ({"select.m": 4, "select.m_final": 1, "select.m_schedule": "linear"}, "select.m_final", "nothing would be learned"),
        ({"rollout.max_gen_batches": 0}, "rollout.max_gen_batches", ">= 1"),
    ],
)
def test_nonsense_is_refused(make_config, reward_spec, overrides, field, needle):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        trainer.check_trainable(_dynamic(make_config, reward_spec, **overrides))
    assert needle in str(err.value)


def test_m_of_one_is_fine_with_advantages_over_the_group(make_config, reward_spec):
    cfg = _dynamic(make_config, reward_spec, **{"select.m": 1, "select.advantage_over": "group"})
    assert cfg.rollout.dynamic_sampling and cfg.select.m == 1
    trainer.check_trainable(cfg)
    with pytest.raises(ConfigError, match=r"select\.m = 1"):  # over the kept subset: refused, dynamic sampling or not
        trainer.check_trainable(make_config(**{"select.m": 1}))


# ------------------------------------------------------------------------- torchrun, 2 gloo ranks

DIST_BASE = {"train.prompts_per_step": 4, "rollout.n": 4, "select.m": 2, "optim.micro_batch_size": 2, "eval.max_problems": 3,
             "rollout.dynamic_sampling": True}  # fmt: skip
DIST_CASES = {
    "dynamic": {},
    "dynamic_d3s_cross": {"select.rule": "d3s_cross"},
    "fsdp_dynamic": {"distributed.parallel": "fsdp", "model.lora": False},
}
# Run with test_distributed.py's one-step cases, in the same launches (conftest.py's dist_steps).
dist_step_cases({name: {"overrides": {**DIST_BASE, **o}, "uniform_second_half": True} for name, o in DIST_CASES.items()})


def test_two_ranks_fill_the_step_as_one_process(dist_steps):
    """Rank 1's groups are all silent (tests/dist_worker.py's FixedEngine): the step samples a
    second batch and trains on rank 0's four groups; rank 1 runs the same batches and collectives
    and trains nothing. The weights equal one process's ("fsdp": torchrun with 1 process)."""
    for name in DIST_CASES:
        w1, w2 = load_file(str(dist_steps / f"{name}-w1.safetensors")), load_file(str(dist_steps / f"{name}-w2.safetensors"))
        diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        assert diff <= 1e-5, f"{name}: max abs weight difference {diff:.2e}"
        m1, m2 = (json.loads((dist_steps / f"{name}-w{w}.json").read_text()) for w in (1, 2))
        for key in ("gen_batches", "prompts_sampled", "groups_with_signal", "kept", "rollouts_generated", "reward_mean", "tokens_total"):
            assert m1[key] == pytest.approx(m2[key], rel=1e-6), (name, key)
        assert m2["gen_batches"] == 2 and m2["groups_with_signal"] == 4 and m2["world_size"] == 2
        assert m2["zero_variance_groups"] == 0.5  # of the first batch: a fixed-n run's figure


def test_torchrun_train_with_dynamic_sampling_and_early_stopping(two_rank_sampling_run):
    """``podsrl train`` on 2 ranks (conftest.py's two_rank_sampling_run, which selects prompts as
    well): each rank stops its own groups early, every rank runs the same generation batches
    (decided on the gathered batch), and the run finishes. Half the prompts are silent (an even
    answer scores 0 on every rollout), so steps sample several batches; each step stops at the
    first batch that brings B groups with a signal, or at the cap with fewer, trains on B of them
    (all of them at the cap), and both ranks record the same decisions."""
    B, n, cap = (SAMPLING_RUN[k] for k in ("train.prompts_per_step", "rollout.n", "rollout.max_gen_batches"))
    rows = read_jsonl(two_rank_sampling_run / "run" / "metrics.jsonl")
    rank0, rank1 = (read_jsonl(two_rank_sampling_run / "ranks" / f"rank{r}.jsonl") for r in (0, 1))
    assert [r["step"] for r in rows] == list(range(1, SAMPLING_RUN["train.max_steps"] + 1)) and rank0 == rank1  # the same decisions
    for r, mine in zip(rows, rank0):
        per_batch = mine["signal_per_batch"]  # [gen_batches]
        found = sum(per_batch)
        assert len(per_batch) == mine["gen_batches"] == r["gen_batches"] and 1 <= r["gen_batches"] <= cap
        assert sum(per_batch[:-1]) < B, per_batch  # no batch sampled after the one that brought the B-th group
        assert found >= B or r["gen_batches"] == cap, per_batch  # fewer than B only at the cap
        assert mine["groups"] == min(found, B) == r["groups_with_signal"] and r["groups_surplus"] == mine["surplus"] == max(0, found - B)
        assert r["world_size"] == 2 and r["prompts_sampled"] == B * r["gen_batches"]
        assert r["rollouts_generated"] == mine["rollouts"] <= n * r["prompts_sampled"]
    assert any(r["gen_batches"] > 1 for r in rows), [r["gen_batches"] for r in rows]  # a step sampled several batches
    assert sum(r["rollouts_generated"] for r in rows) < sum(n * r["prompts_sampled"] for r in rows)  # groups stopped early
