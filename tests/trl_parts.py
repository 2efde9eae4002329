"""``accelerate launch ... tests/trl_parts.py OUT SCRIPT MODEL [SCRIPT MODEL ...]``: run each SCRIPT
(a check of PODSTrainer on two processes, from test_trl.py or test_trl_compat.py) in turn in these
processes, as ``python SCRIPT MODEL TESTS OUT/<name>`` would run it (TESTS: this folder), then leave without
torch's teardown (conftest.exit_without_teardown). After each script every process prints
``<name>: passed on rank R`` or ``<name>: FAILED on rank R`` and the traceback, and goes on to the
next one (a script checks its results on the main process after gathering them, so a failed check
leaves the processes in step).

conftest.py's ``trl_two_processes`` launches it once a session for every such script: accelerate's
start-up, importing TRL and building the tokenizer cost seconds in each process, and each script
paid them in a launch of its own (issue 45).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

out, *pairs = sys.argv[1:]
rank = os.environ.get("RANK", "0")
for script, model in zip(pairs[::2], pairs[1::2]):
    name = Path(script).stem
    sys.argv = [script, model, str(TESTS), str(Path(out) / name)]
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException:  # noqa: BLE001 - a failed check (or an exit) of one script is reported, and the next one runs
        print(f"{name}: FAILED on rank {rank}\n{traceback.format_exc()}", flush=True)
    else:
        print(f"{name}: passed on rank {rank}", flush=True)

from conftest import exit_without_teardown  # noqa: E402

exit_without_teardown()
