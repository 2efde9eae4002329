"""Held-out accuracy with a 95% confidence interval, and pass@k.

Accuracy is the mean over problems of the fraction of a problem's samples that are correct (one
greedy sample by default; with ``samples`` > 1 at a temperature it is the mean per-sample accuracy,
i.e. pass@1, with less noise than one sample). With one sample per problem the interval is Wilson's
score interval for a binomial proportion, which stays inside [0, 1] and behaves at 0% and 100%;
with several it is a normal interval over the per-problem means (samples of one problem are
correlated, so counting them as independent would overstate the confidence). pass@k uses the unbiased
estimator of Chen et al. (2021): 1 - C(c_fail, k) / C(samples, k), averaged over problems.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

from podsrl.engines import Engine, Sampling
from podsrl.rewards import correctness
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


def wilson_interval(successes: int, total: int, z: float = 1.959964) -> tuple[float, float]:
    if total == 0:
        return 0.0, 1.0
    p = successes / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


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
) -> EvalResult:
    """Generate ``samples`` completions per problem with ``engine`` and score them."""
    start = time.perf_counter()
    rollouts = engine.generate(
        prompt_ids, Sampling(n=samples, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed)
    )
    scores = [correctness(text, examples[i // samples]) for i, text in enumerate(rollouts.texts)]
    per_problem = [scores[i * samples : (i + 1) * samples] for i in range(len(examples))]
    means = [sum(int(x > 0) for x in s) / samples for s in per_problem]  # [P]
    accuracy = sum(means) / len(means)
    if samples == 1:
        low, high = wilson_interval(round(sum(means)), len(means))
    else:
        var = sum((x - accuracy) ** 2 for x in means) / max(1, len(means) - 1)
        half = 1.959964 * math.sqrt(var / len(means))
        low, high = max(0.0, accuracy - half), min(1.0, accuracy + half)
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples]
    passes = {
        f"pass@{k}": sum(pass_at_k(samples, sum(int(x > 0) for x in s), k) for s in per_problem) / len(examples)
        for k in ks
    }
    lengths = [len(ids) for ids in rollouts.completion_ids]
    return EvalResult(
        accuracy=accuracy,
        ci_low=low,
        ci_high=high,
        problems=len(examples),
        pass_at_k=passes,
        mean_length=sum(lengths) / len(lengths),
        truncated=sum(rollouts.truncated) / len(lengths),
        seconds=time.perf_counter() - start,
    )
