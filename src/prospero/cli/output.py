"""Output formats shared by every command: `-o text|wide|json|yaml`.

`text` is for people; `wide` is text with more columns (listings; elsewhere it is text);
`json` and `yaml` print the API's data as it came (a command whose API reply is empty prints a
small result object instead, e.g. `{"agent_id": ..., "action": "kill", "accepted": true}`).
Commands that stream (`follow`, `logs`, `--watch`) print one JSON object per line with `json`
and one YAML document per item (`---` before each) with `yaml`.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any

from pydantic import BaseModel


class OutputFormat(StrEnum):
    text = "text"
    wide = "wide"
    json = "json"
    yaml = "yaml"

    @property
    def machine(self) -> bool:
        """JSON or YAML: data, not text for people."""
        return self in (OutputFormat.json, OutputFormat.yaml)


def plain(data: Any) -> Any:
    """A DTO (or a list/dict of them) as the JSON data the API sends."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json", by_alias=True)
    if isinstance(data, list | tuple):
        return [plain(x) for x in data]
    if isinstance(data, dict):
        return {k: plain(v) for k, v in data.items()}
    return data


def _yaml(data: Any, *, start: bool) -> str:
    import yaml  # only when asked for: `prospero` starts faster without it

    return str(
        yaml.safe_dump(
            plain(data),
            sort_keys=False,
            allow_unicode=True,
            default_flow_style=False,
            explicit_start=start,
            width=100,
        )
    )


def print_data(data: Any, fmt: OutputFormat) -> None:
    """The whole reply as one JSON (indented) or YAML document."""
    if fmt is OutputFormat.yaml:
        sys.stdout.write(_yaml(data, start=False))
    else:
        sys.stdout.write(json.dumps(plain(data), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_item(data: Any, fmt: OutputFormat) -> None:
    """One item of a stream: a JSON line, or a YAML document."""
    if fmt is OutputFormat.yaml:
        sys.stdout.write(_yaml(data, start=True))
    else:
        sys.stdout.write(json.dumps(plain(data), ensure_ascii=False) + "\n")
    sys.stdout.flush()
