"""TRL arms of ``podsrl compare`` (podsrl.compare.trl_arm): one compare with a podsrl arm and a TRL
GRPOTrainer arm on the tiny small-vocabulary model, reported side by side, and its rerun skipping
both; the training clock leaving TRL's saving out; a PODSTrainer arm; the config mapping and the
loss a TRL arm takes; the refusals; transformers' noise kept out; configs/compare-vs-trl.toml loads."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from podsrl import compare  # noqa: E402
from podsrl.compare.trl_arm import checkpoints, clock, mapping, metrics  # noqa: E402
from podsrl.compare.trl_arm.run import train_trl  # noqa: E402
from podsrl.errors import ConfigError  # noqa: E402
from podsrl.run.rundir import TRAINER_FILE, TRL_DIR, read_trainer  # noqa: E402
from test_compare import _toml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, model_dir: Path, reward_file: Path, methods: dict, every_steps: int = 1, **train) -> Path:
    """A [compare] TOML on the tiny model: B = 2 prompts, evaluated every ``every_steps``, one seed."""
    from conftest import tiny_config_dict

    base = tiny_config_dict(model_dir, reward_file)
    base["train"].update({"max_steps": 2, "max_seconds": None, "checkpoint_every": 0, **train})
    base["eval"].update(every_steps=every_steps)
    path = tmp_path / "tiny.toml"
    path.write_text(_toml({**base, "compare": {"seeds": 1, "baseline": next(iter(methods)), "methods": methods}}))
    return path


GRPO = {"select.rule": "all", "rollout.n": 2, "select.m": 2}


@pytest.mark.usefixtures("one_thread")
def test_a_trl_arm_and_a_podsrl_arm_side_by_side_and_the_rerun_skips_both(tmp_path, small_vocab_model_dir, reward_file, capsys):
    path = _config(tmp_path, small_vocab_model_dir, reward_file, {"grpo": GRPO, "trl_grpo": {"trainer": "trl", **GRPO}})
    out = tmp_path / "cmp"
    args = argparse.Namespace(config=str(path), out=str(out), seeds=None, methods=None, report_only=False, in_process=True)
    assert compare.main(args, []) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "compare.json").read_text())
    trl = report["methods"]["trl_grpo"]
    assert (report["methods"]["grpo"]["trainer"], trl["trainer"]) == ("podsrl", "trl")
    for name in ("grpo", "trl_grpo"):
        entry = report["methods"][name]
        run = entry["runs"][0]
        assert entry["steps"] == [2] and run["step"] == [0, 1, 2] and len(run["accuracy"]) == 3, name  # at start, step 1, end
        assert all(0 <= a <= 1 for a in run["accuracy"]) and run["problems"] == 4
        assert run["train_seconds"][0] == 0 and run["train_seconds"][1] < run["train_seconds"][2]
        assert entry["median_seconds"]["step"] > 0 and entry["median_seconds"]["generate"] > 0 and entry["median_seconds"]["update"] > 0
        assert entry["signal"]["rollouts"] == 4.0  # B x n = 2 x 2
    assert trl["signal"]["rows_run"] == 1.0  # GRPOTrainer runs every row, advantage 0 or not
    assert trl["signal"]["kept_adv_var"] is not None and trl["signal"]["groups_with_signal"] is not None
    # The same held-out problems and samples: the untrained model scores the same in both arms.
    assert trl["runs"][0]["accuracy"][0] == report["methods"]["grpo"]["runs"][0]["accuracy"][0]
    assert "all (trl)" in printed and "trl_grpo" in printed  # the table's row
    run_dir = out / "runs" / "trl_grpo" / "seed0"
    # Finished: its TRL checkpoints were scored and are removed (a podsrl arm keeps its own: eval --run, export).
    assert read_trainer(run_dir) == "trl" and not list((run_dir / TRL_DIR).glob("checkpoint-*"))
    from podsrl.run.checkpoint import latest

    assert latest(out / "runs" / "grpo" / "seed0") is not None
    assert compare.main(args, []) == 0  # finished: both skipped, the report rebuilt
    assert capsys.readouterr().out.count("finished earlier, skipped") == 2
    args.report_only = True
    assert compare.main(args, []) == 0


@pytest.mark.usefixtures("one_thread")
def test_saving_and_evaluation_stay_off_the_trl_training_clock(tmp_path, small_vocab_model_dir, reward_file, monkeypatch):
    """The clock the TRL arm reads (``time.perf_counter`` in podsrl.compare.trl_arm.clock) jumps 100 s at
    every checkpoint TRL saves and at every evaluation: 3 saves (steps 1, 2, 3) and 4 evaluations
    add 700 s to the run's span on that clock, and none of it may reach its training time."""
    from transformers import Trainer

    import podsrl.train.loop
    from podsrl.compare.plan import load_plan
    from podsrl.run.metrics import read_jsonl

    jump, offset = 100.0, [0.0]
    monkeypatch.setattr(clock, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0]))
    real_save, real_eval = Trainer._save_checkpoint, podsrl.train.loop.run_eval

    def slow_save(*args, **kwargs):
        offset[0] += jump
        return real_save(*args, **kwargs)

    def slow_eval(*args, **kwargs):
        offset[0] += jump
        return real_eval(*args, **kwargs)

    monkeypatch.setattr(Trainer, "_save_checkpoint", slow_save)
    monkeypatch.setattr(podsrl.train.loop, "run_eval", slow_eval)
    path = _config(tmp_path, small_vocab_model_dir, reward_file, {"trl_grpo": {"trainer": "trl", **GRPO}}, max_steps=3)
    cfg = load_plan(path).config("trl_grpo", 0)
    run = train_trl(cfg, "trl", run_dir=tmp_path / "run", log=lambda *_: None)
    steps, evals = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "eval.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3] and [r["step"] for r in evals] == [0, 1, 2, 3]
    assert offset[0] == 7 * jump
    trained = steps[-1]["train_seconds"]
    assert 0 < trained < jump, trained
    assert trained == pytest.approx(sum(r["time/step"] for r in steps))  # the clock is the sum of the steps' spans
    assert [r["train_seconds"] for r in evals[1:]] == [r["train_seconds"] for r in steps]  # each evaluation at its step's clock


