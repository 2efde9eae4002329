"""Several processes (torchrun, gloo, CPU) compute what one process computes.

- One optimizer step on fixed rollouts (tests/dist_worker.py) gives the same weights on 2 ranks as on
  1 (max abs diff <= 1e-5) for max_variance, d3s_intra with token selection and d3s_cross, with
  "ddp" (full fine-tuning and LoRA) and "fsdp", and with the DAPO filter leaving rank 1 nothing.
- ``torchrun --nproc-per-node=2 -m podsrl train`` end to end: one metrics line per step, a
  checkpoint, the exported model (rank 0's), ``--resume`` continues, ``podsrl eval --run`` reads it
  and gets the 2-rank evaluation's numbers; FSDP's run is started by ``accelerate launch``, with
  gradient checkpointing.
- Bad launches are configuration errors that name the field.
- Every process launched here runs in strict mode (tests/dist_worker.py,
  ``hold_collectives_to_placement``): each tensor podsrl hands to a torch.distributed collective must
  be on ``Dist.device`` (under gloo a stand-in device that the callers' CPU tensors are not on), as an
  NCCL group requires; and no module but podsrl/train/distributed.py calls a torch.distributed tensor
  collective itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from podsrl.train import distributed
from podsrl.config import from_dict
from podsrl.errors import ConfigError

from conftest import dist_step_cases, tiny_config_dict

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).parent / "dist_worker.py"

BASE = {
    "train.prompts_per_step": 4,
    "rollout.n": 4,
    "select.m": 2,
    "optim.micro_batch_size": 2,
    "eval.max_problems": 3,
    "model.mixed_precision": "none",  # float32 whatever the CPU ("auto" is bf16 where bfloat16 is native); the mp cases set bf16
}
CASES = {
    "max_variance": {},
    "max_variance_lora": {"model.lora": True, "model.lora_rank": 4, "model.lora_alpha": 8},
    "d3s_intra_tokens": {"select.rule": "d3s_intra", "select.token_fraction": 0.5},
    "d3s_cross": {"select.rule": "d3s_cross", "select.token_fraction": 0.7, "loss.aggregation": "token"},
    "dapo_rank1_empty": {"select.filter_zero_variance": True},
    "fsdp_max_variance": {"distributed.parallel": "fsdp"},
    "fsdp_d3s_cross_tokens": {"distributed.parallel": "fsdp", "select.rule": "d3s_cross", "select.token_fraction": 0.5},
    "fsdp_dapo_rank1_empty": {"distributed.parallel": "fsdp", "select.filter_zero_variance": True},
    # Rank 1's groups have no signal (advantage 0): skipped, it runs no row (FSDP: padding forwards).
    "d3s_tokens_uniform_skip": {"select.rule": "d3s_intra", "select.token_fraction": 0.5},
    "d3s_tokens_uniform_noskip": {"select.rule": "d3s_intra", "select.token_fraction": 0.5, "optim.skip_zero_advantage": False},
    "fsdp_uniform_skip": {"distributed.parallel": "fsdp"},
    "fsdp_uniform_noskip": {"distributed.parallel": "fsdp", "optim.skip_zero_advantage": False},
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    return env


def _torchrun(*args: str, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    """torchrun with ``args``; ``-m podsrl ...`` runs through tests/dist_worker.py, in strict mode."""
    if args[0] == "-m":
        args = (str(WORKER), *args)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--standalone", *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def worker_spec(path: Path, model: Path, reward: Path, out: Path, cases: dict) -> Path:
    """Write tests/dist_worker.py's spec of ``cases`` (name -> {"overrides": ..., ...}) to ``path``."""
    path.write_text(json.dumps({"model": str(model), "reward": str(reward), "out": str(out), "cases": cases}))
    return path


def _step_case(name: str, overrides: dict) -> dict:
    case = {"overrides": {**BASE, **overrides}, "uniform_second_half": name.endswith("rank1_empty") or "_uniform_" in name}
    if name.startswith("fsdp"):  # FSDP needs a launcher: its reference is torchrun with 1 process
        case["overrides"]["model.lora"] = False
    return case


