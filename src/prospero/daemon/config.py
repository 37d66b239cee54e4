"""prosperod configuration: flags > `PROSPERO_*` environment > TOML file > defaults.

Every setting has one canonical key, used as the TOML key (dashes or underscores), the flag
(`--key-with-dashes`) and the env var (`PROSPERO_KEY`). Each source replaces a setting
wholesale (e.g. `--default-env` flags replace `default_env` from the file; they do not merge).

TOML example (`prosperod --config /etc/prospero/prosperod.toml`):

    addr = "0.0.0.0:7878"
    data_dir = "/var/lib/prospero"
    poll_interval_ms = 1000
    poll_idle_backoff = 8          # quiet workspaces: up to 8x less often (1 = fixed cadence)
    poll_quiet_after_ms = 10000    # ... once quiet for 10 s
    autostart = false
    default_env = { OLLAMA_BASE_URL = "http://gpu:11434" }
    api_token_file = "/etc/prospero/tokens"
    rate_card = "/etc/prospero/rates.toml"
    log_format = "json"

Decision webhooks (ADR 0006): `--decision-webhook URL` (repeatable), env
`PROSPERO_DECISION_WEBHOOKS` (comma-separated), TOML `decision_webhook = ["https://..."]`.

API tokens: `--api-token-file FILE` (lines `name:token` or a bare `token`; `#` comments) and/or
`PROSPERO_API_TOKEN` (named `env`). Both sources are combined. Binding a non-loopback address
without any token is refused unless `--insecure-no-auth`.
Scoped tokens (ADR 0010): `--api-tokens-file FILE` (lines `NAME SCOPE sha256:HEX`, written by
`prospero token new NAME --scope read|operate|admin --tokens-file FILE`), re-read on change;
the plaintext tokens above are `admin`.

Fleet backend (issue 13): `--fleet-backend local` (default: a caliband per workspace, discovered
or autostarted, or one `--caliband-addr`) or `k8s` (K8sFleet: agents are `CalibanTask` CRs in
`--k8s-namespace`, env `PROSPERO_K8S_NAMESPACE`, default `default`; the Kubernetes API is reached
through `--kubeconfig FILE`, or when absent lightkube's default: the in-cluster service account,
else `$KUBECONFIG`, else `~/.kube/config`). Each pod's caliband is dialled at its CR's
`status.calibandEndpoint` with `--caliband-ca-file`/`--caliband-token-file`/
`--caliband-server-name` (the daemon-wide networked-caliband credentials; `--caliband-addr` is
refused with k8s). Standalone (SQLite) or clustered (`--database-url`) alike. Workspaces are
registered as with the local backend: a name (the CRs' `spec.workspaceRef.name`) and a root,
which must still be an existing absolute directory on prosperod's host, distinct per workspace;
the k8s backend never reads it (it is only shown, with the git sources found under it).

    fleet_backend = "k8s"
    kubeconfig = "/etc/prospero/kubeconfig"   # omit in a pod: its service account
    k8s_namespace = "agents"
    caliband_ca_file = "/etc/prospero/caliband-ca.pem"
    caliband_token_file = "/etc/prospero/caliband-token"

Host allowlist (DNS rebinding; api/guard.py): besides the loopback names, requests are served
only for `--allowed-host NAME` (repeatable; `*.example.com` = any subdomain; `*` disables the
check, which is unsafe), env `PROSPERO_ALLOWED_HOSTS` (comma-separated), TOML
`allowed_host = ["prospero.lan"]`, and the host of `--public-url URL` (the URL browsers use to
reach prosperod, e.g. behind a TLS proxy; its origin is also accepted as same-origin).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import prospero
from prospero.core.errors import InvalidConfig
from prospero.core.fleet.local import CalibandNetworkConfig
from prospero.core.ratecard import DEFAULT_RATES, Rate, RateCard
from prospero.core.store.backend import is_database_url
from prospero.core.tokens import TokenFileError, read_tokens_file
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import TcpEndpoint
from prospero.daemon.runtime import (
    FLEET_BACKENDS,
    DaemonConfig,
    K8sBackendConfig,
    default_data_dir,
)

DEFAULT_ADDR = "127.0.0.1:7878"
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ConfigError(Exception):
    """A configuration problem: prosperod prints it and exits with status 2."""


# ------------------------------------------------------------------------------ value parsers


def parse_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{key}: expected a boolean, got {value!r}")


def parse_int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if n < minimum:
        raise ConfigError(f"{key}: must be >= {minimum}, got {n}")
    return n


def parse_seconds(value: Any, key: str, maximum: float = 86400.0) -> float:
    """A positive, finite number of seconds (e.g. `10`, `2.5`)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a number of seconds, got {value!r}")
    try:
        n = float(value) if isinstance(value, int | float) else float(str(value).strip())
    except ValueError:
        raise ConfigError(f"{key}: expected a number of seconds, got {value!r}") from None
    if not (0 < n <= maximum):  # also refuses nan and inf
        raise ConfigError(f"{key}: must be > 0 and <= {maximum:g} seconds, got {value!r}")
    return n


