"""Held-out accuracy with a 95% confidence interval, and pass@k.

A sample is correct when the problem's grader (`Example.grader`, chosen by the task:
:mod:`podsrl.grading.graders`) gives it full marks, 1.0; partial credit counts as wrong.
Accuracy is the mean over problems of the fraction of a problem's samples that are correct (one
greedy sample by default; with ``samples`` > 1 at a temperature it is the mean per-sample accuracy,
i.e. pass@1, with less noise than one sample). With one sample per problem the interval is Wilson's
score interval for a binomial proportion, which stays inside [0, 1] and behaves at 0% and 100%;
with several it is a normal interval over the per-problem means (samples of one problem are
correlated, so counting them as independent would overstate the confidence). pass@k uses the unbiased
estimator of Chen et al. (2021): 1 - C(c_fail, k) / C(samples, k), averaged over problems.

Under torchrun the problems are split over the ranks in contiguous blocks (the last ones padded so
that every rank makes the same engine calls), each rank scores its block, and the per-problem
counts are gathered, so every rank returns the one-process result; greedy evaluation gives the same
numbers at any world size (sampled evaluation draws other samples, with the same distribution).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from podsrl.train.distributed import Dist
from podsrl.engines import Engine, Sampling
from podsrl.grading.graders import is_right
from podsrl.intervals import normal_interval, wilson_interval
from podsrl.tasks import Example


@dataclass
class EvalResult:
    accuracy: float
    ci_low: float
    ci_high: float
    problems: int
    pass_at_k: dict[str, float]  # {"pass@1": ..., "pass@4": ...}
    mean_length: float  # completion tokens
    truncated: float  # fraction of completions that hit the token limit
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return f"{100 * self.accuracy:.1f}% [95% CI {100 * self.ci_low:.1f}-{100 * self.ci_high:.1f}] on {self.problems} problems"


def pass_at_k(samples: int, correct: int, k: int) -> float:
    if samples - correct < k:
        return 1.0
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


def evaluate(
    engine: Engine,
    prompt_ids: list[list[int]],
    examples: list[Example],
    *,
    temperature: float = 0.0,
    samples: int = 1,
    max_new_tokens: int = 64,
    seed: int = 0,
    dist: Dist | None = None,
) -> EvalResult:
    """Generate ``samples`` completions per problem with ``engine`` and score them."""
    start = time.perf_counter()
    dist = dist or Dist()
    order = list(range(len(examples)))
    mine, real = dist.pad_shard(order) if dist.active else (order, len(order))
    rollouts = engine.generate(
        [prompt_ids[i] for i in mine],
        Sampling(n=samples, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed + 100 * dist.rank),
    )
    rows = []  # [problem][correct samples, summed length, truncated samples]
    for j, i in enumerate(mine[:real]):
        texts = rollouts.texts[j * samples : (j + 1) * samples]
        ids = rollouts.completion_ids[j * samples : (j + 1) * samples]
        rows.append([
            sum(int(is_right(t, examples[i])) for t in texts),
            sum(len(c) for c in ids),
            sum(rollouts.truncated[j * samples : (j + 1) * samples]),
        ])  # fmt: skip
    counts = dist.gather_ragged(torch.tensor(rows, dtype=torch.long).reshape(-1, 3)).tolist()  # [P, 3]
    correct = [c for c, _, _ in counts]
    means = [c / samples for c in correct]  # [P]
    accuracy = sum(means) / len(means)
    if samples == 1:
        low, high = wilson_interval(round(sum(means)), len(means))
    else:
        low, high = normal_interval(means)
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples]
    passes = {f"pass@{k}": sum(pass_at_k(samples, c, k) for c in correct) / len(examples) for k in ks}
    completions = len(examples) * samples
    return EvalResult(
        accuracy=accuracy,
        ci_low=low,
        ci_high=high,
        problems=len(examples),
        pass_at_k=passes,
        mean_length=sum(length for _, length, _ in counts) / completions,
        truncated=sum(t for _, _, t in counts) / completions,
        seconds=time.perf_counter() - start,
    )