# Mixed precision (model.mixed_precision = "bf16"): bfloat16 arithmetic over float32 weights, on one
# process and on two, DDP (full fine-tuning, LoRA, D3S's scoring pass) and FSDP (its MixedPrecisionPolicy).
MP_CASES = {
    "mp_max_variance": {"model.mixed_precision": "bf16"},
    "mp_max_variance_lora": {"model.mixed_precision": "bf16", "model.lora": True, "model.lora_rank": 4, "model.lora_alpha": 8},
    "mp_d3s_intra_tokens": {"model.mixed_precision": "bf16", "select.rule": "d3s_intra", "select.token_fraction": 0.5},
    "fsdp_mp_max_variance": {"model.mixed_precision": "bf16", "distributed.parallel": "fsdp"},
}
# The same steps in float32: what each mixed-precision case is compared with.
MP_FLOAT32 = {"mp_max_variance": "max_variance", "mp_max_variance_lora": "max_variance_lora", "mp_d3s_intra_tokens": "d3s_intra_tokens",
              "fsdp_mp_max_variance": "fsdp_max_variance"}  # fmt: skip

# Run once a session for every module's cases (conftest.py's dist_steps).
dist_step_cases({name: _step_case(name, overrides) for name, overrides in {**CASES, **MP_CASES}.items()})


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_step_equals_one(dist_steps, case):
    one = load_file(str(dist_steps / f"{case}-w1.safetensors"))
    two = load_file(str(dist_steps / f"{case}-w2.safetensors"))
    assert one.keys() == two.keys() and one
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert diff <= 1e-5, f"{case}: max abs weight difference {diff:.2e}"
    m1 = json.loads((dist_steps / f"{case}-w1.json").read_text())
    m2 = json.loads((dist_steps / f"{case}-w2.json").read_text())
    for key in ("kept", "reward_mean", "reward_kept_mean", "zero_variance_groups", "tokens_total", "tokens_kept", "completion_len"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-6, abs=1e-9), key
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-4)
    assert m2["world_size"] == 2 and len(m2["rank_time/update"]) == 2
    if case.endswith("rank1_empty"):  # the DAPO filter left rank 1 without a row, and nothing hung
        assert m2["kept"] == 4 and m2["zero_variance_groups"] == 0.5


@pytest.mark.parametrize("case", list(MP_CASES))
def test_two_ranks_step_equals_one_under_mixed_precision(dist_steps, case):
    """One step in bfloat16 arithmetic gives the same gradient on 2 ranks as on 1, and the float32
    step's, within what bfloat16 allows (tests/float_bounds.py, ``autocast_gradient_rtol``: two
    bfloat16 computations twice the bound of one, a float32 one within gradient_rtol of the exact
    gradient); the weights and the gradients stay float32 (they are saved as they are)."""
    from float_bounds import autocast_gradient_rtol, gradient_rtol, rel_diff, within

    one, two = (load_file(str(dist_steps / f"{case}-w{w}-grads.safetensors")) for w in (1, 2))
    f32_one, f32_two = (load_file(str(dist_steps / f"{MP_FLOAT32[case]}-w{w}-grads.safetensors")) for w in (1, 2))
    assert one.keys() == two.keys() == f32_one.keys() and one
    bf16 = autocast_gradient_rtol(2, fsdp=case.startswith("fsdp"))  # the tiny model's 2 layers
    f32 = gradient_rtol(686) / 2  # its 686-token vocabulary; one float32 computation: half the bound of two
    for k in one:
        err = rel_diff(two[k], one[k])
        assert within(err, 2 * bf16, f"{case}: 2 ranks vs 1, {k}"), f"{case}: {k} 2 ranks vs 1: {err:.2e}, bound {2 * bf16:.2e}"
        for w, g in ((1, one[k]), (2, two[k])):
            err = rel_diff(g, f32_one[k])
            assert within(err, bf16 + f32, f"{case}: vs float32, {w} ranks, {k}"), f"{case}: {k} on {w} vs float32: {err:.2e}, bound {bf16 + f32:.2e}"
    assert max(rel_diff(one[k], f32_one[k]) for k in one) > 4 * gradient_rtol(686), f"{case}: as close to float32 as float32 is: no bfloat16 ran"
    m1, m2 = (json.loads((dist_steps / f"{case}-w{w}.json").read_text()) for w in (1, 2))
    for key in ("kept", "reward_mean", "zero_variance_groups", "tokens_total", "tokens_kept", "rows_run"):
        assert m1[key] == m2[key], key
    assert m2["world_size"] == 2 and m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=2 * bf16)


