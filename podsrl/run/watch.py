"""What a person watching a run should be told that its numbers only imply.

- **Steps without a signal.** A step whose kept rollouts all have advantage 0 moves no weight (no
  KL term: loss 0, grad_norm 0, rows_run 0). One such step is common (GRPO's groups of 4 are often
  all right or all wrong); :data:`SILENT_STEPS` in a row mean the run is learning nothing, and the
  message names the likely cause from the steps' metrics: completions cut off at
  ``rollout.max_new_tokens``, every completion scoring the same (a reward function returning a
  constant, a task the model always fails or always solves; every completion 0 with the built-in
  ``correctness`` reward names the grader and what it counts as right, since answers right in a form
  the grader does not read look the same), each group scoring alike (the task too
  hard or too easy for n rollouts), or kept subsets scoring alike although the groups did not (the
  rule and m). Settings under which no step could ever learn are refused before the run starts
  (:meth:`podsrl.core.downsample.DownsampleSpec.check_signal`, ``RewardConfig``).
- **Cut-off completions.** When most completions of a training step, or of an evaluation, reach the
  token limit and that plausibly cost answers, once per run: a cut-off completion is scored on what
  it wrote by then, which often holds no final answer. The message names the setting. An
  evaluation says whether the limit cost answers (:func:`truncation_hurts`): the embedded demo's base
  model runs past its 16 tokens in about 70% of its samples, but it was asked for the number alone
  and mostly wrote one (a quarter of its cut-off completions hold none, and a quarter of its wrong
  answers ended on their own: the limit is not why they are wrong), so it gets no note telling a new
  user to change the settings the README shows working. A training step's metrics cannot say which
  completions held an answer: its note is given unless an evaluation at the same limit found the
  cut-off ones harmless (the demo evaluates the base model before its first step).
- **A grader that may miss right answers.** At the first evaluation whose completions include
  some graded wrong that hold their reference answer (one of words) as a word, once per run: the
  grader is named with that count, and where to look (issue 68: a word grader that misses natural
  right answers understates the base model's accuracy and overstates a run's gain). The first
  evaluation, not the first training step: it is what held-out accuracy counts, graded by the
  task's grader whatever the rewards are, and by default it is the base model's, before any
  training. Some such completions are rightly wrong ("It is not Paris."): the note says to look.
- **A correction that weighs the batch down.** When a step's ``is_ess`` (the importance
  correction's effective sample size at the level its mode weights: over the completion tokens'
  own weights for the token modes, over the sequences' weights for the sequence and geometric ones;
  :class:`podsrl.core.importance.ImportanceMetrics`) falls below :data:`ESS_BOUND`, once per run.
  The bound 0.5 is a heuristic: below it the weighted step's gradient has the variance of fewer
  than half its terms equally weighted (Kish's effective sample size; the N/2 at which
  sequential Monte Carlo resamples). Whether that costs more than the cheaper sampler saves (a
  bfloat16 sampler step takes 0.58-0.70x the float32 one's time, docs/vllm.md) is not measured.
  ``sequence_mask`` (TRL's default, podsrl's before issue 59) falls with the completion's length
  (its ratio is a product over the tokens): 0.66 at 512 tokens on GSM8K at the bfloat16 gap of the
  CPU that measured it (docs/vllm.md, "Long completions"), below 0.5 at larger gaps (issue 59's
  simulation at KL 0.009-0.015 a token). Under the default ``token_truncate`` the warning reads the
  tokens' ESS since issue 67: the mean over a sequence's tokens, which it read before, averages a
  degraded correction away on long completions (tests/test_importance.py: a token ESS of 0.28
  where the sequence-mean one reads 0.98). The message names the mode, both levels' figures
  and what keeps more of the batch under it.

:class:`RunWatch` reads the metrics a step logs and the evaluation results (rank 0's
:class:`podsrl.run.metrics.RunLogger` feeds it) and returns the lines to print; it prints nothing
itself. ``podsrl eval`` uses :func:`truncation_note` and :func:`named_but_wrong_note`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SILENT_STEPS = 5  # steps in a row without a row with a signal before the run says so
MOST = 0.5  # "most completions": the share of cut-off completions that gets a note
NEARLY_ALL = 0.9  # the share of the wrong completions that were cut off from which the limit is taken to be why they are wrong
ESS_BOUND = 0.5  # a step's is_ess below this gets a warning, once per run (why: the module docstring)


def eval_token_setting(cfg) -> str:
    """How ``cfg`` names the evaluation's token limit, with its value."""
    if cfg.eval.max_new_tokens is not None:
        return f"eval.max_new_tokens = {cfg.eval.max_new_tokens}"
    return f"eval.max_new_tokens, unset: rollout.max_new_tokens = {cfg.rollout.max_new_tokens}"


