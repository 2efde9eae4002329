"""Benchmark: the update time of PODSTrainer (n=64, m=16) against TRL's GRPOTrainer at n=64 and n=16.

    python bench/trl_pods.py                                   # embedded SmolLM2-135M, B=2 prompts, 64 tokens
    python bench/trl_pods.py --prompts 1 --max-tokens 16 --steps 3 --rounds 2    # small (a 2-core CPU)
    python bench/trl_pods.py --model PATH --device cuda --prompts 8 --max-tokens 256
    python bench/trl_pods.py --quick                           # tiny random model: checks it runs

Three workers, each a fresh subprocess, run --steps optimizer steps each, alternately (GRPO n=16,
GRPO n=64, PODS, GRPO n=16, ...) for --rounds rounds, so that a change in the machine's load hits
all three:

- ``grpo16``: TRL ``GRPOTrainer``, ``num_generations=16``: B*16 completions sampled and trained on.
- ``grpo64``: TRL ``GRPOTrainer``, ``num_generations=64``: B*64 sampled and trained on.
- ``pods64``: ``podsrl.integrations.trl.PODSTrainer``, ``num_generations=64``, ``pods_m=16``,
  max-variance: B*64 sampled, B*16 trained on; kept rows whose advantage is 0 (a group whose 16
  kept rewards are equal) skip the loss's forward and backward (``pods_skip_zero_advantage``, the
  default; ``--no-skip`` turns it off, as in the figures of 2026-11-23, which predate it). The
  fraction of kept rows that ran the loss is printed per run.

Everything else is the same: the model (float32, full fine-tuning), podsrl's arithmetic prompts in
the chat template, podsrl's correctness reward (``as_trl_reward``), transformers ``generate`` at
temperature 1, at most --max-tokens completion tokens, ``loss_type="grpo"``, beta 0, one iteration,
AdamW lr 1e-6, and micro-batches of 16 completions (TRL's ``per_device_train_batch_size`` and
``gradient_accumulation_steps`` chosen so: GRPO n=16 takes B micro-batches per step, GRPO n=64 4B,
PODS B, each of 16 rows), so the memory peak is that of one 16-row micro-batch for all three and
the update's cost is its number of micro-batches.

Timed, per optimizer step (TRL callbacks; the first step of each run is dropped as warm-up):

- step: wall-clock between consecutive ``on_step_end`` (the first from ``on_train_begin``);
- sampling: the time inside TRL's ``_generate_single_turn`` (transformers ``generate``);
- update = step - sampling: rewards, selection, the log-prob forwards, the loss's forwards and
  backwards, the optimizer step and TRL's bookkeeping. This is the part PODS shrinks.

Peak memory: on a GPU, torch's peak allocated memory during training minus what was allocated at
its start; on the CPU, the growth of the process's peak RSS (``getrusage``) during training.
The last line is ``trl update time PODS(n=64,m=16)/GRPO(n=64): R, /GRPO(n=16): R2`` (medians of
update times over all kept steps; targets R <= 0.35, R2 <= 1.15).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _isolated import run_isolated  # bench/_isolated.py (this script's directory is on sys.path)
from _tiny_model import tiny_llama  # bench/_tiny_model.py

ROOT = Path(__file__).resolve().parents[1]
WORKERS = {
    "grpo16": {"n": 16, "m": None},
    "grpo64": {"n": 64, "m": None},
    "pods64": {"n": 64, "m": 16},
}
MICRO = 16  # completions per micro-batch, for every worker


def worker(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from podsrl.integrations.rewards import as_trl_reward
    from podsrl.integrations.trl import PODSConfig, PODSTrainer
    from podsrl.models import resolve_model_path
    from podsrl.tasks import format_user_message, load_task

    torch.manual_seed(spec["seed"])
    task = load_task("arithmetic", num_train=max(64, spec["prompts"] * spec["steps"]), num_eval=1, seed=spec["seed"])
    rows = [
        {"prompt": [{"role": "user", "content": format_user_message(ex, task)}], "answer": ex.answer, "id": ex.id}
        for ex in task.train
    ]
    B, n, m = spec["prompts"], spec["n"], spec["m"]
    cuda = spec["device"] != "cpu"
    common = dict(
        output_dir=spec["tmp"],
        num_generations=n,
        max_completion_length=spec["max_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="grpo",
        num_iterations=1,
        use_vllm=False,
        bf16=spec["bf16"],
        use_cpu=not cuda,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_steps=spec["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        seed=spec["seed"],
        shuffle_dataset=False,
        model_init_kwargs={"dtype": "bfloat16" if spec["bf16"] else "float32"},
    )
    if m is None:  # GRPO: B*n rows, all trained on, in micro-batches of MICRO
        args = GRPOConfig(**common, per_device_train_batch_size=MICRO, gradient_accumulation_steps=B * n // MICRO)
        cls = GRPOTrainer
    else:  # PODS: B*n rows sampled in one generation batch, B*m kept, micro-batches of MICRO kept rows
        micro_steps = B * m // MICRO
        args = PODSConfig(
            **common,
            per_device_train_batch_size=B * n // micro_steps,
            gradient_accumulation_steps=micro_steps,
            pods_rule="max_variance",
            pods_m=m,
            pods_skip_zero_advantage=spec["skip"],
        )
        cls = PODSTrainer

    class Timer(TrainerCallback):
        def __init__(self):
            self.marks: list[float] = []
            self.sampling: list[float] = []
            self.pending = 0.0
            self.rss0 = 0
            self.peak_mib = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                self.rss0 = torch.cuda.memory_allocated()
            else:
                self.rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.marks.append(time.perf_counter())
            self.sampling.append(self.pending)
            self.pending = 0.0

        def on_train_end(self, args, state, control, **kwargs):
            if cuda:
                self.peak_mib = (torch.cuda.max_memory_allocated() - self.rss0) / 2**20
            else:
                self.peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.rss0) / 1024

    timer = Timer()
    trainer = cls(
        model=spec["model"],
        reward_funcs=[as_trl_reward("correctness")],
        args=args,
        train_dataset=Dataset.from_list(rows),
        callbacks=[timer],
    )
    sample = trainer._generate_single_turn

    def timed_sample(*a, **k):
        start = time.perf_counter()
        out = sample(*a, **k)
        if cuda:
            torch.cuda.synchronize()
        timer.pending += time.perf_counter() - start
        return out

    trainer._generate_single_turn = timed_sample
    trainer.train()
    steps = [b - a for a, b in zip(timer.marks, timer.marks[1:])]
    kept = [e["pods/kept"] for e in trainer.state.log_history if "pods/kept" in e]
    loss_rows = [e["pods/loss_rows_fraction"] for e in trainer.state.log_history if "pods/loss_rows_fraction" in e]
    return {
        "step": steps,
        "sampling": timer.sampling,
        "update": [s - g for s, g in zip(steps, timer.sampling)],
        "peak_mib": timer.peak_mib,
        "trained_rows": kept or [B * n] * len(steps),
        "loss_rows_fraction": loss_rows or [1.0] * len(steps),
        "micro_batches": args.gradient_accumulation_steps,
        "model": spec["model"],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _tiny_model(path: Path) -> str:
    """The --quick model."""
    return str(tiny_llama(path, hidden=64, intermediate=128, heads=4, kv_heads=2))


def run_worker(name: str, spec: dict, log_dir: Path, round_: int) -> dict:
    return run_isolated(__file__, ["--worker"], {**spec, **WORKERS[name]}, log=log_dir / f"{name}-round{round_ + 1}.log",
                        prefix=f"trl_pods-{name}-")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="hub id, local directory or embedded name")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--bf16", action="store_true", help="bfloat16 weights and autocast (GPU)")
    parser.add_argument("--prompts", type=int, default=2, help="B, prompts per optimizer step")
    parser.add_argument("--max-tokens", type=int, default=64, help="max completion tokens")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is dropped)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-skip", action="store_true", help="PODS: run the loss on kept rows of advantage 0 too")
    parser.add_argument("--quick", action="store_true", help="tiny random model, B=1, 8 tokens, 2 steps, 1 round")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        Path(args.result).write_text(json.dumps(worker(json.loads(args.worker))))
        return
    log_dir = Path(tempfile.mkdtemp(prefix="trl_pods-logs-"))
    if args.quick:
        args.model = _tiny_model(log_dir / "tiny-model")
        args.prompts, args.max_tokens, args.steps, args.rounds = 1, 8, 2, 1
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is dropped as warm-up)")
    from podsrl.models import resolve_model_path

    model = resolve_model_path(args.model)
    spec = dict(model=model, device=args.device, bf16=args.bf16, prompts=args.prompts, max_tokens=args.max_tokens,
                steps=args.steps, seed=args.seed, skip=not args.no_skip)  # fmt: skip
    print(f"model {args.model} ({'bf16' if args.bf16 else 'fp32'}, full fine-tuning) on {args.device}; B={args.prompts} "
          f"prompts/step, <= {args.max_tokens} completion tokens, micro-batches of {MICRO} completions; "
          f"{args.rounds} round(s) x {args.steps} steps per worker, first step dropped\n", flush=True)  # fmt: skip

    results: dict[str, dict[str, list[float]]] = {name: {"step": [], "sampling": [], "update": [], "peak": []} for name in WORKERS}
    info: dict[str, dict] = {}
    for r in range(args.rounds):
        for name in WORKERS:
            out = run_worker(name, spec, log_dir, r)
            if "error" in out:
                print(f"[round {r + 1}] {name}: FAILED ({out['error']})", flush=True)
                continue
            for key in ("step", "sampling", "update"):
                results[name][key] += out[key][1:]
            results[name]["peak"].append(out["peak_mib"])
            info[name] = out
            print(f"[round {r + 1}] {name:<7} step {', '.join(f'{t:.2f}' for t in out['step'])} s; update "
                  f"{', '.join(f'{t:.2f}' for t in out['update'])} s (first dropped); trained rows "
                  f"{out['trained_rows']} (loss ran on {', '.join(f'{f:.2f}' for f in out['loss_rows_fraction'])}); peak +{out['peak_mib']:.0f} MiB; process {out['wall_seconds']:.0f} s", flush=True)  # fmt: skip

    print(f"\n{'worker':<8} {'n':>3} {'trained':>8} {'micro-batches':>14} {'step s':>8} {'sampling s':>11} {'update s':>9} {'peak MiB':>9}")
    med: dict[str, float] = {}
    for name, cfg in WORKERS.items():
        res = results[name]
        if not res["update"]:
            print(f"{name:<8} (no result)")
            continue
        med[name] = statistics.median(res["update"])
        trained = cfg["m"] or cfg["n"]
        print(f"{name:<8} {cfg['n']:>3} {trained:>6}xB {info[name]['micro_batches']:>14} {statistics.median(res['step']):>8.2f} "
              f"{statistics.median(res['sampling']):>11.2f} {med[name]:>9.2f} {max(res['peak']):>9.0f}")  # fmt: skip
    print(f"(medians over {args.rounds} round(s) x {args.steps - 1} kept steps; logs in {log_dir}; "
          f"torch {next(iter(info.values()))['torch'] if info else '?'}, {next(iter(info.values()))['threads'] if info else '?'} threads)")
    if len(med) < 3:
        sys.exit("trl update time: a worker failed; see the logs above")
    print(f"trl update time PODS(n=64,m=16)/GRPO(n=64): {med['pods64'] / med['grpo64']:.2f}, "
          f"/GRPO(n=16): {med['pods64'] / med['grpo16']:.2f}")


if __name__ == "__main__":
    main()