def parse_factor(value: Any, key: str, maximum: float = 1000.0) -> float:
    """A finite number >= 1 (e.g. `8`, `2.5`)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    try:
        n = float(value) if isinstance(value, int | float) else float(str(value).strip())
    except ValueError:
        raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if not (1 <= n <= maximum):  # also refuses nan and inf
        raise ConfigError(f"{key}: must be >= 1 and <= {maximum:g}, got {value!r}")
    return n


def parse_addr(value: Any, key: str = "addr") -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT`, or a URL like `http://127.0.0.1:7878` (the CLI's format)."""
    s = str(value).strip()
    if "://" in s:
        parts = urlsplit(s)
        if not parts.hostname or parts.port is None:
            raise ConfigError(f"{key}: URL needs a host and a port, got {s!r}")
        return parts.hostname, parts.port
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"{key}: expected HOST:PORT, got {s!r}")
    host = host.strip("[]")
    p = int(port)
    if p > 65535:
        raise ConfigError(f"{key}: port out of range in {s!r}")
    return host, p


def parse_kv(item: str, key: str) -> tuple[str, str]:
    k, sep, v = item.partition("=")
    k = k.strip()
    if not sep or not k:
        raise ConfigError(f"{key}: expected KEY=VALUE, got {item!r}")
    return k, v


