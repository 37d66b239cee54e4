"""Workspace roots and their git checkouts ("sources")."""

from __future__ import annotations

import os
from pathlib import Path

from prospero.core.discovery import canonical_root
from prospero.core.errors import InvalidConfig
from prospero.types.model import Source
from prospero.types.text import control_char_in_name, describe_bad_char

__all__ = ["canonical_root", "discover_sources", "validate_root"]


def validate_root(root: str) -> str:
    """The canonical form of a workspace root given by a user, or InvalidConfig (400).

    A root must be an absolute path (a relative one would resolve against the daemon's working
    directory) to an existing directory, without control characters. Checked before anything
    is registered, so a refused root leaves no trace."""
    found = control_char_in_name(root)
    if found is not None:
        raise InvalidConfig(f"workspace root {describe_bad_char(*found)}")
    if not root.strip():
        raise InvalidConfig("a local workspace needs a root directory")
    if not os.path.isabs(root):
        raise InvalidConfig(f"workspace root must be an absolute path, got {root!r}")
    canon = canonical_root(root)
    try:
        is_dir = os.path.isdir(canon)
        exists = is_dir or os.path.exists(canon)
    except (OSError, ValueError):
        is_dir = exists = False
    if not exists:
        raise InvalidConfig(f"workspace root {root!r} does not exist")
    if not is_dir:
        raise InvalidConfig(f"workspace root {root!r} is not a directory")
    return canon


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
