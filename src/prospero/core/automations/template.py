"""Prompt templates of automations: a tiny placeholder syntax, no code.

    text {{ name }} text {{ payload.items.0.title }} \\{{ literal braces

- `{{ path }}`: a dotted path, whitespace around it allowed. Roots: `trigger` (`schedule` |
  `webhook` | `manual`), `now` (the fire time, ISO 8601 UTC), `run.id`, `automation.id`,
  `automation.name`, `automation.workspace`, `payload` (the webhook's JSON body; `{}` for the
  other triggers) and `payload.<key>...`, where a segment of digits indexes a list. Segments
  are `[A-Za-z0-9_-]+`.
- `\\{{` is a literal `{{`; any other character, `}}` included, is literal text.
- Rendering: a string is inserted as is; a number, boolean, null, list or object as compact
  JSON. A payload path that does not resolve renders as the empty string (webhook senders
  omit fields). Inserted values are never re-parsed (a payload value `{{x}}` stays `{{x}}`),
  and each is cut to `MAX_VALUE_CHARS` characters.
- An unknown root or `automation`/`run` field, an empty or malformed path, or an unclosed `{{`
  is a `TemplateError` with its character offset (line and column too) at creation.

The values are looked up in plain dicts and lists: there is no attribute access, call or
expression of any kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

MAX_VALUE_CHARS = 8192
MAX_PLACEHOLDERS = 200

ROOTS: dict[str, frozenset[str] | None] = {
    # root -> allowed sub-fields (None: any path below it; empty: no sub-field)
    "trigger": frozenset(),
    "now": frozenset(),
    "run": frozenset({"id"}),
    "automation": frozenset({"id", "name", "workspace"}),
    "payload": None,
}

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")


class TemplateError(ValueError):
    def __init__(self, message: str, position: int, text: str) -> None:
        line = text.count("\n", 0, position) + 1
        col = position - (text.rfind("\n", 0, position) + 1) + 1
        super().__init__(f"{message} at offset {position} (line {line}, column {col})")
        self.position = position
        self.line = line
        self.column = col


@dataclass(frozen=True)
class Placeholder:
    path: tuple[str, ...]


Part = str | Placeholder


@dataclass(frozen=True)
class Template:
    source: str
    parts: tuple[Part, ...]

    @property
    def placeholders(self) -> list[Placeholder]:
        return [p for p in self.parts if isinstance(p, Placeholder)]


def parse(text: str) -> Template:
    parts: list[Part] = []
    buf: list[str] = []
    i, n = 0, len(text)
    count = 0
    while i < n:
        if text.startswith("\\{{", i):
            buf.append("{{")
            i += 3
            continue
        if text.startswith("{{", i):
            end = text.find("}}", i + 2)
            if end < 0:
                raise TemplateError("unclosed '{{'", i, text)
            path = _path(text[i + 2 : end], i, text)
            count += 1
            if count > MAX_PLACEHOLDERS:
                raise TemplateError(f"more than {MAX_PLACEHOLDERS} placeholders", i, text)
            if buf:
                parts.append("".join(buf))
                buf = []
            parts.append(Placeholder(path))
            i = end + 2
            continue
        j = text.find("{{", i)
        k = text.find("\\{{", i)
        stops = [x for x in (j, k) if x >= 0]
        stop = min(stops) if stops else n
        if stop == i:  # a lone backslash not starting an escape
            stop = i + 1
        buf.append(text[i:stop])
        i = stop
    if buf:
        parts.append("".join(buf))
    return Template(text, tuple(parts))


def _path(inner: str, at: int, text: str) -> tuple[str, ...]:
    body = inner.strip()
    if not body:
        raise TemplateError("empty placeholder '{{}}'", at, text)
    segments = body.split(".")
    for seg in segments:
        if not _SEGMENT.fullmatch(seg):
            raise TemplateError(f"malformed placeholder {{{{{body}}}}}", at, text)
    root, rest = segments[0], segments[1:]
    if root not in ROOTS:
        known = ", ".join(sorted(ROOTS))
        raise TemplateError(f"unknown placeholder root {root!r} (one of {known})", at, text)
    allowed = ROOTS[root]
    if allowed is not None:
        if len(rest) > 1 or (rest and rest[0] not in allowed) or (not rest and allowed):
            fields = ", ".join(f"{root}.{f}" for f in sorted(allowed)) or root
            raise TemplateError(f"unknown placeholder {body!r} (use {fields})", at, text)
    return tuple(segments)


def _lookup(value: Any, path: tuple[str, ...]) -> Any:
    for seg in path:
        if isinstance(value, dict):
            if seg not in value:
                return None
            value = value[seg]
        elif isinstance(value, list) and seg.isdigit():
            idx = int(seg)
            if idx >= len(value):
                return None
            value = value[idx]
        else:
            return None
    return value


def _text(value: Any, missing: bool) -> str:
    if missing:
        return ""
    if isinstance(value, str):
        out = value
    else:
        try:
            out = orjson.dumps(value).decode()
        except TypeError:
            out = ""
    return out[:MAX_VALUE_CHARS]


def render(template: Template, context: dict[str, Any]) -> str:
    """Render with `context` (plain JSON-like data: `trigger`, `now`, `run`, `automation`,
    `payload`)."""
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        root, rest = part.path[0], part.path[1:]
        if root not in context:
            out.append("")
            continue
        value = context[root]
        found = _lookup(value, rest) if rest else value
        missing = found is None and (bool(rest) and not _present(value, rest))
        out.append(_text(found, missing))
    return "".join(out)


def _present(value: Any, path: tuple[str, ...]) -> bool:
    """Whether `path` resolves (to anything, null included)."""
    for seg in path:
        if isinstance(value, dict) and seg in value:
            value = value[seg]
        elif isinstance(value, list) and seg.isdigit() and int(seg) < len(value):
            value = value[int(seg)]
        else:
            return False
    return True
