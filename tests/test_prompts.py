"""The prompt stream (podsrl/train/prompts.py) and prompt selection (podsrl/core/prompt_selection.py).

- Epochs: each prompt once an epoch, across batch and epoch boundaries; seeded by (seed, epoch);
  ``shuffle = false`` keeps the task's order; the position survives a checkpoint.
- Prompt selection, pure: sampling probabilities, the history, the exploration rate, by hand.
- The stream with selection: skips what the pure rule says, never stalls, records and adapts.
- The trainer: a run skips the prompts that were silent, logs it, and resumes exactly; under
  torchrun (2 gloo ranks) both ranks take the same decisions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from podsrl.config import PromptsConfig
from podsrl.core import prompt_selection as ps
from podsrl.errors import ConfigError
from podsrl.run import checkpoint as ckpt
from podsrl.run.metrics import read_jsonl
from podsrl.train import loop as trainer
from podsrl.train.prompts import PromptStream, prompt_metrics, repeats_warning

from conftest import SAMPLING_RUN

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def make_config(make_small_vocab_config):
    """The runs here use the tiny model with a 686-token tokenizer, ten times faster a step than
    with SmolLM2's 49152 (conftest.py, issue 45): what they check does not depend on it."""
    return make_small_vocab_config

SELECT = PromptsConfig(skip_silent=True)


def _taken(stream: PromptStream, batches: int, B: int, first: int = 0) -> list[int]:
    """The prompts of ``batches`` steps of one batch of B each, the first being step ``first``."""
    return [p for step in range(first, first + batches) for p in stream.take(B, step).prompts]


def _steps(stream: PromptStream, steps: int, B: int, batches: int = 1) -> list[list[int]]:
    """The prompts each of ``steps`` steps samples in ``batches`` batches of B (dynamic sampling's)."""
    return [[p for _ in range(batches) for p in stream.take(B, step).prompts] for step in range(steps)]


# ------------------------------------------------------------------------- epochs


@pytest.mark.parametrize("pool,B", [(10, 3), (7, 7), (3, 4), (1, 2)])
def test_each_prompt_comes_once_an_epoch(pool, B):
    stream = PromptStream(pool, seed=5, cfg=PromptsConfig())
    taken = _taken(stream, batches=4 * pool, B=B)  # 4 * B epochs
    epochs = [taken[i : i + pool] for i in range(0, len(taken) - pool + 1, pool)]
    assert all(sorted(e) == list(range(pool)) for e in epochs)
    assert stream.order.passes == pytest.approx(len(taken) / pool)
    if pool >= 10:  # (7! orders over 28 epochs may repeat one)
        assert len({tuple(e) for e in epochs}) == len(epochs)  # a new order each epoch
        assert epochs[0] != list(range(pool))


def test_the_order_is_seeded_by_the_run_seed_and_the_epoch():
    a, b, c = (PromptStream(20, seed=s, cfg=PromptsConfig()) for s in (1, 1, 2))
    assert _taken(a, 10, 4) == _taken(b, 10, 4) != _taken(c, 10, 4)
    plain = PromptStream(5, seed=1, cfg=PromptsConfig(shuffle=False))
    assert _taken(plain, 3, 4) == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


def test_the_position_survives_a_checkpoint():
    whole = PromptStream(13, seed=3, cfg=SELECT)
    part = PromptStream(13, seed=3, cfg=SELECT)
    for stream in (whole, part):  # some history, so that skipping happens
        stream.record(torch.arange(13), torch.arange(13) % 3 == 0)
        stream.order.epoch = 1
    first = _taken(part, 5, 4)
    saved = ckpt.TrainState(prompts=part.state_dict())
    resumed = PromptStream(13, seed=3, cfg=SELECT)
    assert resumed.load_state_dict(saved.prompts) is None
    assert first + _taken(resumed, 6, 4, first=5) == _taken(whole, 11, 4)
    assert torch.equal(resumed.selection.streak, whole.selection.streak) and resumed.order.passes == whole.order.passes