def parse_env_map(value: Any, key: str) -> dict[str, str]:
    """A TOML table, a list of `K=V`, or (env var) a comma-separated `K=V,K2=V2`."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        items = [p for p in value.split(",") if p.strip()]
    elif isinstance(value, list | tuple):
        items = [str(p) for p in value]
    else:
        raise ConfigError(f"{key}: expected KEY=VALUE pairs, got {value!r}")
    return dict(parse_kv(p, key) for p in items)


def parse_url_list(value: Any, key: str) -> list[str]:
    """A TOML list, repeated flags, or (env var) a comma-separated list of http(s) URLs."""
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(p).strip() for p in value]
    else:
        raise ConfigError(f"{key}: expected a list of URLs, got {value!r}")
    out: list[str] = []
    for item in items:
        if not item:
            continue
        parts = urlsplit(item)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{key}: expected an http(s) URL, got {item!r}")
        out.append(item)
    return out


def parse_host_list(value: Any, key: str) -> list[str]:
    """A TOML list, repeated flags, or (env var) a comma-separated list of host names, IPs,
    `*.suffix` wildcards or `*`."""
    from prospero.api.guard import HostPolicy

    if isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(p).strip() for p in value]
    else:
        raise ConfigError(f"{key}: expected a list of host names, got {value!r}")
    out = [i for i in items if i]
    try:
        HostPolicy(out)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    return out


def parse_public_url(value: Any, key: str) -> str:
    """An http(s) URL; returns its origin (`scheme://host[:port]`)."""
    from prospero.api.guard import parse_origin

    s = str(value).strip()
    parts = urlsplit(s)
    if parts.scheme not in ("http", "https") or not parts.hostname or parse_origin(s) is None:
        raise ConfigError(f"{key}: expected an http(s) URL, got {value!r}")
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}".lower()


def parse_choice(value: Any, key: str, choices: Sequence[str]) -> str:
    s = str(value).strip().lower()
    if s not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
    return s


# ------------------------------------------------------------------------------ settings table


@dataclass(frozen=True)
class Setting:
    key: str
    help: str
    kind: str = "str"  # str | int | bool | path | kv | list
    env: bool = True
    env_var: str = ""  # overrides the derived PROSPERO_<KEY> name

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env_name(self) -> str:
        return self.env_var or "PROSPERO_" + self.key.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting("addr", f"HTTP bind HOST:PORT (default {DEFAULT_ADDR}; port 0 = ephemeral)"),
    Setting("data_dir", "directory holding events.db (default: $XDG_DATA_HOME/prospero)", "path"),
    Setting(
        "database_url",
        "postgresql://user[:password]@host[:port]/db: keep history, workspaces and decisions "
        "in PostgreSQL instead of <data dir>/events.db; replicas sharing it form a cluster",
    ),
    Setting(
        "replica_id",
        "clustered: this replica's lease identity, unique per replica (default: $HOSTNAME)",
    ),
    Setting(
        "lease_ttl_secs",
        "clustered: lease lifetime on the database clock; a dead replica's agents and "
        "workspaces are taken over after it (default 30)",
        "float",
    ),
    Setting(
        "heartbeat_interval_ms",
        "clustered: lease renewal cadence in ms (default TTL/3, at least 1000)",
        "int",
    ),
    Setting("host", "host label shown in fleet snapshots (default: local)"),
    Setting("poll_interval_ms", "workspace poll cadence in ms (default 2000)", "int"),
    Setting(
        "poll_idle_backoff",
        "a quiet workspace is polled up to this many times less often than --poll-interval-ms "
        "(default 8; 1 = always at the interval)",
        "float",
    ),
    Setting(
        "poll_quiet_after_ms",
        "how long a workspace must be quiet (no change, event, API action) before its polls "
        "back off, in ms (default 10000)",
        "int",
    ),
    Setting("autostart", "spawn caliband for workspaces that have none (default on)", "bool"),
    Setting("caliband_bin", "caliband binary used by autostart (default: caliband)"),
    Setting("default_env", "KEY=VALUE layered under every workspace's caliband env", "kv"),
    Setting("retention_days", "prune events older than N days, hourly (0 = keep all)", "int"),
    Setting("allow_acp", "allow spawning agents with drive protocol 'acp'", "bool"),
    Setting("include_thinking", "keep the model's thinking output in the stream", "bool"),
    Setting(
        "fleet_backend",
        "who runs the agents: local (a caliband per workspace, or --caliband-addr) or k8s "
        "(CalibanTask CRs in --k8s-namespace; pod calibands dialled with --caliband-ca-file/"
        "--caliband-token-file) (default local)",
    ),
    Setting(
        "kubeconfig",
        "k8s backend: kubeconfig file of the cluster (absent: the in-cluster service account "
        "when run in a pod, else $KUBECONFIG, else ~/.kube/config, as lightkube resolves it)",
        "path",
    ),
    Setting("k8s_namespace", "k8s backend: namespace of the CalibanTask CRs (default: default)"),
    Setting("caliband_addr", "one networked caliband HOST:PORT instead of Unix discovery"),
    Setting(
        "caliband_ca_file",
        "PEM CA to verify the networked caliband, or with the k8s backend every pod's "
        "(enables TLS)",
        "path",
    ),
    Setting(
        "caliband_token_file",
        "bearer token file for the networked caliband (k8s backend: for the pods')",
        "path",
    ),
    Setting("caliband_server_name", "TLS server name of the networked (or pod) calibands"),
    Setting("log_format", "text or json (default text)"),
    Setting("log_level", "debug|info|warning|error (default info)"),
    Setting("rate_card", "TOML/JSON file: model -> USD per million tokens", "path"),
    Setting("api_token_file", "API tokens, one per line: `name:token` or `token`", "path"),
    Setting("api_token", "a single API token (prefer the env var or a file)", "str"),
    Setting(
        "api_tokens_file",
        "scoped API tokens, stored hashed (`prospero token new NAME --scope read|operate|admin "
        "--tokens-file FILE`); re-read when it changes",
        "path",
    ),
    Setting(
        "insecure_no_auth",
        "allow binding a non-loopback address without any API token (unsafe: anyone who can "
        "reach it controls the fleet)",
        "bool",
    ),
    Setting(
        "decision_webhook",
        "URL POSTed a JSON body when a permission decision becomes pending or is resolved "
        "(repeatable)",
        "list",
        env_var="PROSPERO_DECISION_WEBHOOKS",
    ),
    Setting(
        "allowed_host",
        "serve requests for this Host name besides loopback (repeatable; `*.example.com`; "
        "`*` disables the DNS-rebinding check: unsafe)",
        "list",
        env_var="PROSPERO_ALLOWED_HOSTS",
    ),
    Setting(
        "public_url",
        "the URL browsers reach prosperod at (e.g. behind a proxy): its host is allowed and its "
        "origin is accepted as same-origin",
    ),
    Setting(
        "header_timeout_s",
        "seconds a client gets to send a request's line and headers; slower ones are closed "
        "(default 10)",
        "float",
    ),
    Setting(
        "body_timeout_s",
        "seconds a client gets to send a request's whole body; slower ones get 408 (default 30)",
        "float",
    ),
    Setting(
        "max_connections",
        "concurrent HTTP connections served; more are refused with 503 (default 2048)",
        "int",
    ),
    Setting(
        "decision_rejoin_grace_ms",
        "how long a decision left pending by a previous prosperod waits for its rejoined "
        "session to ask again before it is cancelled (default 30000)",
        "int",
    ),
    Setting(
        "automation_replay_window_s",
        "seconds an automation webhook's signature is remembered (a repeat is 409 replayed) "
        "and its X-Prospero-Timestamp may be off (default 300)",
        "float",
    ),
    Setting(
        "notify_attempts",
        "attempts per notification delivery before it is logged failed (default 5, max 20)",
        "int",
    ),
    Setting(
        "notify_backoff_s",
        "seconds before a notification's first retry, doubling each time; a Retry-After "
        "header wins (default 0.5)",
        "float",
    ),
)
BY_KEY = {s.key: s for s in SETTINGS}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prosperod",
        description="Prospero daemon: HTTP API and control plane for caliban agents.",
        epilog="Precedence: flags > PROSPERO_* environment > --config TOML file > defaults.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file (env: PROSPERO_CONFIG)")
    p.add_argument("--version", action="version", version=f"prosperod {prospero.__version__}")
    for s in SETTINGS:
        if s.key == "api_token":
            continue  # never on the command line (it would show in `ps`)
        dest = s.key
        if s.kind == "bool":
            p.add_argument(s.flag, dest=dest, action=argparse.BooleanOptionalAction, help=s.help)
        elif s.kind == "kv":
            p.add_argument(s.flag, dest=dest, action="append", metavar="KEY=VALUE", help=s.help)
        elif s.kind == "list":
            metavar = "HOST" if s.key == "allowed_host" else "URL"
            p.add_argument(s.flag, dest=dest, action="append", metavar=metavar, help=s.help)
        else:
            p.add_argument(s.flag, dest=dest, metavar=s.key.split("_")[-1].upper(), help=s.help)
    return p


# ------------------------------------------------------------------------------ loading


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key == "no_autostart":
            key, value = "autostart", not parse_bool(value, raw_key)
        if key not in BY_KEY:
            raise ConfigError(f"config file {path}: unknown setting {raw_key!r}")
        out[key] = value
    return out


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in SETTINGS:
        if s.env and s.env_name in environ:
            out[s.key] = environ[s.env_name]
    if "PROSPERO_NO_AUTOSTART" in environ and "autostart" not in out:
        out["autostart"] = not parse_bool(environ["PROSPERO_NO_AUTOSTART"], "PROSPERO_NO_AUTOSTART")
    return out


def merged_settings(argv: Sequence[str] | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """Raw values per key after precedence (flags > env > file); defaults not filled in."""
    ns = vars(build_parser().parse_args(list(argv) if argv is not None else None))
    config_path = ns.pop("config", None) or environ.get("PROSPERO_CONFIG") or None
    merged: dict[str, Any] = {}
    if config_path:
        merged.update(_read_toml(Path(config_path).expanduser()))
    merged.update(_from_env(environ))
    merged.update(ns)
    return merged


TOKEN_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def parse_token_file(path: Path) -> dict[str, str]:
    """Lines `name:token` or bare `token` (named `token-<line>`); blank lines and `#` comments
    are skipped. A line whose part before the first `:` is not a plain name
    (`[A-Za-z0-9_.@-]{1,64}`) is a bare token; so a bare token that contains `:` after a
    name-like prefix must be written with an explicit name (`ci:abc:def`)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read API token file {path}: {e.strerror or e}") from None
    tokens: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = line.partition(":")
        if not sep or not TOKEN_NAME.match(name.strip()):
            name, token = f"token-{lineno}", line
        name, token = name.strip(), token.strip()
        if not token:
            raise ConfigError(f"API token file {path}, line {lineno}: empty token")
        if name in tokens:
            raise ConfigError(f"API token file {path}, line {lineno}: duplicate name {name!r}")
        tokens[name] = token
    if not tokens:
        raise ConfigError(f"API token file {path} holds no token")
    return tokens


