"""Held-out accuracy with a 95% confidence interval, and pass@k.

A sample is correct when the problem's grader (`Example.grader`, chosen by the task:
:mod:`podsrl.grading.graders`) gives it full marks, 1.0; partial credit counts as wrong.
Accuracy is the mean over problems of the fraction of a problem's samples that are correct (one
greedy sample by default; with ``samples`` > 1 at a temperature it is the mean per-sample accuracy,
i.e. pass@1, with less noise than one sample). The 95% interval is
:func:`podsrl.intervals.accuracy_interval`: with one sample per problem Wilson's score interval for
a binomial proportion, which stays inside [0, 1] and behaves at 0% and 100%; with several a normal
interval over the per-problem means (samples of one problem are correlated, so counting them as
independent would overstate the confidence), never narrower than Wilson's on the completions, and
Wilson's on the problems when every problem scores the same (all wrong, all right: no spread to
measure, so the interval one sample per problem gives). pass@k uses the unbiased
estimator of Chen et al. (2021): 1 - C(c_fail, k) / C(samples, k), averaged over problems.

Under torchrun the problems are split over the ranks in contiguous blocks (the last ones padded so
that every rank makes the same engine calls), each rank scores its block, and the per-problem
counts are gathered, so every rank returns the one-process result; greedy evaluation gives the same
numbers at any world size (sampled evaluation draws other samples, with the same distribution).

The problems are generated in up to :data:`CALLS` engine calls of equal size, so that ``podsrl
eval`` can show its progress over problems and an estimate of the time left (a GSM8K evaluation of
512 tokens is long on a CPU): call c draws with seed ``seed + 100 x rank + CALL_SEED_OFFSET x c``,
so a single call draws what the one call of before did, and the calls are the same on every rank (a
sharded model needs every rank in every call). A call holds at least ``min_call`` completions,
since a call has a cost of its own: on a GPU one costs nearly the same for 1 and 256 rollouts
(results/gpu-check/README.md), on a CPU about as much as a few dozen short rollouts (docs/results.md,
the cost model); :func:`podsrl.train.loop.run_eval` asks for 256 on a GPU, 64 on a CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from podsrl.train.distributed import Dist
from podsrl.engines import Engine, Rollouts, Sampling
from podsrl.grading import naming
from podsrl.grading.answers import extract_answer
from podsrl.grading.graders import grade
from podsrl.intervals import accuracy_interval, wilson_interval  # noqa: F401 (wilson_interval: test_compare reads it here)
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
    # Whether the limit cost answers (podsrl.run.watch.truncation_hurts): of all completions, the
    # fractions cut off and right anyway, and cut off with no final answer in them (not right, and
    # no number, "####" answer or box: podsrl.grading.answers.extract_answer).
    truncated_right: float = 0.0
    truncated_unanswered: float = 0.0
    # Completions graded wrong that hold their reference answer, one of words, as a word
    # (podsrl.grading.naming.contains_reference): a hint that the grader misses right answers (issue
    # 68; podsrl.run.watch.named_but_wrong_note). A count, over every rank.
    wrong_with_reference: int = 0
    # The mean completion tokens of the right and of the wrong completions apart (None when there is
    # none): whether a run's answers shorten because the right ones do or because fewer are cut off
    # (issue 67: the loss aggregation on long answers).
    mean_length_right: float | None = None
    mean_length_wrong: float | None = None
    # With keep_completions (`podsrl eval --completions`): one record per problem, in the held-out
    # order, on rank 0 (None on the others): {"id", "question", "answer", "completions": [{"text",
    # "grade", "truncated"}]}, grade by the problem's grader (1.0: right). Not in eval.jsonl.
    completions: list[dict] | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["completions"]
        return out

    def summary(self) -> str:
        return f"{100 * self.accuracy:.1f}% [95% CI {100 * self.ci_low:.1f}-{100 * self.ci_high:.1f}] on {self.problems} problems"


CALLS = 20  # engine calls of an evaluation, at most: its progress bar moves by 5% of the problems or more
CALL_SEED_OFFSET = 1_000_000  # between the sampling seeds of an evaluation's calls (above every rank's 100)


def calls(problems: int, samples: int = 1, min_call: int = 1) -> list[range]:
    """A rank's ``problems`` (its shard) in at most :data:`CALLS` consecutive ranges of equal size
    (the last one shorter), each of at least ``min_call`` completions (``samples`` a problem): one
    engine call each. A function of the counts alone, so every rank, holding the same padded count,
    makes the same calls."""
    size = max(1, math.ceil(problems / CALLS), math.ceil(min_call / samples))
    return [range(first, min(first + size, problems)) for first in range(0, problems, size)]


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation samples: ``samples`` completions a problem at ``temperature`` (0: greedy), of
    up to ``max_new_tokens`` tokens, seeded by ``seed`` (the module docstring: each call's seed), in
    engine calls of at least ``min_call`` completions (:func:`calls`)."""

    temperature: float = 0.0
    samples: int = 1
    max_new_tokens: int = 64
    seed: int = 0
    min_call: int = 1