@pytest.mark.parametrize("case", ["d3s_tokens_uniform", "fsdp_uniform"])
@pytest.mark.parametrize("world", [1, 2])
def test_skipping_zero_advantage_rows_changes_nothing(dist_steps, case, world):
    """The same step with and without skipping the rows whose advantage is 0 (all of rank 1's)."""
    skip = load_file(str(dist_steps / f"{case}_skip-w{world}.safetensors"))
    full = load_file(str(dist_steps / f"{case}_noskip-w{world}.safetensors"))
    for k in full:
        err = float((skip[k] - full[k]).norm() / full[k].norm().clamp(min=1e-12))
        assert err < 1e-6, f"{case} on {world} process(es): {k} relative difference {err:.1e}"
    m_skip = json.loads((dist_steps / f"{case}_skip-w{world}.json").read_text())
    m_full = json.loads((dist_steps / f"{case}_noskip-w{world}.json").read_text())
    assert m_skip["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5)
    assert m_skip["tokens_kept"] == m_full["tokens_kept"] and m_skip["tokens_total"] == m_full["tokens_total"]
    assert m_full["rows_run"] == m_full["kept"] == 8 and m_skip["rows_run"] <= 4  # the uniform half: none ran


# ------------------------------------------------------------------------------ end to end


def _accelerate_launch(*args: str) -> subprocess.CompletedProcess:
    """``accelerate launch`` on 2 processes (on this CPU ``--multi_gpu`` starts gloo ranks) of ``args``,
    which start with a script (tests/dist_worker.py for ``-m podsrl``, as ``_torchrun`` does)."""
    pytest.importorskip("accelerate")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes=2", "--num_machines=1",
           "--main_process_port=0", *args]  # fmt: skip
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("parallel", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp"])
def test_torchrun_train_resume_eval(tmp_path, tiny_model_dir, reward_file, parallel, capsys):
    """A run on 2 processes end to end: trained (2 steps, evaluated at 0 and 2 on both ranks, a
    checkpoint, the exported model), resumed under torchrun for a third step, evaluated by ``podsrl
    eval --run`` in one process. One run serves what four tests launched (issue 45):

    - FSDP's first run is started by ``accelerate launch`` with gradient checkpointing:
      accelerate sets torchrun's environment, so podsrl runs under it unchanged;
    - the exported model/ of a run on two processes is its last checkpoint, written by rank 0
      alone, and loads as a Hugging Face model with the checkpoint's logits;
    - the evaluation split over 2 ranks (3 problems: uneven blocks) at the end of the resumed run
      gives the numbers ``podsrl eval --run`` gets in one process from the same checkpoint.

    "ddp" is slow: the default suite runs DDP on 2 processes in tests/test_faults.py (train, stop,
    checkpoint, exact resume), docs/distributed.md's torchrun command (tests/test_docs.py) and the
    one-step cases above; FSDP here."""
    from podsrl.config import to_toml
    from test_export import _auto_model, _checkpoint_policy, _max_diff

    overrides = {**BASE, "train.checkpoint_every": 2, "distributed.parallel": parallel}
    if parallel == "fsdp":
        overrides["model.gradient_checkpointing"] = True
    cfg = from_dict(tiny_config_dict(tiny_model_dir, reward_file, **overrides))
    config = tmp_path / "run.toml"
    config.write_text(to_toml(cfg))
    run = tmp_path / "run"
    train = ("-m", "podsrl", "train", str(config), "--out", str(run), "--no-plot")
    first = _accelerate_launch(str(WORKER), *train) if parallel == "fsdp" else _torchrun(*train)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"2 processes (gloo, {parallel})" in first.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["world_size"] == 2 for r in rows)
    assert (run / "checkpoints" / "step-000002" / "weights.safetensors").is_file()
    assert first.stdout.count("held-out accuracy") == 1  # rank 0 alone reports
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2] and evals[0]["problems"] == 3
    assert first.stdout.count("exported to") == 1  # rank 0 alone
    exported = load_file(str(run / "model" / "model.safetensors"))
    trained = load_file(str(run / "checkpoints" / "step-000002" / "weights.safetensors"))
    assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
    assert _max_diff(_auto_model(run / "model"), _checkpoint_policy(run, 2)) <= 1e-5

    again = _torchrun("-m", "podsrl", "train", "--resume", str(run), "--train.max_steps=3", "--no-plot")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed" in again.stdout + again.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (run / "checkpoints" / "step-000003").is_dir()
    if parallel == "fsdp":  # the gathered checkpoint holds every weight, full size
        from transformers import AutoConfig

        weights = load_file(str(run / "checkpoints" / "step-000003" / "weights.safetensors"))
        assert weights["model.embed_tokens.weight"].shape[1] == AutoConfig.from_pretrained(tiny_model_dir).hidden_size

    from podsrl.cli import main

    one = tmp_path / "one.json"  # in this process, on one thread as each rank (a launch's start-up is seconds)
    capsys.readouterr()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["eval", "--run", str(run), "--json", str(one)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "step-000003" in printed and "accuracy:" in printed
    sharded = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()][-1]
    assert sharded["step"] == 3
    alone = json.loads(one.read_text())
    for key in ("accuracy", "problems", "mean_length", "truncated", "pass_at_k"):
        assert alone[key] == sharded[key], key