_RATE_FIELDS = {
    "input": "input_per_mtok",
    "input_per_mtok": "input_per_mtok",
    "output": "output_per_mtok",
    "output_per_mtok": "output_per_mtok",
    "cache_write": "cache_write_per_mtok",
    "cache_write_per_mtok": "cache_write_per_mtok",
    "cache_read": "cache_read_per_mtok",
    "cache_read_per_mtok": "cache_read_per_mtok",
}


def load_rate_card(path: Path) -> RateCard:
    """Model -> prices in USD per million tokens, layered over the built-in rates (the local
    table: it overrides the maintained price list, see `core.ratecard`).

    TOML (`[models."claude-sonnet-4-6"] input = 3.0  output = 15.0  cache_read = 0.3`) or JSON
    (`{"models": {"m": {"input": 3, "output": 15}}}`); the `models` level is optional.
    """
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read rate card {path}: {e.strerror or e}") from None
    try:
        if path.suffix.lower() == ".json" or raw.lstrip().startswith(b"{"):
            data = json.loads(raw)
        else:
            data = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"rate card {path} is not valid TOML/JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"rate card {path}: expected a table of models")
    models = data.get("models", data)
    if not isinstance(models, dict):
        raise ConfigError(f"rate card {path}: 'models' must be a table")
    rates = dict(DEFAULT_RATES)
    for model, spec in models.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"rate card {path}: model {model!r} needs a table of prices")
        fields: dict[str, float] = {}
        for k, v in spec.items():
            name = _RATE_FIELDS.get(str(k))
            if name is None:
                raise ConfigError(f"rate card {path}: model {model!r}: unknown price {k!r}")
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ConfigError(f"rate card {path}: model {model!r}: {k} must be a number >= 0")
            fields[name] = float(v)
        if "input_per_mtok" not in fields or "output_per_mtok" not in fields:
            raise ConfigError(f"rate card {path}: model {model!r} needs input and output prices")
        rates[str(model)] = Rate(
            fields["input_per_mtok"],
            fields["output_per_mtok"],
            fields.get("cache_write_per_mtok"),
            fields.get("cache_read_per_mtok"),
        )
    return RateCard(rates=rates)


