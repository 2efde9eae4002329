"""Benchmark: the update with zero-advantage rows skipped against the update that runs them.

    python bench/zero_signal.py               # the embedded SmolLM2-135M, 9 groups of 4, 7 groups (78%) with advantage 0
    python bench/zero_signal.py --quick       # a tiny random Llama: checks the machinery in seconds
    python bench/zero_signal.py --zeros rows  # 78% of the rows at random instead of whole groups

What is measured: podsrl's own ``run_update`` (forward, loss, backward, clip, AdamW step) on one
batch of kept rollouts shaped like the two-digit comparison's GRPO step (configs/compare-2digit.toml:
prompts of ~36 tokens, m = 4 rollouts each, completions of 4-16 tokens, micro-batches of 16), with
9 prompts so that 7 of them, 78% of the rows (GRPO's measured share of zero-variance groups there),
have advantage exactly 0 and the others a random non-zero one. The zero rows are whole groups
(``--zeros groups``, the default): with binary rewards a kept row's advantage is exactly 0 iff its
group's rewards are all equal, so in training a group's rows are skipped together, its prompt with
them. ``--zeros rows`` draws the zero rows at random instead, leaving most prompts to run for a row
or two: the worst case for the saving. Two settings, ``skip_zero_advantage``
on and off, alternate within each round (the order alternates too), so a change in the machine's
load hits both; the headline is the median of the per-round ratios skip / no-skip (target <= 0.35).
The same is done for D3S's token selection (fraction 0.5 of the tokens by |A| x H), whose scoring
pass is skipped for the same rows.

Exactness is printed beside it: the accumulated gradients of the two settings on the same weights
(an SGD with learning rate 0 records them), as the largest absolute difference of any entry and the
largest norm-relative difference of any parameter.

Last line: ``update time skip/no-skip: R (D3S: R2; 78% of rows with advantage 0; max |grad diff| G,
max relative E)``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # update_cost.py, beside this file

PROMPT_LEN = 36
GROUP = 4  # rollouts kept per prompt (GRPO n = m = 4 in the two-digit comparison)


def _load_model(name: str, seed: int):
    """(model, pad id, vocab size) on the CPU: update_cost.py's loader ('tiny': its random Llama)."""
    from update_cost import _load_model as load

    return load(name, seed, "cpu")


def _batch(rows: int, zero_fraction: float, vocab: int, seed: int, whole_groups: bool = True):
    """rows rollouts in groups of GROUP; round(zero_fraction * rows) of them with advantage 0, in whole
    groups (the first ones, rounded to whole groups) or at random."""
    import torch

    from podsrl.train.update import UpdateBatch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range((rows + GROUP - 1) // GROUP)]
    completions = [torch.randint(0, vocab, (int(torch.randint(4, 17, (1,), generator=g)),), generator=g).tolist() for _ in range(rows)]
    advantages = torch.randn(rows, generator=g)
    if whole_groups:
        zeros = torch.arange(round(zero_fraction * rows / GROUP) * GROUP)
    else:
        zeros = torch.randperm(rows, generator=g)[: round(zero_fraction * rows)]
    advantages[zeros] = 0.0
    return UpdateBatch([prompts[i // GROUP] for i in range(rows)], completions, advantages)


def _settings(pad_id: int, skip: bool, token_fraction: float, micro_batch_size: int):
    from podsrl.core.loss import LossSettings
    from podsrl.train.update import UpdateSettings

    loss = LossSettings(eps_low=0.2, aggregation="sequence", max_completion_len=16)
    return UpdateSettings(loss=loss, pad_id=pad_id, micro_batch_size=micro_batch_size, temperature=1.0, grad_clip=1.0,
                          token_fraction=token_fraction, skip_zero_advantage=skip)  # fmt: skip


def _gradient_difference(model, batch, pad_id: int, micro_batch_size: int) -> tuple[float, float]:
    """(max |difference| of any gradient entry, max norm-relative difference of any parameter)."""
    import torch

    from podsrl.train.update import run_update

    class Recorder(torch.optim.SGD):
        def step(self, closure=None):
            self.recorded = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]

    grads = []
    for skip in (False, True):
        optimizer = Recorder([p for p in model.parameters() if p.requires_grad], lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        run_update(model, optimizer, scheduler, batch, _settings(pad_id, skip, 1.0, micro_batch_size))
        grads.append(optimizer.recorded)
    absolute = max(float((a - b).abs().max()) for a, b in zip(*grads))
    relative = max(float((a - b).norm() / b.norm().clamp(min=1e-12)) for a, b in zip(*grads))
    return absolute, relative


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model name or path ('tiny': a random 2-layer Llama)")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 repeats")
    parser.add_argument("--rows", type=int, default=36, help="kept rollouts in the batch (groups of 4)")
    parser.add_argument("--zeros", choices=("groups", "rows"), default="groups", help="zero-advantage rows as whole groups or at random")
    parser.add_argument("--zero-fraction", type=float, default=0.78, help="share of rows with advantage exactly 0")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (each: both settings, alternating order)")
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.model, args.repeats = "tiny", 2

    import torch

    from podsrl.train.update import run_update

    if args.threads:
        torch.set_num_threads(args.threads)
    model, pad_id, vocab = _load_model(args.model, args.seed)
    model.train()
    batch = _batch(args.rows, args.zero_fraction, vocab, args.seed, whole_groups=args.zeros == "groups")
    zero_rows = int((batch.advantages == 0).sum())
    print(f"model {args.model}, {args.rows} rows in groups of {GROUP} ({zero_rows} with advantage 0, as {args.zeros}), "
          f"micro-batch {args.micro_batch_size}, {torch.get_num_threads()} threads")  # fmt: skip

    grad_abs, grad_rel = _gradient_difference(model, batch, pad_id, args.micro_batch_size)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7, fused=True)  # as podsrl train
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    cases = {"GRPO": 1.0, "D3S tokens 0.5": 0.5}
    times = {(case, skip): [] for case in cases for skip in (True, False)}
    run_update(model, optimizer, scheduler, batch, _settings(pad_id, False, 1.0, args.micro_batch_size))  # warm-up
    for r in range(args.repeats):
        for case, fraction in cases.items():
            for skip in ((True, False) if r % 2 == 0 else (False, True)):
                start = time.perf_counter()
                stats = run_update(model, optimizer, scheduler, batch, _settings(pad_id, skip, fraction, args.micro_batch_size))
                times[case, skip].append(time.perf_counter() - start)
                assert stats.rows_run == (args.rows - zero_rows if skip else args.rows)
    ratios = {}
    print(f"{'update':>16} {'skip (s)':>9} {'no skip (s)':>12} {'ratio':>6}")
    for case in cases:
        per_round = [a / b for a, b in zip(times[case, True], times[case, False])]
        ratios[case] = statistics.median(per_round)
        print(f"{case:>16} {statistics.median(times[case, True]):9.2f} {statistics.median(times[case, False]):12.2f} {ratios[case]:6.3f}")
    print(f"gradient, skip vs no skip: max |difference| {grad_abs:.1e}, max norm-relative {grad_rel:.1e}")
    print(
        f"update time skip/no-skip: {ratios['GRPO']:.3f} (D3S: {ratios['D3S tokens 0.5']:.3f}; "
        f"{100 * zero_rows / args.rows:.0f}% of rows with advantage 0, as {args.zeros}; max |grad diff| {grad_abs:.1e}, max relative {grad_rel:.1e})"
    )


if __name__ == "__main__":
    main()