@pytest.mark.usefixtures("one_thread")
def test_a_trl_run_extended_resumes_from_its_checkpoint_with_its_clock(tmp_path, small_vocab_model_dir, reward_file):
    """A finished 2-step TRL run whose budget is raised to 3 (as a comparison may be extended)
    continues from its step-2 checkpoint: one more step, its clock going on from the saved one."""
    from podsrl.compare.plan import load_plan
    from podsrl.run.metrics import read_jsonl

    arm = {"trl_grpo": {"trainer": "trl", **GRPO}}
    cfg = load_plan(_config(tmp_path, small_vocab_model_dir, reward_file, arm)).config("trl_grpo", 0)
    run = train_trl(cfg, "trl", run_dir=tmp_path / "run", log=lambda *_: None)
    before = read_jsonl(run / "metrics.jsonl")
    longer = load_plan(_config(tmp_path, small_vocab_model_dir, reward_file, arm, max_steps=3)).config("trl_grpo", 0)
    assert compare.run_status(run, longer, "trl") == "resume" and compare.run_status(run, cfg, "trl") == "done"
    with pytest.raises(ConfigError, match="trainer = 'trl'"):
        compare.run_status(run, cfg, "trl-pods")  # a run of another trainer is not reused
    train_trl(longer, "trl", run_dir=run, resume=True, log=lambda *_: None)
    after, evals = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "eval.jsonl")
    assert [r["step"] for r in after] == [1, 2, 3] and after[:2] == before
    assert [r["step"] for r in evals] == [0, 1, 2, 3]
    assert after[2]["train_seconds"] == pytest.approx(before[1]["train_seconds"] + after[2]["time/step"])


