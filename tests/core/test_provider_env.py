"""A provider key is warned about at config time exactly when a spawn would be refused for it."""

from __future__ import annotations

import pytest

from prospero.core.errors import ProviderMisconfigured
from prospero.core.provider_env import check_spawnable, config_warnings
from prospero.types.model import RepoProviderConfig as Cfg


@pytest.mark.parametrize(
    ("cfg", "default_env", "process_env", "missing"),
    [
        (Cfg(), {}, {}, None),
        (Cfg(provider="ollama"), {}, {}, None),  # takes no key
        (Cfg(provider="bedrock"), {}, {}, None),  # a provider Prospero knows no key of
        (Cfg(provider="anthropic", api_key_from_env="K"), {}, {"K": "sk"}, None),
        (Cfg(provider="anthropic", env={"ANTHROPIC_API_KEY": "sk"}), {}, {}, None),
        (Cfg(provider="openai"), {"OPENAI_API_KEY": "sk"}, {}, None),
        (
            Cfg(provider="anthropic", api_key_from_env="K"),
            {},
            {"K": ""},
            "provider 'anthropic' needs ANTHROPIC_API_KEY: set K in prosperod's environment",
        ),
        (
            Cfg(provider="Google"),
            {},
            {"GEMINI_API_KEY": "in prosperod, but not named"},
            "provider 'Google' needs GEMINI_API_KEY: configure api_key_from_env (the name of a "
            "variable holding the key) or env GEMINI_API_KEY",
        ),
    ],
)
def test_a_warning_at_config_time_is_the_refusal_at_spawn(
    cfg: Cfg, default_env: dict[str, str], process_env: dict[str, str], missing: str | None
) -> None:
    warnings = config_warnings(cfg, default_env, process_env)
    if missing is None:
        assert warnings == []
        check_spawnable(cfg, default_env, process_env)
        return
    assert warnings == [f"{missing} (until then its spawns are refused)"]
    with pytest.raises(ProviderMisconfigured) as info:
        check_spawnable(cfg, default_env, process_env)
    assert str(info.value) == missing
