"""Cron schedules of automations: standard 5-field expressions (minute hour day-of-month month
day-of-week), evaluated in UTC by `cronsim` (maintained; the parser behind healthchecks.io).

`validate` refuses anything but exactly five fields (cronsim would also take a sixth, seconds
field). `latest_tick(expr, now)` is the most recent tick at or before `now`; `next_tick` the
first one after it. Ticks are whole minutes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

MAX_EXPR = 200


class CronError(ValueError):
    pass


def validate(expr: str) -> str:
    """The expression with its fields single-spaced; CronError when it is not valid."""
    fields = expr.split()
    if len(expr) > MAX_EXPR:
        raise CronError(f"cron expression longer than {MAX_EXPR} characters")
    if len(fields) != 5:
        raise CronError(
            f"cron expression {expr!r} must have 5 fields (minute hour day-of-month month "
            f"day-of-week), not {len(fields)}"
        )
    norm = " ".join(fields)
    try:
        CronSim(norm, datetime(2026, 1, 1, tzinfo=UTC))
    except CronSimError as e:
        raise CronError(f"invalid cron expression {expr!r}: {e}") from e
    return norm


def _utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        return now.replace(tzinfo=UTC)
    return now.astimezone(UTC)


def latest_tick(expr: str, now: datetime) -> datetime | None:
    """The most recent tick at or before `now` (None if there is none in the past)."""
    # cronsim's reverse iteration starts strictly before its start: one minute past `now`'s.
    start = _utc(now).replace(second=0, microsecond=0) + timedelta(minutes=1)
    try:
        return next(CronSim(expr, start, reverse=True))
    except (StopIteration, CronSimError):
        return None


def next_tick(expr: str, now: datetime) -> datetime | None:
    """The first tick strictly after `now`."""
    try:
        return next(CronSim(expr, _utc(now)))
    except (StopIteration, CronSimError):
        return None