@pytest.mark.usefixtures("one_thread")
def test_a_stop_signal_checkpoints_the_trl_run_which_resumes_where_it_stopped(tmp_path, small_vocab_model_dir, reward_file, monkeypatch):
    """SIGUSR1 (a train.stop_signals) during step 1 of 3 (evaluations at steps 0, 2 and 3): the step
    ends, a checkpoint is saved, the run stops (Preempted: exit 75 from the child) without an
    evaluation that was not due; the resume trains steps 2 and 3 and evaluates where due."""
    import os
    import signal

    from podsrl.compare.plan import load_plan
    from podsrl.run.metrics import read_jsonl
    from podsrl.run.preemption import Preempted

    real, sent = metrics.round_metrics, []

    def signal_once(trainer, out):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(trainer, out)

    monkeypatch.setattr(metrics, "round_metrics", signal_once)
    path = _config(tmp_path, small_vocab_model_dir, reward_file, {"trl_grpo": {"trainer": "trl", **GRPO}}, every_steps=2, max_steps=3)
    cfg = load_plan(path).config("trl_grpo", 0)
    run = tmp_path / "run"
    with pytest.raises(Preempted):
        train_trl(cfg, "trl", run_dir=run, log=lambda *_: None)
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1] and [r["step"] for r in read_jsonl(run / "eval.jsonl")] == [0]
    assert compare.run_status(run, cfg, "trl") == "resume"
    train_trl(cfg, "trl", run_dir=run, resume=True, log=lambda *_: None)
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in read_jsonl(run / "eval.jsonl")] == [0, 2, 3]


@pytest.mark.usefixtures("one_thread")
def test_a_pods_trainer_arm_trains_on_m_of_n_and_reports_its_selection(tmp_path, small_vocab_model_dir, reward_file):
    """PODSTrainer(4, 2), with LoRA: TRL trains the adapter of the PeftModel podsrl loaded."""
    from podsrl.compare.plan import load_plan
    from podsrl.run.metrics import read_jsonl

    pods = {"trainer": "trl-pods", "select.rule": "max_variance", "rollout.n": 4, "select.m": 2, "model.lora": True, "model.lora_rank": 4}
    cfg = load_plan(_config(tmp_path, small_vocab_model_dir, reward_file, {"trl_pods": pods})).config("trl_pods", 0)
    run = train_trl(cfg, "trl-pods", run_dir=tmp_path / "run", log=lambda *_: None)
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["kept"] == 2 * 2 and r["rollouts_generated"] == 2 * 4 and r["m"] == 2  # B x m of B x n
        assert r["rows_run"] <= r["kept"] and 0 <= r["groups_with_signal"] <= 2
    args = json.loads((run / TRAINER_FILE).read_text())["args"]
    assert (args["pods_rule"], args["pods_m"], args["num_generations"]) == ("max_variance", 2, 4)
    assert all(r["grad_norm"] > 0 for r in rows)  # the adapter learned


