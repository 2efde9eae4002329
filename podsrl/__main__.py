"""``python -m podsrl ...``: the CLI, also what launchers run (``torchrun -m podsrl train``)."""

import sys

from podsrl.cli import main

sys.exit(main())
