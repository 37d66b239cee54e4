"""Fixtures shared by every test package.

`pg_server` is one throwaway PostgreSQL server for the whole run (`prospero.testkit.postgres`:
Debian's binaries, run as an unprivileged user when the tests run as root), started the first
time a test asks for it; `pg_dsn` is a fresh empty database on it for one test. A machine
without the server binaries fails those tests with what to install: they are never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prospero.testkit.postgres import PgServer


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    pg = PgServer().start()
    try:
        yield pg
    finally:
        pg.stop(remove_in_background=True)  # its files (a database per test) go after the run


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> str:
    return pg_server.create_database()
