"""Where the running code comes from: the git commit of podsrl's source tree, when it is one."""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def source_commit() -> str | None:
    """The commit of the git checkout podsrl is imported from ("<sha>+dirty" when its tracked files
    have uncommitted changes), or None for an installed wheel or a machine without git."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
