"""Networked calibands (TCP + TLS + bearer token): prosperod's default one (`--caliband-addr`)
and a workspace's own (`RepoProviderConfig.caliband`, `CalibandEndpointConfig`).

A workspace's endpoint names its CA and token files; they are read here, when the endpoint is
checked (add/config time: a bad `host:port`, a relative or unreadable file is `InvalidConfig`,
400, before anything is stored) and when LocalFleet builds the client that dials it. The token
lives only in its file and in memory, never in the store or a response.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from prospero.core.errors import InvalidConfig
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import TcpEndpoint
from prospero.types.model import CalibandEndpointConfig

DEFAULT_SERVER_NAME = "caliband"


@dataclass(frozen=True)
class CalibandNetworkConfig:
    """One networked caliband: its control endpoint and how to dial it (TLS + token)."""

    endpoint: TcpEndpoint
    security: NetworkSecurity | None = None


def parse_host_port(value: str, what: str = "caliband addr") -> str:
    """`HOST:PORT` or `[v6]:PORT` as caliband's bare `addr` (a v6 host bracketed), else
    InvalidConfig."""
    s = value.strip()
    host, sep, port = s.rpartition(":")
    host = host.strip()
    bracketed = host.startswith("[") and host.endswith("]")
    bare = host[1:-1] if bracketed else host
    if (
        not sep
        or not bare
        or not port.isdigit()
        or not 0 < int(port) <= 65535
        or any(c.isspace() or c in "/[]@" for c in bare)
        or (":" in bare and not bracketed)
    ):
        raise InvalidConfig(f"{what}: expected HOST:PORT (port 1-65535), got {value!r}")
    return f"[{bare}]:{int(port)}" if ":" in bare else f"{bare}:{int(port)}"


def _absolute_file(path: str, what: str) -> str:
    if not os.path.isabs(path):
        raise InvalidConfig(f"caliband {what} must be an absolute path, got {path!r}")
    return path


def network_config(cfg: CalibandEndpointConfig) -> CalibandNetworkConfig:
    """The endpoint and security `cfg` names, its files read now (InvalidConfig, 400, for a
    bad address, a relative, missing or unreadable file, an empty token, a CA without a
    certificate, or a token without a CA: it would travel in clear)."""
    addr = parse_host_port(cfg.addr)
    ca_file = _absolute_file(cfg.ca_file, "ca_file") if cfg.ca_file else None
    token_file = _absolute_file(cfg.token_file, "token_file") if cfg.token_file else None
    if token_file and not ca_file:
        raise InvalidConfig("caliband token_file needs ca_file: the token would travel in clear")
    if cfg.server_name is not None and not ca_file:
        raise InvalidConfig("caliband server_name needs ca_file (it names the TLS server)")
    security: NetworkSecurity | None = None
    if ca_file or token_file:
        for path, what in ((ca_file, "ca_file"), (token_file, "token_file")):
            if path is None:
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise InvalidConfig(
                    f"caliband {what} {path!r} is not readable: {e.strerror or e}"
                ) from None
        try:
            security = NetworkSecurity.from_files(
                ca_file, token_file, cfg.server_name or DEFAULT_SERVER_NAME
            )
        except OSError as e:
            raise InvalidConfig(f"cannot read caliband TLS/token file: {e}") from None
        except UnicodeDecodeError:
            raise InvalidConfig(f"caliband token_file {token_file!r} is not text") from None
        except InvalidConfig as e:
            raise InvalidConfig(f"caliband endpoint: {e}") from None
    return CalibandNetworkConfig(endpoint=TcpEndpoint(addr=addr), security=security)


def root_contains(root: str, path: str) -> bool:
    """Whether `path` lies in `root` (or is it), on normalised paths and whole components:
    `/a/b` contains `/a/b/c`, not `/a/bc`."""
    r = os.path.normpath(root)
    p = os.path.normpath(path)
    if r == p:
        return True
    prefix = r if r.endswith(os.sep) else r + os.sep
    return p.startswith(prefix)