def test_the_mapping_of_podsrl_settings_to_grpo_config(make_config):
    from trl import GRPOConfig

    cfg = make_config(**{"rollout.n": 8, "rollout.max_new_tokens": 64, "rollout.temperature": 0.9, "select.rule": "all", "select.m": 8,
                         "train.prompts_per_step": 8, "optim.micro_batch_size": 16, "optim.lr": 3e-6, "optim.warmup_steps": 2,
                         "loss.eps_high": 0.28, "loss.aggregation": "token", "train.max_steps": 10})  # fmt: skip
    args = mapping.grpo_config(cfg, "trl", Path("out"), device="cpu")
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"], args["num_generations"]) == (16, 4, 8)
    assert (args["max_completion_length"], args["temperature"], args["learning_rate"]) == (64, 0.9, 3e-6)
    assert (args["loss_type"], args["epsilon"], args["epsilon_high"], args["beta"]) == ("dapo", 0.2, 0.28, 0.0)
    assert (args["lr_scheduler_type"], args["warmup_steps"], args["use_vllm"], args["scale_rewards"]) == ("constant_with_warmup", 2, False, "group")
    assert args["max_steps"] == 10
    GRPOConfig(**{**args, "output_dir": "/tmp/unused"})  # TRL takes every argument
    pods = make_config(**{"rollout.n": 16, "select.rule": "max_variance", "select.m": 4, "train.prompts_per_step": 8, "optim.micro_batch_size": 16})
    args = mapping.grpo_config(pods, "trl-pods", Path("out"), device="cpu")
    # 8 x 16 sampled in one generation, the 8 x 4 kept trained in 2 micro-batches of 16
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"], args["pods_m"]) == (64, 2, 4)


def test_weight_decay_spares_biases_and_norm_weights_in_both_tools(make_config, tiny_model_dir):
    """podsrl's AdamW decays what transformers' Trainer (TRL's) decays, and nothing else, so that
    optim.weight_decay maps onto GRPOConfig's weight_decay as it is; the model's order is kept."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer

    from podsrl.train.loop import make_optimizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.model.norm.bias = torch.nn.Parameter(torch.zeros_like(model.model.norm.weight))  # a bias, too
    names = {id(p): name for name, p in model.named_parameters()}
    opt, _ = make_optimizer(make_config(**{"optim.weight_decay": 0.1}), model)
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    spared = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert decayed == set(Trainer.get_decay_parameter_names(None, model)) & set(names.values())  # the method reads no state
    assert spared and spared == set(names.values()) - decayed and all("norm" in n or "bias" in n for n in spared)
    assert mapping.grpo_config(make_config(**{"optim.weight_decay": 0.1}), "trl", Path("out"), device="cpu")["weight_decay"] == 0.1
    plain, _ = make_optimizer(make_config(), model)  # no decay: one group, as before the split (checkpoints resume)
    assert len(plain.param_groups) == 1 and len(plain.param_groups[0]["params"]) == len(names)


@pytest.mark.parametrize("method, message", [
    ({"trainer": "trl", "select.rule": "max_variance", "rollout.n": 16, "select.m": 4}, "use trainer = \"trl-pods\""),
    ({"trainer": "trl-pods", "select.rule": "max_variance", "rollout.n": 16, "select.m": 4, "rollout.dynamic_sampling": True},
     "rollout.dynamic_sampling"),
    ({"trainer": "vllm", "select.rule": "all"}, "is not a trainer"),
    # TRL counts max_steps, warm-up and global_step in optimizer steps: num_iterations = 2 would double them
    ({"trainer": "trl", "select.rule": "all", "rollout.n": 2, "select.m": 2, "loss.policy_iterations": 2}, "loss.policy_iterations = 2"),
    ({"trainer": "trl", "select.rule": "all", "rollout.n": 2, "select.m": 2, "optim.micro_batch_tokens": 4096}, "optim.micro_batch_tokens = 4096"),
])  # fmt: skip
def test_a_trl_arm_refuses_what_trl_cannot_do_when_the_plan_loads(tmp_path, small_vocab_model_dir, reward_file, method, message):
    from podsrl.compare.plan import load_plan

    with pytest.raises(ConfigError, match="compare.methods.arm") as err:
        load_plan(_config(tmp_path, small_vocab_model_dir, reward_file, {"arm": method}))
    assert message in str(err.value)


def test_a_trl_arm_takes_trls_default_loss_unless_the_comparison_sets_one(tmp_path, small_vocab_model_dir, reward_file):
    """Unset: the TRL arm trains with TRL's default loss_type ("dapo": podsrl's "token", which its
    config.toml records) and the podsrl arm with podsrl's default; set in the base, both take it."""
    from trl import GRPOConfig

    from podsrl.compare.plan import load_plan
    from podsrl.config import LossConfig

    assert GRPOConfig(output_dir=str(tmp_path / "unused"), use_cpu=True).loss_type == mapping.TRL_DEFAULT_LOSS_TYPE == "dapo"
    arms = {"grpo": GRPO, "trl_grpo": {"trainer": "trl", **GRPO}}
    plan = load_plan(_config(tmp_path, small_vocab_model_dir, reward_file, arms))
    trl_cfg = plan.config("trl_grpo", 0)
    assert (plan.config("grpo", 0).loss.aggregation, trl_cfg.loss.aggregation) == (LossConfig().aggregation, "token")
    assert mapping.grpo_config(trl_cfg, "trl", Path("out"), device="cpu")["loss_type"] == "dapo"
    for aggregation, loss_type in [("sequence", "grpo"), ("token", "dapo"), ("constant", "dr_grpo")]:
        pinned = load_plan(_config(tmp_path, small_vocab_model_dir, reward_file, arms), [f"loss.aggregation={aggregation}"])
        assert {pinned.config(name, 0).loss.aggregation for name in arms} == {aggregation}
        assert mapping.grpo_config(pinned.config("trl_grpo", 0), "trl", Path("out"), device="cpu")["loss_type"] == loss_type
    own = load_plan(_config(tmp_path, small_vocab_model_dir, reward_file, {"trl_grpo": {"trainer": "trl", **GRPO, "loss.aggregation": "constant"}}))
    assert own.config("trl_grpo", 0).loss.aggregation == "constant"  # a method's own setting wins too