def truncation_hurts(result) -> bool:
    """Whether most completions of an evaluation (``result``: a
    :class:`podsrl.train.evaluate.EvalResult`) were cut off at the token limit *and* that plausibly
    cost answers: most of the cut-off completions hold no final answer at all (cut before it), or
    nearly all (:data:`NEARLY_ALL`) of the wrong completions were cut off (those that ended on their
    own were right: the errors are the limit's). A model that runs on after writing its answer, or is
    wrong whether it stops or not, gets no note."""
    if not (result.truncated >= MOST):  # also False for NaN
        return False
    unanswered = result.truncated_unanswered / result.truncated  # of the cut-off completions
    wrong = 1.0 - result.accuracy  # of all completions (accuracy: the mean of equal-sized per-problem shares)
    wrong_cut = (result.truncated - result.truncated_right) / wrong if wrong > 0 else 0.0
    return unanswered >= MOST or wrong_cut >= NEARLY_ALL


def eval_truncation_note(result, cfg, where: str) -> str | None:
    """The note for an evaluation's cut-off completions, when :func:`truncation_hurts`; else None."""
    return truncation_note(result.truncated, eval_token_setting(cfg), where) if truncation_hurts(result) else None


def named_but_wrong_note(result, grader: str, where: str) -> str | None:
    """The warning when the completions of an evaluation (``result``, of ``where``) include some graded
    wrong by ``grader`` that hold their reference answer as a word; None when there are none."""
    count = getattr(result, "wrong_with_reference", 0)
    if not count:
        return None
    return (
        f"podsrl: warning: {where}: task.grader = {grader!r} graded {count} completion{'s' if count != 1 else ''} of the "
        f"{result.problems} problems wrong that hold their reference answer as a word; some may be right answers the grader "
        "does not read (then accuracy is understated), others are rightly wrong ('It is not Paris.'): look at them with "
        "`podsrl eval --run RUN --completions FILE` (each completion with its grade), and if they are right choose another "
        "task.grader or task.instruction (warned once)"
    )


def truncation_note(fraction: float, setting: str, where: str) -> str | None:
    """A line for ``where``'s completions when most of them (``fraction``) reached the token limit
    ``setting`` ("rollout.max_new_tokens = 16"); None otherwise."""
    if not (fraction >= MOST):  # also None for NaN
        return None
    name = setting.split(" ", 1)[0].rstrip(",")
    return (
        f"podsrl: note: {100 * fraction:.0f}% of {where} were cut off at the token limit ({setting}); a cut-off "
        f"completion is scored on what it wrote by then, often without its final answer: raise {name} if answers are cut off"
    )


def _remedy(mode: str) -> str:
    """What keeps more of the batch under ``mode``: a sequence ratio (a product over the tokens) drifts
    far from 1 on long completions, so a per-token mode; a per-token or geometric mode that still
    weighs the batch down means the gap itself is large, so a sampler in the policy's dtype."""
    float32 = "a sampler in the policy's dtype (rollout.sampler_dtype = 'auto') closes the gap itself"
    if mode.startswith("sequence"):
        return f"a sequence ratio is a product over the tokens, so long completions drift far from 1: the per-token 'token_truncate' (the default) or {float32}"
    return f"under a per-token or geometric ratio that means a large gap per token: {float32}"


