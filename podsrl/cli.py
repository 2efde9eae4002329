"""``podsrl train | eval | export | compare | plot | config | env``.

    podsrl train                                  # the embedded demo: SmolLM2-135M, arithmetic, PODS
    podsrl train my.toml --select.m=8 --rollout.n=32
    podsrl train --resume runs/20261122-101500-max_variance
    podsrl eval --run runs/...                    # the checkpoint's accuracy on its held-out set
    podsrl eval --model runs/.../model            # an exported model directory (the run's task and settings)
    podsrl eval --run runs/... --completions answers.jsonl   # and what it answered: every completion, graded
    podsrl export runs/... --out my-model         # a checkpoint as a Hugging Face model directory
    podsrl eval --model.name=HuggingFaceTB/SmolLM2-135M-Instruct --task.name=gsm8k \\
                --task.options.path=../shared/data/gsm8k --eval.max_new_tokens=512 --eval.samples=8 --eval.temperature=1 \\
                --eval.max_problems=100                       # 100 of 1,319 problems: 512 tokens are slow on a CPU
    podsrl plot runs/a runs/b -o curves.png
    podsrl compare configs/compare.toml           # methods x seeds (configs/compare.toml explains each setting)
    podsrl config [SECTION]                       # every setting, its default and what it does (TOML)
    podsrl env                                    # versions, devices and engines, for a bug report

User mistakes (bad config values, missing files, unknown names) print one line naming the field and
the fix, with exit code 2, never a traceback. A run stopped by its surroundings says what happened
and how to resume, with an exit code of its own (``podsrl.errors``; the table is in
docs/distributed.md): 3 a reward function failed, 69 the rollout engine died, 74 a checkpoint (or a line of
metrics.jsonl / eval.jsonl) could not be written, 75 preempted by a stop signal after a checkpoint, 124 a rank hung (exited from the
heartbeat), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from podsrl import errors
from podsrl.errors import CheckpointWriteError, ConfigError, EngineError, RewardError, RunWriteError
from podsrl.run.preemption import Preempted
from podsrl.run.rundir import RunInterrupted, check_is_run, check_trained_by_podsrl, check_weight_settings, restart_advice


def _is_override(arg: str) -> bool:
    return arg.startswith("--") and "." in arg.split("=", 1)[0]


def _check_written_with_equals(argv: list[str]) -> None:
    """A setting written with a space before its value (``--eval.max_problems 10``) would leave the
    value to argparse as a positional (a config file named 10, or a run directory): one message,
    for every command, saying how to write it."""
    for i, arg in enumerate(argv):
        if _is_override(arg) and "=" not in arg:
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
            written = f"{arg} {value}" if value is not None else arg
            raise ConfigError(
                f"{written}: write a setting with '=' before its value, as {arg}={value if value is not None else 'VALUE'} "
                "(every setting is written --section.key=value)"
            )


def _split_overrides(rest: list[str], parser: argparse.ArgumentParser) -> list[str]:
    for arg in rest:
        if not _is_override(arg):
            parser.error(f"unrecognised argument {arg!r}; settings are written --section.key=value, e.g. --select.m=8")
    return [arg[2:] for arg in rest]


def cmd_train(args, overrides: list[str]) -> int:
    from podsrl import config as config_mod
    from podsrl.train.loop import train

    if args.resume == "auto":  # resume --out when it holds a checkpoint, else start there (torchrun, SLURM)
        if args.overwrite:
            raise ConfigError("--resume auto continues the run in --out when there is one and --overwrite replaces it; give only one")
        cfg = config_mod.load(args.config, [*overrides, "train.resume=auto"])
        run_dir = Path(args.out) if args.out else None
    elif args.resume:
        run_dir = Path(args.resume)
        if args.overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces one; give only one of them")
        if args.out and Path(args.out) != run_dir:
            raise ConfigError(f"--resume {run_dir} continues the run in its own directory; drop --out {args.out}")
        cfg = _checkpointed_run_config(run_dir, "--resume", overrides, args.config)
    else:
        cfg = config_mod.load(args.config, overrides)
        run_dir = Path(args.out) if args.out else None
    run_dir = train(cfg, run_dir=run_dir, resume=bool(args.resume) and args.resume != "auto", overwrite=args.overwrite)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 reports and plots
        return 0
    _print_summary(run_dir)
    if not args.no_plot:
        from podsrl.run.plot import plot_runs

        print(f"podsrl: plot written to {plot_runs([run_dir], run_dir / 'curves.png')}")
    return 0


def _checkpointed_run_config(run_dir: Path, option: str, overrides: list[str], config: str | None = None):
    """The config of the run ``option`` names (its config.toml, or ``config``, with the overrides);
    ConfigError unless the directory holds a run with a checkpoint."""
    from podsrl import config as config_mod
    from podsrl.run.checkpoint import latest

    check_is_run(run_dir, option)
    check_trained_by_podsrl(run_dir, option)
    if latest(run_dir) is None:
        raise ConfigError(
            f"{option} {run_dir}: no checkpoint under {run_dir / 'checkpoints'} (the run stopped before its first "
            f"one); {restart_advice(run_dir)}"
        )
    try:
        cfg = config_mod.load(config or run_dir / "config.toml", overrides)
    except ConfigError as err:
        if config or str(run_dir / "config.toml") in str(err):
            raise
        raise ConfigError(f"{option} {run_dir}: {run_dir / 'config.toml'} does not load: {err}") from None
    if config is None:
        _say_reward_code(cfg, run_dir / "config.toml", rewards=option == "--resume")
    return cfg


def _say_reward_code(cfg, source: Path, *, rewards: bool = True) -> None:
    """One line for each kind of code that a config read from a directory (a run's config.toml, an
    exported model's podsrl_config.toml) makes podsrl import and call: the directory is data, the
    code it names runs (SECURITY.md). ``rewards``: the command imports the reward functions
    (``podsrl train --resume``; ``podsrl eval`` replaces them, accuracy being the task's grader, so it
    names none); a user grader (task.grader) runs in both."""
    from podsrl.grading.user import user_rewards

    specs = user_rewards(cfg.reward.names)
    if rewards and specs and int(os.environ.get("RANK", "0")) == 0:
        print(f"podsrl: {source} names reward code, which is imported and run (reward.names): {', '.join(specs)}")
    grader = cfg.task.grader
    if grader is not None and ":" in grader and int(os.environ.get("RANK", "0")) == 0:  # a user grader, run by eval too
        print(f"podsrl: {source} names grader code, which is imported and run (task.grader): {grader}")


def _print_summary(run_dir: Path) -> None:
    from podsrl.run.metrics import read_jsonl

    evals = read_jsonl(run_dir / "eval.jsonl")
    if len(evals) >= 2 and evals[0]["step"] == 0:
        first, last = evals[0], evals[-1]
        diff = 100 * (last["accuracy"] - first["accuracy"])
        fmt = lambda r: f"{100 * r['accuracy']:5.1f}%  (95% CI {100 * r['ci_low']:.1f}-{100 * r['ci_high']:.1f})"  # noqa: E731
        print(f"\nheld-out accuracy on the same {last['problems']} problems:")
        print(f"  base model      {fmt(first)}")
        print(f"  trained policy  {fmt(last)}   step {last['step']}, {last['train_seconds'] / 60:.1f} min of training")
        print(f"  change          {diff:+.1f} points")
    written = [name for name in ("config.toml", "metrics.jsonl", "eval.jsonl") if (run_dir / name).is_file()]
    written += ["checkpoints/"] if (run_dir / "checkpoints").is_dir() else []
    print(f"run directory: {run_dir} ({', '.join(written)})")
    if (run_dir / "model" / "config.json").is_file() or (run_dir / "model" / "adapter_config.json").is_file():
        print(f"trained policy: {run_dir / 'model'} (a Hugging Face model directory; its README.md says how to load it)")


def cmd_eval(args, overrides: list[str]) -> int:
    import dataclasses

    from podsrl import config as config_mod

    cfg = _eval_config(args, overrides)
    for option, value in (("--json", args.json), ("--completions", args.completions)):  # before the evaluation, not after it
        if value:
            _check_output_file(Path(value), option)
    # Accuracy is the task's grader, whatever the run trained on: the run's own reward
    # functions are never called, so they are not imported (a reward file need not be at hand).
    cfg = dataclasses.replace(cfg, reward=config_mod.RewardConfig())
    result, grader = _evaluate(cfg, args)
    _print_evaluation(result, cfg, grader)
    _write_evaluation(result, cfg, args)
    return 0


def _eval_config(args, overrides: list[str]):
    """The config of what ``podsrl eval`` evaluates: a run's (--run, its config.toml), an exported
    model's (--model, its podsrl_config.toml when it has one) or a config file's, with the overrides."""
    from podsrl import config as config_mod

    if args.run and args.model:
        raise ConfigError("--run evaluates a run's checkpoint and --model a model directory; give one of them")
    if args.run:
        run_dir = Path(args.run)
        if args.config:
            raise ConfigError(f"--run {run_dir} evaluates with the run's own config.toml; drop {args.config} (change settings with --section.key=value)")
        cfg = _checkpointed_run_config(run_dir, "--run", overrides)
        check_weight_settings(run_dir, cfg)
        return cfg
    if args.model:
        from podsrl.run.export import CONFIG_FILE, eval_config

        cfg = eval_config(args.model, args.config, overrides)
        if args.config is None and (Path(args.model).expanduser() / CONFIG_FILE).is_file():
            _say_reward_code(cfg, Path(args.model).expanduser() / CONFIG_FILE, rewards=False)
        return cfg
    return config_mod.load(args.config, overrides)


def _evaluate(cfg, args):
    """Load the model (with --run, the run's newest checkpoint), say what is evaluated, evaluate;
    the result and the task's grader."""
    from podsrl.run import checkpoint as ckpt
    from podsrl.train.loop import describe_eval, run_eval, setup

    run = setup(cfg)
    if run.grading_note is not None:
        print(f"podsrl: warning: {run.grading_note}")
    if args.run:
        last, _ = ckpt.load_newest(Path(args.run), run.policy.model)
        run.engine.sync_weights(run.policy.model)
        print(f"podsrl: evaluating {last}")
    elif args.model:
        print(f"podsrl: evaluating {cfg.model.name}")
    for line in describe_eval(run):  # before the wait, which on a CPU can be long (flushed: stdout may be a pipe)
        print(line, flush=True)
    result = run_eval(run, ckpt.TrainState(), progress=cfg.train.progress, keep_completions=bool(args.completions))
    run.engine.close()
    return result, run.task.grader


def _print_evaluation(result, cfg, grader: str) -> None:
    """Accuracy with its interval and what it means, pass@k, lengths, and a note when the token
    limit cost answers or when the task's ``grader`` graded wrong completions holding the reference."""
    from podsrl.run.watch import eval_truncation_note, named_but_wrong_note

    print(f"accuracy: {result.summary()}")
    print(f"  ({ACCURACY_MEANS})")
    for k, v in result.pass_at_k.items():
        print(f"{k}: {100 * v:.1f}%")
    print(f"mean completion length {result.mean_length:.1f} tokens, truncated {100 * result.truncated:.1f}%, {result.seconds:.0f} s")
    for note in (eval_truncation_note(result, cfg, "the completions"), named_but_wrong_note(result, grader, "this evaluation")):
        if note is not None:
            print(note)


def _write_evaluation(result, cfg, args) -> None:
    """--json: the result's numbers; --completions: every completion with its grade (rank 0)."""
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(result.to_dict(), indent=2))
        except OSError as err:
            raise ConfigError(f"--json {args.json}: cannot write it ({err.strerror or err})") from None
    if args.completions and result.completions is not None:  # rank 0 holds them
        from podsrl.run.rundir import write_text_atomic

        try:
            write_text_atomic(args.completions, "".join(json.dumps(r) + "\n" for r in result.completions))
        except OSError as err:
            raise ConfigError(f"--completions {args.completions}: cannot write it ({err.strerror or err})") from None
        print(f"podsrl: {result.problems} problems x {cfg.eval.samples} completions, each with its grade, written to {args.completions}")


def cmd_export(args, overrides: list[str]) -> int:
    from podsrl.run.export import MAX_SHARD_SIZE, export_run

    if overrides:
        raise ConfigError(f"podsrl export takes a run directory and its options only, not settings ({overrides[0]})")
    result = export_run(
        args.run, args.out, step=args.step, dtype=args.dtype, adapter_only=args.adapter_only, overwrite=args.overwrite,
        push_to_hub=args.push_to_hub, max_shard_size=args.max_shard_size or MAX_SHARD_SIZE,
    )  # fmt: skip
    what = "LoRA adapter" if not result.merged else "merged model and LoRA adapter" if result.lora else "model"
    if result.path is not None:
        print(f"podsrl: exported the {what} of {result.checkpoint} to {result.path} ({result.dtype}, {result.seconds:.1f} s)")
    if result.pushed:
        print(f"podsrl: pushed to {result.pushed}")
    return 0


def cmd_env(args, overrides: list[str]) -> int:
    from podsrl.envinfo import format_report, report

    if overrides:
        raise ConfigError("podsrl env takes no settings")
    print(format_report(report()))
    return 0


def _check_output_file(path: Path, option: str) -> None:
    """Refuse an output file that cannot be written before the work that produces it."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a directory; give a file name")
    if not path.parent.is_dir():
        raise ConfigError(f"{option} {path}: cannot write it ({path.parent} is not a directory)")


def cmd_plot(args, overrides: list[str]) -> int:
    from podsrl.run.plot import plot_runs

    if overrides:
        raise ConfigError("podsrl plot takes run directories and -o only")
    for run in args.runs:
        if not Path(run).is_dir():
            raise ConfigError(f"{run}: no such run directory")
    print(f"podsrl: plot written to {plot_runs([Path(r) for r in args.runs], Path(args.output))}")
    return 0


def cmd_config(args, overrides: list[str]) -> int:
    from podsrl import config as config_mod
    from podsrl.configdoc import render

    print(render(config_mod.load(None, overrides), args.section), end="")
    return 0


def cmd_compare(args, overrides: list[str]) -> int:
    from podsrl.compare import main as compare_main

    return compare_main(args, overrides)


# What `podsrl eval`'s accuracy (and every run's eval.jsonl) measures.
ACCURACY_MEANS = (
    "accuracy: the share of sampled completions whose final answer equals the problem's reference answer "
    "(the task's grader, task.grader; reward.names is what training optimises, not what this measures)"
)

SETTINGS_HELP = (
    "Any setting is also given as --section.key=value, e.g. --select.m=8 --rollout.n=32. "
    "`podsrl config [SECTION]` prints every setting with its default and a one-line description, "
    "as a TOML file to start from (podsrl config > my.toml)."
)


def build_parser() -> argparse.ArgumentParser:
    """The `podsrl` parser: one sub-parser per command, each built by its ``_add_COMMAND``."""
    parser = argparse.ArgumentParser(
        prog="podsrl",
        description="Reinforcement learning of language models with verifiable rewards: GRPO, PODS, D3S.\n"
        "`podsrl COMMAND --help` lists a command's options.",
        epilog="examples:\n" + __doc__.split("\n\n")[1],  # the module docstring's examples, as written
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_eval, _add_export, _add_plot, _add_compare, _add_config, _add_env):
        add(sub)
    return parser


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a policy (no arguments: the embedded demo)", epilog=SETTINGS_HELP)
    p.add_argument("config", nargs="?", help="TOML config file (defaults apply to what it leaves out)")
    p.add_argument("--out", help="run directory (default: train.out_dir)")
    p.add_argument(
        "--resume", metavar="RUN_DIR",
        help="continue this run from its latest checkpoint; 'auto': continue the run in --out if it has a checkpoint, "
        "else start it there (for torchrun --max-restarts and SLURM --requeue; a directory named auto: ./auto)",
    )  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (its run files only)")
    p.add_argument("--no-plot", action="store_true", help="do not write curves.png at the end")
    p.set_defaults(func=cmd_train)


def _add_eval(sub) -> None:
    p = sub.add_parser(
        "eval", help="held-out accuracy (95%% CI) and pass@k of a model or a run's checkpoint",
        description="Held-out accuracy (95% CI) and pass@k of a model or a run's checkpoint. " + ACCURACY_MEANS
        + "; pass@k: the share of problems with a correct answer among k of its samples (eval.samples per problem).",
        epilog=SETTINGS_HELP,
    )  # fmt: skip
    p.add_argument("config", nargs="?", help="TOML config file")
    p.add_argument("--run", help="evaluate this run directory's latest checkpoint with its config")
    p.add_argument("--model", metavar="DIR",
                   help="evaluate this model directory (or hub id); an exported one with its run's task and settings")
    p.add_argument("--json", help="also write the result to this JSON file")
    p.add_argument("--completions", metavar="FILE",
                   help="also write every completion with its grade to this JSONL file, one line per problem "
                   '({"id", "question", "answer", "completions": [{"text", "grade", "truncated"}]})')
    p.set_defaults(func=cmd_eval)


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="a run's checkpoint as a Hugging Face model directory (and/or pushed to the Hub)")
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--out", metavar="DIR", help="the model directory to write (new or empty; see --overwrite)")
    p.add_argument("--step", type=int, metavar="N", help="the checkpoint at step N (default: the newest)")
    p.add_argument("--dtype", default="auto", metavar="bf16|fp16|fp32",
                   help="dtype of the model weights (default: the run's model.dtype)")
    p.add_argument("--adapter-only", action="store_true", help="LoRA runs: the adapter alone, not merged")
    p.add_argument("--overwrite", action="store_true", help="replace the model directory already in --out")
    p.add_argument("--push-to-hub", metavar="REPO_ID",
                   help="also push it to this Hub repo (token: HF_TOKEN or `hf auth login`); without --out, only push")
    p.add_argument("--max-shard-size", metavar="SIZE", help="split the weights into files of at most this size (default: 5GB)")
    p.set_defaults(func=cmd_export)


def _add_plot(sub) -> None:
    p = sub.add_parser("plot", help="reward and accuracy curves of one or more runs")
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("-o", "--output", default="curves.png", help="PNG file to write (default: curves.png)")
    p.set_defaults(func=cmd_plot)


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="methods x seeds under one budget: steps and time to accuracy")
    p.add_argument("config", nargs="?",
                   help="TOML file with a [compare] table, as configs/compare.toml (what `podsrl compare` runs without one; "
                   "its comments explain every setting) or configs/compare-2digit.toml")  # fmt: skip
    p.add_argument("--out", default="runs/compare", help="output directory (resumable)")
    p.add_argument("--seeds", metavar="N|N,METHOD=K,...",
                   help="seeds per method: N for every method, METHOD=K for one (adds seeds to an existing comparison)")
    p.add_argument("--methods", help="comma-separated subset of the methods to run")
    p.add_argument("--report-only", action="store_true", help="rebuild compare.json/png from finished runs")
    p.add_argument("--in-process", action="store_true", help="train every run in this process, not one process per run")
    p.add_argument("--parallel", type=int, metavar="K",
                   help="train K runs at once (default 1, or one per --devices); runs on one device share its time")
    p.add_argument("--devices", metavar="0,1,...",
                   help="GPU indices: pin each run to one (CUDA_VISIBLE_DEVICES), the least loaded first")
    p.set_defaults(func=cmd_compare)


def _add_config(sub) -> None:
    p = sub.add_parser(
        "config", help="print every setting with its default and a description, as TOML to start from",
        description="Print every setting with its default and a description, as TOML to start from "
        "(podsrl config > my.toml). Settings given as --section.key=value show in the output, so "
        "`podsrl config task --task.name=jsonl` lists the options of the jsonl task.",
    )  # fmt: skip
    p.add_argument("section", nargs="?", help="print only this section, e.g. select or task")
    p.set_defaults(func=cmd_config)


def _add_env(sub) -> None:
    p = sub.add_parser("env", help="podsrl, Python, torch, devices, engines and libraries: paste it into a bug report")
    p.set_defaults(func=cmd_env)


# What `podsrl` prints and exits with for each kind of error a run can end with (docs/distributed.md).
_ERRORS = (
    (ConfigError, "error", errors.EXIT_CONFIG),
    (RewardError, "reward error", errors.EXIT_REWARD),
    (EngineError, "engine error", errors.EXIT_ENGINE),
    (CheckpointWriteError, "checkpoint error", errors.EXIT_CHECKPOINT),
    (RunWriteError, "write error", errors.EXIT_CHECKPOINT),
)
_USER_FACING = tuple(kind for kind, _, _ in _ERRORS)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # Overrides are taken out first: argparse would read one with a space in its value as a positional.
    settings = [a for a in argv if _is_override(a)]
    try:
        _check_written_with_equals(argv)
    except ConfigError as err:
        print(f"podsrl: error: {err}", file=sys.stderr)
        return errors.EXIT_CONFIG
    args, rest = parser.parse_known_args([a for a in argv if not _is_override(a)])
    try:
        overrides = _split_overrides(settings + rest, parser)
        return args.func(args, overrides)
    except _USER_FACING as err:  # one line naming the cause and the fix, never a traceback
        label, code = next((label, code) for kind, label, code in _ERRORS if isinstance(err, kind))
        print(f"podsrl: {label}: {err}", file=sys.stderr)
        return code
    except Preempted as err:  # the stop signals are ignored from here on (StopSignals.restore)
        print(f"podsrl: {err.advice()}", file=sys.stderr)
        return errors.EXIT_PREEMPTED
    except KeyboardInterrupt as err:
        if isinstance(err, RunInterrupted):  # names the run directory, and whether it can be resumed
            print(f"\npodsrl: {err.advice()}", file=sys.stderr)
        else:
            print("\npodsrl: interrupted; resume with `podsrl train --resume RUN_DIR` from the last checkpoint", file=sys.stderr)
        return errors.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