def _generate(engine: Engine, prompts: list[list[int]], settings: EvalSettings, dist: Dist, bar) -> Rollouts:
    """This rank's rollouts of ``prompts``, ``settings.samples`` each, in :func:`calls`, the bar
    advancing by the problems every rank scored in a call (the real ones, not the padding)."""
    parts = []
    done = 0
    s = settings
    with bar:
        for c, part in enumerate(calls(len(prompts), s.samples, s.min_call)):
            sampling = Sampling(n=s.samples, temperature=s.temperature, top_p=1.0, max_new_tokens=s.max_new_tokens,
                                seed=s.seed + 100 * dist.rank + CALL_SEED_OFFSET * c)  # fmt: skip
            parts.append(engine.generate([prompts[i] for i in part], sampling))
            scored = min(bar.total, part.stop * dist.world)
            bar.update(scored - done)
            done = scored
    return Rollouts(
        prompt_ids=prompts,
        completion_ids=[ids for r in parts for ids in r.completion_ids],
        texts=[text for r in parts for text in r.texts],
        truncated=[t for r in parts for t in r.truncated],
    )


def pass_at_k(samples: int, correct: int, k: int) -> float:
    if samples - correct < k:
        return 1.0
    return 1.0 - math.comb(samples - correct, k) / math.comb(samples, k)


class Counts(NamedTuple):
    """One problem's tallies over its samples: what ranks gather (one row of whole numbers each)."""

    correct: int  # samples with full marks
    tokens: int  # completion tokens, summed
    truncated: int  # samples cut off at the token limit
    truncated_right: int  # cut off and right anyway
    truncated_unanswered: int  # cut off with no final answer in them (podsrl.grading.answers.extract_answer)
    wrong_with_reference: int  # graded wrong, and holding the reference (words) as a word
    tokens_right: int  # completion tokens of the right samples, summed (the wrong ones': tokens - tokens_right)


def evaluate(
    engine: Engine,
    prompt_ids: list[list[int]],
    examples: list[Example],
    settings: EvalSettings = EvalSettings(),
    *,
    dist: Dist | None = None,
    progress: bool = False,
    keep_completions: bool = False,
) -> EvalResult:
    """Generate ``settings.samples`` completions per problem (``prompt_ids`` [P], ``examples`` [P])
    with ``engine`` and score them; ``progress``: a progress bar over the problems on rank 0 (stderr),
    one update per engine call (:func:`calls`); ``keep_completions``: the texts and their grades too
    (``EvalResult.completions``)."""
    start = time.perf_counter()
    dist = dist or Dist()
    order = list(range(len(examples)))
    mine, real = dist.pad_shard(order) if dist.active else (order, len(order))
    bar = tqdm(total=len(examples), desc="eval", unit="problem", disable=not (progress and dist.is_main), dynamic_ncols=True)
    rollouts = _generate(engine, [prompt_ids[i] for i in mine], settings, dist, bar)
    scored = [_score(examples[i], rollouts, j, settings.samples) for j, i in enumerate(mine[:real])]  # this rank's problems
    rows = torch.tensor([counts for counts, _ in scored], dtype=torch.long).reshape(-1, len(Counts._fields))
    counts = [Counts(*row) for row in dist.gather_ragged(rows).tolist()]  # [P], every rank's
    completions = _gather_completions([record for _, record in scored], dist) if keep_completions else None
    return _result(counts, settings.samples, seconds=time.perf_counter() - start, completions=completions)