def _caliband_security(values: Mapping[str, Any]) -> NetworkSecurity | None:
    """The networked calibands' TLS + token (`--caliband-ca-file`, `--caliband-token-file`,
    `--caliband-server-name`), read now so a bad file is a configuration error."""
    ca = values.get("caliband_ca_file")
    token = values.get("caliband_token_file")
    server_name = str(values.get("caliband_server_name") or "caliband")
    if token and not ca:
        raise ConfigError(
            "refusing --caliband-token-file without --caliband-ca-file: the token would travel "
            "in clear"
        )
    if not (ca or token):
        return None
    try:
        return NetworkSecurity.from_files(ca, token, server_name)
    except OSError as e:
        raise ConfigError(f"cannot read caliband TLS/token file: {e}") from None
    except InvalidConfig as e:
        raise ConfigError(f"caliband network config: {e}") from None


def _caliband_network(values: Mapping[str, Any]) -> CalibandNetworkConfig | None:
    addr = values.get("caliband_addr")
    if not addr:
        if values.get("caliband_ca_file") or values.get("caliband_token_file"):
            raise ConfigError(
                "--caliband-ca-file/--caliband-token-file need --caliband-addr "
                "(or --fleet-backend k8s, where they are the pod calibands' credentials)"
            )
        return None
    host, port = parse_addr(addr, "caliband_addr")
    security = _caliband_security(values)
    hp = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return CalibandNetworkConfig(endpoint=TcpEndpoint(addr=hp), security=security)


