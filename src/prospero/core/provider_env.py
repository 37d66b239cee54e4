"""Provider credentials and endpoints for a workspace's caliband (caliband-wire.md §3.4).

Credentials never travel in the SpawnSpec: they go into the caliband process environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from prospero.core.caliband_net import network_config
from prospero.core.errors import ProviderMisconfigured
from prospero.types.model import RepoProviderConfig

# provider -> (base-url variable, api-key variable or None)
PROVIDER_VARS: dict[str, tuple[str, str | None]] = {
    "ollama": ("OLLAMA_BASE_URL", None),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
    "google": ("GEMINI_BASE_URL", "GEMINI_API_KEY"),
}


def validate_config(cfg: RepoProviderConfig) -> None:
    """Checks at add/set time."""
    if cfg.provider is not None:
        vars_ = PROVIDER_VARS.get(cfg.provider.lower())
        if cfg.api_key_from_env and vars_ is not None and vars_[1] is None:
            raise ProviderMisconfigured(
                f"provider '{cfg.provider}' takes no API key; drop api_key_from_env"
            )
    for key in cfg.env:
        if not key or "=" in key:
            raise ProviderMisconfigured(f"invalid environment variable name {key!r}")
    if cfg.caliband is not None:
        network_config(cfg.caliband)  # InvalidConfig (400): address, files readable


def resolve_env(
    cfg: RepoProviderConfig,
    default_env: Mapping[str, str] | None = None,
    process_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Layers, low to high: default env, provider vars (+ key copied from prosperod's env), raw env."""
    penv = os.environ if process_env is None else process_env
    out: dict[str, str] = dict(default_env or {})
    if cfg.provider:
        out["CALIBAN_PROVIDER"] = cfg.provider
        vars_ = PROVIDER_VARS.get(cfg.provider.lower())
        if vars_ is not None:
            base_var, key_var = vars_
            if cfg.base_url:
                out[base_var] = cfg.base_url
            if key_var and cfg.api_key_from_env and penv.get(cfg.api_key_from_env):
                out[key_var] = penv[cfg.api_key_from_env]
    out.update(cfg.env)
    return out


def missing_key(
    cfg: RepoProviderConfig,
    default_env: Mapping[str, str] | None = None,
    process_env: Mapping[str, str] | None = None,
) -> str | None:
    """Why a spawn under `cfg` would be refused for want of its provider's key (the key
    variable does not resolve: see `resolve_env`), with what to do; None when nothing is
    missing."""
    if not cfg.provider:
        return None
    vars_ = PROVIDER_VARS.get(cfg.provider.lower())
    if vars_ is None or vars_[1] is None:
        return None
    key_var = vars_[1]
    env = resolve_env(cfg, default_env, process_env)
    if env.get(key_var):
        return None
    hint = (
        f"set {cfg.api_key_from_env} in prosperod's environment"
        if cfg.api_key_from_env
        else f"configure api_key_from_env (the name of a variable holding the key) or env {key_var}"
    )
    return f"provider '{cfg.provider}' needs {key_var}: {hint}"


def config_warnings(
    cfg: RepoProviderConfig,
    default_env: Mapping[str, str] | None = None,
    process_env: Mapping[str, str] | None = None,
) -> list[str]:
    """What is wrong with a workspace's config that is not refused at add/config time (the
    environment may change before a spawn), said then: a provider key that does not resolve."""
    missing = missing_key(cfg, default_env, process_env)
    return [f"{missing} (until then its spawns are refused)"] if missing else []


def check_spawnable(
    cfg: RepoProviderConfig,
    default_env: Mapping[str, str] | None = None,
    process_env: Mapping[str, str] | None = None,
) -> None:
    """Refuse a spawn whose provider needs a key that does not resolve."""
    missing = missing_key(cfg, default_env, process_env)
    if missing:
        raise ProviderMisconfigured(missing)
