"""Prospero: a control plane for fleets of caliban coding agents.

The import package is `prospero`; the distribution is `prospero-fleet` (the name `prospero`
on PyPI belongs to an unrelated project), so the installed version is looked up by that name.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

DISTRIBUTION = "prospero-fleet"

try:
    __version__ = _version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"
