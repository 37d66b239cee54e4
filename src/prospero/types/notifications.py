"""Notifications (docs/notifications.md): webhook targets told when a decision is pending, an
agent finished or failed, or a budget warned or stopped an agent; and the log of deliveries.

A target's URL is a secret (Slack and Discord webhook URLs are bearer credentials): it is
stored as given and shown only masked (`mask_url`)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

NotifyFormat = Literal["slack", "discord", "json"]
NotifyEvent = Literal[
    "decision_pending", "agent_finished", "agent_failed", "budget_warning", "budget_exceeded"
]
NOTIFY_EVENTS: tuple[str, ...] = get_args(NotifyEvent)
DeliveryState = Literal["pending", "delivered", "failed"]

TARGET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
TargetName = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=TARGET_NAME_PATTERN)
]
WorkspaceName = Annotated[str, StringConstraints(min_length=1, max_length=200)]


def check_url(url: str) -> str:
    """An absolute http(s) URL with a host, no credentials in it, no whitespace."""
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        raise ValueError("the URL has whitespace or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        raise ValueError(f"not a URL: {e}") from e
    if parts.scheme not in ("http", "https"):
        raise ValueError("the URL must be http:// or https://")
    if not parts.hostname:
        raise ValueError("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("put no credentials in the URL's authority (user:password@)")
    return url


TargetUrl = Annotated[
    str, StringConstraints(min_length=1, max_length=2048), AfterValidator(check_url)
]


def mask_url(url: str) -> str:
    """`https://hooks.slack.com/…` : scheme, host and port; the path and query (the secret
    part of a Slack or Discord webhook URL) elided."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    rest = "/…" if (parts.path not in ("", "/") or parts.query) else "/"
    return f"{parts.scheme}://{host}{port}{rest}"


class TargetCreate(BaseModel):
    """`POST /api/notifications/targets`."""

    model_config = ConfigDict(extra="forbid")

    name: TargetName
    url: TargetUrl
    format: NotifyFormat = "json"
    events: list[NotifyEvent] | None = Field(
        default=None, min_length=1, description="the events sent to it (absent: all of them)"
    )
    workspaces: list[WorkspaceName] | None = Field(
        default=None, min_length=1, description="only these workspaces' events (absent: all)"
    )
    enabled: bool = True


class TargetPatch(BaseModel):
    """`PATCH /api/notifications/targets/{id}`: the fields given change; `events` or
    `workspaces` null: all."""

    model_config = ConfigDict(extra="forbid")

    name: TargetName | None = None
    url: TargetUrl | None = None
    format: NotifyFormat | None = None
    events: list[NotifyEvent] | None = Field(default=None, min_length=1)
    workspaces: list[WorkspaceName] | None = Field(default=None, min_length=1)
    enabled: bool | None = None


class NotificationTarget(BaseModel):
    """A target as stored (`url` in full: never send this model to a client)."""

    id: str
    name: str
    url: str
    format: NotifyFormat = "json"
    events: list[NotifyEvent] | None = None
    workspaces: list[str] | None = None
    enabled: bool = True
    created_at: str = ""

    def wants(self, event: str, workspace: str) -> bool:
        if not self.enabled:
            return False
        if self.events is not None and event not in self.events:
            return False
        return self.workspaces is None or workspace in self.workspaces


class TargetView(BaseModel):
    """A target as the API shows it: the URL masked."""

    id: str
    name: str
    url: str = Field(description="scheme, host and port only: the rest is a secret")
    format: NotifyFormat
    events: list[NotifyEvent] = Field(description="the events sent to it")
    workspaces: list[str] | None = Field(description="only these workspaces (null: all)")
    enabled: bool
    created_at: str

    @classmethod
    def of(cls, t: NotificationTarget) -> TargetView:
        return cls(
            id=t.id,
            name=t.name,
            url=mask_url(t.url),
            format=t.format,
            events=list(t.events) if t.events is not None else list(NOTIFY_EVENTS),
            workspaces=t.workspaces,
            enabled=t.enabled,
            created_at=t.created_at,
        )


class Delivery(BaseModel):
    """One notification to one target and what became of it (the delivery log)."""

    id: int
    target_id: str
    ordinal: int | None = Field(description="the event's fleet ordinal (null: a test message)")
    event: str = Field(description="a NotifyEvent, or `test`")
    agent_id: str | None = None
    workspace: str | None = None
    summary: str = ""
    state: DeliveryState = "pending"
    attempts: int = 0
    http_status: int | None = None
    error: str | None = None
    created_at: str = ""
    updated_at: str = ""


class TestResult(BaseModel):
    """`POST /api/notifications/targets/{id}/test`: the test message's delivery."""

    delivered: bool
    delivery: Delivery
