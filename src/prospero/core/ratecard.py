"""Per-model token prices, for a cost figure the wire does not carry.

Prices are USD per million tokens. Where a model's rate comes from, first match wins:

1. the local table (`RateCard.rates`): the daemon's `--rate-card` file over `DEFAULT_RATES`
   (models no price list knows: local models cost nothing per token). It overrides anything
   below, exactly (`claude-sonnet-4-6`), by the bare name of `provider/model`, or by the
   longest prefix (`claude-sonnet-4-6-20260101`);
2. the maintained price list (`core.prices`: the `genai-prices` package's snapshot), with its
   tiers (a turn over a provider's long-context threshold is priced at the tier's rates);
3. otherwise the model is not priced: cost null ("not priced"), never 0 and never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prospero.core.prices import MaintainedPrices, Price, SourcePrices, shared_prices
from prospero.types.events import Usage


@dataclass(frozen=True)
class Rate:
    input_per_mtok: float
    output_per_mtok: float
    cache_write_per_mtok: float | None = None
    cache_read_per_mtok: float | None = None
    # (threshold, rate), ascending: a turn with more input tokens than a threshold (cache
    # reads and writes included) is priced at that tier's rate, all of its tokens.
    tiers: tuple[tuple[int, Rate], ...] = ()
    # Where the rate comes from: "local", or "genai-prices:<provider>/<model id>".
    source: str = "local"

    def for_input(self, input_tokens: int) -> Rate:
        for threshold, tier in reversed(self.tiers):
            if input_tokens > threshold:
                return tier
        return self

    @staticmethod
    def from_source(p: SourcePrices) -> Rate:
        """The maintained list's prices as a Rate: the base prices, and one tier per
        threshold any of them has (the others at their price for that many tokens)."""

        def at(price: Price | None, tokens: int) -> float | None:
            if price is None:
                return None
            value = price[0]
            for start, tier_price in price[1]:
                if tokens > start:
                    value = tier_price
            return value

        def rate(tokens: int, tiers: tuple[tuple[int, Rate], ...] = ()) -> Rate:
            inp, out = at(p.input, tokens), at(p.output, tokens)
            assert inp is not None and out is not None
            return Rate(
                inp,
                out,
                at(p.cache_write, tokens),
                at(p.cache_read, tokens),
                tiers,
                f"genai-prices:{p.provider}/{p.model_id}",
            )

        starts = sorted(
            {
                s
                for price in (p.input, p.output, p.cache_write, p.cache_read)
                if price
                for s, _ in price[1]
            }
        )
        return rate(0, tuple((s, rate(s + 1)) for s in starts))


DEFAULT_RATES: dict[str, Rate] = {
    # Local models cost nothing per token (no price list has them).
    "llama3.1": Rate(0.0, 0.0),
    "qwen2.5-coder": Rate(0.0, 0.0),
}


@dataclass
class RateCard:
    rates: dict[str, Rate] = field(default_factory=lambda: dict(DEFAULT_RATES))
    # The maintained price list under the local table (None: the local table only).
    maintained: MaintainedPrices | None = field(default_factory=shared_prices)
    _maintained_rates: dict[str, Rate | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def preload(self) -> None:
        """Start loading the maintained list in the background (prosperod does once serving);
        otherwise the first lookup that needs it loads it, and waits (~1 s)."""
        if self.maintained is not None:
            self.maintained.preload()

    def local_rate(self, model: str) -> Rate | None:
        if model in self.rates:
            return self.rates[model]
        # "provider/model" and dated suffixes ("claude-sonnet-4-6-20260101") resolve too.
        bare = model.rsplit("/", 1)[-1]
        if bare in self.rates:
            return self.rates[bare]
        best = max((k for k in self.rates if bare.startswith(k)), key=len, default=None)
        return self.rates[best] if best else None

    def rate_for(self, model: str | None) -> Rate | None:
        if not model:
            return None
        local = self.local_rate(model)
        if local is not None or self.maintained is None:
            return local
        try:
            return self._maintained_rates[model]
        except KeyError:
            pass
        found = self.maintained.prices_for(model)
        rate = Rate.from_source(found) if found is not None else None
        self._maintained_rates[model] = rate
        return rate

    def cost(self, model: str | None, usage: Usage | None) -> float | None:
        if usage is None:
            return None
        rate = self.rate_for(model)
        if rate is None:
            return None
        cache_write = usage.cache_creation_input_tokens or 0
        cache_read = usage.cache_read_input_tokens or 0
        if rate.tiers:
            rate = rate.for_input(usage.input_tokens + cache_write + cache_read)
        total = (
            usage.input_tokens * rate.input_per_mtok + usage.output_tokens * rate.output_per_mtok
        )
        if cache_write:
            total += cache_write * (
                rate.cache_write_per_mtok
                if rate.cache_write_per_mtok is not None
                else rate.input_per_mtok
            )
        if cache_read:
            total += cache_read * (
                rate.cache_read_per_mtok
                if rate.cache_read_per_mtok is not None
                else rate.input_per_mtok
            )
        return round(total / 1_000_000, 10)