# A namespace is a DNS-1123 label.
K8S_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _k8s_backend(values: Mapping[str, Any]) -> K8sBackendConfig:
    """`--fleet-backend k8s`: the namespace, the kubeconfig (loaded now, so a missing or
    malformed one is a configuration error) and the pod calibands' TLS + token."""
    import yaml
    from lightkube import ConfigError as KubeConfigError
    from lightkube import KubeConfig

    if values.get("caliband_addr"):
        raise ConfigError(
            "--caliband-addr is for --fleet-backend local: the k8s backend dials each pod's "
            "caliband at its CalibanTask's status.calibandEndpoint"
        )
    namespace = str(values.get("k8s_namespace") or "default").strip()
    if not K8S_NAMESPACE.match(namespace):
        raise ConfigError(
            f"k8s_namespace: expected a Kubernetes namespace (lowercase letters, digits and '-', "
            f"at most 63), got {values.get('k8s_namespace')!r}"
        )
    kubeconfig: Path | None = None
    try:
        if values.get("kubeconfig"):
            kubeconfig = Path(str(values["kubeconfig"])).expanduser()
            KubeConfig.from_file(kubeconfig)
        else:
            KubeConfig.from_env()
    except (
        KubeConfigError,
        yaml.YAMLError,
        OSError,
        ValueError,
        LookupError,
        TypeError,
        AttributeError,
    ) as e:
        where = (
            f"kubeconfig {kubeconfig}"
            if kubeconfig is not None
            else "no --kubeconfig, and neither an in-cluster service account nor "
            "$KUBECONFIG/~/.kube/config is usable"
        )
        raise ConfigError(f"k8s backend: {where}: {e}") from None
    return K8sBackendConfig(
        namespace=namespace, kubeconfig=kubeconfig, caliband_security=_caliband_security(values)
    )


def _fleet_backend(values: Mapping[str, Any], cfg: DaemonConfig) -> None:
    backend = parse_choice(values.get("fleet_backend") or "local", "fleet_backend", FLEET_BACKENDS)
    cfg.fleet_backend = backend
    if backend == "k8s":
        cfg.k8s = _k8s_backend(values)
        return
    given = [BY_KEY[k].flag for k in ("kubeconfig", "k8s_namespace") if values.get(k)]
    if given:
        raise ConfigError(
            f"{'/'.join(given)} {'needs' if len(given) == 1 else 'need'} --fleet-backend k8s "
            "(the fleet backend is local)"
        )
    cfg.caliband_network = _caliband_network(values)


