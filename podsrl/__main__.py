"""``python -m podsrl ...``: the CLI, also what launchers run (``torchrun -m podsrl train``); through
:func:`podsrl.launch.entry`, as the ``podsrl`` command."""

from podsrl.launch import entry

entry()
