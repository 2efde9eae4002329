"""``torchrun ... tests/record_ranks.py DIR train ARGS...``: ``podsrl train ARGS...`` in strict mode
(tests/dist_worker.py), each rank appending what its ``sample_step`` decided, one line a step, to
``DIR/rank<r>.jsonl``, so a test can check that every rank took the same decisions:

- sampling: the generation batches, the groups with a signal in each batch (every rank's, gathered:
  for max_variance with a binary reward, the groups whose sampled rewards vary), the groups kept,
  the surplus and the rollouts generated;
- the prompt stream after the step: epoch, position (and the prompts moved to the end of the
  epoch), exploration rate, each prompt's silent streak, the prompts the step sampled (every batch)
  and trained on, and what the step's prompt selection logged.

conftest.py's ``two_rank_sampling_run`` launches it once a session for test_dynamic_sampling.py and
test_prompts.py (issue 45: each launched its own run).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dist_worker import hold_collectives_to_placement, run_module  # noqa: E402

hold_collectives_to_placement()

from podsrl.train import loop, sampling  # noqa: E402

OUT = sys.argv.pop(1)
sample_batch, sample_step, batches, sampled = sampling._sample_batch, loop.sample_step, [], []


def counted(*args, **kwargs):
    out = sample_batch(*args, **kwargs)
    r = out.reward
    batches.append(int((r.nan_to_num(-1.0).amax(1) > r.nan_to_num(2.0).amin(1)).sum()))
    sampled.extend(out.prompt.tolist())
    return out


def recorded(s, step, progress, timer):
    out = sample_step(s, step, progress, timer)
    st = s.prompts.state_dict()
    line = {
        "step": step, "gen_batches": out.gen_batches, "groups": len(out.groups), "surplus": out.surplus, "rollouts": out.rollouts,
        "signal_per_batch": list(batches), "epoch": st["epoch"], "position": st["position"], "back": st["back"], "explore": st.get("explore"),
        "streak": st["streak"].tolist() if "streak" in st else None, "prompts": out.groups.prompt.tolist(), "sampled": list(sampled), **out.prompts,
    }  # fmt: skip
    with open(os.path.join(OUT, f"rank{s.dist.rank}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
    batches.clear()
    sampled.clear()
    return out


sampling._sample_batch, loop.sample_step = counted, recorded
run_module(["podsrl", *sys.argv[1:]])
