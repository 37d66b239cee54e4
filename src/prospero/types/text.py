"""String types for request fields that refuse control bytes (issue 10, item 5).

A NUL or another control byte in a name, an id, a path or a label is never meaningful and
breaks whatever it reaches (SQLite text, the caliband wire, the process environment, a
terminal); a lone surrogate cannot be encoded as UTF-8 at all. Request models use these types
so such input is a 422 with a clear message instead of a traceback further down:

- `Name`: names, ids, labels, model names, env keys, globs — no control character at all
  (C0, DEL, C1) and no lone surrogate;
- `FreeText`: prompts, input text, notes, env values — tab, newline and carriage return are
  allowed; NUL, the other C0 controls and lone surrogates are not;
- `AbsolutePath`: a `Name` that is also an absolute path (`/…`); whether it exists is checked
  where it is used (`prospero.core.sources.validate_root`).

The JSON Schema of each type carries the equivalent `pattern`, so generated clients (and
schemathesis) know what the server accepts.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import AfterValidator, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

# The patterns leave out the lone-surrogate range the validators also refuse: JSON Schema
# regex engines (jsonschema-rs, used by schemathesis) reject surrogate code points in a
# pattern, and neither UTF-8 JSON nor a percent-encoded URL can carry a lone surrogate anyway.
NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
# An environment variable name (RepoProviderConfig.env keys): also non-empty and without `=`.
ENV_NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f=]+$"
TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*$"
# "" is let through (the route answers "a local workspace needs a root"), hence the `?`.
ABSOLUTE_PATH_PATTERN = r"^(/[^\x00-\x1f\x7f-\x9f]*)?$"

_TEXT_ALLOWED = frozenset("\t\n\r")


def _is_surrogate(code: int) -> bool:
    return 0xD800 <= code <= 0xDFFF


def control_char_in_name(value: str) -> tuple[int, int] | None:
    """(index, code point) of the first character a `Name` refuses, else None."""
    for i, ch in enumerate(value):
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F or _is_surrogate(code):
            return i, code
    return None


def control_char_in_text(value: str) -> tuple[int, int] | None:
    """(index, code point) of the first character a `FreeText` refuses, else None."""
    for i, ch in enumerate(value):
        code = ord(ch)
        if (code < 0x20 and ch not in _TEXT_ALLOWED) or _is_surrogate(code):
            return i, code
    return None


def describe_bad_char(index: int, code: int) -> str:
    what = "a lone surrogate" if _is_surrogate(code) else "a control character"
    return f"contains {what} (U+{code:04X} at index {index})"


def _refuse(found: tuple[int, int], allowed: str) -> PydanticCustomError:
    index, code = found
    return PydanticCustomError(
        "control_character",
        "must not contain control characters{allowed}: {what}",
        {"allowed": allowed, "what": describe_bad_char(index, code)},
    )


def check_name(value: str) -> str:
    found = control_char_in_name(value)
    if found is not None:
        raise _refuse(found, "")
    return value


def check_text(value: str) -> str:
    found = control_char_in_text(value)
    if found is not None:
        raise _refuse(found, " (tab, newline and carriage return are allowed)")
    return value


def check_absolute_path(value: str) -> str:
    check_name(value)
    if value and not os.path.isabs(value):
        raise PydanticCustomError(
            "absolute_path",
            "must be an absolute path (starting with /), got {value}",
            {"value": repr(value[:200])},
        )
    return value


class _Pattern:
    """Adds `pattern` to a string's JSON Schema (validation is done by the AfterValidator,
    which gives a clearer message than a regex mismatch)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema: dict[str, Any] = handler(core_schema)
        schema["pattern"] = self.pattern
        return schema


Name = Annotated[str, AfterValidator(check_name), _Pattern(NAME_PATTERN)]
FreeText = Annotated[str, AfterValidator(check_text), _Pattern(TEXT_PATTERN)]
AbsolutePath = Annotated[str, AfterValidator(check_absolute_path), _Pattern(ABSOLUTE_PATH_PATTERN)]