@pytest.mark.parametrize("pool,B,batches,steps", [(10, 4, 1, 10), (200, 32, 4, 50), (1000, 64, 1, 200)])
def test_no_prompt_twice_in_a_step_across_an_epoch_boundary(pool, B, batches, steps):
    """A step's batches ran over an epoch's end into the next epoch's permutation, which can hold
    the same prompts (issue 57, seed 0: 10 prompts in batches of 4, step 8 was [8, 0, 9, 0]; 200
    prompts in 4 batches of 32, 30 of 50 steps repeated one; 1,000 in batches of 64, 8 of 200).
    The next epoch puts the prompts the step has sampled at its end: each prompt still once an epoch."""
    taken = _steps(PromptStream(pool, seed=0, cfg=PromptsConfig()), steps, B, batches)
    assert [i for i, step in enumerate(taken) if len(set(step)) < len(step)] == []
    stream = [p for step in taken for p in step]
    epochs = [stream[i : i + pool] for i in range(0, len(stream) - pool + 1, pool)]
    assert len(epochs) >= 2 and all(sorted(e) == list(range(pool)) for e in epochs)
    if pool == 10:
        assert taken[7][:3] == [8, 0, 9] and 0 not in taken[7][3:]  # epoch 3 begins with 9, its 0 and 8 at its end


def test_an_epoch_begun_in_a_step_survives_a_checkpoint():
    """The order of an epoch a step began depends on what that step had sampled: the checkpoint
    carries it (``back``), so a resumed run reads the rest of that epoch as an uninterrupted one."""
    whole = _steps(PromptStream(10, seed=4, cfg=PromptsConfig()), 6, 4, batches=2)
    part = PromptStream(10, seed=4, cfg=PromptsConfig())
    first = _steps(part, 2, 4, batches=2)  # step 1 began epoch 1 with 2 prompts of epoch 0
    state = ckpt.TrainState(prompts=part.state_dict()).prompts
    assert len(state["back"]) == 2
    resumed = PromptStream(10, seed=4, cfg=PromptsConfig())
    assert resumed.load_state_dict(state) is None
    assert first + [[p for _ in range(2) for p in resumed.take(4, step).prompts] for step in range(2, 6)] == whole


def test_no_prompt_twice_in_a_step_that_skips_past_an_epoch():
    """With prompt selection a step's candidates can run through the next epoch's front into the
    prompts it put at the end: those are passed over (the step sampled them). A step of as many
    prompts as the pool then samples every prompt once, however many it skips."""
    stream = PromptStream(12, seed=1, cfg=PromptsConfig(skip_silent=True, explore=0.05, explore_min=0.05))
    silent = torch.arange(12) % 4 != 0  # 3 prompts in 4 always silent
    for step in range(20):
        batches = [stream.take(4, step) for _ in range(3)]
        taken = [p for b in batches for p in b.prompts]
        assert sorted(taken) == list(range(12)), (step, taken)
        stream.record(torch.tensor(taken), silent[taken])
    assert stream.order.epoch >= 20


def test_a_pool_smaller_than_the_step_samples_each_once_before_any_twice(make_config):
    for taken in _steps(PromptStream(6, seed=2, cfg=PromptsConfig()), 6, 4, batches=2):  # 8 a step from 6
        assert sorted(taken[:6]) == list(range(6)) and len(set(taken[6:])) == 2
    cfg = make_config(**{"train.prompts_per_step": 4, "rollout.dynamic_sampling": True, "rollout.max_gen_batches": 3})
    assert repeats_warning(12, cfg) is None
    assert repeats_warning(11, cfg) == (
        "the training set has 11 prompts, fewer than the 12 a step may sample (train.prompts_per_step = 4 x "
        "rollout.max_gen_batches = 3): a step that samples more than 11 samples some prompts twice (each once before any twice)")  # fmt: skip
    plain = make_config(**{"train.prompts_per_step": 4})
    assert repeats_warning(4, plain) is None and "fewer than the 4 a step samples (train.prompts_per_step = 4)" in repeats_warning(3, plain)


