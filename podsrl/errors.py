"""The errors podsrl raises on purpose, and the exit codes the CLI gives them.

`ConfigError` is a user mistake (a bad config field, a missing file, an unknown name): its message
names the field or file and says how to fix it, so the CLI prints it without a traceback.
`RewardError` is a reward function that failed on a real completion: the run stops rather than
silently scoring 0, because a reward that quietly returns 0 looks exactly like a model that
learns nothing.

The others stop a run that was going well because its surroundings failed; each message names what
failed and the run directory to resume (the trainer adds it): `EngineError` (the rollout engine
died), `CheckpointWriteError` (a checkpoint could not be written, e.g. a full disk; the previous one
is intact), `RunWriteError` (a line of metrics.jsonl or eval.jsonl could not be written). A
preempted run (``podsrl.run.preemption.Preempted``) and a hung rank (``podsrl.train.heartbeat``)
have exit codes of their own too, so that a job script or a scheduler can tell "resume me" from
"fix me".
"""

# Exit codes of `podsrl train` (docs/distributed.md has the table); the 6x-7x ones follow sysexits.h.
EXIT_CONFIG = 2  # ConfigError: fix the command or the config
EXIT_REWARD = 3  # RewardError: fix the reward function
EXIT_ENGINE = 69  # EngineError (EX_UNAVAILABLE): the rollout engine died; resume
EXIT_CHECKPOINT = 74  # CheckpointWriteError, RunWriteError (EX_IOERR): free space, then resume
EXIT_PREEMPTED = 75  # stopped by a signal after a checkpoint (EX_TEMPFAIL): resume, e.g. on requeue
EXIT_HUNG = 124  # a rank hung or was lost (as timeout(1)); every rank exits
EXIT_INTERRUPTED = 130  # Ctrl-C


class ConfigError(ValueError):
    """A user mistake in configuration or inputs; the message says what to change."""


class RewardError(RuntimeError):
    """A reward function raised, or returned NaN, inf or something that is not a number.

    The message names the reward function and shows the prompt and completion (truncated) with
    the original exception or value; the original exception is chained as `__cause__`.
    """


class EngineError(RuntimeError):
    """The rollout engine failed after it had started (vLLM's engine core died or raised); the
    message names the engine and, once the trainer has added it, the run directory to resume."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (ENOSPC, EIO, a quota): the message names the directory,
    the error, and the space it needed against the space free; the previous checkpoint is intact."""


class RunWriteError(RuntimeError):
    """A run file other than a checkpoint (metrics.jsonl, eval.jsonl) could not be written (ENOSPC,
    EIO, a quota): the message names the file and the error; the trainer adds the run to resume."""
