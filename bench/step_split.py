"""Benchmark: where a training step's time goes, podsrl against TRL, at short and long completions.

    python bench/step_split.py                                  # 16, 128, 256 tokens at B = 8, 2, 2; 2 steps an arm (1 timed)
    python bench/step_split.py --lengths 16 --prompts 8 --steps 3   # one length at a time (the tables of each run combine)
    python bench/step_split.py --quick                          # a tiny random model, 4 and 8 tokens: checks it runs
    python bench/step_split.py --keep runs/step-split           # also keep every arm's run directory and the steps' records
    python bench/step_split.py --table results/step-split/step_split.json   # a saved run's tables (docs/results.md)

What it measures (issue 67). The step of each arm, split into its phases, at each completion length
L, and the gap between podsrl and TRL's GRPOTrainer at the same n split into its causes.

**The arms** (each a fresh process per length, one after another, ``--rounds`` times):
podsrl's GRPO(16), PODS(16, 4) (max-variance) and GRPO(4), through ``podsrl.train.loop.train`` with
every default saving (prompts shared, zero-advantage rows skipped) and vLLM's engine; TRL 1.16's
GRPOTrainer(16) and podsrl's PODSTrainer(16, 4), through ``podsrl compare``'s TRL arm
(:func:`podsrl.compare.trl_arm.run.train_trl`: TRL's own engine, transformers ``generate``; every
shared setting mapped as in the 10-minute comparison, docs/trl.md). The embedded SmolLM2-135M,
float32, full fine-tuning, the sampler in float32 (``rollout.sampler_dtype = "auto"``), B prompts a
step, micro-batches of 16 rows, one optimizer step per step, evaluation off.

**Fixed lengths, a fixed signal.** Every completion is exactly L tokens (end-of-sequence suppressed:
vLLM's ``min_tokens`` and transformers' ``min_new_tokens``, set to L), so each arm does the same work
every step and the lengths are the ones asked for; the completions are then text past the answer,
which nobody grades. The reward is the bench's own (:func:`signal_reward`): the training set is the
step's B two-digit problems (``num_train`` = B, so every step trains on all of them), and the first
half of them ("signal" problems) score each completion by a hash of its text in [0, 1), the others
0. So every step has exactly B/2 groups with a signal whose every row has a nonzero advantage, and
B/2 constant groups whose rows have advantage 0, in every arm and both tools (the 10-minute
comparison's GRPO(16) had 3.7 of 8 groups with a signal; its GRPO(4) had 1.6 where this has 4).
No learning is needed: the weights move by the default learning rate, which changes no cost.

**The phases** (a step's median over its steps, the first ``--warmup`` steps of each run dropped):
``generate`` (podsrl: sampling, rewards, selection and the weight sync to vLLM; TRL: its
``_generate_and_score_completions``, generation, rewards and advantages) and ``update`` (the rest of
the step). Inside the update, timed by hooks this script installs on the policy (nothing in podsrl
or TRL changes; a forward is counted when it records gradients, so the sampler's forwards are not):
``prompt fwd`` (podsrl's shared-prompt pass, once per distinct prompt of a micro-batch),
``completion fwd`` (podsrl's pass of the completions on the prompts' cache), ``sequence fwd`` (a
forward of whole [prompt; completion] rows: TRL's, and podsrl's without sharing), ``backward``
(every ``Tensor.backward``: prompt and completion together), ``optimizer`` (AdamW's step) and
``rest`` (the update less those: the log-softmax of the kept logits and the loss, gradient
clipping, batching, bookkeeping). ``update share`` is update / step.

**The gap**, GRPOTrainer(16) - GRPO(16) and PODSTrainer(16, 4) - PODS(16, 4), per step, measured
by ablation on the same batches: after each timed step of podsrl's GRPO(16) the update is run again
on that step's batch without skipping and then without sharing either (``optim.skip_zero_advantage``,
``optim.share_prompts``), and PODS(16, 4)'s without sharing, each timed (:func:`gap_split`; these
reruns are the bench's largest cost at long completions: every row, twice):

- ``engine``: TRL's generate - podsrl's generate (transformers ``generate`` against vLLM, weight
  sync included);
- ``zero-adv rows``: podsrl's update without skipping - with it (GRPO only: PODSTrainer skips too);
- ``prompt sharing``: podsrl's update without sharing - with it (both without skipping for GRPO);
- ``per-token cost``: TRL's update - podsrl's without sharing (or skipping, for GRPO): the same rows
  and tokens through both tools' forward, loss, backward and optimizer;
- ``rest``: what remains of the step gap (rewards, selection, bookkeeping outside both).

They add up to the gap of the phase medians (generate + update + rest of each arm). Prints the
phase table and the gap table, the command and date; the last line is
``step time podsrl/TRL at L tokens: GRPO(16) R1, PODS(16, 4) R2, ...``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

from _isolated import run_isolated  # bench/_isolated.py (this script's directory is on sys.path)
from _tiny_model import tiny_llama  # bench/_tiny_model.py

ROOT = Path(__file__).resolve().parents[1]

# name -> (label, tool, rule, n, m, ablation variants run after each step: name -> UpdateSettings changes)
ARMS: dict[str, tuple[str, str, str, int, int, dict[str, dict[str, bool]]]] = {
    "grpo16": ("GRPO(16)", "podsrl", "all", 16, 16,
               {"no_skip": {"skip_zero_advantage": False}, "no_share": {"skip_zero_advantage": False, "share_prompts": False}}),
    "pods16_4": ("PODS(16, 4)", "podsrl", "max_variance", 16, 4, {"no_share": {"share_prompts": False}}),
    "grpo4": ("GRPO(4)", "podsrl", "all", 4, 4, {}),
    "trl_grpo16": ("GRPOTrainer(16)", "trl", "all", 16, 16, {}),
    "trl_pods16_4": ("PODSTrainer(16, 4)", "trl-pods", "max_variance", 16, 4, {}),
}  # fmt: skip
PAIRS = (("trl_grpo16", "grpo16"), ("trl_pods16_4", "pods16_4"))  # (TRL arm, podsrl arm) whose gap is split
UPDATE_PHASES = ("prompt_fwd", "completion_fwd", "sequence_fwd", "backward", "optimizer")
SIGNAL: set[str] = set()  # the ids of the problems whose completions score by their hash (the worker fills it)


def signal_reward(completion: str, example) -> float:
    """The bench's reward: a "signal" problem's completion scores a hash of its text in [0, 1) (distinct
    completions, distinct rewards: every row of its group has a nonzero advantage), any other 0."""
    return zlib.crc32(completion.encode()) / 2**32 if example.id in SIGNAL else 0.0


# ---------------------------------------------------------------------------------------------
# The worker: one arm at one length, in its own process


class PhaseClock:
    """Seconds per update phase, added to ``current`` (a dict; None: not recording) by hooks on the
    policy's forward, on ``torch.Tensor.backward`` and on every optimizer's step (module docstring)."""

    def __init__(self):
        self.current: dict[str, float] | None = None
        self._open: list[tuple[str, float]] = []

    def add(self, phase: str, seconds: float) -> None:
        if self.current is not None:
            self.current[phase] = self.current.get(phase, 0.0) + seconds

    def install(self, model):
        """Hook ``model``, ``torch.Tensor.backward`` and every optimizer; returns a function that
        removes the hooks (a worker keeps them until it exits)."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

        def before(module, args, kwargs):
            if torch.is_grad_enabled():  # the update's forwards; sampling and scoring run without gradients
                sync()
                self._open.append((forward_kind(kwargs), time.perf_counter()))

        def after(module, args, kwargs, output):
            if torch.is_grad_enabled() and self._open:
                sync()
                kind, start = self._open.pop()
                self.add(kind, time.perf_counter() - start)

        handles = [model.register_forward_pre_hook(before, with_kwargs=True), model.register_forward_hook(after, with_kwargs=True)]
        backward = torch.Tensor.backward

        def timed_backward(tensor, *args, **kwargs):
            start = time.perf_counter()
            backward(tensor, *args, **kwargs)
            sync()
            self.add("backward", time.perf_counter() - start)

        torch.Tensor.backward = timed_backward
        started: list[float] = []

        def step_begins(optimizer, args, kwargs) -> None:
            sync()
            started.append(time.perf_counter())

        def step_ends(optimizer, args, kwargs) -> None:
            sync()
            self.add("optimizer", time.perf_counter() - started.pop())

        handles += [register_optimizer_step_pre_hook(step_begins), register_optimizer_step_post_hook(step_ends)]

        def remove() -> None:
            torch.Tensor.backward = backward
            for handle in handles:
                handle.remove()

        return remove


