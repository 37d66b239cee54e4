"""The CLI's own config file: named contexts (a prosperod URL and its token), kubectl-style.

    $XDG_CONFIG_HOME/prospero/config.yaml   (~/.config/prospero/config.yaml; PROSPERO_CLI_CONFIG
                                             names another file)

    current-context: prod
    contexts:
      prod:
        server: https://prospero.example:7878
        token-file: /home/me/.config/prospero/prod.token   # read at each use
      local:
        server: http://127.0.0.1:7878

A context holds either a `token-file` (read at each use, first line) or the `token` itself;
the file is written with mode 0600 (its folder 0700), atomically.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prospero.cli import exits
from prospero.cli.client import CliError

CONFIG_ENV = "PROSPERO_CLI_CONFIG"
CONTEXT_ENV = "PROSPERO_CONTEXT"
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass
class Context:
    name: str
    server: str
    token_file: str | None = None
    token: str | None = None

    def read_token(self) -> str | None:
        """The context's token: its `token`, else the first line of its `token-file`."""
        if self.token:
            return self.token
        if not self.token_file:
            return None
        path = Path(os.path.expanduser(self.token_file))
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise CliError(
                f"context '{self.name}': cannot read its token file {path}: {e.strerror or e}",
                exits.USAGE,
            ) from None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not lines:
            raise CliError(f"context '{self.name}': its token file {path} is empty", exits.USAGE)
        return lines[0]

    def as_yaml(self) -> dict[str, str]:
        out = {"server": self.server}
        if self.token_file:
            out["token-file"] = self.token_file
        if self.token:
            out["token"] = self.token
        return out


@dataclass
class CliConfig:
    current: str | None = None
    contexts: dict[str, Context] = field(default_factory=dict)


def config_path() -> Path:
    given = os.environ.get(CONFIG_ENV)
    if given:
        return Path(os.path.expanduser(given))
    base = os.environ.get("XDG_CONFIG_HOME", "")
    # The XDG spec: a relative XDG_CONFIG_HOME is invalid and ignored.
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "prospero" / "config.yaml"


def check_name(name: str) -> str:
    if not name or len(name) > 100 or not set(name) <= NAME_CHARS:
        raise CliError(
            f"invalid context name {name!r}: use letters, digits, '.', '_' and '-'", exits.USAGE
        )
    return name


def _bad(path: Path, why: str) -> CliError:
    return CliError(f"{path}: {why}", exits.USAGE)


def load(path: Path | None = None) -> CliConfig:
    """The config file (none yet: an empty config). A malformed one is a usage error."""
    import yaml

    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return CliConfig()
    except OSError as e:
        raise _bad(path, f"cannot read it: {e.strerror or e}") from None
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _bad(path, f"not valid YAML: {e}") from None
    if doc is None:
        return CliConfig()
    if not isinstance(doc, dict):
        raise _bad(path, "expected a mapping with current-context and contexts")
    raw = doc.get("contexts") or {}
    if not isinstance(raw, dict):
        raise _bad(path, "contexts must be a mapping of name to {server, token-file}")
    cfg = CliConfig()
    for name, body in raw.items():
        if not isinstance(body, dict) or not isinstance(body.get("server"), str):
            raise _bad(path, f"context {name!r} needs a server URL")
        token_file, token = body.get("token-file"), body.get("token")
        if token_file is not None and not isinstance(token_file, str):
            raise _bad(path, f"context {name!r}: token-file must be a path")
        if token is not None and not isinstance(token, str):
            raise _bad(path, f"context {name!r}: token must be a string")
        cfg.contexts[str(name)] = Context(str(name), body["server"], token_file, token)
    current = doc.get("current-context")
    cfg.current = str(current) if current else None
    return cfg


def save(cfg: CliConfig, path: Path | None = None) -> Path:
    """Write the config atomically, mode 0600 (it may hold tokens), its folder 0700."""
    import yaml

    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "current-context": cfg.current,
        "contexts": {name: c.as_yaml() for name, c in sorted(cfg.contexts.items())},
    }
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    fd, tmp = tempfile.mkstemp(prefix=".config-", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def selected(cfg: CliConfig, name: str | None) -> Context | None:
    """The context `name` (from --context / PROSPERO_CONTEXT), else the current one."""
    if name:
        found = cfg.contexts.get(name)
        if found is None:
            known = ", ".join(sorted(cfg.contexts)) or "none"
            raise CliError(f"no context '{name}' (contexts: {known})", exits.USAGE)
        return found
    if cfg.current:
        return cfg.contexts.get(cfg.current)
    return None