@dataclass
class RunWatch:
    """Reads a run's step metrics and evaluations; returns the notes to print (see the module docstring)."""

    cfg: object  # podsrl.config.Config
    grader: str | None = None  # the grader of the run's task (podsrl.tasks.build.build_task: task.grader or the task's own)
    silent: list[dict] = field(default_factory=list)  # the metrics of the current streak of steps without a signal
    told: set[str] = field(default_factory=set)  # the once-per-run notes already given
    harmless_cutoff: bool = False  # the last evaluation, at the rollouts' token limit, found most completions cut off but no answer lost

    def step(self, metrics: dict) -> list[str]:
        notes = []
        signal = metrics.get("signal_rows")
        if signal is not None:
            self.silent = self.silent + [metrics] if signal == 0 else []
            if len(self.silent) == SILENT_STEPS:  # once per streak
                notes.append(self._no_signal(self.silent))
        note = truncation_note(metrics.get("truncated", math.nan), f"rollout.max_new_tokens = {self.cfg.rollout.max_new_tokens}",
                               f"step {metrics.get('step')}'s completions")  # fmt: skip
        if note is not None and "train" not in self.told and not self.harmless_cutoff:
            self.told.add("train")
            notes.append(note)
        ess = metrics.get("is_ess")
        if isinstance(ess, (int, float)) and ess < ESS_BOUND and "ess" not in self.told:
            self.told.add("ess")
            notes.append(self._low_ess(metrics))
        return notes

    def _low_ess(self, metrics: dict) -> str:
        r = self.cfg.rollout
        kl = metrics.get("sampler_kl")
        gap = f" (sampler_kl {kl:.4f} nats a token)" if isinstance(kl, (int, float)) else ""
        per_token = r.importance_sampling_mode.startswith("token")
        other, other_key = ("sequences", "is_ess_sequences") if per_token else ("completion tokens", "is_ess_tokens")
        beside = f"; over the {other}, {metrics[other_key]:.2f}" if isinstance(metrics.get(other_key), (int, float)) else ""
        return (
            f"podsrl: warning: step {metrics.get('step')}: the importance correction weighs the batch down: its effective sample size "
            f"is_ess = {metrics['is_ess']:.2f} of the step's {'completion tokens' if per_token else 'sequences'} (below {ESS_BOUND}{beside}), "
            f"mean sequence weight {metrics.get('is_weight_mean', math.nan):.2f}, from the sampler's gap{gap} under "
            f"rollout.importance_sampling_mode = '{r.importance_sampling_mode}'; {_remedy(r.importance_sampling_mode)} "
            "(docs/vllm.md, \"Long completions\"; warned once; metrics.jsonl has is_ess, is_ess_tokens and is_ess_sequences for every step)"
        )

    def evaluation(self, result, step: int) -> list[str]:
        """The notes for an evaluation (``result``: a :class:`podsrl.train.evaluate.EvalResult`)."""
        notes = []
        named = named_but_wrong_note(result, self.grader or "auto", f"the evaluation at step {step}")
        if named is not None and "named" not in self.told:
            self.told.add("named")
            notes.append(named)
        note = eval_truncation_note(result, self.cfg, f"the completions of the evaluation at step {step}")
        same_limit = self.cfg.eval.max_new_tokens in (None, self.cfg.rollout.max_new_tokens)
        self.harmless_cutoff = same_limit and result.truncated >= MOST and note is None
        if note is not None and "eval" not in self.told:
            self.told.add("eval")
            notes.append(note)
        return notes

    def _no_signal(self, steps: list[dict]) -> str:
        first, last = steps[0].get("step"), steps[-1].get("step")
        head = (
            f"podsrl: warning: steps {first}-{last} had no kept rollout with a nonzero advantage (signal_rows 0): "
            "the weights do not move (loss 0, grad_norm 0); "
        )
        return head + _likely_cause(self.cfg, steps, self.grader)


def _likely_cause(cfg, steps: list[dict], grader: str | None) -> str:
    """The likeliest reason the ``steps`` had no signal, from their metrics, with the fix."""
    mean = lambda key: sum(s.get(key) or 0.0 for s in steps) / len(steps)  # noqa: E731
    constant_groups = all(s.get("zero_variance_groups") == 1 for s in steps)
    rewards = {s.get("reward_mean") for s in steps}
    n, tokens = cfg.rollout.n, cfg.rollout.max_new_tokens
    if not constant_groups:
        return (
            f"some groups' rewards varied, but the {cfg.select.m_start(n)} rollouts select.rule = '{cfg.select.rule}' kept of each "
            "scored alike; keep more (select.m) or use a rule that keeps both ends (max_variance)"
        )
    causes = []
    if mean("truncated") >= MOST:
        causes.append(
            f"{100 * mean('truncated'):.0f}% of the completions were cut off at rollout.max_new_tokens = {tokens} tokens: "
            "raise it if the answers come later"
        )
    if len(rewards) == 1 and all((s.get("reward_std") or 0.0) == 0 for s in steps):
        value = next(iter(rewards))
        scored = f"every completion scored {value if value is None else f'{value:g}'}"
        if value == 0 and "correctness" in cfg.reward.names:
            causes.append(f"{scored}: {_grader_cause(cfg, grader or 'auto')}")
        else:
            causes.append(
                f"{scored}: a reward function that returns a constant (check reward.names on a few completions), "
                "or a task the model always fails (too hard) or always solves (too easy)"
            )
    else:
        causes.append(
            f"every group's {n} rollouts scored alike (reward_mean {mean('reward_mean'):.2f}): the task is too hard or too easy "
            "for the model at this size of group; raise rollout.n, or pick problems nearer its level"
        )
    return "likely cause: " + "; or ".join(causes)


def _grader_cause(cfg, grader: str) -> str:
    """Why the built-in correctness reward gave every completion 0: its ``grader``, named with its rule."""
    from podsrl.grading.graders import RULES

    named = f"task.grader = {grader!r}" + ("" if cfg.task.grader else " (the task's own)")
    rule = RULES.get(grader, "your function's grade is 1.0")
    return (
        f"the correctness reward's grader, {named}, found no answer right (it counts: {rule}); look at what the model "
        "answers (`podsrl eval --run RUN --completions FILE` writes each completion with its grade): answers right in a form "
        "the grader does not read need another instruction (task.instruction) or grader (task.grader; `podsrl config task` "
        "lists them), else the task is too hard for the model"
    )
