"""`/metrics`: the Prometheus exposition of the process `Metrics` (`core.metrics_export`, on the
Runtime's own `CollectorRegistry`), Prometheus text format 0.0.4 unless the scraper's `Accept`
asks for OpenMetrics. The metric set is `core.metrics_catalog` (docs/operations.md)."""

from __future__ import annotations

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from prospero.core.metrics import Metrics
from prospero.core.metrics_export import PREFIX, exported_name
from prospero.core.metrics_export import render as _render

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

API_SSE_STREAMS = "api_sse_streams"

__all__ = ["API_SSE_STREAMS", "CONTENT_TYPE", "PREFIX", "exported_name", "render"]


def render(metrics: Metrics, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) for a scrape with this `Accept` header."""
    return _render(metrics, accept)