@pytest.mark.slow
def test_torchrun_with_early_stop(tmp_path, tiny_model_dir, reward_file):
    """Exact early stopping in rounds: each rank samples its own block, no collective per round,
    and groups really stop early. max_variance with m = 2 on a binary reward stops a group once it
    holds one reward of each value; the parity of a random model's completion text is close to a
    fair coin, so a group of n = 8 in rounds of 2 runs to n only if its first 6 rewards are equal
    (about 1 in 32 for a fair coin): near-certain that some of the 4 groups of a step stop early,
    and certain under the fixed seed (issue 36: the test accepted a run that never stopped).
    Slow: the default suite runs exact early stopping on 2 ranks in conftest.py's
    two_rank_sampling_run, inside dynamic sampling (test_dynamic_sampling.py's
    test_torchrun_train_with_dynamic_sampling_and_early_stopping)."""
    from podsrl.config import to_toml

    rewards = tmp_path / "parity.py"
    rewards.write_text("def parity(completion, example):\n    return float(len(completion) % 2)\n\n\nparity.reward_values = (0.0, 1.0)\n")
    n = 8
    overrides = {**BASE, "reward.names": [f"{rewards}:parity"], "rollout.n": n, "rollout.early_stop": "exact", "rollout.round_size": 2,
                 "select.rule": "max_variance", "select.m": 2, "eval.at_start": False, "eval.at_end": False}  # fmt: skip
    config = tmp_path / "run.toml"
    config.write_text(to_toml(from_dict(tiny_config_dict(tiny_model_dir, reward_file, **overrides))))
    done = _torchrun("-m", "podsrl", "train", str(config), "--out", str(tmp_path / "run"), "--no-plot")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    B = BASE["train.prompts_per_step"]
    assert rows and all(r["world_size"] == 2 and 2 * B <= r["rollouts_generated"] <= n * B and r["sample_rounds"] >= 1 for r in rows)
    assert all(r["rollouts_generated"] < n * B for r in rows), [r["rollouts_generated"] for r in rows]  # some group stopped early


def test_only_rank_0_checks_the_run_directory(tmp_path, make_config, monkeypatch):
    """Under FSDP nothing is collective while the model is set up, so rank 0 may have opened (and
    locked) the run directory before rank 1 gets to check it: rank 1 must take rank 0's answer, not
    probe the lock itself and find it taken by its own job."""
    from podsrl.run import rundir
    from podsrl.train import loop

    path = tmp_path / "run"
    held = rundir.prepare(path)
    held.open()  # rank 0 of this job, already past its checks
    try:
        with pytest.raises(ConfigError, match="in use"):
            rundir.prepare(path)  # what rank 1 did itself before
        rank1 = distributed.Dist(rank=1, world=2, backend="gloo")
        monkeypatch.setattr(rank1, "broadcast_object", lambda obj: (True, rundir.RunDir(path=path)))  # rank 0's answer
        claim = loop._check_run_dir(make_config(), rank1, path, resume=False, overwrite=False)
        assert claim.path == path
    finally:
        held.close()


# ------------------------------------------------------------------------------ bad launches


def test_batch_not_divisible_names_the_field(make_config):
    cfg = make_config(**{"train.prompts_per_step": 3})
    with pytest.raises(ConfigError, match=r"train.prompts_per_step: 3 prompts .* 2 processes.*e\.g\. 2 or 4"):
        distributed.check_launch(cfg, 2)


def test_fsdp_with_lora_is_a_config_error(tiny_model_dir, reward_file):
    data = tiny_config_dict(tiny_model_dir, reward_file, **{"distributed.parallel": "fsdp", "model.lora": True})
    with pytest.raises(ConfigError, match="distributed.parallel: 'fsdp' shards full fine-tuning"):
        from_dict(data)


def test_fsdp_needs_a_launcher(make_config, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="needs a launcher; run `torchrun"):
        distributed.init(make_config(**{"distributed.parallel": "fsdp"}))


