"""The rate card: the local table over the maintained price list (genai-prices), tiers, names
with providers and dates, and models nobody prices (null cost, never an error)."""

from __future__ import annotations

import logging

import genai_prices
import pytest

from prospero.core.prices import MaintainedPrices, shared_prices
from prospero.core.ratecard import DEFAULT_RATES, Rate, RateCard
from prospero.types.events import Usage


def source_cost(model: str, u: Usage) -> float:
    """What genai-prices' own calculator says (its input counts the cache reads and writes)."""
    cw, cr = u.cache_creation_input_tokens or 0, u.cache_read_input_tokens or 0
    price = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=u.input_tokens + cw + cr,
            output_tokens=u.output_tokens,
            cache_write_tokens=cw or None,
            cache_read_tokens=cr or None,
        ),
        model,
    )
    return round(float(price.total_price), 10)


USAGES = [
    Usage(input_tokens=1200, output_tokens=300),
    Usage(
        input_tokens=800,
        output_tokens=50,
        cache_read_input_tokens=20_000,
        cache_creation_input_tokens=1500,
    ),
    Usage(input_tokens=250_000, output_tokens=4000),  # over a 200k long-context tier
    Usage(
        input_tokens=150_000, output_tokens=10, cache_read_input_tokens=60_000
    ),  # over it with the cache
]


@pytest.mark.parametrize(
    "model", ["claude-sonnet-4-6", "claude-sonnet-4-5", "claude-opus-4-1", "gpt-5", "gpt-5.5"]
)
def test_maintained_prices_match_the_sources_own_calculation(model: str) -> None:
    card = RateCard()
    rate = card.rate_for(model)
    assert rate is not None and rate.source.startswith("genai-prices:")
    for u in USAGES:
        assert card.cost(model, u) == pytest.approx(source_cost(model, u), abs=1e-9), u


def test_tiers_apply_per_turn() -> None:
    card = RateCard()
    rate = card.rate_for("claude-sonnet-4-5")
    assert rate is not None and rate.tiers and rate.tiers[0][0] == 200_000
    small = card.cost("claude-sonnet-4-5", Usage(input_tokens=200_000, output_tokens=0))
    big = card.cost("claude-sonnet-4-5", Usage(input_tokens=200_001, output_tokens=0))
    assert small is not None and big is not None and big > 1.9 * small  # all tokens at the tier


def test_names_with_provider_and_date_resolve() -> None:
    card = RateCard()
    base = card.rate_for("claude-sonnet-4-5")
    assert card.rate_for("anthropic/claude-sonnet-4-5") == base
    assert card.rate_for("claude-sonnet-4-5-20250929") == base
    opus = card.rate_for("claude-opus-4-1-20250805")
    assert opus is not None and opus.source == "genai-prices:anthropic/claude-opus-4-1"
    assert (opus.input_per_mtok, opus.output_per_mtok) == (15.0, 75.0)


def test_the_local_table_overrides_the_maintained_list() -> None:
    mine = Rate(1.0, 2.0)
    card = RateCard(
        rates={**DEFAULT_RATES, "claude-sonnet-4-6": mine, "claude-haiku": Rate(0.0, 0.0)}
    )
    assert card.rate_for("claude-sonnet-4-6") == mine
    assert card.rate_for("anthropic/claude-sonnet-4-6-20260101") == mine  # bare name, prefix
    assert (
        card.cost("claude-sonnet-4-6", Usage(input_tokens=1_000_000, output_tokens=1_000_000))
        == 3.0
    )
    assert (
        card.cost("claude-haiku-4-5", Usage(input_tokens=10, output_tokens=10)) == 0.0
    )  # a prefix rule
    assert RateCard().cost("llama3.1", Usage(input_tokens=10**6)) == 0.0  # built-in local model
    # without the maintained list: the local table only
    alone = RateCard(maintained=None)
    assert alone.rate_for("claude-sonnet-4-6") is None and alone.rate_for("llama3.1") is not None


def test_unknown_models_cost_nothing_and_never_fail() -> None:
    card = RateCard()
    u = Usage(input_tokens=10, output_tokens=5)
    for model in ("fake-model", "no-such-provider/no-such-model", "", None, "x" * 500, "////"):
        assert card.rate_for(model) is None
        assert card.cost(model, u) is None  # null: "not priced", never a fake 0
    assert card.cost("claude-sonnet-4-6", None) is None  # no usage reported


def test_a_broken_maintained_list_is_no_price(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("snapshot unreadable")

    monkeypatch.setattr(genai_prices.data_snapshot, "get_snapshot", broken)
    card = RateCard(maintained=MaintainedPrices())  # a fresh list: loads (and fails) now
    with caplog.at_level(logging.WARNING, "prospero.core.prices"):
        assert card.cost("claude-sonnet-4-6", Usage(input_tokens=1)) is None
    assert "unavailable" in caplog.text
    assert card.cost("llama3.1", Usage(input_tokens=1)) == 0.0  # the local table still works


def test_the_list_is_loaded_once_per_process() -> None:
    assert RateCard().maintained is shared_prices() is RateCard().maintained
    assert shared_prices().version == genai_prices.__version__