def test_a_run_whose_pool_is_smaller_than_a_step_says_so_once(make_config, tmp_path):
    logs: list[str] = []
    cfg = make_config(**{"task.options": {"ops": ["+"], "min_digits": 1, "max_digits": 1, "num_train": 3, "num_eval": 2}, "train.prompts_per_step": 4,
                         "train.max_steps": 2, "rollout.n": 2, "eval.at_start": False, "eval.at_end": False, "train.export_model": False})  # fmt: skip
    trainer.train(cfg, run_dir=tmp_path / "run", log=logs.append)
    assert [line for line in logs if "samples some prompts twice" in line] == [
        "podsrl: warning: the training set has 3 prompts, fewer than the 4 a step samples (train.prompts_per_step = 4): a step "
        "that samples more than 3 samples some prompts twice (each once before any twice)"]  # fmt: skip


def test_a_checkpoint_from_before_epochs_or_another_task_says_what_happens():
    stream = PromptStream(10, seed=0, cfg=SELECT)
    assert "before prompts were read in epochs" in stream.load_state_dict({})
    assert "had 12 prompts, this one has 10" in stream.load_state_dict({"epoch": 2, "position": 3, "pool": 12})
    assert "history starts empty" in stream.load_state_dict({"epoch": 2, "position": 3, "pool": 10})
    assert (stream.order.epoch, stream.order.position) == (2, 3)


# ------------------------------------------------------------------------- prompt selection: the pure rule


def test_sampling_probability_by_hand():
    streak = torch.tensor([0, 1, 2, 3, 255], dtype=torch.uint8)
    got = ps.sample_probability(streak, explore=0.5, floor=0.1)
    assert got.tolist() == [1.0, 0.5, 0.25, 0.125, 0.1]
    uniform = torch.tensor([0.99, 0.49, 0.26, 0.124, 0.2])
    assert ps.skip_mask(streak, uniform, explore=0.5, floor=0.1).tolist() == [False, False, True, False, True]


def test_the_history_counts_consecutive_silent_visits():
    streak = torch.tensor([0, 3, 254, 7], dtype=torch.uint8)
    out = ps.record_outcomes(streak, torch.tensor([0, 1, 2, 3, 3]), torch.tensor([True, True, True, True, False]))
    assert out.tolist() == [1, 4, 255, 0] and streak.tolist() == [0, 3, 254, 7]  # pure: a new tensor
    assert ps.record_outcomes(out, torch.tensor([2]), torch.tensor([True])).tolist()[2] == ps.STREAK_MAX  # saturates


@pytest.mark.parametrize("share,want", [(0.3, 0.49), (0.25, 0.49), (0.2, 0.51), (0.9, 0.49)])
def test_the_exploration_rate_steers_toward_the_target(share, want):
    assert ps.next_explore_rate(0.5, share, target=0.25, step=0.01, low=0.05, high=0.95) == pytest.approx(want)


def test_the_exploration_rate_stays_in_its_range():
    assert ps.next_explore_rate(0.05, 1.0, target=0.25, step=0.01, low=0.05, high=0.95) == 0.05
    assert ps.next_explore_rate(0.95, 0.0, target=0.25, step=0.01, low=0.05, high=0.95) == 0.95


# ------------------------------------------------------------------------- the stream with selection


def test_the_stream_skips_what_the_rule_says():
    pool = 40
    stream = PromptStream(pool, seed=9, cfg=SELECT)
    silent = torch.arange(pool) % 2 == 0  # even prompts always silent
    stream.record(torch.arange(pool), silent)
    stream.record(torch.arange(pool), silent)  # streak 2 for the even ones
    stream.order.epoch = 1
    order, uniform = stream.order.current(), stream.selection.draws(1)
    batch = stream.take(10, step=0)
    skip = ps.skip_mask(stream.selection.streak[order], uniform, 0.5, SELECT.min_sample_probability)  # [P] in stream order
    want = order[~skip][:10].tolist()
    assert batch.prompts == want
    assert batch.skipped == int(skip[: stream.order.position].sum())  # every candidate passed over was a skip
    assert batch.explored == [p % 2 == 0 for p in want]  # sampled although predicted silent
    assert 0 < batch.skipped and sum(batch.explored) < 10 / 2


