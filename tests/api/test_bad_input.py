"""Bad input gets a 4xx, never a traceback; HEAD is answered wherever GET is (issue 10, item 5).

Against a real server: every operation of the app's own OpenAPI document is sent NUL bytes,
control bytes, lone surrogates and huge numbers in each path parameter, query parameter and
body field (string leaves, map keys, numbers); nothing may answer 5xx, every refusal is the
`{error, kind}` envelope, and a string no field accepts is always a 4xx.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from prospero.api.app import api_state_of
from prospero.api.errors import envelope_bytes
from prospero.api.routes_agents import MAX_CURSOR
from prospero.api.routes_dashboard import ASSETS
from prospero.core.errors import InvalidConfig
from tests.api.conftest import Stack, StackFactory, envelope
from tests.support import wait_until

# Refused by every string type of a request body (names, free text, paths, literals).
BAD_STRINGS = ["\x00", "a\x00b", "\x01", "\x1b[31m", "\x0b", "\ud800", "x\udfff"]
# Refused in names/ids/labels/roots, allowed in free text (prompts, input text, notes).
NAME_ONLY_BAD = ["\x7f", "\x85", "a\tb", "a\nb"]
BAD_NUMBERS: list[Any] = [2**63, -(2**63) - 1, 10**30, float("inf"), float("-inf"), float("nan")]
# Already percent-encoded. True: no resource can have such a name, so it must be a 4xx.
BAD_PATH_SEGMENTS = {
    "%00": True,
    "a%00b": True,
    "%01": True,
    "%1B": True,
    "%0A": True,
    "%7F": True,
    "%C2%85": True,
    "%ED%A0%80": False,  # invalid UTF-8 (a UTF-8-encoded surrogate): decoded as U+FFFD
    "%FF": False,
    "%F0%9F%92%A9": False,
    "9223372036854775808": False,
    "-1": False,
}
BAD_QUERY_VALUES = [
    "%00",
    "a%00b",
    "%01",
    "%1B",
    "%ED%A0%80",
    "%FF",
    "9223372036854775808",
    "-9223372036854775809",
    "1e400",
    "NaN",
    "9" * 5000,
]
BAD_LAST_EVENT_IDS: list[str | bytes] = [
    "9223372036854775807",
    "9223372036854775808",
    str(MAX_CURSOR + 1),
    "9" * 5000,
    "-1",
    "abc",
    "1e3",
    "+5",
    "5_0",
    "0x10",
    b"\xb2",  # SUPERSCRIPT TWO (latin-1): str.isdigit() but not an ASCII digit
    b"\xef\xbc\x95",  # FULLWIDTH DIGIT FIVE in UTF-8
]
HTTP_METHODS = ("get", "post", "put", "patch", "delete")


@dataclass
class Target:
    stack: Stack
    agent_id: str
    dir: Path

    def path_value(self, name: str) -> str:
        if name == "agent_id":
            return self.agent_id
        if name in ("workspace", "name"):
            return "fz"
        return "nonexistent"


@pytest.fixture
async def target(make_stack: StackFactory) -> Target:
    stack = await make_stack()
    await stack.add_workspace("fz")
    agent_id = await stack.spawn(ws="fz")
    await stack.wait_finished(agent_id)
    spare = stack.tmp / "spare"
    spare.mkdir()
    return Target(stack, agent_id, spare)


# ------------------------------------------------------------------------------ schema walking


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = doc["components"]["schemas"][name]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [s for s in schema[key] if _resolve(doc, s).get("type") != "null"]
            return _resolve(doc, options[0]) if options else {"type": "null"}
    return schema


def sample(doc: dict[str, Any], schema: dict[str, Any], at: tuple[Any, ...], maps: set[Any]) -> Any:
    """A value for `schema` with every optional property filled; map paths go into `maps`."""
    s = _resolve(doc, schema)
    if "enum" in s:
        return s["enum"][0]
    if "const" in s:
        return s["const"]
    kind = s.get("type")
    if kind == "object" or "properties" in s:
        out = {k: sample(doc, v, (*at, k), maps) for k, v in (s.get("properties") or {}).items()}
        extra = s.get("additionalProperties")
        if not s.get("properties") and isinstance(extra, dict):
            maps.add(at)
            out["K"] = sample(doc, extra, (*at, "K"), maps)
        return out
    if kind == "array":
        return [sample(doc, s.get("items", {}), (*at, 0), maps)]
    if kind == "integer":
        return max(int(s.get("minimum", 1)), 1)
    if kind == "number":
        return 1
    if kind == "boolean":
        return False
    return "x"


# Values the generic sample cannot guess.
BODY_OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/api/workspaces"): {"name": "fuzzed"},
    ("post", "/api/workspaces/{workspace}/agents"): {"isolation": "shared"},
}


def leaves(obj: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[str, tuple[Any, ...]]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaves(v, (*at, i))
    elif isinstance(obj, str):
        yield "str", at
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield "num", at


def replaced(obj: Any, at: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(obj)
    node = out
    for step in at[:-1]:
        node = node[step]
    node[at[-1]] = value
    return out


def rekeyed(obj: Any, at: tuple[Any, ...], key: str) -> Any:
    out = copy.deepcopy(obj)
    node = out
    for step in at:
        node = node[step]
    node[key] = node.pop("K")
    return out


def as_json(obj: Any) -> bytes:
    # ensure_ascii writes a lone surrogate as a `\\udXXX` escape: valid JSON text that decodes to
    # a string UTF-8 cannot encode. NaN/Infinity are written as such (Python's parser reads them).
    return json.dumps(obj, ensure_ascii=True).encode()


# ------------------------------------------------------------------------------ sending


@dataclass
class Answer:
    status: int
    body: bytes
    headers: httpx.Headers


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str | bytes] | None = None,
) -> Answer:
    hdrs: dict[str, Any] = dict(headers or {})
    if body is not None:
        hdrs["content-type"] = "application/json"
    async with client.stream(method.upper(), url, content=body, headers=hdrs) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return Answer(r.status_code, b"", r.headers)  # a stream: do not wait for its end
        return Answer(r.status_code, await r.aread(), r.headers)


def problem(what: str, ans: Answer, must_4xx: bool) -> str | None:
    if ans.status >= 500:
        return f"{what}: {ans.status} {ans.body[:200]!r}"
    if must_4xx and not 400 <= ans.status < 500:
        return f"{what}: expected a 4xx, got {ans.status} {ans.body[:200]!r}"
    if ans.status >= 400:
        try:
            parsed = json.loads(ans.body)
        except ValueError:
            return f"{what}: {ans.status} without a JSON body: {ans.body[:200]!r}"
        if not (
            isinstance(parsed, dict)
            and set(parsed) == {"error", "kind"}
            and isinstance(parsed["error"], str)
            and parsed["error"]
        ):
            return f"{what}: {ans.status} not the envelope: {parsed!r}"
    return None


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                yield method, path, item[method]


def fill(template: str, values: dict[str, str]) -> str:
    out = template
    for k, v in values.items():
        out = out.replace("{" + k + "}", v)
    return out


def body_schema(op: dict[str, Any]) -> dict[str, Any] | None:
    content = (op.get("requestBody") or {}).get("content") or {}
    media = content.get("application/json")
    return media.get("schema") if media else None


# ------------------------------------------------------------------------------ the fuzz


async def test_every_operation_refuses_bad_bytes_without_a_server_error(target: Target) -> None:
    c = target.stack.client
    doc = (await c.get("/openapi.json")).json()
    failures: list[str] = []
    sent = 0

    async def probe(what: str, method: str, url: str, body: bytes | None, must_4xx: bool) -> None:
        nonlocal sent
        sent += 1
        issue = problem(what, await send(c, method, url, body), must_4xx)
        if issue is not None:
            failures.append(issue)

    ops = list(operations(doc))
    assert len(ops) >= 25, [f"{m} {p}" for m, p, _ in ops]
    for method, template, op in ops:
        params = op.get("parameters", [])
        path_names = [p["name"] for p in params if p["in"] == "path"]
        query_names = [p["name"] for p in params if p["in"] == "query"]
        good = {n: target.path_value(n) for n in path_names}
        schema = body_schema(op)
        maps: set[Any] = set()
        baseline: Any = None
        if schema is not None:
            baseline = sample(doc, schema, (), maps)
            if isinstance(baseline, dict):
                baseline.update(BODY_OVERRIDES.get((method, template), {}))
                if "root" in baseline:
                    baseline["root"] = str(target.dir)
        good_body = as_json(baseline) if schema is not None else None
        op_name = f"{method.upper()} {template}"

        for name in path_names:
            for seg, must in BAD_PATH_SEGMENTS.items():
                url = fill(template, {**good, name: seg})
                await probe(f"{op_name} path {name}={seg}", method, url, good_body, must)
        for name in query_names:
            for value in BAD_QUERY_VALUES:
                url = fill(template, good) + f"?{name}={value}"
                await probe(f"{op_name} query {name}={value[:20]}", method, url, good_body, False)
        if schema is None:
            continue
        url = fill(template, good)
        for kind, at in leaves(baseline):
            for value in BAD_STRINGS if kind == "str" else BAD_NUMBERS:
                await probe(
                    f"{op_name} body {'.'.join(map(str, at))}={value!r}",
                    method,
                    url,
                    as_json(replaced(baseline, at, value)),
                    kind == "str",
                )
        for at in maps:
            for key in BAD_STRINGS:
                await probe(
                    f"{op_name} body key {'.'.join(map(str, at))}[{key!r}]",
                    method,
                    url,
                    as_json(rekeyed(baseline, at, key)),
                    True,
                )
        await probe(f"{op_name} body lone surrogate", method, url, b'"\\ud800"', True)
        await probe(f"{op_name} body [NaN]", method, url, b"[NaN]", True)
        # unknown keys: refused by a closed model, ignored by an open one (RepoProviderConfig)
        closed = _resolve(doc, schema).get("additionalProperties") is False
        for raw in (b'{"\\ud800": 1}', b'{"a\\u0000": 1}'):
            await probe(f"{op_name} body {raw!r}", method, url, raw, closed)

    assert not failures, f"{len(failures)} of {sent} requests:\n" + "\n".join(failures[:60])
    assert sent > 500


async def test_names_refuse_every_control_character_free_text_keeps_tabs(target: Target) -> None:
    c = target.stack.client
    url = "/api/workspaces/fz/agents"
    for field in ("label", "model", "isolation", "provider_ref", "frontmatter_path"):
        for value in NAME_ONLY_BAD:
            body = envelope(
                await c.post(url, json={"prompt": "p", field: value}), 422, "invalid_request"
            )
            assert field in body["error"] and "control character" in body["error"], body
    body = envelope(
        await c.post(url, json={"prompt": "say \x00 hi", "isolation": "shared"}),
        422,
        "invalid_request",
    )
    assert "prompt" in body["error"] and "U+0000" in body["error"], body
    r = await c.post(
        url, json={"prompt": "a\tb\nc\r\nd \x7f é", "isolation": "shared", "label": "ok"}
    )
    assert r.status_code == 201, r.text
    envelope(
        await c.post(f"/api/agents/{target.agent_id}/input", json={"text": "\x1b[A"}),
        422,
        "invalid_request",
    )
    body = envelope(
        await c.put("/api/workspaces/fz/config", json={"env": {"A\x00B": "v"}}),
        422,
        "invalid_request",
    )
    assert "env" in body["error"], body
    # a lone surrogate (a JSON escape UTF-8 cannot encode) is refused, also in a message
    raw = b'{"prompt": "\\ud800", "isolation": "shared"}'
    r = await c.post(url, content=raw, headers={"content-type": "application/json"})
    envelope(r, 422, "invalid_request")
    r = await c.post(url, content=b'{"\\ud800": 1}', headers={"content-type": "application/json"})
    envelope(r, 422, "invalid_request")
    # and an error message quoting one is still encodable
    assert json.loads(envelope_bytes("bad \ud800", "invalid_request"))["error"] == "bad \\ud800"


# ------------------------------------------------------------------------------ Last-Event-ID


@pytest.mark.parametrize("value", BAD_LAST_EVENT_IDS)
async def test_last_event_id_out_of_range_or_malformed_is_422(
    target: Target, value: str | bytes
) -> None:
    c = target.stack.client
    for url in (f"/api/agents/{target.agent_id}/stream", "/api/stream"):
        ans = await send(c, "get", url, headers={"Last-Event-ID": value})
        assert problem(url, ans, must_4xx=True) is None, (value, ans.status, ans.body)
        assert ans.status == 422, ans.status
        body = json.loads(ans.body)
        assert body["kind"] == "invalid_request" and "Last-Event-ID" in body["error"], body
        assert str(MAX_CURSOR) in body["error"], body


async def test_last_event_id_at_the_bound_streams(target: Target) -> None:
    c = target.stack.client
    st = api_state_of(target.stack.server.app)
    for url in (f"/api/agents/{target.agent_id}/stream", "/api/stream"):
        for value in (str(MAX_CURSOR), "0", "00042"):
            ans = await send(c, "get", url, headers={"Last-Event-ID": value})
            assert ans.status == 200, (url, value, ans.status, ans.body)
    # ?from has the same bound
    envelope(
        await c.get(f"/api/agents/{target.agent_id}/events", params={"from": MAX_CURSOR + 1}),
        422,
        "invalid_request",
    )
    await wait_until(lambda: st.hub.open_streams == 0, 10, what="streams released")


async def test_usage_timestamps_out_of_range_are_422(target: Target) -> None:
    c = target.stack.client
    for params in (
        {"until": "0001-01-01T00:00:00Z"},
        {"until": "0001-01-01T00:00:00+05:00"},
        {"since": "9999-12-31T23:59:59-05:00"},
        {"until": "9999-12-31T23:59:59.999999"},
    ):
        body = envelope(await c.get("/api/usage", params=params), 422, "invalid_request")
        assert "between" in body["error"], body
    assert (await c.get("/api/usage", params={"days": 10**6})).status_code == 200


async def test_agent_stream_refuses_an_id_no_agent_can_have(target: Target) -> None:
    c = target.stack.client
    for seg in ("%00", "a%01b", "%1B"):
        ans = await send(c, "get", f"/api/agents/{seg}/stream")
        assert ans.status == 422, (seg, ans.status, ans.body)


# ------------------------------------------------------------------------------ roots


async def test_workspace_roots_must_be_absolute_existing_directories(target: Target) -> None:
    c = target.stack.client
    before = (await c.get("/api/workspaces")).json()
    a_file = target.stack.tmp / "a-file"
    a_file.write_text("not a directory\n")
    cases: list[tuple[str, int, str, str]] = [
        ("../..", 422, "invalid_request", "absolute"),
        ("relative", 422, "invalid_request", "absolute"),
        ("~", 422, "invalid_request", "absolute"),
        (str(target.dir) + "\x00x", 422, "invalid_request", "control character"),
        (str(target.dir) + "\n", 422, "invalid_request", "control character"),
        (str(target.stack.tmp / "missing"), 400, "invalid_config", "does not exist"),
        (str(a_file), 400, "invalid_config", "not a directory"),
        (str(a_file / "below"), 400, "invalid_config", "does not exist"),
        ("", 400, "invalid_config", "needs a root"),
        ("   ", 422, "invalid_request", "absolute"),
    ]
    for root, status, kind, words in cases:
        body = envelope(
            await c.post("/api/workspaces", json={"name": "newws", "root": root}), status, kind
        )
        assert words in body["error"], (root, body)
    raw = b'{"name": "newws", "root": "/tmp/\\ud800"}'
    r = await c.post("/api/workspaces", content=raw, headers={"content-type": "application/json"})
    envelope(r, 422, "invalid_request")
    # nothing was registered, nothing half-registered
    assert (await c.get("/api/workspaces")).json() == before
    envelope(await c.get("/api/workspaces/newws/agents"), 404, "not_found")
    # the manager (used by `prospero demo`) refuses the same roots
    mgr = target.stack.runtime.manager
    assert mgr is not None
    for root in ("relative", str(a_file), str(target.stack.tmp / "missing")):
        with pytest.raises(InvalidConfig):
            await mgr.add_workspace("newws", root)
    # a real directory is fine
    r = await c.post("/api/workspaces", json={"name": "newws", "root": str(target.dir)})
    assert r.status_code == 201, r.text


# ------------------------------------------------------------------------------ HEAD


async def test_head_healthz(target: Target) -> None:
    r = await target.stack.client.head("/healthz")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-length"] == "2"
    assert r.headers["content-type"].startswith("text/plain")


def _comparable(h: httpx.Headers) -> dict[str, str]:
    volatile = {"date", "content-length", "x-prospero-last-ordinal", "set-cookie"}
    return {k: v for k, v in h.items() if k not in volatile}


async def test_head_on_every_get_route_matches_get(target: Target) -> None:
    c = target.stack.client
    doc = (await c.get("/openapi.json")).json()
    urls = [
        fill(path, {p["name"]: target.path_value(p["name"]) for p in op.get("parameters", [])})
        for method, path, op in operations(doc)
        if method == "get"
    ]
    urls += ["/openapi.json", "/docs", *sorted(ASSETS)]
    checked = 0
    for url in urls:
        first = await send(c, "get", url)
        second = await send(c, "get", url)
        head = await c.head(url)
        assert head.content == b"", url
        assert head.status_code == first.status, (url, head.status_code, first.status)
        assert _comparable(head.headers) == _comparable(first.headers), url
        if "content-length" in first.headers:
            assert "content-length" in head.headers, url
            if first.body == second.body:  # a body that does not change between requests
                assert head.headers["content-length"] == str(len(first.body)), url
        checked += 1
    assert checked >= 15, urls


async def test_head_on_streams_sends_headers_then_ends(target: Target) -> None:
    c = target.stack.client
    st = api_state_of(target.stack.server.app)
    for url in (
        f"/api/agents/{target.agent_id}/stream",
        "/api/agents/notyet/stream",
        "/api/stream",
    ):
        r = await c.head(url, timeout=5.0)
        assert r.status_code == 200, (url, r.status_code)
        assert r.headers["content-type"].startswith("text/event-stream"), url
        assert r.content == b""
        # the connection is still usable afterwards (the HEAD response was complete)
        assert (await c.get("/healthz")).status_code == 200
    await wait_until(lambda: st.hub.open_streams == 0, 10, what="HEAD streams released")
    ans = await c.head("/api/stream", headers={"Last-Event-ID": "-1"})
    assert ans.status_code == 422 and ans.content == b""


async def test_head_without_get_stays_405(target: Target) -> None:
    c = target.stack.client
    r = await c.head(f"/api/agents/{target.agent_id}/kill")
    assert r.status_code == 405 and r.content == b""
    assert "POST" in r.headers.get("allow", "")
    assert (await c.head("/api/nope")).status_code == 404
    # the agent was not touched, and a real GET still works
    assert (await c.get(f"/api/agents/{target.agent_id}")).status_code == 200
