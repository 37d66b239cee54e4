"""Workspace roots and their git checkouts ("sources")."""

from __future__ import annotations

import os
from pathlib import Path

from prospero.types.model import Source


def canonical_root(root: str) -> str:
    """Resolve symlinks once (best effort: a missing path is kept as given, made absolute).

    The same string is hashed for the caliband socket name and passed as --workspace-root.
    """
    p = Path(os.path.expanduser(root))
    try:
        return str(p.resolve(strict=True))
    except OSError:
        return str(p.absolute())


def discover_sources(root: str) -> list[Source]:
    """The root itself if it is a git checkout, else its immediate child checkouts, sorted."""
    base = Path(root)
    try:
        if (base / ".git").exists():
            return [Source(name=base.name, path=str(base))]
        children = sorted(
            (c for c in base.iterdir() if c.is_dir() and (c / ".git").exists()),
            key=lambda c: c.name,
        )
    except OSError:
        return []
    return [Source(name=c.name, path=str(c)) for c in children]
