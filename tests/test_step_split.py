"""bench/step_split.py (issue 67) without its long run: the gap's parts add up to the gap (hand
numbers), the phase medians, the hooks that split an update into its phases (on the tiny model,
through podsrl's own forward with and without shared prompts), the bench's reward and each arm's
config (podsrl's and the TRL arms' checks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    with script_module(ROOT / "bench" / "step_split.py") as module:
        yield module


def test_the_gap_is_split_into_parts_that_add_up(bench):
    """GRPOTrainer's step of 60 s (13 generating, 47 updating) against podsrl's 12 (4.5, 7.0, 0.5 of
    rest), whose update took 12.0 without skipping and 20.0 without sharing either: engine 8.5,
    zero-advantage rows 5.0, prompt sharing 8.0, per-token cost 27.0, rest -0.5, 48 in all. PODS's
    pair, both skipping: no zero-advantage part."""
    trl = {"step": 60.0, "generate": 13.0, "update": 47.0, "rest": 0.0}
    ours = {"step": 12.0, "generate": 4.5, "update": 7.0, "rest": 0.5, "update_no_skip": 12.0, "update_no_share": 20.0}
    split = bench.gap_split(trl, ours)
    assert split == {"gap": 48.0, "engine": 8.5, "zero_adv_rows": 5.0, "prompt_sharing": 8.0, "per_token_cost": 27.0, "rest": -0.5}
    assert sum(v for k, v in split.items() if k != "gap") == pytest.approx(split["gap"])
    pods = bench.gap_split({"step": 19.0, "generate": 13.0, "update": 6.0, "rest": 0.0},
                           {"step": 6.5, "generate": 4.0, "update": 2.3, "rest": 0.2, "update_no_share": 3.0})  # fmt: skip
    assert pods == pytest.approx({"gap": 12.5, "engine": 9.0, "zero_adv_rows": 0.0, "prompt_sharing": 0.7, "per_token_cost": 3.0, "rest": -0.2})


def test_phases_are_medians_of_the_steps(bench):
    steps = [
        {"time/step": 10.0, "time/generate": 5.0, "time/reward": 0.5, "time/sync": 0.5, "time/update": 3.0, "rows_run": 8,
         "phases": {"prompt_fwd": 0.5, "completion_fwd": 1.0, "backward": 1.0, "optimizer": 0.25}, "no_skip": {"update": 6.0, "phases": {}}},
        {"time/step": 12.0, "time/generate": 6.0, "time/update": 5.0, "rows_run": 8,
         "phases": {"prompt_fwd": 0.5, "completion_fwd": 2.0, "backward": 2.0, "optimizer": 0.25}, "no_skip": {"update": 8.0, "phases": {}}},
        {"time/step": 11.0, "time/generate": 6.5, "time/select": 0.5, "time/update": 4.0, "rows_run": 8,
         "phases": {"prompt_fwd": 0.5, "completion_fwd": 1.5, "backward": 1.5, "optimizer": 0.25}, "no_skip": {"update": 7.0, "phases": {}}},
    ]  # fmt: skip
    x = bench.phases(steps)
    assert (x["step"], x["generate"], x["update"], x["rows_run"]) == (11.0, 6.0, 4.0, 8)  # generate: 6.0, 6.0, 7.0 with reward, select, sync
    assert (x["prompt_fwd"], x["completion_fwd"], x["sequence_fwd"], x["backward"], x["optimizer"]) == (0.5, 1.5, 0.0, 1.5, 0.25)
    assert x["update_rest"] == pytest.approx(4.0 - 3.75) and x["rest"] == pytest.approx(11.0 - 6.0 - 4.0)
    assert x["update_no_skip"] == 7.0 and "update_phases" not in x
    table = bench.phase_table({16: {"grpo16": x}})
    assert "| 16 | GRPO(16) | 8 | 11.00 | 6.00 | 4.00 | 0.50 | 1.50 | 0.00 | 1.50 | 0.25 | 0.25 | 36% |" in table
    gap = bench.gap_table({16: {"grpo16": {**x, "update_no_share": 9.0}, "trl_grpo16": {"step": 40.0, "generate": 12.0, "update": 28.0, "rest": 0.0}}})
    assert "| 16 | GRPOTrainer(16) - GRPO(16) | 29.00 | 6.00 (21%) | 3.00 (10%) | 2.00 (7%) | 19.00 (66%) | -1.00 (-3%) |" in gap


def test_a_saved_run_gives_its_tables_and_every_committed_one_is_in_the_results_page(bench):
    """``--table`` reads a saved step_split.json back to the tables the run printed, and every committed
    run (results/step-split/*.json) appears in docs/results.md as ``--table`` prints it (issue 68)."""
    step = {"time/step": 11.0, "time/generate": 6.0, "time/update": 4.0, "rows_run": 8,
            "phases": {"prompt_fwd": 0.5, "completion_fwd": 1.5, "backward": 1.5, "optimizer": 0.25}}  # fmt: skip
    tables = bench.saved_tables({"command": "python bench/step_split.py", "steps": {"16": {"grpo16": [step], "grpo4": []}}})
    assert tables.startswith("`python bench/step_split.py`\n\n| L | arm |") and "| 16 | GRPO(16) | 8 | 11.00 |" in tables
    assert "GRPO(4)" not in tables  # an arm without steps (failed) is left out, as the run leaves it out
    page = (ROOT / "docs" / "results.md").read_text()
    for path in sorted((ROOT / "results" / "step-split").glob("*.json")):
        assert bench.saved_tables(json.loads(path.read_text())) in page, f"docs/results.md lacks {path.name}'s tables: paste `python bench/step_split.py --table {path.relative_to(ROOT)}`"


def test_the_hooks_split_podsrls_update(bench, small_vocab_model_dir, one_thread):
    """On the tiny model: the shared-prompt forward is two timed passes (the prompts, then the
    completions on their cache), the plain one a whole-row pass; the backward and the optimizer's
    step are timed; a forward without gradients (sampling, scoring) is not; removing the hooks
    restores torch.Tensor.backward."""
    from transformers import AutoModelForCausalLM

    from podsrl.train.sequences import forward_logprobs, pack

    model = AutoModelForCausalLM.from_pretrained(small_vocab_model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    clock = bench.PhaseClock()
    backward = torch.Tensor.backward
    remove = clock.install(model)
    try:
        packed = pack([[5, 6, 7]] * 3, [[8, 9], [10, 11, 12], [13]], 0)
        with torch.no_grad():
            forward_logprobs(model, packed)
        assert clock.current is None  # not recording
        clock.current = {}
        with torch.no_grad():
            forward_logprobs(model, packed)
        assert clock.current == {}  # no gradients: not the update's
        logprobs, _ = forward_logprobs(model, packed, share_prompts=True)
        logprobs.sum().backward()
        optimizer.step()
        assert set(clock.current) == {"prompt_fwd", "completion_fwd", "backward", "optimizer"}
        assert all(v > 0 for v in clock.current.values())
        clock.current = {}
        forward_logprobs(model, packed, share_prompts=False)
        assert set(clock.current) == {"sequence_fwd"}
    finally:
        remove()
    assert torch.Tensor.backward is backward


def test_the_reward_gives_half_the_groups_a_signal(bench, monkeypatch):
    from podsrl.tasks import Example

    monkeypatch.setattr(bench, "SIGNAL", {"1+2"})
    signal, silent = Example(id="1+2", question="What is 1 + 2?", answer="3"), Example(id="3+4", question="What is 3 + 4?", answer="7")
    values = [bench.signal_reward(text, signal) for text in ("a", "b", "a b", "a")]
    assert all(0 <= v < 1 for v in values) and len(set(values[:3])) == 3 and values[3] == values[0]
    assert bench.signal_reward("a", silent) == 0.0


@pytest.mark.parametrize("arm", ["grpo16", "pods16_4", "grpo4", "trl_grpo16", "trl_pods16_4"])
def test_every_arm_is_a_valid_run(bench, arm):
    """Each arm's config passes podsrl's checks (and a TRL arm's, podsrl compare's), with B problems to
    train on, half of them with a signal."""
    from podsrl.compare.trl_arm.mapping import check_arm
    from podsrl.tasks.build import build_task

    cfg = bench.config(dict(arm=arm, length=128, prompts=4, steps=3, seed=0, model="smollm2-135m-instruct", engine="vllm", keep=None))
    label, tool, rule, n, m, _ = bench.ARMS[arm]
    assert (cfg.rollout.n, cfg.select.rule, cfg.select.m_start(n), cfg.rollout.max_new_tokens, cfg.train.prompts_per_step) == (n, rule, m, 128, 4)
    assert cfg.rollout.engine == ("vllm" if tool == "podsrl" else "transformers")
    check_arm(cfg, tool)
    assert len(build_task(cfg).train) == 4
