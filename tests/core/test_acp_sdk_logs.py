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


def _validation_error() -> Exception:
    from acp.schema import SessionNotification
    from pydantic import ValidationError

    try:
        SessionNotification.model_validate(
            {"sessionId": "s", "update": {"sessionUpdate": "notice", "text": "hi"}}
        )
    except ValidationError as e:
        return e
    raise AssertionError("an unknown update kind validated")


def test_an_unknown_session_update_is_not_an_sdk_error(capture: Capture) -> None:
    # what acp/connection.py `_run_notification` does for an update newer than the SDK
    logging.exception(
        "Unhandled error while handling notification method=%s",
        "session/update",
        exc_info=_validation_error(),
    )
    assert capture.records == []  # the driver's own warning line is the one record
    logging.getLogger().setLevel(logging.DEBUG)
    logging.exception(
        "Unhandled error while handling notification method=%s",
        "session/update",
        exc_info=_validation_error(),
    )
    [rec] = capture.records
    assert rec.levelno == logging.DEBUG and rec.exc_info is None
    assert rec.getMessage().startswith("ACP SDK dropped an unrecognised session/update")


def test_other_notification_errors_keep_their_traceback(capture: Capture) -> None:
    logging.exception(
        "Unhandled error while handling notification method=%s",
        "session/update",
        exc_info=RuntimeError("handler bug"),
    )
    logging.exception(
        "Unhandled error while handling notification method=%s",
        "_vendor/thing",
        exc_info=_validation_error(),
    )
    assert [r.levelno for r in capture.records] == [logging.ERROR, logging.ERROR]
    assert all(r.exc_info for r in capture.records)


async def test_a_driver_meeting_an_unknown_update_logs_one_warning_line(
    capture: Capture,
) -> None:
    import asyncio

    from prospero.testkit import acp_scripts as S
    from tests.conformance.agent_driver import Recorder
    from tests.core.acp_support import Rig

    rig = Rig()
    try:
        script = S.AcpScript(turns=[[S.text("a"), S.unknown_update("notice"), S.text("b")]])
        peer = await rig.peer(script)
        rec = Recorder()
        await asyncio.wait_for(rig.driver(rig.target(peer), rec).run(), 15.0)
    finally:
        await rig.aclose()
    assert rec.stdout() == ["a", "b"]
    assert "frames_skipped" in rec.kinds()  # the skip is visible in history too
    errors = [r for r in capture.records if r.levelno >= logging.ERROR]
    assert errors == []
    warnings = [r for r in capture.records if "unknown" in r.getMessage().lower()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].exc_info is None
