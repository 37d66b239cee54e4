"""Poison events: the reduced form of an event kind that cannot be serialised.

A kind is *poison* when its JSON cannot be written, by pydantic (what the store writes) or by
orjson (what the API and SSE write): a free-form value nested deeper than either limit (a tool
input 500 levels deep), a lone surrogate in any string (text decoded from `\\ud800` escapes),
an integer beyond 64 bits, a non-string key or an object JSON has no form for. Such an event is
stored and published in its *reduced* form instead of failing its batch (docs/adr/0004):

- every string: each lone surrogate replaced by the six characters `\\udXXX` (its escape, as
  text), so nothing is lost silently and the result is valid UTF-8;
- every free-form (`Any`) value: at most `MAX_DEPTH` levels of containers kept, deeper ones
  replaced by the string `DEEP_MARKER`; integers beyond 64 bits, non-string keys and other
  objects become strings; and, when any of that changed it, the value is wrapped as
  `{"_reduced": true, "value": <reduced value>}` — the flag a reader sees.

`json_safe` is the cheap check the store runs on the free-form values of the kinds that have
them (tool and decision events), whose pydantic JSON may succeed where orjson's would not.
Pure functions; no I/O.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from pydantic import BaseModel

from prospero.types.events import (
    CompactKind,
    DecisionPending,
    DecisionResolved,
    EventKind,
    ToolStarted,
)

# Containers kept in a free-form value (orjson refuses beyond 254, pydantic beyond 255; the
# event envelope adds a few levels).
MAX_DEPTH = 64
DEEP_MARKER = f"_reduced: nested deeper than {MAX_DEPTH} levels"
REDUCED_KEY = "_reduced"

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(s: str) -> str:
    """`s` with each lone surrogate replaced by its `\\udXXX` escape as text."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", s)


def json_safe(value: Any, depth: int = 0) -> bool:
    """Whether a free-form value is plain JSON both pydantic and orjson write as it is, with at
    most `MAX_DEPTH` levels of containers. Strings are not scanned (a lone surrogate already
    fails pydantic's serialisation, which the store tries first)."""
    t = type(value)
    if value is None or t is str or t is bool or t is float:
        return True
    if t is int:
        return bool(_INT_MIN <= value <= _INT_MAX)
    if t is dict:
        if depth >= MAX_DEPTH:
            return False
        return all(type(k) is str and json_safe(v, depth + 1) for k, v in value.items())
    if t is list or t is tuple:
        if depth >= MAX_DEPTH:
            return False
        return all(json_safe(v, depth + 1) for v in value)
    return False


def _clean_any(value: Any, depth: int) -> tuple[Any, bool]:
    """A free-form value made plain JSON (see the module doc); and whether it changed."""
    t = type(value)
    if value is None or t is bool or t is float:
        return value, False
    if t is str:
        if _SURROGATE.search(value):
            return escape_surrogates(value), True
        return value, False
    if t is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value, False
        return str(value), True
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_DEPTH:
            return DEEP_MARKER, True
        changed = False
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for k, v in value.items():
                key, kc = _clean_any(k if type(k) is str else str(k), depth + 1)
                cv, vc = _clean_any(v, depth + 1)
                changed = changed or kc or vc or type(k) is not str
                out[key] = cv
            return out, changed
        items: list[Any] = []
        for v in value:
            cv, vc = _clean_any(v, depth + 1)
            changed = changed or vc
            items.append(cv)
        return items, changed
    if isinstance(value, int):  # a subclass (IntEnum, ...): its plain value
        return _clean_any(int(value), depth)
    if isinstance(value, float):
        return float(value), False
    return escape_surrogates(repr(value)), True


def _reduce_typed(value: Any) -> tuple[Any, bool]:
    """A value of a typed field: strings escaped, models and lists reduced; the rest as is."""
    if type(value) is str:
        if _SURROGATE.search(value):
            return escape_surrogates(value), True
        return value, False
    if isinstance(value, Enum):
        return value, False
    if isinstance(value, BaseModel):
        return reduce_model(value)
    if type(value) is list or type(value) is tuple:
        changed = False
        items = []
        for v in value:
            cv, vc = _reduce_typed(v)
            changed = changed or vc
            items.append(cv)
        return (type(value)(items) if changed else value), changed
    if type(value) is dict:
        changed = False
        out = {}
        for k, v in value.items():
            ck, kc = _reduce_typed(k)
            cv, vc = _reduce_typed(v)
            changed = changed or kc or vc
            out[ck] = cv
        return (out if changed else value), changed
    return value, False


def reduce_model(model: BaseModel) -> tuple[BaseModel, bool]:
    """The model with every field reduced (see the module doc); and whether anything changed."""
    update: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = model.__dict__.get(name)
        if info.annotation is Any:
            # From depth 1: the `_reduced` wrapper is the first level of the result.
            cleaned, changed = _clean_any(value, 1)
            if changed:
                update[name] = {REDUCED_KEY: True, "value": cleaned}
        else:
            cleaned, changed = _reduce_typed(value)
            if changed:
                update[name] = cleaned
    if not update:
        return model, False
    return model.model_copy(update=update), True


def reduce_kind(kind: EventKind) -> EventKind:
    """The reduced form of a kind (itself when nothing needed reducing)."""
    reduced, _ = reduce_model(kind)
    return reduced  # type: ignore[return-value]


def reduce_compact(kind: CompactKind) -> CompactKind:
    """`reduce_kind` for a compact kind (an Output as its (stream, chunk) pair)."""
    if type(kind) is tuple:
        return (kind[0], escape_surrogates(kind[1]))
    return reduce_kind(kind)  # type: ignore[arg-type]


def needs_check(kind: Any) -> bool:
    """Whether the kind carries free-form values `json_safe` should look at."""
    t = type(kind)
    return t is ToolStarted or t is DecisionPending or t is DecisionResolved


def free_form_safe(kind: Any) -> bool:
    """`json_safe` over the kind's free-form values (`needs_check` kinds only)."""
    t = type(kind)
    if t is ToolStarted:
        return json_safe(kind.__dict__["input"])
    if t is DecisionPending or t is DecisionResolved:
        return json_safe(kind.__dict__["tool_call"].__dict__.get("input"))
    return True
