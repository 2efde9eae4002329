"""The two kinds of error podsrl raises on purpose.

`ConfigError` is a user mistake (a bad config field, a missing file, an unknown name): its message
names the field or file and says how to fix it, so the CLI prints it without a traceback.
`RewardError` is a reward function that failed on a real completion: the run stops rather than
silently scoring 0, because a reward that quietly returns 0 looks exactly like a model that
learns nothing.
"""


class ConfigError(ValueError):
    """A user mistake in configuration or inputs; the message says what to change."""


class RewardError(RuntimeError):
    """A reward function raised, or returned NaN, inf or something that is not a number.

    The message names the reward function and shows the prompt and completion (truncated) with
    the original exception or value; the original exception is chained as `__cause__`.
    """
