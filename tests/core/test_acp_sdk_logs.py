"""The SDK's disconnect tracebacks become one DEBUG line; its other errors keep theirs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from prospero.core.drivers import acp_sdk_logs


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def capture() -> Iterator[Capture]:
    root = logging.getLogger()
    handler = Capture()
    acp_sdk_logs.install(handler)
    acp_sdk_logs.install(handler)  # idempotent
    assert len(handler.filters) == 1
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def sdk_error(message: str, exc: BaseException) -> None:
    # what acp/connection.py and acp/task/sender.py do
    logging.exception(message, exc_info=exc)


def test_disconnects_are_dropped_at_info(capture: Capture) -> None:
    sdk_error("Connection main loop failed", BrokenPipeError(32, "Broken pipe"))
    sdk_error("Send loop failed", ConnectionResetError("Connection lost"))
    sdk_error("Receive loop failed", ConnectionResetError("Connection lost"))
    sdk_error("Background task failed", ConnectionResetError("Connection lost"))
    assert capture.records == []


def test_disconnects_are_one_debug_line_at_debug(capture: Capture) -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    sdk_error("Receive loop failed", ConnectionResetError("Connection lost"))
    [rec] = capture.records
    assert rec.levelno == logging.DEBUG and rec.exc_info is None
    assert rec.getMessage() == (
        "ACP connection ended (receive loop failed): ConnectionResetError('Connection lost')"
    )


def test_other_errors_keep_level_and_traceback(capture: Capture) -> None:
    sdk_error("Connection main loop failed", ValueError("bad frame"))
    logging.getLogger("prospero.x").error("Send loop failed", exc_info=BrokenPipeError())
    logging.exception("Error parsing JSON-RPC message", exc_info=ConnectionResetError())
    assert [(r.levelno, r.getMessage()) for r in capture.records] == [
        (logging.ERROR, "Connection main loop failed"),
        (logging.ERROR, "Send loop failed"),
        (logging.ERROR, "Error parsing JSON-RPC message"),
    ]
    assert all(r.exc_info for r in capture.records)