def test_a_stream_of_silent_prompts_never_stalls():
    stream = PromptStream(6, seed=0, cfg=PromptsConfig(skip_silent=True, explore=0.05, explore_min=0.05, min_sample_probability=1e-9))
    stream.record(torch.arange(6), torch.ones(6, dtype=torch.bool))
    batch = stream.take(4, step=0)  # one epoch's worth examined, then taken without skipping
    assert len(batch.prompts) == 4 and batch.skipped + len(batch.prompts) <= 6 + 4


def test_prompts_the_fallback_forces_in_are_not_counted_as_explored():
    """An all-silent pool: the batch examines an epoch's worth, skipping nearly all, then takes the
    next candidates without skipping. Those were forced in, not explored (issue 57: skipped 10,
    explored 8): ``prompts_explored`` and its precision count the prompts the rule chose to sample."""
    stream = PromptStream(10, seed=0, cfg=PromptsConfig(skip_silent=True, explore=0.05, explore_min=0.05, min_sample_probability=1e-9))
    stream.record(torch.arange(10), torch.ones(10, dtype=torch.bool))
    stream.order.epoch = 1
    order, uniform = stream.order.current(), stream.selection.draws(1)
    chosen = int((~ps.skip_mask(stream.selection.streak[order], uniform, 0.05, 1e-9)).sum())  # sampled by the rule, of the first 10 examined
    batch = stream.take(8, step=0)
    assert (sum(batch.explored), sum(batch.forced), batch.skipped) == (chosen, 8 - chosen, 10 - chosen) and chosen < 8
    assert batch.forced == [not e for e in batch.explored]  # every prompt is predicted silent: sampled by the rule, or forced
    silent = torch.tensor([True, False] * 4)
    metrics = prompt_metrics([batch], [silent], epoch=stream.step_epoch, epoch_end=stream.order.passes, explore_rate=stream.explore_rate)
    assert (metrics["prompts_explored"], metrics["prompts_forced"], metrics["prompts_skipped"]) == (chosen, 8 - chosen, 10 - chosen)
    forced = torch.tensor(batch.forced)
    assert (metrics["prompts_explored_silent"], metrics["prompts_forced_silent"]) == (int(silent[~forced].sum()), int(silent[forced].sum()))


def test_the_epoch_logged_is_the_one_the_steps_prompts_came_from():
    """``epoch`` is the passes over the prompts when the step began taking them: the step that
    crosses into epoch 1 is from epoch 0 (issue 57: it was logged after its prompts were taken, 1.2);
    ``epoch_end`` the passes once it has taken them (what ``epoch`` was before; the report's epochs)."""
    stream = PromptStream(10, seed=0, cfg=PromptsConfig())
    logged = []
    for step in range(6):
        batch = stream.take(4, step)
        row = prompt_metrics([batch], [torch.zeros(4, dtype=torch.bool)], epoch=stream.step_epoch, epoch_end=stream.order.passes, explore_rate=None)
        logged.append((row["epoch"], row["epoch_end"]))
    assert logged == [(0.0, 0.4), (0.4, 0.8), (0.8, 1.2), (1.2, 1.6), (1.6, 2.0), (2.0, 2.4)]


def test_the_step_metrics_by_hand():
    from podsrl.train.prompts import PromptBatch

    batches = [PromptBatch([3, 5, 7], skipped=2, explored=[True, False, True], forced=[False, False, False]),
               PromptBatch([1, 2, 4], skipped=1, explored=[False, True, False], forced=[True, False, True])]  # fmt: skip
    silent = [torch.tensor([True, True, False]), torch.tensor([False, True, True])]
    assert prompt_metrics(batches, silent, epoch=1.23456, epoch_end=1.87654, explore_rate=0.4) == {
        "epoch": 1.2346, "epoch_end": 1.8765, "prompts_skipped": 3, "explore_rate": 0.4, "prompts_explored": 3, "prompts_forced": 2,
        "prompts_explored_silent": 2, "prompts_forced_silent": 1, "explored_silent_share": 2 / 3}  # fmt: skip
    assert prompt_metrics(batches, silent, epoch=0.5, epoch_end=0.8, explore_rate=None) == {"epoch": 0.5, "epoch_end": 0.8}  # no prompt selection
    assert math.isnan(prompt_metrics(batches[:0], [], epoch=0.0, epoch_end=0.0, explore_rate=0.4)["explored_silent_share"])


