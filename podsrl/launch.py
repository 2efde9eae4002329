"""The ``podsrl`` command and ``python -m podsrl``: glibc's allocator set up first where asked
(:func:`podsrl.hostmem.restart_if_asked`, before anything imports torch), then the CLI."""

from __future__ import annotations

import sys

from podsrl.hostmem import restart_if_asked

__all__ = ["entry"]


def entry() -> None:
    restart_if_asked()
    from podsrl.cli import main

    sys.exit(main())
