"""Generated integer arithmetic: "What is 7 + 5?" -> "12". The default task.

Options: `ops` (a subset of "+", "-", "*"), `min_digits`/`max_digits` (operand digit range),
`num_train`, `num_eval`, `seed`.

The problem space is every (a, op, b) with both operands in the digit range: one-digit operands
are 0..9, d-digit operands (d >= 2) are 10**(d-1)..10**d - 1, so min_digits=1, max_digits=2 means
0..99 (drawn uniformly over values, so most operands have max_digits digits). Operands are
never negative; "-" can give a negative answer ("3 - 7" -> "-4"). Each problem
has an index in [0, N), so nothing is enumerated unless the space is small.

Split, disjoint by construction: the eval set is `num_eval` distinct indices drawn with the seed;
train is drawn only from the indices left over. Train is distinct problems when enough are left,
and drawn WITH replacement when `num_train` exceeds them (the one-digit "+" space has only 100
problems), so `train` may repeat. Asking for more eval problems than exist (all but one, which
train needs) is a ConfigError saying how many exist. The eval set depends only on the space,
`num_eval` and `seed`, not on `num_train`.
"""

import random

from podsrl.errors import ConfigError
from podsrl.tasks.types import Example, Task, check_count

OPS = ("+", "-", "*")  # canonical order: ("*", "+") and ("+", "*") give the same problems
INSTRUCTION = "Give only the final number."
# Short on purpose: SmolLM2's chat template otherwise inserts its own system prompt, and every prompt
# token is paid for in each rollout's forward and backward pass. It agrees with the instruction.
SYSTEM_PROMPT = "Answer with only the final number."
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def load(
    *,
    num_train: int,
    ops: tuple[str, ...] | list[str] = ("+",),
    min_digits: int = 1,
    max_digits: int = 1,
    num_eval: int = 200,
    seed: int = 0,
) -> Task:
    """Seeded arithmetic problems; see the module docstring for the split."""
    ops = _check_ops(ops)
    _check_digits(min_digits, max_digits)
    check_count("arithmetic", "num_train", num_train)
    check_count("arithmetic", "num_eval", num_eval)
    check_count("arithmetic", "seed", seed)
    lo, hi = operand_range(min_digits, max_digits)
    size = len(ops) * (hi - lo + 1) ** 2
    if num_eval >= size:
        raise ConfigError(
            f"task 'arithmetic': num_eval={num_eval} but ops={ops} with {min_digits}-{max_digits} "
            f"digit operands give only {size} distinct problems (and train needs at least one); "
            f"lower num_eval to at most {size - 1}, or widen the space with a larger max_digits "
            "or more ops"
        )
    # A string seed is hashed with SHA-512 by `random`, so the draw is the same in every process.
    eval_indices = random.Random(f"arithmetic-eval-{seed}").sample(range(size), num_eval)
    train_rng = random.Random(f"arithmetic-train-{seed}")
    train_indices = _sample_excluding(train_rng, size, set(eval_indices), num_train)
    return Task(
        name="arithmetic",
        train=[make_example(*problem_at(i, ops, lo, hi)) for i in train_indices],
        eval=[make_example(*problem_at(i, ops, lo, hi)) for i in eval_indices],
        system_prompt=SYSTEM_PROMPT,
        instruction=INSTRUCTION,
    )


def operand_range(min_digits: int, max_digits: int) -> tuple[int, int]:
    """Inclusive operand bounds; one-digit numbers include 0."""
    lo = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    return lo, 10**max_digits - 1


def problem_at(index: int, ops: tuple[str, ...], lo: int, hi: int) -> tuple[int, str, int]:
    """The problem with this index: mixed radix (op, a, b), b fastest."""
    width = hi - lo + 1
    op_index, rest = divmod(index, width * width)
    a, b = divmod(rest, width)
    return lo + a, ops[op_index], lo + b


def make_example(a: int, op: str, b: int) -> Example:
    """The Example for `a op b`; its id is the canonical problem, e.g. "7+5"."""
    answer = str(_APPLY[op](a, b))
    return Example(id=f"{a}{op}{b}", question=f"What is {a} {op} {b}?", answer=answer)


def _sample_excluding(rng: random.Random, size: int, excluded: set[int], k: int) -> list[int]:
    """`k` indices from [0, size) minus `excluded`; distinct if enough remain, else with
    replacement.

    Rejection sampling when the remainder is at least twice `k` (cheap, nothing materialised);
    otherwise the remainder is listed, which then costs at most about 2k + len(excluded) ints.
    """
    remaining = size - len(excluded)
    if k * 2 <= remaining:
        chosen: dict[int, None] = {}  # insertion-ordered set
        while len(chosen) < k:
            i = rng.randrange(size)
            if i not in excluded:
                chosen[i] = None
        return list(chosen)
    pool = [i for i in range(size) if i not in excluded]
    return rng.sample(pool, k) if k <= len(pool) else rng.choices(pool, k=k)


def _check_ops(ops: object) -> tuple[str, ...]:
    if isinstance(ops, str) or not isinstance(ops, (tuple, list)) or not ops:
        raise ConfigError(
            f"task 'arithmetic': option ops={ops!r} must be a non-empty list drawn from {OPS}"
        )
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ConfigError(
            f"task 'arithmetic': option ops has unknown operator(s) {unknown}; valid: {OPS}"
        )
    return tuple(op for op in OPS if op in ops)


def _check_digits(min_digits: object, max_digits: object) -> None:
    for option, value in (("min_digits", min_digits), ("max_digits", max_digits)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"task 'arithmetic': option {option}={value!r} must be an int >= 1")
    if min_digits > max_digits:
        raise ConfigError(
            f"task 'arithmetic': min_digits={min_digits} is larger than max_digits={max_digits}"
        )
