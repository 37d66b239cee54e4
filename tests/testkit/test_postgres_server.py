"""The throwaway PostgreSQL server the clustered-store tests run on (`testkit.postgres`)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import asyncpg

from prospero.testkit.postgres import PgServer


async def test_each_database_is_fresh_and_separate(pg_server: PgServer, pg_dsn: str) -> None:
    other = pg_server.create_database()
    assert other != pg_dsn
    a = await asyncpg.connect(pg_dsn)
    b = await asyncpg.connect(other)
    try:
        await a.execute("CREATE TABLE t (x int)")
        await a.execute("INSERT INTO t VALUES (1)")
        assert await a.fetchval("SELECT count(*) FROM t") == 1
        missing = await b.fetchval("SELECT to_regclass('public.t')")
        assert missing is None
    finally:
        await a.close()
        await b.close()


def test_server_runs_unprivileged_on_loopback(pg_server: PgServer) -> None:
    assert pg_server.dir is not None
    pid = int((pg_server.dir / "data" / "postmaster.pid").read_text().split()[0])
    uid = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    assert uid != 0  # postgres refuses root; run as root, the server runs as `nobody`
    assert uid == (os.geteuid() if os.geteuid() != 0 else pwd.getpwnam("nobody").pw_uid)
