"""The exit codes of `prospero` (docs/cli.md). One code per kind of failure, so a script can
tell "no such agent" from "prosperod is down" without parsing the message."""

from __future__ import annotations

OK = 0
FAILURE = 1  # anything not below: a server error (5xx), an unexpected reply, a bug
USAGE = 2  # a bad command line or input, the server's 400/422 (the request as given is invalid)
NOT_FOUND = 3  # no such agent, workspace or decision (404; an id prefix that matches nothing)
AUTH = 4  # 401/403: no token, a wrong one, one of too small a scope; 429 after wrong ones
CONFLICT = 5  # 409: not in that state (already finished, not interactive), an ambiguous prefix
UNREACHABLE = 6  # prosperod cannot be reached or did not answer in time; a 503 (retry later)
AGENT_FAILED = 7  # --exit-status: the followed agent's run did not end `done`
INTERRUPTED = 130  # Ctrl-C
BROKEN_PIPE = 141  # the reader of stdout left (`prospero logs ID | head`)

TABLE: tuple[tuple[int, str], ...] = (
    (OK, "success"),
    (FAILURE, "other failure (server error, unexpected reply)"),
    (USAGE, "usage: bad command line or input (also the server's 400/422)"),
    (NOT_FOUND, "not found (404; an id prefix that matches nothing)"),
    (AUTH, "authentication or permission (401, 403, 429)"),
    (CONFLICT, "conflict (409: wrong state, ambiguous id prefix)"),
    (UNREACHABLE, "prosperod unreachable, timed out, or 503"),
    (AGENT_FAILED, "with --exit-status: the agent's run did not end done"),
    (INTERRUPTED, "interrupted (Ctrl-C)"),
)


def for_status(status: int) -> int:
    """The exit code of a failed HTTP request, by its status code."""
    if status in (400, 413, 415, 422):
        return USAGE
    if status == 404:
        return NOT_FOUND
    if status in (401, 403, 429):
        return AUTH
    if status == 409:
        return CONFLICT
    if status in (502, 503, 504):
        return UNREACHABLE
    return FAILURE


def help_text() -> str:
    """The exit-code table as the `--help` epilog shows it."""
    return "Exit codes: " + "; ".join(f"{code} {what}" for code, what in TABLE) + "."
