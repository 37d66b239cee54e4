"""A throwaway PostgreSQL server for tests and benches: Debian's `postgresql` binaries, a fresh
cluster in a temp dir, on a free port on 127.0.0.1, torn down with its files.

PostgreSQL refuses to run as root, so when this process is root the cluster is created and run
as an unprivileged user (`nobody` unless `PROSPERO_PG_USER` names another), which owns the temp
dir; otherwise it runs as the current user. Binaries: `PROSPERO_PG_BINDIR`, else the newest
`/usr/lib/postgresql/<version>/bin`, else `initdb` on PATH. Missing binaries are an error that
says what to install, never a skip (`.ci/run` installs Debian's `postgresql`).

    with PgServer() as pg:
        dsn = pg.create_database()      # a fresh, empty database: postgresql://...

`python -m prospero.testkit.postgres` starts one and prints `{"dsn": ...}` until interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

START_TIMEOUT = 30.0
STOCK = 16  # empty databases created per psql run (`create_database`)


class PgUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed (or the server would not start)."""


def find_bindir() -> Path:
    env = os.environ.get("PROSPERO_PG_BINDIR")
    if env:
        return Path(env)
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted(
            (p for p in root.iterdir() if (p / "bin" / "initdb").exists()),
            key=lambda p: int(p.name) if p.name.isdigit() else 0,
        )
        if versions:
            return versions[-1] / "bin"
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PgUnavailable(
        "PostgreSQL server binaries not found (no /usr/lib/postgresql/*/bin/initdb): install "
        "Debian's `postgresql` package (`.ci/run` does) or set PROSPERO_PG_BINDIR"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster: `start()` (or `with`), `create_database()`, `stop()`."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.port = 0
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        self._stock: list[str] = []
        if os.geteuid() == 0:
            self._user = os.environ.get("PROSPERO_PG_USER", "nobody")

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://prospero@127.0.0.1:{self.port}/postgres"

    def dsn(self, database: str) -> str:
        return f"postgresql://prospero@127.0.0.1:{self.port}/{database}"

    def _ids(self) -> tuple[int | None, int | None, list[int] | None]:
        """(uid, gid, supplementary groups) to run the server as; all None: as ourselves."""
        if self._user is None:
            return None, None, None
        pw = pwd.getpwnam(self._user)
        return pw.pw_uid, pw.pw_gid, []

    def start(self) -> PgServer:
        self.dir = Path(tempfile.mkdtemp(prefix="pr-pg-", dir="/tmp"))
        data, sock = self.dir / "data", self.dir / "sock"
        sock.mkdir()
        if self._user is not None:
            pw = pwd.getpwnam(self._user)
            for p in (self.dir, sock):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        uid, gid, groups = self._ids()
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "HOME": str(self.dir)}
        init = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "prospero",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            capture_output=True,
            env=env,
            cwd=self.dir,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
        if init.returncode != 0:
            raise PgUnavailable(f"initdb failed: {init.stderr.decode(errors='replace')[-2000:]}")
        self.port = free_port()
        log = open(self.dir / "server.log", "wb")
        self._proc = subprocess.Popen(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(self.port),
                "-k",
                str(sock),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.dir,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                out = (self.dir / "server.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise PgUnavailable(f"postgres exited at start: {out}")
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise PgUnavailable(f"postgres not ready within {START_TIMEOUT:g}s")
            time.sleep(0.05)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its DSN. Unnamed ones are created `STOCK` at a time
        (one psql process for all of them: the process, not the CREATE, is the cost) and
        handed out one per call, each used once."""
        if name is not None:
            self._create([name])
            return self.dsn(name)
        if not self._stock:
            self._stock = [f"t_{uuid.uuid4().hex[:12]}" for _ in range(STOCK)]
            self._create(self._stock)
        return self.dsn(self._stock.pop())

    def _create(self, names: list[str]) -> None:
        args = [str(self.bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", self.admin_dsn]
        for n in names:  # one -c each: CREATE DATABASE cannot share a transaction
            args += ["-c", f'CREATE DATABASE "{n}" TEMPLATE template0']
        out = subprocess.run(args, capture_output=True)
        if out.returncode != 0:
            raise PgUnavailable(f"CREATE DATABASE failed: {out.stderr.decode(errors='replace')}")

    def stop(self, *, remove_in_background: bool = False) -> None:
        """Stop the server and remove its files. `remove_in_background`: a detached `rm -rf`
        removes them after this returns (a test suite's cluster holds a database per test,
        gigabytes that took its teardown ~15 s to delete)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # SIGQUIT: immediate shutdown. The cluster is thrown away, so no shutdown checkpoint
            # (SIGINT's fast shutdown wrote one over every database a suite had created: the
            # suite's teardown waited ~10 s for it, then killed it anyway).
            proc.send_signal(signal.SIGQUIT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if self.dir is not None:
            if remove_in_background:
                subprocess.Popen(
                    ["rm", "-rf", str(self.dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> None:
    with PgServer() as pg:
        print(json.dumps({"dsn": pg.create_database("prospero"), "admin_dsn": pg.admin_dsn}))
        sys.stdout.flush()
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
