"""Benchmark: vectorised PODS max-variance selection vs a per-group loop (the paper's Algorithm 2).

    python bench/selection.py [--groups 4096] [--n 64] [--m 16] [--loop-groups 256] [--threads 1]

The reference sorts each group, then for every k in 0..m builds the candidate (m - k lowest,
k highest) and computes its variance from scratch: O(n log n + m^2) per group, one group at a
time. It runs on the first --loop-groups groups only and its time is scaled to all groups (the
per-group cost does not depend on the batch size). Both are checked to keep the same variance.
Both run on one CPU thread by default, so the comparison is core for core (the loop's tiny ops
cannot use more; on a shared machine extra OpenMP threads can also make the vectorised side slower).
Headline: Bernoulli rewards (each group's success rate drawn uniformly), the last line printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from podsrl.core.selection import max_variance  # noqa: E402


def loop_max_variance(rewards: torch.Tensor, m: int) -> torch.Tensor:
    """Per-group reference: [G, n] -> [G, n] bool, the paper's Algorithm 2 one group at a time."""
    keep = torch.zeros_like(rewards, dtype=torch.bool)
    n = rewards.shape[1]
    for g in range(rewards.shape[0]):
        row = rewards[g]
        order = torch.argsort(row)
        best_var, best = -1.0, order[:m]
        for k in range(m + 1):
            candidate = torch.cat([order[: m - k], order[n - k :]])
            var = row[candidate].var(unbiased=False).item()
            if var > best_var:
                best_var, best = var, candidate
        keep[g, best] = True
    return keep


def kept_variance(rewards: torch.Tensor, keep: torch.Tensor, m: int) -> torch.Tensor:
    return rewards.double()[keep].view(-1, m).var(dim=1, unbiased=False)  # [G]


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name: str, rewards: torch.Tensor, m: int, loop_groups: int) -> float:
    groups = rewards.shape[0]
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):  # warm-up
        max_variance(rewards, m, generator=gen)
    vectorised = median_seconds(lambda: max_variance(rewards, m, generator=gen), repeats=7)

    subset = rewards[:loop_groups]
    loop = median_seconds(lambda: loop_max_variance(subset, m), repeats=3)
    loop_scaled = loop / loop_groups * groups

    got = kept_variance(subset, max_variance(subset, m, generator=gen), m)
    expected = kept_variance(subset, loop_max_variance(subset, m), m)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-9)

    speedup = loop_scaled / vectorised
    print(
        f"[{name}] vectorised: {vectorised * 1e3:.2f} ms per call ({groups} groups, median of 7) | "
        f"loop: {loop / loop_groups * 1e6:.0f} us per group over {loop_groups} groups (median of 3), "
        f"scaled to {groups} groups: {loop_scaled * 1e3:.0f} ms | speedup {speedup:.0f}x | same kept variance: yes"
    )
    return speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4096)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--loop-groups", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: one core each)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(1234)
    success_rate = torch.rand(args.groups, 1, generator=gen).expand(args.groups, args.n)
    binary = torch.bernoulli(success_rate, generator=gen)  # [G, n] 0/1
    continuous = torch.randn(args.groups, args.n, generator=gen)  # [G, n]

    print(
        f"max_variance B={args.groups} n={args.n} m={args.m}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU thread(s)"
    )
    bench("continuous N(0,1)", continuous, args.m, args.loop_groups)
    speedup = bench("binary Bernoulli", binary, args.m, args.loop_groups)
    print(f"max_variance speedup vs per-group loop: {speedup:.0f}x")


if __name__ == "__main__":
    main()
