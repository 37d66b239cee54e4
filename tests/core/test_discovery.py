"""Socket discovery and autostart (caliband-wire.md §1.2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prospero.core.caliband_client import CalibandClient
from prospero.core.discovery import (
    autostarted_processes,
    canonical_root,
    ensure_caliband,
    hash16,
    runtime_base_dir,
    socket_path_for,
)
from prospero.core.errors import CalibandUnreachable
from prospero.core.wire.control import SpawnSpec
from prospero.testkit.fake_caliband import FakeCaliband
from tests.support import short_tmpdir, wait_until


def test_hash16_test_vector() -> None:
    assert hash16("/some/repo/root") == "ae89cb2b620ea8fc"


def test_base_dir_precedence() -> None:
    assert runtime_base_dir({"CALIBAN_DAEMON_RUNTIME_DIR": "/r", "XDG_RUNTIME_DIR": "/x"}) == Path(
        "/r"
    )
    assert runtime_base_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == Path("/run/user/7/caliban")
    assert runtime_base_dir({"TMPDIR": "/var/tmp"}) == Path("/var/tmp/caliban-daemon")
    assert runtime_base_dir({}) == Path("/tmp/caliban-daemon")
    # caliban's resolver ignores an empty runtime dir and a relative XDG_RUNTIME_DIR (§11.12)
    assert runtime_base_dir({"CALIBAN_DAEMON_RUNTIME_DIR": "", "XDG_RUNTIME_DIR": "/x"}) == Path(
        "/x/caliban"
    )
    assert runtime_base_dir({"XDG_RUNTIME_DIR": "rel", "TMPDIR": "/t"}) == Path("/t/caliban-daemon")
    assert runtime_base_dir({"TMPDIR": ""}) == Path("/tmp/caliban-daemon")


def test_socket_path_for_uses_hash_of_root() -> None:
    env = {"CALIBAN_DAEMON_RUNTIME_DIR": "/run/c"}
    assert socket_path_for("/some/repo/root", env) == "/run/c/ae89cb2b620ea8fc.sock"


def test_canonical_root_resolves_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert canonical_root(link) == os.path.realpath(real)
    assert canonical_root(str(link) + "/") == os.path.realpath(real)
    # non-existent paths are kept (absolutised)
    assert canonical_root(tmp_path / "missing" / "x") == os.path.realpath(tmp_path) + "/missing/x"
    # both spellings land on the same socket
    assert socket_path_for(canonical_root(link), {}) == socket_path_for(canonical_root(real), {})


async def test_ensure_finds_running_caliband(tmp_path: Path) -> None:
    run = short_tmpdir()
    env = {"CALIBAN_DAEMON_RUNTIME_DIR": run}
    root = canonical_root(tmp_path)
    fake = await FakeCaliband.start_unix(socket_path_for(root, env), root=root)
    try:
        ep = await ensure_caliband(tmp_path, autostart=False, env=env)
        assert ep.path == fake.endpoint.path  # type: ignore[union-attr]
        await CalibandClient(ep).status()
    finally:
        await fake.stop()
        shutil.rmtree(run, ignore_errors=True)


async def test_no_autostart_is_unreachable(tmp_path: Path) -> None:
    run = short_tmpdir()
    with pytest.raises(CalibandUnreachable, match="autostart is off: start `caliband --work"):
        await ensure_caliband(tmp_path, autostart=False, env={"CALIBAN_DAEMON_RUNTIME_DIR": run})
    shutil.rmtree(run, ignore_errors=True)


async def test_missing_binary_is_unreachable_with_the_fix(tmp_path: Path) -> None:
    run = short_tmpdir()
    missing = tmp_path / "no-such-caliband"
    with pytest.raises(CalibandUnreachable) as info:
        await ensure_caliband(
            tmp_path, autostart=True, binary=str(missing), env={"CALIBAN_DAEMON_RUNTIME_DIR": run}
        )
    assert str(info.value) == (
        f"caliband binary {missing} does not exist: install caliban there, or pass "
        "--caliband-bin PATH to prosperod (or caliband_bin in its config file)"
    )
    # a bare name is looked up on the PATH the caliband would be started with
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(CalibandUnreachable) as info:
        await ensure_caliband(
            tmp_path,
            autostart=True,
            binary="caliband",
            env={"CALIBAN_DAEMON_RUNTIME_DIR": run, "PATH": str(empty)},
        )
    assert str(info.value).startswith("caliband not found on PATH: install caliban, or pass ")
    assert "Errno" not in str(info.value)
    shutil.rmtree(run, ignore_errors=True)


def _argv0(p: subprocess.Popen[bytes]) -> str:
    args = p.args
    return str(args[0]) if isinstance(args, list | tuple) else str(args)


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "caliband"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


async def test_binary_that_exits_fails_fast(tmp_path: Path) -> None:
    run = short_tmpdir()
    binary = _script(tmp_path, "exit 3\n")
    with pytest.raises(CalibandUnreachable, match="exited with code 3"):
        await ensure_caliband(
            tmp_path, autostart=True, binary=binary, env={"CALIBAN_DAEMON_RUNTIME_DIR": run}
        )
    shutil.rmtree(run, ignore_errors=True)


async def test_binary_that_never_listens_times_out(tmp_path: Path) -> None:
    run = short_tmpdir()
    binary = _script(tmp_path, "exec sleep 30\n")
    with pytest.raises(CalibandUnreachable, match="did not listen"):
        await ensure_caliband(
            tmp_path,
            autostart=True,
            binary=binary,
            env={"CALIBAN_DAEMON_RUNTIME_DIR": run},
            timeout=0.3,
        )
    # the stray daemon was terminated
    await wait_until(lambda: not any(_argv0(p) == binary for p in autostarted_processes()), 5.0)
    shutil.rmtree(run, ignore_errors=True)


async def test_autostart_runs_fake_caliband_binary(tmp_path: Path) -> None:
    """A shell script standing in for `caliband` execs the fake, which derives its socket path
    from --workspace-root and the env overlay exactly as discovery does."""
    run = short_tmpdir()
    repo = tmp_path / "repo"
    repo.mkdir()
    link = tmp_path / "alias"
    link.symlink_to(repo)
    log = tmp_path / "args.txt"
    binary = _script(
        tmp_path,
        f'echo "$@" > "{log}"\nexec "{sys.executable}" -m prospero.testkit.fake_caliband "$@"\n',
    )
    env = {"CALIBAN_DAEMON_RUNTIME_DIR": run, "FAKE_MARKER": "1"}
    ep = await ensure_caliband(link, autostart=True, binary=binary, env=env, timeout=20.0)
    client = CalibandClient(ep)
    try:
        canonical = canonical_root(repo)
        assert ep.path == f"{run}/{hash16(canonical)}.sock"
        assert log.read_text().split() == ["--workspace-root", canonical]
        st = await client.status()
        assert st.endpoint == ep
        # it is a working caliband: spawn an agent and see it listed
        spawned = await client.spawn(SpawnSpec(initial_prompt="hi"))
        assert spawned.id in [a.id for a in await client.list()]
        # a second ensure finds the running daemon without starting another
        assert await ensure_caliband(repo, autostart=True, binary="/nonexistent", env=env) == ep
    finally:
        await client.shutdown()
        await wait_until(
            lambda: not os.path.exists(ep.path), 10.0, what="socket removed after shutdown"
        )
        procs = [p for p in autostarted_processes() if _argv0(p) == binary]
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(run, ignore_errors=True)