def build_config(values: Mapping[str, Any]) -> DaemonConfig:
    """Turn merged raw values into a DaemonConfig (validating every field)."""
    cfg = DaemonConfig()
    host, port = parse_addr(values.get("addr", DEFAULT_ADDR))
    cfg.bind_host, cfg.port = host, port
    if values.get("data_dir"):
        cfg.data_dir = Path(str(values["data_dir"])).expanduser()
    else:
        cfg.data_dir = default_data_dir()
    if values.get("database_url"):
        url = str(values["database_url"])
        if not is_database_url(url):
            raise ConfigError(
                "database_url must be postgresql://user[:password]@host[:port]/database"
            )
        cfg.database_url = url
    if values.get("replica_id"):
        rid = str(values["replica_id"]).strip()
        if not rid or any(c.isspace() for c in rid) or len(rid) > 200:
            raise ConfigError("replica_id: one word of at most 200 characters")
        cfg.replica_id = rid
    if "lease_ttl_secs" in values:
        cfg.lease_ttl = parse_seconds(values["lease_ttl_secs"], "lease_ttl_secs", 3600.0)
    if "heartbeat_interval_ms" in values:
        cfg.heartbeat_interval = (
            parse_int(values["heartbeat_interval_ms"], "heartbeat_interval_ms", 1) / 1000
        )
    if "host" in values:
        cfg.host_label = str(values["host"]) or "local"
    if "poll_interval_ms" in values:
        cfg.poll_interval = parse_int(values["poll_interval_ms"], "poll_interval_ms", 1) / 1000
    if "poll_idle_backoff" in values:
        cfg.poll_idle_backoff = parse_factor(values["poll_idle_backoff"], "poll_idle_backoff")
    if "poll_quiet_after_ms" in values:
        cfg.poll_quiet_after = (
            parse_int(values["poll_quiet_after_ms"], "poll_quiet_after_ms", 0) / 1000
        )
    if "autostart" in values:
        cfg.autostart = parse_bool(values["autostart"], "autostart")
    if "caliband_bin" in values:
        cfg.caliband_bin = str(values["caliband_bin"])
    if "default_env" in values:
        cfg.default_env = parse_env_map(values["default_env"], "default_env")
    if "retention_days" in values:
        cfg.retention_days = parse_int(values["retention_days"], "retention_days", 0)
    if "allow_acp" in values:
        cfg.allow_acp = parse_bool(values["allow_acp"], "allow_acp")
    if "include_thinking" in values:
        cfg.include_thinking = parse_bool(values["include_thinking"], "include_thinking")
    _fleet_backend(values, cfg)
    if "log_format" in values:
        cfg.log_format = parse_choice(values["log_format"], "log_format", LOG_FORMATS)
    if "log_level" in values:
        cfg.log_level = parse_choice(values["log_level"], "log_level", LOG_LEVELS)
    if values.get("rate_card"):
        cfg.rate_card = load_rate_card(Path(str(values["rate_card"])).expanduser())
    tokens: dict[str, str] = {}
    if values.get("api_token_file"):
        tokens.update(parse_token_file(Path(str(values["api_token_file"])).expanduser()))
    single = str(values.get("api_token") or "").strip()
    if single:
        if "env" in tokens:
            raise ConfigError("API token name 'env' is reserved for PROSPERO_API_TOKEN")
        tokens["env"] = single
    cfg.api_tokens = tokens
    if values.get("api_tokens_file"):
        cfg.api_tokens_file = Path(str(values["api_tokens_file"])).expanduser()
        try:
            scoped = read_tokens_file(cfg.api_tokens_file)
        except TokenFileError as e:
            raise ConfigError(str(e)) from None
        clash = sorted({e.name for e in scoped} & set(tokens))
        if clash:
            raise ConfigError(
                f"API token name(s) {', '.join(clash)} in both {cfg.api_tokens_file} and the "
                "plaintext tokens (--api-token-file / PROSPERO_API_TOKEN)"
            )
    if "insecure_no_auth" in values:
        cfg.insecure_no_auth = parse_bool(values["insecure_no_auth"], "insecure_no_auth")
    if "decision_webhook" in values:
        cfg.decision_webhooks = parse_url_list(values["decision_webhook"], "decision_webhook")
    if "allowed_host" in values:
        cfg.allowed_hosts = parse_host_list(values["allowed_host"], "allowed_host")
    if values.get("public_url"):
        cfg.public_url = parse_public_url(values["public_url"], "public_url")
    if "header_timeout_s" in values:
        cfg.header_timeout = parse_seconds(values["header_timeout_s"], "header_timeout_s")
    if "body_timeout_s" in values:
        cfg.body_timeout = parse_seconds(values["body_timeout_s"], "body_timeout_s")
    if "max_connections" in values:
        cfg.max_connections = parse_int(values["max_connections"], "max_connections", 1)
    if "decision_rejoin_grace_ms" in values:
        cfg.decision_rejoin_grace = (
            parse_int(values["decision_rejoin_grace_ms"], "decision_rejoin_grace_ms", 0) / 1000
        )
    if "automation_replay_window_s" in values:
        cfg.automation_replay_window = parse_seconds(
            values["automation_replay_window_s"], "automation_replay_window_s"
        )
    if "notify_attempts" in values:
        cfg.notify_attempts = parse_int(values["notify_attempts"], "notify_attempts", 1)
        if cfg.notify_attempts > 20:
            raise ConfigError(f"notify_attempts: at most 20, got {values['notify_attempts']!r}")
    if "notify_backoff_s" in values:
        cfg.notify_backoff = parse_seconds(values["notify_backoff_s"], "notify_backoff_s", 3600.0)
    return cfg


def validate(cfg: DaemonConfig) -> None:
    """Start-up refusals that depend on several settings."""
    from prospero.api.server import is_loopback

    if cfg.heartbeat_interval is not None and cfg.heartbeat_interval >= cfg.lease_ttl:
        raise ConfigError(
            f"heartbeat_interval_ms ({cfg.heartbeat_interval * 1000:g}) must be shorter than "
            f"lease_ttl_secs ({cfg.lease_ttl:g}): a lease would expire between renewals"
        )
    no_auth = not cfg.api_tokens and cfg.api_tokens_file is None
    if no_auth and not cfg.insecure_no_auth and not is_loopback(cfg.bind_host):
        raise ConfigError(
            f"refusing to bind non-loopback address {cfg.bind_host} without an API token: "
            "set --api-tokens-file (prospero token new), PROSPERO_API_TOKEN or --api-token-file "
            "(or --insecure-no-auth, which lets anyone who reaches it control the fleet)"
        )


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> DaemonConfig:
    env = os.environ if environ is None else environ
    cfg = build_config(merged_settings(argv, env))
    validate(cfg)
    return cfg
