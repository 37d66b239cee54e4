"""Per-model token prices, for a cost figure the wire does not carry.

Prices are USD per million tokens. A model with no rate gives cost null ("not priced"),
never 0. The daemon loads overrides from a TOML/JSON table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prospero.types.events import Usage


@dataclass(frozen=True)
class Rate:
    input_per_mtok: float
    output_per_mtok: float
    cache_write_per_mtok: float | None = None
    cache_read_per_mtok: float | None = None


DEFAULT_RATES: dict[str, Rate] = {
    "claude-opus-4-1": Rate(15.0, 75.0, 18.75, 1.5),
    "claude-sonnet-4-6": Rate(3.0, 15.0, 3.75, 0.3),
    "claude-sonnet-4-5": Rate(3.0, 15.0, 3.75, 0.3),
    "claude-haiku-4-5": Rate(1.0, 5.0, 1.25, 0.1),
    "gpt-5.5": Rate(1.25, 10.0, None, 0.125),
    # Local models cost nothing per token.
    "llama3.1": Rate(0.0, 0.0),
    "qwen2.5-coder": Rate(0.0, 0.0),
}


@dataclass
class RateCard:
    rates: dict[str, Rate] = field(default_factory=lambda: dict(DEFAULT_RATES))

    def rate_for(self, model: str | None) -> Rate | None:
        if not model:
            return None
        if model in self.rates:
            return self.rates[model]
        # "provider/model" and dated suffixes ("claude-sonnet-4-6-20260101") resolve too.
        bare = model.rsplit("/", 1)[-1]
        if bare in self.rates:
            return self.rates[bare]
        best = max((k for k in self.rates if bare.startswith(k)), key=len, default=None)
        return self.rates[best] if best else None

    def cost(self, model: str | None, usage: Usage | None) -> float | None:
        if usage is None:
            return None
        rate = self.rate_for(model)
        if rate is None:
            return None
        total = usage.input_tokens * rate.input_per_mtok + usage.output_tokens * rate.output_per_mtok
        if usage.cache_creation_input_tokens:
            total += usage.cache_creation_input_tokens * (
                rate.cache_write_per_mtok if rate.cache_write_per_mtok is not None else rate.input_per_mtok
            )
        if usage.cache_read_input_tokens:
            total += usage.cache_read_input_tokens * (
                rate.cache_read_per_mtok if rate.cache_read_per_mtok is not None else rate.input_per_mtok
            )
        return round(total / 1_000_000, 10)
