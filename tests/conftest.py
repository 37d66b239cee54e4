"""Fixtures shared by every test package.

`pg_server` is one throwaway PostgreSQL server for the whole run (`prospero.testkit.postgres`:
Debian's binaries, run as an unprivileged user when the tests run as root), started the first
time a test asks for it; `pg_dsn` is a fresh empty database on it for one test. A machine
without the server binaries fails those tests with what to install: they are never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


# Tests whose assertions bound wall-clock time against the machine's pace (lease TTLs,
# takeovers within 2 x TTL, slow-client timeouts, SIGKILL schedules): `./run test` runs them
# after the rest, alone, as CI always ran them; everything else runs on two xdist workers.
SERIAL = (
    "tests/faults/",
    "tests/api/test_cluster_",
    "tests/api/test_agent_owner_api.py",
    "tests/api/test_k8s_cluster.py",
    "tests/api/test_slow_clients.py",
    "tests/core/test_leases.py",
    "tests/core/test_fencing.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        rel = item.path.relative_to(root).as_posix()
        if rel.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m serial` (`./run test`'s second phase) does not collect the modules that hold no
    serial test: collecting the contract tests alone costs ~35 s (schemathesis builds its
    coverage cases then)."""
    if config.getoption("markexpr", "") != "serial":
        return None
    try:
        rel = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    if collection_path.is_dir():
        inside = rel + "/"
        keep = any(s.startswith(inside) or inside.startswith(s) for s in SERIAL)
        return None if keep or rel == "." else True
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return None if rel.startswith(SERIAL) else True
    return None
