"""The request string types refuse control bytes and lone surrogates (prospero.types.text)."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel, ValidationError

from prospero.types.text import (
    ABSOLUTE_PATH_PATTERN,
    NAME_PATTERN,
    TEXT_PATTERN,
    AbsolutePath,
    FreeText,
    Name,
)


class M(BaseModel):
    name: Name | None = None
    text: FreeText | None = None
    path: AbsolutePath = ""


@pytest.mark.parametrize(
    "value", ["\x00", "a\x01", "\x1b[0m", "\x7f", "\x85", "\t", "\n", "\ud800"]
)
def test_names_refuse_every_control_character(value: str) -> None:
    with pytest.raises(ValidationError) as err:
        M(name=value)
    assert err.value.errors()[0]["type"] == "control_character"
    assert re.fullmatch(NAME_PATTERN, value) is None or value == "\ud800"


@pytest.mark.parametrize("value", ["\x00", "a\x01", "\x1b[0m", "\x0b", "\x0c", "\udfff"])
def test_free_text_refuses_nul_and_c0_controls(value: str) -> None:
    with pytest.raises(ValidationError) as err:
        M(text=value)
    assert "U+" in err.value.errors()[0]["msg"]


def test_free_text_keeps_tab_newline_cr_and_other_text() -> None:
    value = "line 1\tcol\r\nline 2 \x7f \x85 é 💩"
    assert M(text=value).text == value
    assert re.fullmatch(TEXT_PATTERN, value)
    assert M(name="ok-name_1.2 é").name == "ok-name_1.2 é"


@pytest.mark.parametrize("value", ["relative", "../..", "~", "~/x", " /x"])
def test_paths_must_be_absolute(value: str) -> None:
    with pytest.raises(ValidationError) as err:
        M(path=value)
    assert "absolute" in err.value.errors()[0]["msg"]
    assert re.fullmatch(ABSOLUTE_PATH_PATTERN, value) is None


def test_schema_declares_the_patterns() -> None:
    props = M.model_json_schema()["properties"]
    assert props["path"]["pattern"] == ABSOLUTE_PATH_PATTERN
    assert {"pattern": NAME_PATTERN, "type": "string"} in props["name"]["anyOf"]
    assert M(path="/abs/ok").path == "/abs/ok" and M().path == ""
