"""A workspace's networked caliband: the address it names and which agents its root holds."""

from __future__ import annotations

import pytest

from prospero.core.caliband_net import parse_host_port, root_contains
from prospero.core.errors import InvalidConfig


@pytest.mark.parametrize(
    ("given", "addr"),
    [
        ("127.0.0.1:7000", "127.0.0.1:7000"),
        (" caliband.internal:443 ", "caliband.internal:443"),
        ("[::1]:7000", "[::1]:7000"),
        ("host:0080", "host:80"),
    ],
)
def test_host_port(given: str, addr: str) -> None:
    assert parse_host_port(given) == addr


@pytest.mark.parametrize(
    "bad", ["host", ":7000", "host:", "host:0", "host:65536", "::1:7000", "a b:1", "h/x:1", "[]:1"]
)
def test_bad_host_port(bad: str) -> None:
    with pytest.raises(InvalidConfig, match="expected HOST:PORT"):
        parse_host_port(bad)


@pytest.mark.parametrize(
    ("root", "path", "inside"),
    [
        ("/a/b", "/a/b", True),
        ("/a/b", "/a/b/c", True),
        ("/a/b/", "/a/b/c/", True),
        ("/a/b", "/a/b/./c/../d", True),
        ("/a/b", "/a/bc", False),
        ("/a/b", "/a", False),
        ("/a/b", "/a/b/../bc", False),
        ("/", "/x", True),
    ],
)
def test_root_contains(root: str, path: str, inside: bool) -> None:
    assert root_contains(root, path) is inside