def test_adapting_starts_in_the_second_epoch():
    stream = PromptStream(8, seed=0, cfg=SELECT)
    stream.take(4, step=0)
    stream.end_step(sampled=4, silent=4)
    assert stream.explore_rate == 0.5  # no prompt has come back yet
    stream.take(4, step=1)
    stream.end_step(sampled=4, silent=4)
    assert stream.explore_rate == pytest.approx(0.49)
    stream.end_step(sampled=4, silent=0)
    assert stream.explore_rate == pytest.approx(0.5)


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"target_silent": 1.5}, "prompts.target_silent"),
        ({"explore_step": 0.0}, "prompts.explore_step"),
        ({"explore_min": 0.6, "explore_max": 0.5}, "prompts.explore_min"),
        ({"explore": 0.01}, "prompts.explore"),
        ({"min_sample_probability": 0.0}, "prompts.min_sample_probability"),
    ],
)
def test_nonsense_is_refused_with_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        PromptsConfig(**overrides)


# ------------------------------------------------------------------------- the trainer

PARITY = "def parity(completion, example):\n    return 0.0 if int(example.answer) % 2 == 0 else float(len(completion) % 2)\n\n\nparity.reward_values = (0.0, 1.0)\n"


def _selecting(make_config, tmp_path, **overrides):
    """A training set of 12 prompts, half of which (an even answer) are always silent."""
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY)
    settings = {"reward.names": [f"{reward}:parity"], "task.options": {"ops": ["+"], "min_digits": 1, "max_digits": 1, "num_train": 12, "num_eval": 4},
                "train.prompts_per_step": 4, "train.max_steps": 8, "rollout.n": 4, "prompts.skip_silent": True, "prompts.explore": 0.2,
                "prompts.explore_min": 0.05, "eval.at_start": False, "eval.at_end": False, "train.export_model": False, "train.checkpoint_every": 4,
                **overrides}  # fmt: skip
    return make_config(**settings)


def test_a_run_skips_the_prompts_that_were_silent_and_resumes_exactly(make_config, tmp_path):
    from test_trainer import _assert_rows_equal, _weights

    cfg = _selecting(make_config, tmp_path, **{"rollout.dynamic_sampling": True, "rollout.max_gen_batches": 3})
    full = trainer.train(cfg, run_dir=tmp_path / "full", log=lambda *_: None)
    rows = read_jsonl(full / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows[0]["prompts_skipped"] == 0 and rows[0]["epoch"] == 0 and rows[1]["epoch"] == pytest.approx(rows[0]["prompts_sampled"] / 12, abs=5e-5)
    assert sum(r["prompts_skipped"] for r in rows) > 0  # once the silent prompts have come back
    assert all(0.05 <= r["explore_rate"] <= 0.95 for r in rows)
    for r in rows:  # everything sampled was recorded; what was explored anyway came back as predicted (even: silent)
        assert r["groups_passed"] + r["groups_surplus"] + r["groups_silent"] == r["prompts_sampled"]
        assert r["prompts_explored_silent"] <= r["prompts_explored"] and r["prompts_explored"] + r["prompts_forced"] <= r["prompts_sampled"]
        assert r["prompts_forced_silent"] <= r["prompts_forced"]
    explored = sum(r["prompts_explored"] for r in rows)  # mostly even prompts, always silent (an odd one: 1 in 8)
    assert explored > 0 and sum(r["prompts_explored_silent"] for r in rows) >= 0.5 * explored
    state = ckpt.read_train_state(ckpt.latest(full))
    assert state.prompts["pool"] == 12 and state.prompts["epoch"] + state.prompts["position"] / 12 > rows[-1]["epoch"]  # logged before its step
    assert state.prompts["epoch"] + state.prompts["position"] / 12 == pytest.approx(rows[-1]["epoch_end"], abs=5e-5)  # and after it
    even = torch.tensor([int(ex.answer) % 2 == 0 for ex in trainer.build_task(cfg).train])
    assert bool((state.prompts["streak"][even] >= 1).all())  # every one was sampled in the first epoch, and was silent
    part = trainer.train(_selecting(make_config, tmp_path, **{"rollout.dynamic_sampling": True, "rollout.max_gen_batches": 3,
                                                              "train.max_steps": 4}), run_dir=tmp_path / "part", log=lambda *_: None)  # fmt: skip
    trainer.train(cfg, run_dir=part, resume=True, log=lambda *_: None)
    _assert_rows_equal(rows, read_jsonl(part / "metrics.jsonl"))
    wa, wb = _weights(full), _weights(part)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=1e-5)


