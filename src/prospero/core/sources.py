"""Workspace roots and their git checkouts ("sources")."""

from __future__ import annotations

from pathlib import Path

from prospero.core.discovery import canonical_root
from prospero.types.model import Source

__all__ = ["canonical_root", "discover_sources"]


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
