"""The OpenAPI document is honest: a bounded schemathesis run over every operation.

Every documented operation is exercised against a live prosperod (tests/contract/conftest.py:
real uvicorn, a fake caliband, an admin token) with generated requests, valid and invalid,
which really spawn, kill and respawn agents against the fake. Each response must be no 5xx,
have a documented status code and content type, and match the body schema documented for it.
Deterministic (derandomized, fixed seed) and bounded (`MAX_EXAMPLES` per operation and phase),
so the run is repeatable and quick. The one-line summary (operations, requests, failures) is
printed at the end of the pytest run.

The schema under test is the app's own document, loaded at import time (schemathesis's lazy
`from_fixture` loader does not work with pytest 9); `test_served_document_is_the_one_tested`
checks the live server serves exactly that document.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from prospero.api.app import create_app
from prospero.core.metrics import Metrics
from tests.contract.conftest import TALLY, LiveStack, auth_headers

# CI's bounded, repeatable run; a longer hunt: PROSPERO_CONTRACT_EXAMPLES=100 PROSPERO_CONTRACT_SEED=7
MAX_EXAMPLES = int(os.environ.get("PROSPERO_CONTRACT_EXAMPLES", "10"))
SEED = int(os.environ.get("PROSPERO_CONTRACT_SEED", "10"))
REQUEST_TIMEOUT = 10.0
# An SSE stream does not end by itself: schemathesis reads it until this timeout (or
# MAX_STREAM_EVENTS events) and validates the events it read.
# (its first byte must arrive within it too: 0.5 s leaves room for a loaded CI box)
STREAM_TIMEOUT = 0.5
MAX_STREAM_EVENTS = 5


def schema_valid_request_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's `positive_data_acceptance` (a request the schema allows is not refused
    as invalid: the schema is not looser than the validation), for requests that are valid in
    every part: its coverage phase also marks as positive a case whose body it made invalid."""
    meta = case.meta
    if meta is None or any(not c.mode.is_positive for c in meta.components.values()):
        return None
    result: bool | None = positive_data_acceptance(ctx, response, case)
    return result


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    schema_valid_request_accepted,
]
# What a schema-valid request may get that is about state, not shape: an unknown id (404), a
# finished agent (409), a root that is not an existing directory or an option the agent did not
# offer (400), a token that is not in the tokens file (401, `POST /api/session`).
ACCEPTED = ["2xx", "400", "401", "404", "409"]


class _Offline:
    """Enough of a runtime to build the app (and so its OpenAPI document)."""

    manager = None
    store = None
    bus = None
    config = None
    metrics = Metrics()


def app_document() -> dict[str, Any]:
    return create_app(_Offline()).openapi()  # type: ignore[arg-type]


CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
        "phases": {"stateful": {"enabled": False}},
        "request-timeout": REQUEST_TIMEOUT,
        "max-stream-events": MAX_STREAM_EVENTS,
        "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}},
        "operations": [{"include-path-regex": r"/stream$", "request-timeout": STREAM_TIMEOUT}],
    }
)
schema = schemathesis.openapi.from_dict(app_document(), config=CONFIG)


def test_served_document_is_the_one_tested(live_stack: LiveStack) -> None:
    r = httpx.get(f"{live_stack.url}/openapi.json", timeout=REQUEST_TIMEOUT)
    assert r.status_code == 200
    assert r.json() == app_document()


@schema.parametrize()
def test_every_operation_honours_its_contract(case: Any, live_stack: LiveStack) -> None:
    label = case.operation.label
    response = case.call(base_url=live_stack.url, headers=auth_headers(live_stack))
    TALLY.record(label, response.status_code)
    try:
        case.validate_response(response, checks=CHECKS)
    except Exception as e:
        TALLY.fail(label, e)
        raise