def forward_kind(kwargs: dict) -> str:
    """Which update phase a forward call of the policy is: podsrl's shared-prompt pass (an empty cache
    to fill), its completions on that cache (a filled one), or a whole [prompt; completion] row."""
    cache = kwargs.get("past_key_values")
    if cache is None:
        return "sequence_fwd"
    return "prompt_fwd" if cache.get_seq_length() == 0 else "completion_fwd"


def _fix_lengths(length: int, clock: PhaseClock, *, generate: bool) -> None:
    """Every completion of podsrl's engines exactly ``length`` tokens (vLLM's, and with ``generate``
    the transformers engine's; TRL's gets ``generation_kwargs``), and the phase hooks on the policy
    as soon as it is loaded (module docstring)."""
    import functools

    import podsrl.engines.vllm as podsrl_vllm
    import podsrl.train.loop as loop

    import_vllm = podsrl_vllm._import_vllm

    def with_min_tokens():
        vllm, LLM, SamplingParams = import_vllm()
        return vllm, LLM, functools.partial(SamplingParams, min_tokens=length)

    podsrl_vllm._import_vllm = with_min_tokens
    load_policy = loop.load_policy

    def load(*args, **kwargs):
        policy = load_policy(*args, **kwargs)
        if generate:  # podsrl's transformers engine calls the policy's own generate
            plain = policy.model.generate
            policy.model.generate = lambda *a, **k: plain(*a, **{**k, "min_new_tokens": length})
        clock.install(policy.model)
        return policy

    loop.load_policy = load


