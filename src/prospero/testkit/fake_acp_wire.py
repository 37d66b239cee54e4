"""Script entries of `prospero.testkit.acp_scripts` as ACP wire objects (tool call fields,
tool content, permission options), and the text of a prompt's content blocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def text_of(prompt: Sequence[Any]) -> str:
    parts: list[str] = []
    for block in prompt:
        t = block.get("text") if isinstance(block, dict) else getattr(block, "text", None)
        if isinstance(t, str):
            parts.append(t)
    return "".join(parts)


def content_items(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "content", "content": {"type": "text", "text": content}}]
    if isinstance(content, list):
        return [dict(c) for c in content]
    raise ValueError(f"tool content must be a str or a list, got {type(content).__name__}")


def tool_fields(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"toolCallId": str(spec["id"])}
    for src, dst in (
        ("title", "title"),
        ("kind", "kind"),
        ("status", "status"),
        ("raw_input", "rawInput"),
        ("raw_output", "rawOutput"),
        ("locations", "locations"),
    ):
        if src in spec and spec[src] is not None:
            out[dst] = spec[src]
    if spec.get("content") is not None:
        out["content"] = content_items(spec["content"])
    return out


def option_wire(o: dict[str, Any]) -> dict[str, Any]:
    return {
        "optionId": str(o.get("option_id", o.get("optionId", ""))),
        "name": str(o.get("name", o.get("option_id", o.get("optionId", "")))),
        "kind": str(o.get("kind", "allow_once")),
    }
