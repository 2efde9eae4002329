"""``python -m podsrl ...``: the CLI, also what launchers run (``torchrun -m podsrl train``); through
:func:`podsrl.hostmem.entry`, as the ``podsrl`` command."""

from podsrl.hostmem import entry

entry()