def config(spec: dict):
    """The arm's podsrl config (module docstring)."""
    from podsrl.config import from_dict

    _, tool, rule, n, m, _ = ARMS[spec["arm"]]
    B = spec["prompts"]
    model = {"name": spec["model"], "dtype": "float32", "lora": False}
    return from_dict({
        "model": model,
        "task": {"name": "arithmetic", "options": {"ops": ["+", "-"], "min_digits": 2, "max_digits": 2, "num_train": B, "num_eval": 2}},
        "reward": {"names": ["step_split:signal_reward"], "weights": [1.0]},
        "rollout": {"engine": spec["engine"] if tool == "podsrl" else "transformers", "n": n, "max_new_tokens": spec["length"],
                    "sampler_dtype": "auto", "max_model_len": max(512, 128 + spec["length"])},
        "select": {"rule": rule, "m": m},
        "eval": {"at_start": False, "at_end": False},
        "train": {"prompts_per_step": B, "max_steps": spec["steps"], "max_seconds": "none", "seed": spec["seed"], "checkpoint_every": 0,
                  "progress": False, "export_model": False},
    })  # fmt: skip


def worker(spec: dict) -> dict:
    """Train the arm for ``spec["steps"]`` steps; each step's metrics, its update phases and (podsrl's
    GRPO and PODS) the ablation updates on its batch."""
    import dataclasses

    import podsrl.train.loop as loop
    from podsrl.run.metrics import read_jsonl
    from podsrl.tasks.build import build_task

    sys.modules.setdefault("step_split", sys.modules[__name__])  # the reward "step_split:signal_reward" is this module's
    label, tool, *_, variants = ARMS[spec["arm"]]
    clock = PhaseClock()
    _fix_lengths(spec["length"], clock, generate=tool == "podsrl")
    cfg = config(spec)
    task = build_task(cfg)
    SIGNAL.update(ex.id for ex in task.train[: len(task.train) // 2])
    records: list[dict] = []
    run_dir = Path(spec["keep"] or spec["tmp"]) / "run"
    if tool == "podsrl":
        last: dict = {}
        run_update = loop.run_update

        def recorded_update(*args, **kwargs):
            last.update(args=args, kwargs=kwargs)
            return run_update(*args, **kwargs)

        def step(*args, **kwargs):
            clock.current = {}
            metrics = train_step(*args, **kwargs)
            record = {"phases": clock.current}
            model, optimizer, scheduler, batch, settings = last["args"]
            warmup = len(records) < spec["warmup"]  # left out of the medians: no ablation
            for name, change in ({} if warmup else variants).items():  # the same batch, timed again with a saving off
                clock.current = {}
                start = time.perf_counter()
                run_update(model, optimizer, scheduler, batch, dataclasses.replace(settings, **change), **last["kwargs"])
                record[name] = {"update": time.perf_counter() - start, "phases": clock.current}
            clock.current = None
            records.append(record)
            return metrics

        train_step, loop.run_update, loop.train_step = loop.train_step, recorded_update, step
        loop.train(cfg, run_dir=run_dir, log=lambda *a, **k: None)
    else:
        from transformers import TrainerCallback

        import podsrl.compare.trl_arm.run as trl_arm

        class Phases(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                clock.current = {}

            def on_step_end(self, args, state, control, **kwargs):
                records.append({"phases": clock.current})
                clock.current = None

        grpo_config, make_trainer = trl_arm.grpo_config, trl_arm._make_trainer
        trl_arm.grpo_config = lambda *a, **k: {**grpo_config(*a, **k), "generation_kwargs": {"min_new_tokens": spec["length"]}}

        def make(*args, **kwargs):
            trainer = make_trainer(*args, **kwargs)
            trainer.add_callback(Phases())
            return trainer

        trl_arm._make_trainer = make
        trl_arm.train_trl(cfg, tool, run_dir=run_dir, log=lambda *a, **k: None)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    for heavy in ("checkpoints", "trl"):  # the final checkpoint's weights and optimizer state (TRL's in trl/): not needed
        shutil.rmtree(run_dir / heavy, ignore_errors=True)
    if len(rows) != len(records):
        raise RuntimeError(f"{label}: {len(rows)} metrics rows but {len(records)} timed steps")
    keys = ("time/step", "time/generate", "time/reward", "time/select", "time/sync", "time/update", "rows_run", "tokens_run", "kept",
            "completion_len", "groups_with_signal")  # fmt: skip
    return {"steps": [{**{k: row[k] for k in keys if k in row}, **record} for row, record in zip(rows, records)], "signal": sorted(SIGNAL)}


# ---------------------------------------------------------------------------------------------
# The figures


def phases(steps: list[dict]) -> dict[str, float]:
    """An arm's median seconds per phase over ``steps`` (its timed steps): step, generate, update,
    the update's phases and its rest, the step's rest, rows run. podsrl's generate includes its
    rewards, selection and weight sync; TRL's is its generation round."""
    med = lambda values: statistics.median(values) if values else 0.0  # noqa: E731
    out = {
        "step": med([s["time/step"] for s in steps]),
        "generate": med([sum(s.get(k, 0.0) for k in ("time/generate", "time/reward", "time/select", "time/sync")) for s in steps]),
        "update": med([s["time/update"] for s in steps]),
        "rows_run": med([s.get("rows_run", 0) for s in steps]),
    }
    for p in UPDATE_PHASES:
        out[p] = med([s["phases"].get(p, 0.0) for s in steps])
    out["update_rest"] = out["update"] - sum(out[p] for p in UPDATE_PHASES)
    out["rest"] = out["step"] - out["generate"] - out["update"]
    for name in {k for s in steps for k in s if isinstance(s.get(k), dict) and "update" in s[k]}:  # the ablations
        out[f"update_{name}"] = med([s[name]["update"] for s in steps])
    return out


def gap_split(trl: dict[str, float], ours: dict[str, float]) -> dict[str, float]:
    """The step gap TRL - podsrl (both :func:`phases`) and its parts (module docstring): engine,
    zero-adv rows, prompt sharing, per-token cost, rest; they add up to the gap. ``ours`` carries
    ``update_no_share`` (and, when it skipped rows TRL ran, ``update_no_skip``)."""
    skip = ours.get("update_no_skip")
    plain = ours["update_no_share"]
    parts = {
        "engine": trl["generate"] - ours["generate"],
        "zero_adv_rows": (skip - ours["update"]) if skip is not None else 0.0,
        "prompt_sharing": plain - (skip if skip is not None else ours["update"]),
        "per_token_cost": trl["update"] - plain,
        "rest": trl["rest"] - ours["rest"],
    }
    return {"gap": trl["step"] - ours["step"], **parts}


def saved_tables(data: dict) -> str:
    """The phase and gap tables of a saved run (``--keep``'s step_split.json; ``--table FILE``), as
    docs/results.md shows them (tests/test_step_split.py checks that it does)."""
    results = {int(L): {a: phases(s) for a, s in arms.items() if s} for L, arms in data["steps"].items()}
    return f"`{data['command']}`\n\n{phase_table(results)}\n\n{gap_table(results)}"


def phase_table(results: dict[int, dict[str, dict[str, float]]]) -> str:
    cols = ["step", "generate", "update", *UPDATE_PHASES, "update_rest"]
    head = "| L | arm | rows run | step s | generate | update | prompt fwd | completion fwd | sequence fwd | backward | optimizer | rest of update | update share |"
    lines = [head, "|" + "---|" * 13]
    for length, arms in results.items():
        for arm, x in arms.items():
            cells = " | ".join(f"{x[c]:.2f}" for c in cols)
            lines.append(f"| {length} | {ARMS[arm][0]} | {x['rows_run']:.0f} | {cells} | {x['update'] / x['step']:.0%} |")
    return "\n".join(lines)


def gap_table(results: dict[int, dict[str, dict[str, float]]]) -> str:
    parts = ("engine", "zero_adv_rows", "prompt_sharing", "per_token_cost", "rest")
    lines = ["| L | TRL - podsrl | step gap s | engine | zero-adv rows | prompt sharing | per-token cost | rest |", "|" + "---|" * 8]
    for length, arms in results.items():
        for theirs, ours in PAIRS:
            if theirs not in arms or ours not in arms:
                continue
            g = gap_split(arms[theirs], arms[ours])
            share = lambda p: f"{g[p]:.2f} ({g[p] / g['gap']:.0%})" if g["gap"] else f"{g[p]:.2f}"  # noqa: E731
            lines.append(f"| {length} | {ARMS[theirs][0]} - {ARMS[ours][0]} | {g['gap']:.2f} | " + " | ".join(share(p) for p in parts) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Driver


def _tiny_model(path: Path) -> str:
    """The --quick model: heads of 64 dimensions, which vLLM's CPU attention supports."""
    return str(tiny_llama(path, hidden=128, intermediate=256, heads=2, kv_heads=1))


def _ints(text: str, what: str, parser) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        parser.error(f"{what}: expected comma-separated integers, got {text!r}")
    if min(values) < 1:
        parser.error(f"{what}: every value must be >= 1")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="16,128,256", help="completion lengths L, comma-separated")
    parser.add_argument("--prompts", default="8,2,2", help="B at each length (one value: every length), even")
    parser.add_argument("--steps", default="2", help="steps per arm at each length (one value: every length), the warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="the first steps of each run, left out of the medians")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every arm at every length")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"which of {','.join(ARMS)}")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="an embedded model's name or a model directory")
    parser.add_argument("--engine", default="vllm", choices=("vllm", "transformers"), help="podsrl's engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each arm's run directory (without its checkpoint) under KEEP/L<length>/runs/<arm>/seed<round>/run")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a tiny random model, lengths 4,8, B = 2, 2 steps")
    parser.add_argument("--table", type=Path, default=None, help="measure nothing: print a saved step_split.json's tables for docs/results.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table is not None:
        print(saved_tables(json.loads(args.table.read_text())))
        return 0
    if args.worker:
        Path(args.result).write_text(json.dumps(worker(json.loads(args.worker))))
        return 0
    log_dir = Path(tempfile.mkdtemp(prefix="step_split-logs-"))
    if args.quick:
        args.model = _tiny_model(log_dir / "tiny-model")
        args.lengths, args.prompts, args.steps = "4,8", "2", "2"
    lengths = _ints(args.lengths, "--lengths", parser)
    prompts = _ints(args.prompts, "--prompts", parser)
    prompts = prompts * len(lengths) if len(prompts) == 1 else prompts
    if len(prompts) != len(lengths) or any(b % 2 for b in prompts):
        parser.error("--prompts: one even B, or one even B per length")
    counts = _ints(str(args.steps), "--steps", parser)
    counts = counts * len(lengths) if len(counts) == 1 else counts
    if len(counts) != len(lengths) or min(counts) <= args.warmup:
        parser.error(f"--steps: one count, or one per length, each above --warmup ({args.warmup}): the warm-up steps are dropped")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if unknown := [a for a in arms if a not in ARMS]:
        parser.error(f"--arms: unknown {unknown}; valid: {', '.join(ARMS)}")
    from podsrl.models import resolve_model_path

    command = "python bench/step_split.py " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.time()
    steps: dict[int, dict[str, list[dict]]] = {L: {a: [] for a in arms} for L in lengths}
    for r in range(args.rounds):
        for L, B, count in zip(lengths, prompts, counts):
            for arm in arms:
                keep = None if args.keep is None else str(args.keep / f"L{L}" / "runs" / arm / f"seed{r}")
                spec = dict(arm=arm, length=L, prompts=B, steps=count, warmup=args.warmup, seed=args.seed + r, model=resolve_model_path(args.model),
                            engine=args.engine, keep=keep)  # fmt: skip
                out = run_isolated(__file__, ["--worker"], spec, log=log_dir / f"L{L}-{arm}-round{r + 1}.log", prefix=f"step_split-{arm}-")
                if "error" in out:
                    print(f"[L={L}] {arm}: FAILED ({out['error']})", flush=True)
                    continue
                steps[L][arm] += out["steps"][args.warmup :]
                times = ", ".join(f"{s['time/step']:.1f}" for s in out["steps"])
                print(f"[L={L}, B={B}, round {r + 1}] {ARMS[arm][0]}: steps {times} s (first {args.warmup} dropped); "
                      f"process {out['wall_seconds']:.0f} s", flush=True)  # fmt: skip
    results = {L: {a: phases(s) for a, s in arms_.items() if s} for L, arms_ in steps.items()}
    print(f"\n# {command}")
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {time.time() - started:.0f} s; model {args.model}, podsrl's engine "
          f"{args.engine}; B = {','.join(map(str, prompts))} at L = {','.join(map(str, lengths))}; medians of {args.rounds} round(s) x "
          f"{','.join(str(c - args.warmup) for c in counts)} steps an arm; logs in {log_dir}\n")  # fmt: skip
    print(phase_table(results))
    print()
    print(gap_table(results))
    if args.keep is not None:
        (args.keep / "step_split.json").write_text(json.dumps({"command": command, "steps": {str(L): s for L, s in steps.items()}}, indent=1))
    ratios = []
    for L, arms_ in results.items():
        pairs = [f"{ARMS[ours][0]} {arms_[ours]['step'] / arms_[theirs]['step']:.2f}" for theirs, ours in PAIRS if theirs in arms_ and ours in arms_]
        ratios.append(f"{L} tokens: {', '.join(pairs) or 'n/a'}")
    print("\nstep time podsrl/TRL at " + "; ".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
