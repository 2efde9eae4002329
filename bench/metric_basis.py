"""Which mean of the sampled rewards estimates a fixed-n run's ``reward_mean`` under exact early stopping.

    python bench/metric_basis.py          # 200000 simulated groups, a few seconds

Early stopping samples a group until its kept set is settled, so how many rollouts a group gets
depends on its rewards (PODS max-variance, binary rewards: a group with both outcomes stops early,
one whose rewards are all equal runs to n). Simulated here with podsrl's own criterion
(:func:`podsrl.core.early_stop.stop_criterion`) and metrics (:func:`podsrl.train.sampling.sample_metrics`):
prompts whose success probability p is drawn from a Beta law, n = 16 rollouts, m = 4 kept, rounds of
4 (and of 1). Printed per setting: the policy's true mean (the mean of p), what a fixed-n run logs
(every rollout of every group), and three means of the early-stopped rollouts: pooled over every
sampled rollout (podsrl before issue 36), the mean of the per-group means, and the first round of
every group (what ``reward_mean`` is now, podsrl/train/sampling.py). Only the last has the
fixed-n expectation; the first two are biased in opposite directions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from podsrl.core.early_stop import stop_criterion
    from podsrl.train.sampling import Groups, StepSample, sample_metrics

    groups, n, m = 200_000, 16, 4
    torch.manual_seed(0)
    criterion = stop_criterion("max_variance", m, values=(0.0, 1.0))
    for a, b in ((3.0, 1.0), (1.0, 4.0)):
        p = torch.distributions.Beta(a, b).sample((groups,))  # [G]
        rewards = (torch.rand(groups, n) < p[:, None]).float()  # [G, n]
        for size in (4, 1):
            count, running = torch.zeros(groups, dtype=torch.long), torch.ones(groups, dtype=torch.bool)
            while running.any():
                count = torch.where(running, (count + size).clamp(max=n), count)
                seen = torch.where(torch.arange(n) < count[:, None], rewards, torch.nan)  # [G, n]
                running &= (count < n) & ~criterion(seen)
            g = Groups.unsampled(list(range(groups)), n, rank=0, batch=0, rewards=["r"], timed=[])
            sampled = ~seen.isnan()
            g.reward, g.per_reward["r"] = seen, seen
            g.round = torch.where(sampled, (torch.arange(n) // size).float().expand(groups, n), torch.nan)
            g.length, g.truncated = torch.where(sampled, 1.0, torch.nan), torch.where(sampled, 0.0, torch.nan)
            step = StepSample(groups=g, first=g, gen_batches=1, rollouts=int(sampled.sum()), rounds=1, timeouts=0, surplus=0)
            basis = sample_metrics(step, ["r"])["reward_mean"]
            print(
                f"p ~ Beta({a:g}, {b:g}), rounds of {size}: true {float(p.mean()):.3f}, fixed n {float(rewards.mean()):.3f}; "
                f"early stopping ({int(sampled.sum()) / rewards.numel():.2f} of the rollouts): pooled {float(seen.nanmean()):.3f}, "
                f"mean of group means {float(seen.nanmean(dim=1).mean()):.3f}, first round (reward_mean) {basis:.3f}"
            )


if __name__ == "__main__":
    main()