def test_torchrun_ranks_take_the_same_prompt_decisions(two_rank_sampling_run):
    """``podsrl train`` on 2 gloo ranks with prompt selection, dynamic sampling and early stopping
    (conftest.py's two_rank_sampling_run): each rank samples its own rollouts of its half of each
    batch, and every rank's stream (position, history, exploration rate) and choice of prompts is
    the same after every step."""
    rank0, rank1 = (read_jsonl(two_rank_sampling_run / "ranks" / f"rank{r}.jsonl") for r in (0, 1))
    assert len(rank0) == SAMPLING_RUN["train.max_steps"] and rank0 == rank1
    assert all(len(set(r["sampled"])) == len(r["sampled"]) for r in rank0)  # no prompt twice in a step (issue 57)
    assert any(r["back"] for r in rank0)  # among them a step that began an epoch
    assert sum(r["prompts_skipped"] for r in rank0) > 0
    rows = read_jsonl(two_rank_sampling_run / "run" / "metrics.jsonl")
    assert [r["prompts_skipped"] for r in rows] == [r["prompts_skipped"] for r in rank0] and rows[-1]["world_size"] == 2


# ------------------------------------------------------------------------- dynamic sampling's surplus, the seeds registry


def _batch(ranks: list[int], n: int = 2):
    from podsrl.train.sampling import Groups

    parts = [Groups.unsampled([10 * r + i], n, rank=r, batch=0, rewards=[], timed=[]) for i, r in enumerate(ranks)]
    return Groups.cat(parts)


def test_the_surplus_is_dropped_to_balance_the_ranks():
    """The last batch brings more groups with a signal than the step needs: the ones kept spread
    over the ranks (each next one from the rank holding the fewest), not the first in rank order,
    which left rank 0 with every row while rank 1 padded (issue 45)."""
    from podsrl.core.downsample import Selection
    from podsrl.train.sampling import _with_signal

    first = _batch([0, 0, 1, 1])
    last = _batch([0, 0, 0, 1, 1, 1])
    sel = lambda g: Selection(torch.ones(len(g), 2, dtype=torch.bool), torch.zeros(len(g), 2), 2, 1.0, {})  # noqa: E731
    signals = [torch.tensor([True, False, False, False]), torch.tensor([True, True, True, True, True, True])]
    groups, keep, found = _with_signal([first, last], [sel(first), sel(last)], signals, B=4, world=2)
    assert found == 7 and keep.shape == (4, 2)
    assert groups.rank.tolist() == [0, 0, 1, 1]  # rank 0 had one: one more from rank 0, two from rank 1
    assert groups.prompt.tolist() == [0, 0, 13, 14]  # in prompt order within each rank
    alone = _batch([0] * 6)
    one, _, _ = _with_signal([alone], [sel(alone)], [signals[1]], B=4, world=1)
    assert one.prompt.tolist() == [0, 1, 2, 3]  # one process: the first four, as before


def test_every_random_stream_comes_from_the_registry():
    """No module seeds a draw with a stream number of its own (podsrl/core/seeds.py is the one
    registry): every step_seed / generator call names a Stream member, and the members differ."""
    import ast

    from podsrl.core.seeds import Stream

    assert len({int(s) for s in Stream}) == len(Stream)
    root = Path(__file__).resolve().parents[1] / "podsrl"
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "seeds.py":  # the registry's own helpers pass a stream through
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("step_seed", "generator"):
                if len(node.args) == 3 and not any(isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "Stream" for n in ast.walk(node.args[2])):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
