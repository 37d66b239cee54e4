"""Finding (and autostarting) the caliband of a workspace root (caliband-wire.md §1.2).

Control socket: `<base>/<hash16>.sock` where

    base   = $CALIBAN_DAEMON_RUNTIME_DIR        (if set and non-empty)
           | $XDG_RUNTIME_DIR/caliban           (if set, non-empty and absolute)
           | ${TMPDIR:-/tmp}/caliban-daemon
    hash16 = first 16 hex chars of SHA-256(<workspace root string as given to caliband>)

The base-dir rules follow caliban's own resolver (the daemon decides where it binds), which
ignores an empty runtime dir and a relative XDG_RUNTIME_DIR; upstream Rust Prospero did not
(caliband-wire.md §11.12), which could make both sides disagree.

The root is canonicalised once (`canonical_root`) and that exact string is both hashed and
passed as `--workspace-root` on autostart, so both sides compute the same name.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from prospero.core.aio import wait_for
from prospero.core.errors import CalibandUnreachable
from prospero.core.wire.control import UnixEndpoint

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.05
PROBE_TIMEOUT = 2.0

# Daemons we started. Kept referenced so Popen does not warn on garbage collection and so the
# exit status of one that died is reaped; they are detached and outlive us by design.
_CHILDREN: list[subprocess.Popen[bytes]] = []


def autostarted_processes() -> list[subprocess.Popen[bytes]]:
    """caliband processes started by `ensure_caliband` in this process that are still alive."""
    _CHILDREN[:] = [p for p in _CHILDREN if p.poll() is None]
    return list(_CHILDREN)


def hash16(root: str) -> str:
    """First 16 lowercase hex chars of SHA-256 of the root path string."""
    return hashlib.sha256(root.encode()).hexdigest()[:16]


def canonical_root(path: str | os.PathLike[str]) -> str:
    """Absolute path with symlinks resolved; a non-existent path is kept (absolutised)."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def runtime_base_dir(env: Mapping[str, str] | None = None) -> Path:
    e = os.environ if env is None else env
    explicit = e.get("CALIBAN_DAEMON_RUNTIME_DIR", "")
    if explicit:
        return Path(explicit)
    xdg = e.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "caliban"
    return Path(e.get("TMPDIR") or "/tmp") / "caliban-daemon"


def socket_path_for(root: str, env: Mapping[str, str] | None = None) -> str:
    """Control socket path for `root` (hashed verbatim: pass a canonical root)."""
    return str(runtime_base_dir(env) / f"{hash16(root)}.sock")


def effective_env(overlay: Mapping[str, str] | None) -> dict[str, str]:
    """The environment an autostarted caliband sees: ours, overlaid."""
    merged = dict(os.environ)
    if overlay:
        merged.update(overlay)
    return merged


async def probe_unix(path: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """True when something accepts connections on the Unix socket `path`."""
    try:
        _, writer = await wait_for(asyncio.open_unix_connection(path), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await wait_for(writer.wait_closed(), 1.0)
    return True


def _launch_detached(argv: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
    """Start a daemon in its own session (it outlives us; SIGINT to our group spares it).

    Not an asyncio child on purpose: its lifetime is not tied to this event loop."""
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd if os.path.isdir(cwd) else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    _CHILDREN.append(proc)
    return proc


async def ensure_caliband(
    root: str | os.PathLike[str],
    *,
    autostart: bool,
    binary: str = "caliband",
    env: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> UnixEndpoint:
    """Return the control endpoint of `root`'s caliband, starting it if allowed.

    The socket path is computed from our environment overlaid with `env` (the same environment
    the autostarted daemon gets, so both sides agree). If the socket refuses and `autostart` is
    on, exec `<binary> --workspace-root <canonical root>` detached, then poll `connect()` every
    50 ms for up to `timeout` seconds. Raises CalibandUnreachable otherwise.
    """
    canonical = canonical_root(root)
    full_env = effective_env(env)
    path = socket_path_for(canonical, full_env)
    endpoint = UnixEndpoint(path=path)
    if await probe_unix(path):
        return endpoint
    if not autostart:
        raise CalibandUnreachable(
            f"caliband for {canonical} is not running (no listener at {path}) and autostart is "
            f"off: start `caliband --workspace-root {canonical}`, or run prosperod with --autostart"
        )
    log.info("autostarting caliband: %s --workspace-root %s (socket %s)", binary, canonical, path)
    try:
        proc = _launch_detached([binary, "--workspace-root", canonical], full_env, canonical)
    except OSError as e:
        raise CalibandUnreachable(launch_failure(binary, canonical, e)) from e
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await probe_unix(path, timeout=max(0.05, min(PROBE_TIMEOUT, deadline - loop.time()))):
            log.info("caliband for %s listens on %s", canonical, path)
            return endpoint
        code = proc.poll()
        if code is not None:
            raise CalibandUnreachable(
                f"caliband ({binary!r}) for {canonical} exited with code {code} before listening "
                f"on {path} (its own message is in prosperod's log: caliband's stderr is "
                "prosperod's)"
            )
        if loop.time() >= deadline:
            with contextlib.suppress(OSError):
                proc.terminate()
            raise CalibandUnreachable(
                f"caliband ({binary!r}) for {canonical} did not listen on {path} within "
                f"{timeout:g}s and was stopped (see prosperod's log for its output)"
            )
        await asyncio.sleep(POLL_INTERVAL)


def launch_failure(binary: str, root: str, e: OSError) -> str:
    """Why `binary` could not be started for `root`, and what to do about it."""
    fix = "pass --caliband-bin PATH to prosperod (or caliband_bin in its config file)"
    if isinstance(e, FileNotFoundError):
        if os.sep not in binary:
            return f"{binary} not found on PATH: install caliban, or {fix}"
        return f"caliband binary {binary} does not exist: install caliban there, or {fix}"
    if isinstance(e, PermissionError):
        return f"caliband binary {binary} cannot be executed ({e.strerror or e}): {fix}"
    return f"cannot start caliband ({binary!r}) for {root}: {e}"
