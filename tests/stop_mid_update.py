"""``torchrun ... tests/stop_mid_update.py DIR train ARGS...``: ``podsrl train ARGS...`` in strict mode
(tests/dist_worker.py) whose step 2 is made slow in its update, and stopped there: each rank writes
its pid to ``DIR/rank<r>``; the first rank to run a forward pass with gradients in step 2 (the
update's, before its optimizer step) writes the time to ``DIR/signalled`` and sends SIGTERM to every
rank, as SLURM and torchrun do; from then on every such forward pass is repeated with pauses for at
least 30 s, unless the signal cuts it short. tests/test_faults.py launches it (issue 68).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dist_worker import hold_collectives_to_placement, run_module  # noqa: E402

hold_collectives_to_placement()

import torch  # noqa: E402

from podsrl.train import loop, update  # noqa: E402

OUT = Path(sys.argv.pop(1))
RANK = os.environ.get("RANK", "0")
(OUT / f"rank{RANK}").write_text(str(os.getpid()))
train_step, forward_logprobs, step = loop.train_step, update.forward_logprobs, [0]


def recorded(run, model, optimizer, scheduler, state):
    step[0] = state.step + 1
    return train_step(run, model, optimizer, scheduler, state)


def slow(*args, **kwargs):
    if step[0] != 2 or not torch.is_grad_enabled():
        return forward_logprobs(*args, **kwargs)
    try:
        os.close(os.open(OUT / "signalled", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        (OUT / "signalled").write_text(str(time.time()))
        for rank in range(int(os.environ["WORLD_SIZE"])):
            while not (OUT / f"rank{rank}").is_file():
                time.sleep(0.01)
            os.kill(int((OUT / f"rank{rank}").read_text()), signal.SIGTERM)
    except FileExistsError:
        pass
    for _ in range(300):
        out = forward_logprobs(*args, **kwargs)
        time.sleep(0.1)
    return out


loop.train_step, update.forward_logprobs = recorded, slow
run_module(["podsrl", *sys.argv[1:]])
