"""The OpenAPI document and `/docs` (issue 10, item 6): operation ids that read as names, the
security schemes and each operation's scope, every error as the `{error, kind}` envelope (the
shape the server really sends), empty 2xx bodies, and Swagger UI served from packaged assets
with nothing loaded from elsewhere. The live conformance run is tests/contract/test_openapi.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.routing import APIRoute

from prospero.api.app import create_app
from prospero.api.auth import required_scope
from prospero.core.metrics import Metrics
from tests.api.conftest import Stack, envelope

METHODS = ("get", "put", "post", "delete", "patch")
CAMEL = re.compile(r"^[a-z][a-z]*(?:[A-Z][a-z]+)*$")
OPEN = (
    {("get", "/healthz"), ("get", "/readyz")}
    | {(m, "/api/session") for m in ("get", "post", "delete")}
    | {("post", "/api/automations/{ref}/trigger")}  # its HMAC signature is the credential
)


class _Offline:
    manager = None
    store = None
    bus = None
    config = None
    metrics = Metrics()


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app(_Offline())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def doc(app: Any) -> dict[str, Any]:
    spec: dict[str, Any] = app.openapi()
    return spec


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (m, p, op) for p, item in doc["paths"].items() for m, op in item.items() if m in METHODS
    ]


def api_routes(routes: list[Any]) -> list[APIRoute]:
    """Every APIRoute, including those of included routers (FastAPI >= 0.16x keeps them
    inside the router rather than copying them onto the app)."""
    out: list[APIRoute] = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append(r)
        elif hasattr(r, "original_router"):
            out.extend(api_routes(list(r.original_router.routes)))
    return out


def test_every_route_names_its_operation_in_camel_case(app: Any, doc: dict[str, Any]) -> None:
    routes = [r for r in api_routes(list(app.routes)) if r.include_in_schema]
    assert routes
    for r in routes:
        assert r.operation_id, f"{r.path} has no explicit operation_id="
        assert CAMEL.match(r.operation_id), r.operation_id
    ids = [op["operationId"] for _m, _p, op in operations(doc)]
    assert len(ids) == len(set(ids)) == len(routes)
    named = {(m, p): op["operationId"] for m, p, op in operations(doc)}
    assert named[("post", "/api/workspaces/{workspace}/agents")] == "spawnAgent"
    assert named[("get", "/api/workspaces/{workspace}/agents")] == "listAgents"
    assert named[("post", "/api/agents/{agent_id}/kill")] == "killAgent"
    assert named[("get", "/api/agents/{agent_id}/stream")] == "streamAgentEvents"
    assert named[("get", "/healthz")] == "healthz"


def test_security_schemes_and_each_operations_scope(doc: dict[str, Any]) -> None:
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["sessionCookie"]["in"] == "cookie"
    assert schemes["sessionCookie"]["name"] == "prospero_session"
    assert schemes["accessTokenQuery"] == {
        **schemes["accessTokenQuery"],
        "in": "query",
        "name": "access_token",
    }
    for method, path, op in operations(doc):
        if (method, path) in OPEN:
            assert op["security"] == [], (method, path)
            continue
        scope = required_scope(method.upper(), path)
        assert scope is not None, (method, path)
        names = [next(iter(req)) for req in op["security"]]
        expected = ["bearerAuth", "sessionCookie"]
        if path.endswith("/stream"):
            expected.append("accessTokenQuery")
        assert names == expected, (method, path)
        assert all(list(req.values()) == [[scope.name]] for req in op["security"])
        assert op["x-prospero-scope"] == scope.name
        assert {"401", "403", "429"} <= set(op["responses"]), (method, path)


def test_every_error_is_the_envelope(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert schemas["ErrorEnvelope"]["required"] == ["error", "kind"]
    for method, path, op in operations(doc):
        responses = op["responses"]
        assert {"400", "408", "413", "421", "500"} <= set(responses), (method, path)
        if method != "get":
            assert "403" in responses, (method, path)
        if "requestBody" in op:
            assert {"415", "422"} <= set(responses), (method, path)
        for code, resp in responses.items():
            if int(code) < 400:
                continue
            schema = resp["content"]["application/json"]["schema"]
            refs = [schema] if "$ref" in schema else schema["anyOf"]
            assert {"$ref": "#/components/schemas/ErrorEnvelope"} in refs, (method, path, code)


# automations: a create answers its secret once (201); a fire answers its run (202)
WITH_BODIES = {
    ("post", "/api/automations"): "/AutomationCreated",
    ("post", "/api/automations/{ref}/run"): "/AutomationRun",
    ("post", "/api/automations/{ref}/trigger"): "/AutomationRun",
    ("post", "/api/notifications/targets"): "/TargetView",
}


def test_bodies_and_media_types(doc: dict[str, Any]) -> None:
    # a k8s workspace write answers 202 with the Workspace CR's phase (WorkspaceAccepted)
    k8s_accepted = {("post", "/api/workspaces"), ("put", "/api/workspaces/{name}/config")}
    for method, path, op in operations(doc):
        for code, resp in op["responses"].items():
            if code == "202" and (method, path) in k8s_accepted:
                schema = resp["content"]["application/json"]["schema"]
                assert schema["$ref"].endswith("/WorkspaceAccepted"), (method, path)
            elif code == "201" and (method, path) == ("post", "/api/workspaces"):
                schema = resp["content"]["application/json"]["schema"]
                assert schema["$ref"].endswith("/WorkspaceSummary"), (method, path)
            elif (method, path) in WITH_BODIES and code in ("201", "202"):
                schema = resp["content"]["application/json"]["schema"]
                assert schema["$ref"].endswith(WITH_BODIES[(method, path)]), (method, path)
            elif code in ("201", "202", "204") and path != "/api/workspaces/{workspace}/agents":
                assert "content" not in resp, (method, path, code)
    paths = doc["paths"]
    assert set(paths["/api/workspaces"]["post"]["responses"]) >= {"201", "202"}
    assert set(paths["/api/workspaces/{name}/config"]["put"]["responses"]) >= {"202", "204"}
    assert set(paths["/healthz"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    for sse in ("/api/stream", "/api/agents/{agent_id}/stream"):
        assert set(paths[sse]["get"]["responses"]["200"]["content"]) == {"text/event-stream"}
    spawned = paths["/api/workspaces/{workspace}/agents"]["post"]["responses"]["201"]
    assert spawned["content"]["application/json"]["schema"]["$ref"].endswith("/SpawnedResponse")


def test_no_parameter_is_documented_as_nullable(doc: dict[str, Any]) -> None:
    for method, path, op in operations(doc):
        for param in op.get("parameters", []):
            assert {"type": "null"} not in param["schema"].get("anyOf", []), (method, path, param)


async def test_validation_errors_are_sent_as_documented(stack: Stack) -> None:
    """The 422 the document promises is what a validation failure really answers."""
    r = await stack.client.get("/api/agents/x/events", params={"limit": 0})
    envelope(r, 422, "invalid_request")
    r = await stack.client.post("/api/workspaces/ws/agents", json={"prompt": ""})
    envelope(r, 422, "invalid_request")


# ------------------------------------------------------------------------------------ /docs


async def test_docs_are_served_from_the_server_itself(stack: Stack) -> None:
    r = await stack.client.get("/docs")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    html = r.text
    assert not re.search(r"https?://", html), "the page must load nothing from elsewhere"
    csp = r.headers["content-security-policy"]
    assert "script-src 'self' 'sha256-" in csp and "connect-src 'self'" in csp
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert {"/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css"} <= set(refs)
    assert "url: '/openapi.json'" in html
    for ref in [*refs, "/openapi.json"]:
        assert ref.startswith("/"), ref
        a = await stack.client.get(ref)
        assert a.status_code == 200, ref
        assert a.content, ref
    js = await stack.client.get("/docs/swagger-ui-bundle.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert "SwaggerUIBundle" in js.text
    again = await stack.client.get(
        "/docs/swagger-ui.css", headers={"If-None-Match": js.headers["etag"]}
    )
    assert again.status_code == 200
    cached = await stack.client.get(
        "/docs/swagger-ui.css", headers={"If-None-Match": again.headers["etag"]}
    )
    assert cached.status_code == 304
    envelope(await stack.client.get("/docs/nope.js"), 404, "not_found")
    envelope(await stack.client.get("/redoc"), 404, "not_found")


async def test_docs_and_the_document_are_open_when_tokens_are_configured(
    make_stack: Any,
) -> None:
    stack = await make_stack(tokens={"admin": "s3cret"})
    for path in ("/docs", "/docs/swagger-ui.css", "/openapi.json"):
        assert (await stack.client.get(path)).status_code == 200, path
    envelope(await stack.client.get("/api/fleet"), 401, "unauthorized")


def test_the_schema_is_no_looser_than_the_validation(doc: dict[str, Any]) -> None:
    """The requests the schema allowed and the server refused (issue 10, item 5)."""
    paths = doc["paths"]

    def param(path: str, name: str) -> dict[str, Any]:
        found = [p for p in paths[path]["get"]["parameters"] if p["name"] == name]
        assert len(found) == 1, (path, name)
        schema: dict[str, Any] = found[0]["schema"]
        return schema

    # `since` / `until`: RFC 3339 date-times in the years the server takes
    for name in ("since", "until"):
        pattern = re.compile(param("/api/usage", name)["pattern"])
        assert pattern.search("2026-03-01T00:00:00Z")
        assert not pattern.search("yesterday")
        assert not pattern.search("1900-01-01T00:00:00Z")
    # `kinds`: known event kinds only
    kinds = re.compile(param("/api/stream", "kinds")["pattern"])
    assert kinds.search("status_changed,agent_finished")
    assert not kinds.search("status_changed,nope") and not kinds.search("")
    # `Last-Event-ID`: digits only, never a JSON null
    last = param("/api/stream", "last-event-id")
    assert last["type"] == "string" and not re.search(last["pattern"], "null")
    # a workspace root is required and absolute
    body = doc["components"]["schemas"]["AddWorkspaceBody"]
    assert "root" in body["required"]
    assert not re.search(body["properties"]["root"]["pattern"], "")
    assert not re.search(body["properties"]["root"]["pattern"], "../..")
    # env names are names: no other property passes as "additional"
    env = doc["components"]["schemas"]["RepoProviderConfig"]["properties"]["env"]
    assert "patternProperties" not in env and env["propertyNames"]["minLength"] == 1
    # no path segment holds a control character
    for _m, _p, op in operations(doc):
        for p in op.get("parameters", []):
            if p["in"] == "path":
                assert not re.search(p["schema"]["pattern"], "a\x00b"), (_p, p)
