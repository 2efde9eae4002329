"""The child process of one TRL run of ``podsrl compare`` (:func:`podsrl.compare.arms.command`):

    python -m podsrl.compare.trl_arm CONFIG --trainer trl --out RUN     # or --resume RUN

Exit codes as ``podsrl train``'s: 2 for a ConfigError, 75 when a stop signal checkpointed the run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from podsrl.compare.trl_arm.mapping import TRL_TRAINERS


def main(argv: list[str] | None = None) -> int:
    from podsrl import config as config_mod
    from podsrl.compare.trl_arm.run import train_trl
    from podsrl.errors import EXIT_PREEMPTED, ConfigError
    from podsrl.run.preemption import Preempted

    parser = argparse.ArgumentParser(prog="python -m podsrl.compare.trl_arm", description="one TRL run of podsrl compare")
    parser.add_argument("config")
    parser.add_argument("--trainer", required=True, choices=list(TRL_TRAINERS))
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out")
    where.add_argument("--resume")
    args = parser.parse_args(argv)
    try:
        cfg = config_mod.load(args.config)
        train_trl(cfg, args.trainer, run_dir=Path(args.resume or args.out), resume=args.resume is not None)
    except ConfigError as err:
        print(f"podsrl: error: {err}", file=sys.stderr)
        return 2
    except Preempted as err:
        print(f"podsrl: {err.advice()}", file=sys.stderr)
        return EXIT_PREEMPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
