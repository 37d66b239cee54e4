"""Model prices from a maintained source: pydantic's `genai-prices` package (its bundled
snapshot of ~2,300 models across providers, updated with each release; never fetched at run
time). The rate card (`core.ratecard`) asks here for models its local table does not price.

Loading the snapshot takes about a second (a large generated module), so it happens once per
process, in a background thread started by `preload()` (prosperod calls it once it serves), or
on the first lookup, which then waits for it. Lookups are cached per model name. Any failure — the package missing or broken, a
model it does not know, one not priced per token — is "no price" (cost null), never an error.

The prices are read out of the source once per model (`prices_for`: base prices and their
tiers) and applied by the rate card itself: a turn is priced with a few multiplications on the
ingest path, not through the source's general calculator (~0.1-1 ms a call).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)


# A price as the source gives it, in USD per million tokens: the base price and the tiers
# ((threshold, price), ascending): above a threshold of input tokens (cache reads and writes
# included) the turn's tokens all cost the tier's price.
Price = tuple[float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class SourcePrices:
    """A model's per-token prices in the source (None: the source has no such price)."""

    provider: str
    model_id: str
    input: Price
    output: Price
    cache_write: Price | None
    cache_read: Price | None


def _price(value: Any) -> Price | None:
    if value is None:
        return None
    tiers = getattr(value, "tiers", None)
    if tiers is None:
        return float(value), ()
    steps = tuple(sorted((int(t.start), float(t.price)) for t in tiers))
    return float(value.base), steps


class MaintainedPrices:
    """The genai-prices snapshot, loaded once and looked up by model name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._snapshot: Any = None
        self._failed = False
        self._cache: dict[str, SourcePrices | None] = {}
        self._thread: threading.Thread | None = None

    @property
    def version(self) -> str | None:
        try:
            from importlib.metadata import version

            return version("genai-prices")
        except Exception:
            return None

    def preload(self) -> None:
        """Start loading the snapshot in a background thread (idempotent)."""
        with self._lock:
            if self._loaded.is_set() or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._load, name="prospero-prices", daemon=True)
            self._thread.start()

    def _load(self) -> None:
        try:
            from genai_prices import data_snapshot

            snapshot = data_snapshot.get_snapshot()
            snapshot.providers  # noqa: B018 (the bundled data is loaded here)
            self._snapshot = snapshot
        except Exception as e:  # the package missing or broken: no maintained prices
            self._failed = True
            log.warning("prices: the maintained price list is unavailable (%s)", e)
        finally:
            self._loaded.set()

    def _ready(self) -> Any:
        if not self._loaded.is_set():
            self.preload()
            self._loaded.wait()
        return self._snapshot

    def prices_for(self, model: str) -> SourcePrices | None:
        """The source's prices of `model` ("provider/model" and dated names resolve), or None
        (unknown, or not priced per token). Cached per name."""
        if model in self._cache:
            return self._cache[model]
        found = self._find(model)
        self._cache[model] = found
        return found

    def _find(self, model: str) -> SourcePrices | None:
        snapshot = self._ready()
        if snapshot is None:
            return None
        provider_id, _, bare = model.rpartition("/")
        attempts: list[tuple[str, str | None]] = [(model, None)]
        if provider_id:
            attempts += [(bare, provider_id), (bare, None)]
        for ref, provider in attempts:
            try:
                prov, info = snapshot.find_provider_model(ref, None, provider, None)
                prices = info.get_prices(datetime.now(tz=UTC))
                inp = _price(getattr(prices, "input_mtok", None))
                out = _price(getattr(prices, "output_mtok", None))
                if inp is None or out is None:
                    continue  # not priced per token (e.g. per request or per second)
                return SourcePrices(
                    provider=str(prov.id),
                    model_id=str(info.id),
                    input=inp,
                    output=out,
                    cache_write=_price(getattr(prices, "cache_write_mtok", None)),
                    cache_read=_price(getattr(prices, "cache_read_mtok", None)),
                )
            except Exception:
                continue
        return None


_SHARED = MaintainedPrices()


def shared_prices() -> MaintainedPrices:
    """The process's one maintained price list (the snapshot is loaded once per process)."""
    return _SHARED
