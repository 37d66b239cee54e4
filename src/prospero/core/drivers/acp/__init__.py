"""The ACP driver (ADR 0011, docs/adr/0005, docs/acp-mapping.md), in the same shape as the
NDJSON one:

- `driver`: `AcpDriver` on the shared `ReconnectingDriver`: lifecycle, steering, the end of
  the history (`conclude`, finish), persistence; `registry`: one driver per agent;
- `mapping`: the pure ACP → event mapping (the counterpart of `core/normalize.py`);
- `output`: the ordered output queue and the pump that commits the resume state with its events;
- `session`: the handshake (initialize, new/load, authenticate) and the prompt turns;
- `permissions`: the permission bridge and the duck-typed SDK client object;
- `resume`: the typed, versioned resume state;
- `auth`: which advertised `authenticate` method the workspace has credentials for.

Importing names from `prospero.core.drivers.acp` keeps working.
"""

from prospero.core.drivers.acp.driver import (
    ACP_UNSERVED_REQUESTS,
    STOPPED_MID_TURN,
    AcpDriver,
    StreamObserver,
    acp_driver_factory,
)
from prospero.core.drivers.acp.mapping import (
    ACP_IGNORED_UPDATES,
    ACP_LATE_TOOL_INPUT,
    ACP_TURNS_LOST,
    ACP_UNKNOWN_STOP_REASONS,
    ACP_UNKNOWN_UPDATES,
    KNOWN_STOP_REASONS,
    NOT_RESUMABLE,
    STOP_OUTCOMES,
    AcpMapper,
    outcome_for,
    render_content,
)
from prospero.core.drivers.acp.permissions import ACP_PERMISSION_REQUESTS
from prospero.core.drivers.acp.registry import DriverConflict, active_driver
from prospero.core.drivers.acp.resume import STATE_VERSION, AcpResumeState
from prospero.core.drivers.acp.session import (
    ACP_PROMPT_ERRORS,
    CLIENT_NAME,
    CLIENT_VERSION,
    NOT_RESUMABLE_DETAIL,
    NOT_RESUMED,
    PROTOCOL_VERSION,
)

__all__ = [
    "ACP_IGNORED_UPDATES",
    "ACP_LATE_TOOL_INPUT",
    "ACP_PERMISSION_REQUESTS",
    "ACP_PROMPT_ERRORS",
    "ACP_TURNS_LOST",
    "ACP_UNKNOWN_STOP_REASONS",
    "ACP_UNKNOWN_UPDATES",
    "ACP_UNSERVED_REQUESTS",
    "CLIENT_NAME",
    "CLIENT_VERSION",
    "KNOWN_STOP_REASONS",
    "NOT_RESUMABLE",
    "NOT_RESUMABLE_DETAIL",
    "NOT_RESUMED",
    "PROTOCOL_VERSION",
    "STATE_VERSION",
    "STOPPED_MID_TURN",
    "STOP_OUTCOMES",
    "AcpDriver",
    "AcpMapper",
    "AcpResumeState",
    "DriverConflict",
    "StreamObserver",
    "acp_driver_factory",
    "active_driver",
    "outcome_for",
    "render_content",
]