def test_missing_backend_is_a_config_error(make_config, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match="distributed.backend: 'nccl' needs CUDA GPUs"):
        distributed.init(make_config(**{"distributed.backend": "nccl", "model.device": "cpu", "train.prompts_per_step": 2}))
    with pytest.raises(ConfigError, match="model.device: 'cuda:1' pins one GPU"):
        distributed.rank_device("cuda:1", 0, 2)


def test_single_process_is_untouched(make_config, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    d = distributed.init(make_config())
    assert not d.active and d.world == 1 and d.shard([1, 2, 3]) == [1, 2, 3]
    t = torch.arange(6.0).view(3, 2)
    assert d.gather_rows(t) is t and d.sum(t) is t and d.local_rows(t).shape == (3, 2)
    assert distributed.Dist(rank=1, world=2).pad_shard(list(range(5))) == ([3, 4, 0], 2)


# ------------------------------------------------------------------------------ placement (NCCL: CUDA tensors only)


def test_the_collective_device_is_the_rank_gpu_under_nccl_and_the_cpu_under_gloo():
    assert distributed.collective_device("nccl", torch.device("cuda", 3)) == torch.device("cuda", 3)
    assert distributed.collective_device("gloo", torch.device("cuda", 1)) == torch.device("cpu")
    assert distributed.collective_device("gloo", torch.device("cpu")) == torch.device("cpu")
    assert distributed.Dist().device == torch.device("cpu")


class _Stop(Exception):
    pass


def test_collectives_run_on_the_group_device_and_return_on_the_callers(monkeypatch):
    """Under NCCL every tensor a collective sends is on cuda:LOCAL_RANK whatever the caller's device,
    and the result comes back on the caller's device. Fake tensors stand in for a GPU (their device
    is "cuda" without one); the collectives are recorders (no group: nothing is sent)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gpu = torch.device("cuda", 1)
    seen: list[tuple[str, torch.device]] = []
    stop = {"now": False}

    def recorder(name):
        def collective(*args, **kwargs):
            for t in [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]:
                seen.append((name, t.device))
            if stop["now"]:  # the caller goes on to read the value, which a fake tensor has not
                raise _Stop

        return collective

    for name in ("all_reduce", "all_gather_into_tensor", "broadcast"):
        monkeypatch.setattr(torch.distributed, name, recorder(name))
    d = distributed.Dist(rank=1, world=2, local_rank=1, backend="nccl", device=gpu)
    with FakeTensorMode(allow_non_fake_inputs=True):
        on_cpu, on_gpu = torch.ones(3, 2), torch.ones(3, 2, device=gpu)
        for t in (on_cpu, on_gpu):
            assert d.sum(t).device == t.device
            gathered = d.gather_rows(t)
            assert gathered.device == t.device and gathered.shape == (6, 2)
        for device in ("cpu", gpu):
            model = torch.nn.Module()
            model.weight, model.bias = (torch.nn.Parameter(torch.ones(shape, device=device)) for shape in ((2, 2), (2,)))
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            if device == "cpu":  # (a fake CUDA tensor cannot be copied into; GPU gradients are not moved anyway)
                d.all_reduce_grads(list(model.parameters()))
            d.broadcast_params(model)
            assert all(p.device == torch.device(device) and p.grad.device == p.device for p in model.parameters())
        stop["now"] = True
        with pytest.raises(_Stop):
            d.max_int(3)
        with pytest.raises(_Stop):
            d.gather_ragged(on_cpu)
    assert {name for name, _ in seen} == {"all_reduce", "all_gather_into_tensor", "broadcast"}
    assert all(device == gpu for _, device in seen), seen


def test_token_selection_runs_on_the_group_device_on_a_rank_without_entropies():
    """A rank whose rows were all skipped has no entropies (on the GPU or anywhere): it must still
    take the global top-k on the group's device, as the other ranks do, since top-k breaks ties
    per device and every rank must cut the same mask. "meta" stands in for the GPU."""
    from podsrl.train.update import UpdateBatch, UpdateSettings, _Row, _select_tokens, _Update

    d = distributed.Dist(rank=0, world=1, backend="nccl", device=torch.device("meta"))
    seen = []

    def gather(t, sizes=None):
        seen.append(t.device)
        return torch.zeros(t.shape, dtype=t.dtype)  # the gathered table, here on the CPU so the mask can be cut

    d.gather_ragged, d.max_int, d.row_counts = gather, (lambda value: value), (lambda k: [k])
    batch = UpdateBatch(prompt_ids=[[1], [1]], completion_ids=[[5, 6, 7], [5, 6]], advantages=torch.zeros(2))
    u = _Update(None, None, None, batch, UpdateSettings(token_fraction=0.5), d, None, [_Row(), _Row()])
    masks = _select_tokens(u, [3, 2])
    assert seen == [torch.device("meta")] * 3 and [m.shape for m in masks] == [(3,), (2,)]


def test_token_selection_gathers_the_row_counts_once(strict, monkeypatch):
    """_select_tokens gathers three tensors of the same rows (entropies, advantages, valid tokens):
    every rank's row count is gathered once for the three, and gives this rank's slice of the mask
    (it was gathered by each gather_ragged and once more as an object: 8 collectives, now 5), under
    strict mode."""
    from podsrl.train.update import UpdateBatch, UpdateSettings, _Row, _select_tokens, _Update

    calls = []
    for name in ("all_reduce", "all_gather_into_tensor", "all_gather_object", "broadcast", "broadcast_object_list"):
        real = getattr(torch.distributed, name)
        monkeypatch.setattr(torch.distributed, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    batch = UpdateBatch(prompt_ids=[[1], [1]], completion_ids=[[5, 6, 7, 8], [5, 6]], advantages=torch.tensor([1.0, -1.0]))
    rows = [_Row(), _Row()]
    rows[0].entropy, rows[1].entropy = torch.tensor([0.1, 0.9, 0.5, 0.2]), torch.tensor([0.3, 0.4])
    u = _Update(None, None, None, batch, UpdateSettings(token_fraction=0.5), strict, None, rows)
    masks = _select_tokens(u, [4, 2])
    assert [m.tolist() for m in masks] == [[False, True, True, False], [False, True]]  # the top 3 of 6 by |A| x H
    assert calls == ["all_reduce"] + ["all_gather_into_tensor"] * 4, calls  # max_int (T), the counts, three tables
    with pytest.raises(ValueError, match="sizes"):
        strict.gather_ragged(torch.zeros(3), [2])  # counts that are not this rank's rows


@pytest.fixture
def gloo_alone():
    """A one-process gloo group in this process (no torchrun)."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.fixture
def strict(gloo_alone, monkeypatch):
    """tests/dist_worker.py's strict mode in this process, and a one-rank gloo Dist under it (whose
    collectives device is strict mode's stand-in, not the CPU the callers' tensors are on)."""
    from dist_worker import STAND_IN, hold_collectives_to_placement

    mode = hold_collectives_to_placement(monkeypatch.setattr)
    d = distributed.Dist(rank=0, world=1, backend="gloo", device=distributed.collective_device("gloo", torch.device("cpu")))
    assert d.device == STAND_IN
    yield d
    mode.__exit__(None, None, None)


def test_strict_mode_admits_only_tensors_on_the_collectives_device(strict):
    """tests/dist_worker.py's strict mode, which every multi-process test here runs under: each
    tensor collective of Dist passes it; a tensor that was not moved to ``Dist.device`` fails."""
    from dist_worker import PlacementError

    d = strict
    t = torch.arange(6.0).view(3, 2)
    assert torch.equal(d.sum(t), t) and torch.equal(d.gather_rows(t), t) and torch.equal(d.gather_ragged(t), t)
    assert d.gather_ragged(t[:0]).shape == (0, 2) and d.max_int(5) == 5
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.ones(2, 2)
    d.all_reduce_grads(list(model.parameters()))
    d.broadcast_params(model)
    assert d.broadcast_object({"a": 1}) == {"a": 1} and d.gather_objects(3) == [3]
    d.barrier()
    with pytest.raises(PlacementError, match=r"torch.distributed.all_reduce called at .* not on the collectives' device"):
        torch.distributed.all_reduce(torch.ones(1))  # a caller that bypasses Dist
    torch.distributed.all_reduce(torch.ones(1).to(d.device))  # one that moved its tensor there


@pytest.mark.parametrize("method", ["sum", "gather_rows", "max_int", "gather_ragged", "max"])
def test_strict_mode_fails_a_dist_that_does_not_move_tensors(strict, monkeypatch, method):
    """On this CPU every tensor is on gloo's device; strict mode's stand-in is not, so a ``place``
    that does not move (here a no-op) sends the caller's tensor to the collective and fails."""
    from dist_worker import PlacementError

    monkeypatch.setattr(distributed.Dist, "place", lambda self, t, copy=False: t)
    arg = 3 if method == "max_int" else torch.arange(6.0).view(3, 2)
    with pytest.raises(PlacementError, match="not on the collectives' device"):
        getattr(strict, method)(arg)


def test_sum_leaves_a_tensor_already_on_the_collectives_device_alone(strict, monkeypatch):
    """``Dist.sum`` returns a new tensor: a caller's tensor already on the collectives' device (a GPU
    tensor under NCCL) must not be reduced in place. The one-rank all-reduce doubles here, as two
    ranks holding the same values would; a ``place`` that drops ``copy`` fails."""
    all_reduce = torch.distributed.all_reduce

    def doubled(t, *args, **kwargs):
        out = all_reduce(t, *args, **kwargs)
        t.mul_(2)
        return out

    monkeypatch.setattr(torch.distributed, "all_reduce", doubled)
    t = torch.ones(3).to(strict.device)
    assert torch.equal(strict.sum(t), torch.full((3,), 2.0)) and torch.equal(t, torch.ones(3))
    monkeypatch.setattr(distributed.Dist, "place", lambda self, t, copy=False: t.to(self.device))
    strict.sum(t)
    assert not torch.equal(t, torch.ones(3))  # what the check above catches


def test_only_the_distributed_module_calls_tensor_collectives():
    """Placement is central only if nothing else sends tensors: no module of podsrl but
    podsrl/train/distributed.py calls a torch.distributed tensor collective (by any import alias).
    PODSTrainer's gathers are accelerate's, on TRL's device (docs/distributed.md)."""
    import ast

    from dist_worker import TENSOR_COLLECTIVES

    offenders = []
    for path in sorted((ROOT / "podsrl").rglob("*.py")):
        if path == ROOT / "podsrl" / "train" / "distributed.py":
            continue
        tree = ast.parse(path.read_text())
        modules = {"torch.distributed", "torch.distributed.distributed_c10d"}  # names bound to the modules that define them
        functions = set()  # collectives imported by name
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.asname for a in node.names if a.name in ("torch.distributed", "torch.distributed.distributed_c10d") and a.asname}
            elif isinstance(node, ast.ImportFrom) and node.module in ("torch.distributed", "torch.distributed.distributed_c10d"):
                functions |= {a.asname or a.name for a in node.names if a.name in TENSOR_COLLECTIVES}
                modules |= {a.asname or a.name for a in node.names if a.name == "distributed_c10d"}
            elif isinstance(node, ast.ImportFrom) and node.module == "torch":
                modules |= {a.asname or a.name for a in node.names if a.name == "distributed"}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id in functions:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {f.id}")
            elif isinstance(f, ast.Attribute) and f.attr in TENSOR_COLLECTIVES and ast.unparse(f.value) in modules:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(f)}")
    assert not offenders, f"tensor collectives outside Dist (use its methods, which place the tensors): {offenders}"


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_per_rank_with_fsdp(tmp_path):
    """The embedded model, vLLM on each rank ("external_launcher" in the trainer's group), FSDP's
    shards gathered into it tensor by tensor after every step; then resumed."""
    pytest.importorskip("vllm")
    run = tmp_path / "run"
    args = [
        "-m", "podsrl", "train", "--out", str(run), "--no-plot", "--rollout.engine=vllm", "--distributed.parallel=fsdp",
        "--train.max_steps=2", "--train.max_seconds=none", "--train.prompts_per_step=2", "--rollout.n=4", "--select.m=2",
        "--eval.max_problems=4", "--eval.samples=1", "--eval.temperature=0", "--rollout.kv_cache_gib=0.25",
    ]  # fmt: skip
    first = _torchrun(*args, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "rollout engine vllm" in first.stdout and "2 processes (gloo, fsdp)" in first.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["time/sync"] > 0 for r in rows)
    again = _torchrun("-m", "podsrl", "train", "--resume", str(run), "--no-plot", "--train.max_steps=3", timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


# ------------------------------------------------------------------------------ on a GPU (NCCL)

NCCL_CASES = {
    "max_variance": {},
    "lora_bf16": {"model.lora": True, "model.lora_rank": 4, "model.lora_alpha": 8, "model.dtype": "bfloat16"},
    "d3s_intra_tokens": {"select.rule": "d3s_intra", "select.token_fraction": 0.5},
    # Every group uniform: every row is skipped, so the token selection has no entropy on the GPU.
    "d3s_intra_tokens_all_skipped": {"select.rule": "d3s_intra", "select.token_fraction": 0.5},
    "d3s_cross_tokens": {"select.rule": "d3s_cross", "select.token_fraction": 0.7, "loss.aggregation": "token"},
    "fsdp_d3s_intra_tokens": {"distributed.parallel": "fsdp", "select.rule": "d3s_intra", "select.token_fraction": 0.5},
    "fsdp_bf16_all_skipped": {"distributed.parallel": "fsdp", "model.mixed_precision": "bf16"},
    "bf16_max_variance": {"model.mixed_precision": "bf16"},
}


@pytest.mark.gpu
def test_nccl_steps_like_one_process_on_the_gpu(tmp_path, tiny_model_dir, reward_file):
    """One torchrun process on NCCL (every collective runs, and NCCL refuses a CPU tensor) takes the
    step that one process without a group takes on the GPU: the same weights. FSDP has no groupless
    reference: in float32 it must match the same step without FSDP, in bf16 compute just run."""
    cases = {}
    for name, overrides in NCCL_CASES.items():
        # float32 unless a case asks for bfloat16 ("auto" would choose it on most GPUs): the FSDP case's reference is float32
        cases[name] = {"overrides": {**BASE, "model.device": "cuda", "model.mixed_precision": "none", **overrides},
                       "uniform_all": name.endswith("all_skipped")}  # fmt: skip
    spec = worker_spec(tmp_path / "spec.json", tiny_model_dir, reward_file, tmp_path, cases)
    groupless = {k: v for k, v in cases.items() if not k.startswith("fsdp")}
    alone_spec = worker_spec(tmp_path / "alone.json", tiny_model_dir, reward_file, tmp_path, groupless)
    alone = subprocess.run([sys.executable, str(WORKER), str(alone_spec)], env=_env(), capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stderr[-3000:]
    for name in groupless:  # both write <name>-w1: keep the groupless results apart
        for ext in ("safetensors", "json"):
            (tmp_path / f"{name}-w1.{ext}").rename(tmp_path / f"{name}-alone.{ext}")
    run = _torchrun(str(WORKER), str(spec), nproc=1, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    references = {name: name for name in groupless} | {"fsdp_d3s_intra_tokens": "d3s_intra_tokens"}
    for name in cases:
        nccl = load_file(str(tmp_path / f"{name}-w1.safetensors"))
        assert json.loads((tmp_path / f"{name}-w1.json").read_text())["world_size"] == 1
        assert all(bool(torch.isfinite(t).all()) for t in nccl.values()), name
        if name in references:
            reference = load_file(str(tmp_path / f"{references[name]}-alone.safetensors"))
            assert nccl.keys() == reference.keys(), name
            diff = max(float((nccl[k] - reference[k]).abs().max()) for k in reference)
            assert diff <= (1e-4 if name.startswith("fsdp") else 1e-5), f"{name}: max abs weight difference {diff:.2e} from one process"


@pytest.mark.gpu
def test_every_dist_collective_runs_under_nccl_from_either_device(tmp_path, make_config):
    """Each tensor collective of Dist under a real NCCL group (world 1), with CPU and GPU inputs: the
    values are right and come back on the input's device; object collectives and barrier run."""
    from podsrl.config import to_toml

    config = tmp_path / "run.toml"
    config.write_text(to_toml(make_config(**{"model.device": "cuda", "train.prompts_per_step": 2})))
    script = tmp_path / "collectives.py"
    script.write_text(
        "import sys, torch\n"
        "from podsrl.config import load\n"
        "from podsrl.train import distributed\n"
        "d = distributed.init(load(sys.argv[1]))\n"
        "assert d.backend == 'nccl' and d.device == torch.device('cuda', 0), (d.backend, d.device)\n"
        "for device in ('cpu', 'cuda'):\n"
        "    t = torch.arange(6.0, device=device).view(3, 2)\n"
        "    for out in (d.sum(t), d.gather_rows(t), d.gather_ragged(t)):\n"
        "        assert out.device == t.device and torch.equal(out.cpu(), t.cpu()), (device, out)\n"
        "    assert d.gather_ragged(t[:0]).shape == (0, 2)\n"
        "    model = torch.nn.Linear(2, 2, device=device)\n"
        "    model.weight.grad = torch.ones(2, 2, device=device)\n"
        "    d.all_reduce_grads(list(model.parameters()))\n"
        "    d.broadcast_params(model)\n"
        "    assert model.bias.grad.device == model.weight.device and float(model.weight.grad.sum()) == 4.0\n"
        "assert d.max_int(7) == 7 and d.broadcast_object({'a': 1}) == {'a': 1} and d.gather_objects(3) == [3]\n"
        "d.barrier()\n"
        "d.close()\n"
        "print('collectives ok')\n"
    )
    done = _torchrun(str(script), str(config), nproc=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "collectives ok" in done.stdout
