"""Fleet snapshot, the fleet-wide SSE stream and usage (prospero-surface.md §1.2, §1.6)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from starlette.responses import Response

from prospero.api.deps import ApiState, api_state
from prospero.api.errors import InvalidRequest
from prospero.api.responses import clean_workspace, dump, errors, json_response
from prospero.api.routes_agents import LAST_EVENT_ID_SCHEMA, FromQuery, parse_last_event_id
from prospero.api.routes_cluster import fill_owners
from prospero.api.routes_decisions import fill_pending
from prospero.api.sse import (
    SSE_RESPONSES,
    SseResponse,
    StreamSession,
    fleet_frame,
    fleet_frame_for,
)
from prospero.core.store.base import UsageDay
from prospero.core.subscription import follow_fleet
from prospero.types.api import (
    UsageBucket,
    UsageGroup,
    UsageOutcomes,
    UsageReport,
)
from prospero.types.events import EVENT_KIND_NAMES
from prospero.types.model import FleetSnapshot

router = APIRouter(tags=["fleet"])

State = Annotated[ApiState, Depends(api_state)]

MAX_USAGE_DAYS = 3660
TS_MIN_YEAR = 1970
TS_MAX_YEAR = 9000


@router.get("/api/fleet", operation_id="getFleet", response_model=FleetSnapshot)
async def fleet(st: State) -> Response:
    snap = st.manager.snapshot()
    agents = [a for ws in snap.workspaces for a in ws.agents]
    await fill_owners(st, agents)
    await fill_pending(st, agents)
    data = dump(snap)
    for ws in data["workspaces"]:
        clean_workspace(ws)
    return json_response(data)


def fleet_resume(
    from_: FromQuery = 0,
    last_event_id: Annotated[
        str | None,
        Header(description="resume after this ordinal", json_schema_extra=LAST_EVENT_ID_SCHEMA),
    ] = None,
) -> int:
    """Ordinal to resume after: `Last-Event-ID` when present, else `from - 1`."""
    last = parse_last_event_id(last_event_id)
    return last if last is not None else max(from_ - 1, 0)


# What `kind_filter` accepts, as the schema says it (a subset: the filter also skips blanks
# and spaces around names): known kind names, comma-separated.
_KIND_NAME = "(?:" + "|".join(sorted(EVENT_KIND_NAMES)) + ")"
KINDS_PATTERN = f"^{_KIND_NAME}(?:,{_KIND_NAME})*$"


def kind_filter(
    kinds: Annotated[
        str | None,
        Query(
            description=(
                "Only these event kinds, comma-separated (e.g. "
                "`status_changed,agent_finished`); default: every kind."
            ),
            max_length=2000,
            json_schema_extra={"pattern": KINDS_PATTERN},
        ),
    ] = None,
) -> frozenset[str] | None:
    if kinds is None:
        return None
    wanted = frozenset(k.strip() for k in kinds.split(",") if k.strip())
    if not wanted:
        raise InvalidRequest("kinds must name at least one event kind")
    unknown = sorted(wanted - EVENT_KIND_NAMES)
    if unknown:
        raise InvalidRequest(
            f"unknown event kind(s) {', '.join(unknown)}; known: {', '.join(sorted(EVENT_KIND_NAMES))}"
        )
    return wanted


async def fleet_session(
    st: State,
    after: Annotated[int, Depends(fleet_resume)],
    kinds: Annotated[frozenset[str] | None, Depends(kind_filter)],
) -> AsyncIterator[StreamSession]:
    frame = fleet_frame if kinds is None else fleet_frame_for(kinds)
    session = st.hub.open(follow_fleet(st.store, st.bus, after), frame)
    try:
        yield session
    finally:
        await session.close()


@router.get(
    "/api/stream",
    operation_id="streamFleetEvents",
    response_class=Response,  # an SseResponse; documented as FastAPI documents SSE
    responses=SSE_RESPONSES,
    summary="SSE: replay then tail every stream in store order",
    description=(
        "Each event is an unnamed message `data: <FleetEvent>` with `id: <store ordinal>`. "
        "Resume with `?from=N` (ordinal >= N) or `Last-Event-ID` (after that ordinal; wins over "
        "`from`). `?kinds=a,b` keeps only those event kinds (ids stay store ordinals, so they "
        "skip). Events the store failed to persist have no ordinal and are not part of this "
        "feed. With API auth on, `?access_token=` is accepted here."
    ),
)
async def fleet_stream(
    session: Annotated[StreamSession, Depends(fleet_session)],
) -> Response:
    return SseResponse(session)


# ---------------------------------------------------------------------------------- usage


# `since` / `until` as the schema says them: RFC 3339 date-times within the years `parse_ts`
# accepts (a subset of what it parses: it also takes other ISO 8601 forms, lowercase, days 29-31).
TIMESTAMP_PATTERN = (
    r"^(?:19[7-9][0-9]|[2-8][0-9]{3})-(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
    r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)
TimestampQuery = Query(
    max_length=64,
    description="RFC 3339 date-time, e.g. `2026-03-01T00:00:00Z` (without an offset: UTC).",
    json_schema_extra={"pattern": TIMESTAMP_PATTERN},
)


def ts_string(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


def parse_ts(value: str, name: str) -> datetime:
    try:
        dt = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidRequest(f"{name} must be an RFC 3339 timestamp, got {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    # Far enough inside datetime's range that the window arithmetic (up to MAX_USAGE_DAYS back,
    # a UTC offset) cannot overflow: an out-of-range year is a 422, not an OverflowError.
    if not TS_MIN_YEAR <= dt.year < TS_MAX_YEAR:
        raise InvalidRequest(
            f"{name} must be between {TS_MIN_YEAR} and {TS_MAX_YEAR}, got {value[:64]!r}"
        )
    return dt.astimezone(UTC)


def usage_window(
    since: str | None, until: str | None, days: int | None, now: datetime | None = None
) -> tuple[datetime, datetime]:
    until_dt = parse_ts(until, "until") if until else (now or datetime.now(UTC))
    if since:
        since_dt = parse_ts(since, "since")
    else:
        span = min(max(days if days is not None else 7, 1), MAX_USAGE_DAYS)
        since_dt = until_dt - timedelta(days=span)
    return since_dt, until_dt


def _add(a: int | None, b: int | None) -> int | None:
    if a is None and b is None:
        return None
    return (a or 0) + (b or 0)


def _addf(a: float | None, b: float | None) -> float | None:
    if a is None and b is None:
        return None
    return round((a or 0.0) + (b or 0.0), 10)


def build_report(since: str, until: str, rows: list[UsageDay]) -> UsageReport:
    groups: dict[str, UsageGroup] = {}
    for row in sorted(rows, key=lambda r: (r.workspace, r.day)):
        outcomes = UsageOutcomes(
            **{k: int(v) for k, v in row.outcomes.items() if k in UsageOutcomes.model_fields}
        )
        bucket = UsageBucket(
            day=row.day,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cost_usd=row.cost_usd,
            turns=row.turns,
            runs=row.runs,
            outcomes=outcomes,
        )
        g = groups.get(row.workspace)
        if g is None:
            g = groups[row.workspace] = UsageGroup(workspace=row.workspace)
        g.input_tokens = _add(g.input_tokens, bucket.input_tokens)
        g.output_tokens = _add(g.output_tokens, bucket.output_tokens)
        g.cost_usd = _addf(g.cost_usd, bucket.cost_usd)
        g.turns += bucket.turns
        g.runs += bucket.runs
        for k in UsageOutcomes.model_fields:
            setattr(g.outcomes, k, getattr(g.outcomes, k) + getattr(outcomes, k))
        g.series.append(bucket)
    return UsageReport(since=since, until=until, groups=[groups[k] for k in sorted(groups)])


@router.get(
    "/api/usage",
    operation_id="getUsage",
    response_model=UsageReport,
    responses=errors(422, 500),
    summary="Tokens, cost, turns, runs and outcomes per workspace per UTC day",
    description=(
        "Window: `until` (RFC 3339, default now) and `since` (default `until - days`, days "
        "defaults to 7, at least 1). Read from per-day aggregates maintained at ingest, so "
        "whole UTC days are counted: every day touched by [since, until). Token and cost sums "
        "are null when nothing in the bucket reported them."
    ),
)
async def usage(
    st: State,
    since: Annotated[str | None, TimestampQuery] = None,
    until: Annotated[str | None, TimestampQuery] = None,
    days: Annotated[int | None, Query(ge=-(10**6), le=10**6)] = None,
) -> Response:
    since_dt, until_dt = usage_window(since, until, days)
    since_day = since_dt.date().isoformat()
    # `until` is exclusive: an until of exactly midnight does not include that day.
    until_day = (until_dt - timedelta(microseconds=1)).date().isoformat()
    rows = await st.store.usage(since_day, until_day) if since_day <= until_day else []
    return json_response(build_report(ts_string(since_dt), ts_string(until_dt), rows))
