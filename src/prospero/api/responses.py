"""Response helpers: orjson bodies, empty 2xx bodies, provider-config cleaning."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel
from starlette.responses import Response

from prospero.types.api import K8S_SUMMARY_TAIL, ErrorEnvelope


def dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json", by_alias=True)


def json_response(data: Any, status: int = 200) -> Response:
    if isinstance(data, BaseModel):
        data = dump(data)
    return Response(content=orjson.dumps(data), status_code=status, media_type="application/json")


def empty(status: int) -> Response:
    return Response(status_code=status)


def clean_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """RepoProviderConfig on output: absent/empty fields are omitted (surface §1.3), in the
    nested `caliband` endpoint too."""
    out = {k: v for k, v in cfg.items() if v is not None and v != {}}
    if isinstance(out.get("caliband"), dict):
        out["caliband"] = {k: v for k, v in out["caliband"].items() if v is not None}
    return out


def clean_workspace(ws: dict[str, Any]) -> dict[str, Any]:
    """A workspace on output: its config cleaned; the k8s-only tail keys omitted when unset
    (a local workspace's payload is what it was before the k8s backend)."""
    if isinstance(ws.get("config"), dict):
        ws["config"] = clean_config(ws["config"])
    for key in K8S_SUMMARY_TAIL:
        if key in ws and ws[key] is None:
            del ws[key]
    if not ws.get("warnings", True):
        del ws["warnings"]
    return ws


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting the `{error, kind}` envelope."""
    return {code: {"model": ErrorEnvelope} for code in codes}