def _score(example: Example, rollouts: Rollouts, j: int, samples: int) -> tuple[Counts, dict]:
    """Problem ``example``'s tallies from its ``samples`` rollouts (the j-th block of ``rollouts``),
    and its record for ``EvalResult.completions``: {"id", "question", "answer", "completions":
    [{"text", "grade", "truncated"}]}."""
    block = slice(j * samples, (j + 1) * samples)
    texts, ids, cut = rollouts.texts[block], rollouts.completion_ids[block], rollouts.truncated[block]
    grades = [grade(t, example) for t in texts]
    right = [g >= 1.0 for g in grades]  # graders.is_right, on the grades computed once
    words = naming.is_words(example.answer)
    counts = Counts(
        correct=sum(right),
        tokens=sum(len(c) for c in ids),
        truncated=sum(cut),
        truncated_right=sum(c and r for c, r in zip(cut, right)),
        truncated_unanswered=sum(c and not r and extract_answer(t) is None for c, r, t in zip(cut, right, texts)),
        wrong_with_reference=sum(words and not r and naming.contains_reference(t, example.answer) for r, t in zip(right, texts)),
        tokens_right=sum(len(c) for c, r in zip(ids, right) if r),
    )
    record = {"id": example.id, "question": example.question, "answer": example.answer,
              "completions": [{"text": t, "grade": g, "truncated": bool(c)} for t, g, c in zip(texts, grades, cut)]}  # fmt: skip
    return counts, record


def _gather_completions(records: list[dict], dist: Dist) -> list[dict] | None:
    """Every rank's records on rank 0, in the held-out order (the ranks' shards, in rank order);
    None on the other ranks."""
    if not dist.active:
        return records
    gathered = dist.gather_objects(records)
    return [r for part in gathered for r in part] if dist.is_main else None


def _result(counts: list[Counts], samples: int, *, seconds: float, completions: list[dict] | None) -> EvalResult:
    """Accuracy with its interval (:func:`podsrl.intervals.accuracy_interval`), pass@k and the
    completions' lengths and cut-offs, from every problem's tallies."""
    correct = [c.correct for c in counts]
    low, high = accuracy_interval(correct, samples)
    total = len(counts) * samples  # completions
    right, tokens_right = sum(correct), sum(c.tokens_right for c in counts)
    tokens_wrong = sum(c.tokens for c in counts) - tokens_right
    return EvalResult(
        accuracy=sum(c / samples for c in correct) / len(counts),
        ci_low=low,
        ci_high=high,
        problems=len(counts),
        pass_at_k={f"pass@{k}": sum(pass_at_k(samples, c, k) for c in correct) / len(counts)
                   for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples},  # fmt: skip
        mean_length=sum(c.tokens for c in counts) / total,
        truncated=sum(c.truncated for c in counts) / total,
        seconds=seconds,
        truncated_right=sum(c.truncated_right for c in counts) / total,
        truncated_unanswered=sum(c.truncated_unanswered for c in counts) / total,
        wrong_with_reference=sum(c.wrong_with_reference for c in counts),
        mean_length_right=tokens_right / right if right else None,
        mean_length_wrong=tokens_wrong / (total - right) if total > right else None,
        completions=completions,
    )