def test_transformers_noise_stays_out_of_a_trl_arm(tmp_path, tiny_model_dir, capfd, caplog):
    """transformers' "parallel_mode != ParallelMode.DISTRIBUTED" warning (a one-process group exists,
    as podsrl's vLLM evaluation engine makes one) and its "Writing model shards" bars are not shown
    inside quiet_transformers(), and are again after it."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from podsrl.compare.trl_arm.run import quiet_transformers

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)

    def noise() -> str:
        caplog.clear()
        GRPOConfig(output_dir=str(tmp_path / "args"), use_cpu=True, report_to="none").device  # noqa: B018 (the warning's place)
        model.save_pretrained(tmp_path / "model")
        return caplog.text + capfd.readouterr().err

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with quiet_transformers():
            quiet = noise()
        loud = noise()
    finally:
        dist.destroy_process_group()
    assert "parallel_mode" not in quiet and "Writing model shards" not in quiet, quiet
    assert "parallel_mode" in loud and "Writing model shards" in loud, loud


def test_the_vs_trl_preset_loads_with_the_issues_arms():
    plan = compare.load_plan(ROOT / "configs" / "compare-vs-trl.toml")
    arms = {m.name: (m.trainer, plan.config(m.name, 0).rollout.n, plan.config(m.name, 0).select.m_start(plan.config(m.name, 0).rollout.n))
            for m in plan.methods}  # fmt: skip
    assert sorted(arms.values()) == sorted([("podsrl", 4, 4), ("podsrl", 8, 8), ("podsrl", 16, 16), ("podsrl", 16, 4), ("podsrl", 16, 8),
                                            ("trl", 8, 8), ("trl", 16, 16), ("trl-pods", 16, 4)])  # fmt: skip
    cfg = plan.config(plan.methods[0].name, 0)
    rollouts = compare.load_plan(ROOT / "configs" / "compare-rollouts.toml").config("grpo", 0)
    assert cfg.task == rollouts.task and (plan.seeds, cfg.train.max_seconds, cfg.eval.every_seconds) == (3, 600.0, 120.0)
    # every arm with the loss its committed run trained with (TRL's GRPOTrainer: loss_type "grpo")
    assert {plan.config(m.name, 0).loss.aggregation for m in plan.methods} == {"sequence"}
