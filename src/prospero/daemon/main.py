"""prosperod: the Prospero daemon (console script `prosperod`, or `python -m prospero.daemon`).

Start-up: parse config (exit 2 on a bad one), bind the HTTP socket (before anything else has
side effects), start the Runtime (store, bus, FleetManager, poll loop, retention), serve.

Shutdown on SIGTERM/SIGINT, in this order: stop accepting HTTP connections, end SSE streams
(and background API tasks), let in-flight requests finish (bounded), then `Runtime.stop()`
(stops attach tasks and the poll loop, flushes the emitter, closes the store). Exit code 0.
A second signal during shutdown forces the HTTP side down immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from prospero.api.app import create_app
from prospero.api.server import ApiServer, is_loopback
from prospero.api.settings import ApiSettings
from prospero.core.drivers import acp_sdk_logs
from prospero.core.tokens import TokenFileError, TokenTable, load_or_create_session_key
from prospero.daemon.config import ConfigError, load_config, validate
from prospero.daemon.runtime import DaemonConfig, Runtime

log = logging.getLogger("prospero.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2

_STD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()
    | {"message", "asctime", "color_message", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    acp_sdk_logs.install(handler)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # ours never logs query strings
    # The Kubernetes client's HTTP library logs every request at INFO (the k8s backend's
    # gets, applies and watch re-opens): only when debugging.
    logging.getLogger("httpx2").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)


def api_auth(config: DaemonConfig) -> tuple[TokenTable, bytes | None]:
    """The token table (tokens file + plaintext tokens) and, when auth is on, the session-cookie
    key kept in `<data dir>/session.key` (0600, created on first start)."""
    tokens = TokenTable(config.api_tokens_file, config.api_tokens)
    if not tokens.enabled:
        return tokens, None
    config.data_dir.mkdir(parents=True, exist_ok=True)
    return tokens, load_or_create_session_key(config.data_dir / "session.key")


async def serve(
    config: DaemonConfig,
    *,
    runtime: Runtime | None = None,
    settings: ApiSettings | None = None,
    stop_event: asyncio.Event | None = None,
    install_signal_handlers: bool = True,
    on_ready: Callable[[ApiServer], Any] | None = None,
) -> int:
    """Run prosperod until a signal (or `stop_event`); returns the process exit code.

    `prospero demo` and tests reuse this with their own runtime (e.g. a fake provider),
    settings, and a stop event instead of signals.
    """
    try:
        validate(config)
    except ConfigError as e:
        log.error("%s", e)
        return EXIT_CONFIG
    runtime = runtime or Runtime(config)
    if settings is None:
        try:
            tokens, session_key = api_auth(config)
        except (TokenFileError, OSError) as e:
            log.error("API authentication: %s", e)
            return EXIT_CONFIG
    settings = settings or ApiSettings(
        tokens=tokens,
        session_key=session_key,
        allowed_hosts=list(config.allowed_hosts),
        public_origins=[config.public_url] if config.public_url else [],
        header_timeout=config.header_timeout,
        body_timeout=config.body_timeout,
        max_connections=config.max_connections,
    )
    app = create_app(runtime, settings)
    server = ApiServer(app, config.bind_host, config.port)
    try:
        server.bind()
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", config.bind_host, config.port, e.strerror or e)
        return EXIT_FAILURE

    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    signals_seen = 0

    def on_signal(sig: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info("received %s: shutting down", signal.Signals(sig).name)
            stop.set()
        else:
            log.warning("received %s again: forcing shutdown", signal.Signals(sig).name)
            server.force_exit()

    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, on_signal, sig)
                installed.append(sig)

    try:
        try:
            await runtime.start()
        except Exception as e:
            log.error("prosperod failed to start: %s", e, exc_info=log.isEnabledFor(logging.DEBUG))
            server.close_socket()
            with contextlib.suppress(Exception):
                await runtime.stop()
            return EXIT_FAILURE
        await server.start()
        auth = f"on ({len(settings.tokens)} token(s))" if settings.tokens.enabled else "off"
        log.info(
            "prosperod listening on %s (data dir %s, API auth %s)",
            server.url,
            config.data_dir,
            auth,
            extra={"url": server.url, "auth": settings.tokens.enabled},
        )
        if not settings.tokens.enabled and not is_loopback(config.bind_host):  # pragma: no cover
            log.warning("API auth is off on a non-loopback address")
        # The maintained price list (~1 s of CPU to load) loads in the background once serving,
        # so that neither start-up nor the first priced turn waits for it.
        config.rate_card.preload()
        if on_ready is not None:
            res = on_ready(server)
            if asyncio.iscoroutine(res):
                await res

        stop_task = asyncio.create_task(stop.wait(), name="prosperod-stop")
        server_task = asyncio.create_task(server.wait(), name="prosperod-http")
        done, _ = await asyncio.wait({stop_task, server_task}, return_when=asyncio.FIRST_COMPLETED)
        exit_code = EXIT_OK
        if server_task in done and not stop.is_set():
            log.error("HTTP server stopped unexpectedly")
            exit_code = EXIT_FAILURE
        stop_task.cancel()
        server_task.cancel()

        started = time.monotonic()
        await server.stop()
        log.info("HTTP server stopped; stopping the fleet runtime")
        await runtime.stop()
        log.info("prosperod stopped cleanly in %.2fs", time.monotonic() - started)
        return exit_code
    finally:
        for sig in installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


# The cyclic collector's thresholds for a long-running prosperod (see `tune_gc`).
GC_THRESHOLDS = (20_000, 50, 100)


def tune_gc() -> None:
    """Keep the cyclic garbage collector out of the live path's tail latency: the heap built at
    start-up (modules, pydantic schemas: the bulk of the tracked objects) is frozen, so a full
    collection no longer walks it, and the young generation is collected every 20,000
    allocations instead of 700 (the ingest path allocates short-lived, acyclic objects that
    reference counting frees anyway). bench/fanout.py: a full collection paused the loop for up
    to 106 ms, 3 per 20 s; with this, at most one, of 64 ms, and ~1 young collection."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load_config(argv)
    except ConfigError as e:
        print(f"prosperod: {e}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log_format, config.log_level)
    tune_gc()
    try:
        return asyncio.run(serve(config))
    except KeyboardInterrupt:  # pragma: no cover - signal arrived before handlers were installed
        return 130


def run() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
