"""Automations end to end on the real stack (Runtime + uvicorn + a fake caliband): a signed
webhook spawns an agent whose prompt has the payload substituted and whose run is in the
history linked to it; forged, missing, malformed, replayed and stale signatures fire nothing;
a schedule fires on a driven clock (one run per tick, at most one catch-up); run-now; disabled
fires nothing; refused spawns are failed runs; bad input is a clear 400/409."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson

from prospero.core.aio import wait_for
from prospero.core.automations.service import STALE_RUN
from prospero.core.automations.signing import sign
from prospero.types.automations import AutomationRun
from tests.api.conftest import Stack, StackFactory, envelope
from tests.support import wait_until


def body(name: str = "triage", **kw: Any) -> dict[str, Any]:
    spawn = {
        "prompt": "Triage {{payload.issue.title}} (#{{payload.issue.number}}) via {{trigger}}"
        " for {{automation.name}}",
        "isolation": "shared",
        **kw.pop("spawn", {}),
    }
    return {"name": name, "workspace": "ws", "spawn": spawn, **kw}


async def create(stack: Stack, **kw: Any) -> dict[str, Any]:
    r = await stack.client.post("/api/automations", json=body(**kw))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def post_hook(
    stack: Stack, ref: str, raw: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    # A webhook sender: no API token, only the signature (and JSON content type).
    async with httpx.AsyncClient(base_url=stack.url, timeout=20) as c:
        return await c.post(
            f"/api/automations/{ref}/trigger",
            content=raw,
            headers={"Content-Type": "application/json", **(headers or {})},
        )


async def runs(stack: Stack, ref: str) -> list[dict[str, Any]]:
    r = await stack.client.get(f"/api/automations/{ref}/runs")
    assert r.status_code == 200, r.text
    return list(r.json())


PAST = datetime(2000, 1, 1, tzinfo=UTC)  # before any automation's armed_at: nothing is due


async def driven(make_stack: StackFactory) -> Stack:
    """A stack whose scheduler runs only when a test calls `run_once` (its loop waits an
    hour between passes) on a clock the test sets (first: PAST, so no real tick fires)."""
    stack = await make_stack(automation_interval=3600.0)
    assert stack.runtime.scheduler is not None
    stack.runtime.scheduler.clock = lambda: PAST
    return stack


def prompt_of(stack: Stack, agent_id: str) -> str:
    return str(stack.fake.record(agent_id).spec.initial_prompt)


async def test_signed_webhook_spawns_agent_with_payload(make_stack: StackFactory) -> None:
    stack = await make_stack(tokens={"admin": "tok"}, client_token="tok")
    created = await create(stack, webhook=True)
    secret = created["secret"]
    auto = created["automation"]
    assert secret and auto["webhook"] is True and "secret" not in auto
    # never echoed afterwards
    for r in (
        await stack.client.get(f"/api/automations/{auto['id']}"),
        await stack.client.get("/api/automations"),
    ):
        assert secret not in r.text
    raw = orjson.dumps({"issue": {"title": "Crash on boot", "number": 42}})
    r = await post_hook(stack, "triage", raw, {"X-Prospero-Signature": sign(secret, raw)})
    assert r.status_code == 202, r.text
    run = r.json()
    assert run["state"] == "spawned" and run["trigger"] == "webhook" and run["agent_id"]
    agent_id = run["agent_id"]
    assert prompt_of(stack, agent_id) == "Triage Crash on boot (#42) via webhook for triage"
    hist = await runs(stack, "triage")
    assert [(h["id"], h["agent_id"]) for h in hist] == [(run["id"], agent_id)]
    agent = await stack.client.get(f"/api/agents/{agent_id}")
    assert agent.status_code == 200
    await stack.wait_finished(agent_id)
    # the same signed body again: a replay, nothing fired
    again = await post_hook(stack, "triage", raw, {"X-Prospero-Signature": sign(secret, raw)})
    envelope(again, 409, "replayed")
    # timestamp mode: signature over "<ts>." + body
    ts = str(int(time.time()))
    ok = await post_hook(
        stack,
        auto["id"],
        raw,
        {"X-Prospero-Signature": sign(secret, raw, ts), "X-Prospero-Timestamp": ts},
    )
    assert ok.status_code == 202, ok.text
    assert len(await runs(stack, "triage")) == 2
    m = await stack.client.get("/metrics")
    assert 'prospero_automation_fires_total{trigger="webhook"} 2.0' in m.text
    assert 'prospero_automation_webhook_rejections_total{reason="replayed"} 1.0' in m.text


async def test_bad_signatures_fire_nothing(stack: Stack) -> None:
    created = await create(stack, webhook=True)
    secret = created["secret"]
    raw = b'{"issue": {"title": "x"}}'
    cases = {
        "missing": {},
        "forged": {"X-Prospero-Signature": sign("not-the-secret", raw)},
        "malformed": {"X-Prospero-Signature": "sha1=abc"},
        "tampered": {"X-Prospero-Signature": sign(secret, raw + b" ")},
    }
    for name, headers in cases.items():
        body_ = envelope(await post_hook(stack, "triage", raw, headers), 401, "unauthorized")
        assert body_["error"], name
    stale = str(int(time.time()) - 3600)
    envelope(
        await post_hook(
            stack,
            "triage",
            raw,
            {"X-Prospero-Signature": sign(secret, raw, stale), "X-Prospero-Timestamp": stale},
        ),
        401,
        "unauthorized",
    )
    # a timestamp sent but not covered by the signature (body-only signature): forged
    now = str(int(time.time()))
    envelope(
        await post_hook(
            stack,
            "triage",
            raw,
            {"X-Prospero-Signature": sign(secret, raw), "X-Prospero-Timestamp": now},
        ),
        401,
        "unauthorized",
    )
    # a body that is not a JSON object: 400, nothing fired
    arr = b"[1, 2]"
    envelope(
        await post_hook(stack, "triage", arr, {"X-Prospero-Signature": sign(secret, arr)}),
        400,
        "invalid_config",
    )
    assert await runs(stack, "triage") == []
    assert stack.fake.agents == {}
    # no webhook configured, or no such automation: the forged answer, word for word (the
    # route is open: a caller without the secret learns no automation's name)
    await create(stack, name="nohook")
    forged = await post_hook(stack, "triage", raw, {"X-Prospero-Signature": sign("x", raw)})
    envelope(forged, 401, "unauthorized")
    for ref in ("nohook", "nope"):
        r = await post_hook(stack, ref, raw, {"X-Prospero-Signature": sign("x", raw)})
        assert (r.status_code, r.json()) == (forged.status_code, forged.json()), ref
        r = await post_hook(stack, ref, raw, {})
        envelope(r, 401, "unauthorized")
        assert "missing X-Prospero-Signature" in r.text
    assert await runs(stack, "nohook") == []
    # rotation: the old secret stops verifying, the new one works
    r = await stack.client.post("/api/automations/triage/rotate-secret")
    assert r.status_code == 200, r.text
    new = r.json()["secret"]
    assert new and new != secret
    envelope(
        await post_hook(stack, "triage", b"{}", {"X-Prospero-Signature": sign(secret, b"{}")}),
        401,
        "unauthorized",
    )
    ok = await post_hook(stack, "triage", b"", {"X-Prospero-Signature": sign(new, b"")})
    assert ok.status_code == 202, ok.text
    # missing payload fields render as empty
    assert prompt_of(stack, ok.json()["agent_id"]) == "Triage  (#) via webhook for triage"


async def test_disabled_fires_nothing_and_run_now(make_stack: StackFactory) -> None:
    stack = await driven(make_stack)
    created = await create(stack, webhook=True, schedule="* * * * *")
    secret = created["secret"]
    r = await stack.client.post("/api/automations/triage/disable")
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["next_fire"] is None
    raw = b"{}"
    envelope(
        await post_hook(stack, "triage", raw, {"X-Prospero-Signature": sign(secret, raw)}),
        409,
        "disabled",
    )
    envelope(await stack.client.post("/api/automations/triage/run"), 409, "disabled")
    sched = stack.runtime.scheduler
    assert sched is not None
    sched.clock = lambda: datetime(2099, 1, 1, 0, 0, 30, tzinfo=UTC)
    assert await sched.run_once() == []
    assert await runs(stack, "triage") == []
    r = await stack.client.post("/api/automations/triage/enable")
    assert r.json()["enabled"] is True and r.json()["next_fire"]
    r = await stack.client.post("/api/automations/triage/run")
    assert r.status_code == 202, r.text
    run = r.json()
    assert run["trigger"] == "manual" and run["state"] == "spawned"
    assert prompt_of(stack, run["agent_id"]) == "Triage  (#) via manual for triage"
    assert (await runs(stack, "triage"))[0]["id"] == run["id"]


async def test_schedule_fires_once_per_tick_on_a_driven_clock(make_stack: StackFactory) -> None:
    stack = await driven(make_stack)
    await create(stack, schedule="*/5 * * * *", spawn={"prompt": "tick at {{now}}"})
    sched = stack.runtime.scheduler
    assert sched is not None
    clock = [datetime(2099, 1, 1, 10, 3, tzinfo=UTC)]
    sched.clock = lambda: clock[0]
    # the latest tick (10:00) is after armed_at (the creation, today): it fires
    first = await sched.run_once()
    assert [r["tick"] for r in [f.model_dump() for f in first]] == ["2099-01-01T10:00+00:00"]
    assert await sched.run_once() == []  # same tick: nothing
    clock[0] = datetime(2099, 1, 1, 10, 4, 59, tzinfo=UTC)
    assert await sched.run_once() == []
    # downtime across many ticks: one run, for the latest one only
    clock[0] = datetime(2099, 1, 1, 12, 7, tzinfo=UTC)
    later = await sched.run_once()
    assert [r.tick for r in later] == ["2099-01-01T12:05+00:00"]
    passes = sched.passes
    sched.nudge()  # the loop's own pass on the same clock claims nothing more
    await wait_until(lambda: sched.passes > passes, 10.0, what="a loop pass")
    hist = await runs(stack, "triage")
    assert [h["tick"] for h in hist] == ["2099-01-01T12:05+00:00", "2099-01-01T10:00+00:00"]
    assert all(h["state"] == "spawned" and h["trigger"] == "schedule" for h in hist)
    prompt = prompt_of(stack, hist[0]["agent_id"])
    assert prompt.startswith("tick at 2099-01-01T12:07:00")
    auto = (await stack.client.get("/api/automations/triage")).json()
    assert auto["last_fired"].startswith("2099-01-01T12:07")


async def test_a_refused_spawn_is_a_failed_run(make_stack: StackFactory) -> None:
    stack = await driven(make_stack)
    # ACP is not allowed on this daemon: the fire is a failed run with the error, not a crash
    await create(stack, spawn={"drive_protocol": "acp"})
    r = await stack.client.post("/api/automations/triage/run")
    assert r.status_code == 202, r.text
    run = r.json()
    assert run["state"] == "failed" and run["agent_id"] is None
    assert "allow-acp" in run["error"]
    # the workspace went away after creation: failed run, scheduler still alive
    await create(stack, name="gone", schedule="* * * * *")
    assert stack.runtime.manager is not None
    await stack.runtime.manager.remove_workspace("ws")
    sched = stack.runtime.scheduler
    assert sched is not None
    sched.clock = lambda: datetime(2099, 1, 1, tzinfo=UTC)
    (failed,) = await sched.run_once()
    assert failed.state == "failed" and "ws" in (failed.error or "")
    m = await stack.client.get("/metrics")
    assert 'prospero_automation_fire_failures_total{trigger="manual"} 1.0' in m.text


async def test_a_run_left_firing_by_a_dead_replica_is_marked_failed(
    make_stack: StackFactory,
) -> None:
    # A prosperod that died between claiming a run and the spawn's answer left it `firing`;
    # the scheduler's pass fails it once it is STALE_RUN old, and leaves a young one alone.
    stack = await driven(make_stack)
    a = await create(stack)
    sched = stack.runtime.scheduler
    assert sched is not None
    now = datetime.now(UTC)
    for id_, age in (("run-dead", STALE_RUN + 60), ("run-young", 60.0)):
        at = (now - timedelta(seconds=age)).isoformat(timespec="microseconds")
        run = AutomationRun(
            id=id_, automation_id=a["automation"]["id"], trigger="manual", tick=id_, fired_at=at
        )
        assert await sched.service.store.claim_run(run)
    assert await sched.run_once() == []
    got = {r["id"]: r for r in await runs(stack, "triage")}
    assert got["run-dead"]["state"] == "failed" and got["run-dead"]["agent_id"] is None
    assert got["run-dead"]["error"].startswith("interrupted: ")
    assert (got["run-young"]["state"], got["run-young"]["error"]) == ("firing", None)


async def test_bad_input_is_a_clear_error(stack: Stack) -> None:
    c = stack.client
    r = await c.post("/api/automations", json=body(schedule="* * * *"))
    assert "5 fields" in envelope(r, 400, "invalid_config")["error"]
    r = await c.post("/api/automations", json=body(schedule="61 * * * *"))
    envelope(r, 400, "invalid_config")
    r = await c.post("/api/automations", json=body(schedule="* * * * * *"))
    envelope(r, 400, "invalid_config")
    r = await c.post("/api/automations", json=body(spawn={"prompt": "hi\n{{payload.x"}))
    err = envelope(r, 400, "invalid_config")["error"]
    assert "offset 3" in err and "line 2, column 1" in err
    r = await c.post("/api/automations", json=body(spawn={"prompt": "{{ env.HOME }}"}))
    assert "unknown placeholder root" in envelope(r, 400, "invalid_config")["error"]
    r = await c.post("/api/automations", json={**body(), "workspace": "nope"})
    assert "unknown workspace" in envelope(r, 400, "invalid_config")["error"]
    r = await c.post("/api/automations", json=body(name="bad name"))
    envelope(r, 422, "invalid_request")
    await create(stack)
    envelope(await c.post("/api/automations", json=body()), 409, "conflict")
    envelope(await c.get("/api/automations/nope"), 404, "not_found")
    envelope(await c.post("/api/automations/nope/run"), 404, "not_found")
    r = await c.patch("/api/automations/triage", json={"schedule": "bad"})
    envelope(r, 400, "invalid_config")
    # nothing lost: the automation is as created
    got = (await c.get("/api/automations/triage")).json()
    assert got["schedule"] is None
    # patch, then delete
    r = await c.patch(
        "/api/automations/triage", json={"schedule": "0 3 * * 1", "labels": {"a": "b"}}
    )
    assert r.status_code == 200 and r.json()["schedule"] == "0 3 * * 1"
    assert r.json()["labels"] == {"a": "b"} and r.json()["next_fire"].endswith(
        "03:00:00.000000+00:00"
    )
    r = await c.patch("/api/automations/triage", json={"schedule": None})
    assert r.json()["schedule"] is None
    assert (await c.delete("/api/automations/triage")).status_code == 204
    envelope(await c.get("/api/automations/triage"), 404, "not_found")
    assert (await c.get("/api/automations")).json() == []


DOC_TEXT = (Path(__file__).resolve().parents[2] / "docs" / "automations.md").read_text()


async def test_the_docs_curl_and_openssl_example_is_accepted(stack: Stack, tmp_path: Path) -> None:
    """docs/automations.md's shell example, as written there, against the real server."""
    script = re.search(r"```sh\n(.*?)```", DOC_TEXT, re.S)
    assert script is not None
    created = await create(stack, webhook=True)
    with open(tmp_path / "triage.secret", "w") as f:  # noqa: ASYNC230 (a test's tiny file)
        f.write(created["secret"])
    shell = script.group(1).replace("http://127.0.0.1:7878", stack.url)
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        shell,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    answers = [orjson.loads(line) for line in out.decode().replace("}{", "}\n{").splitlines()]
    assert [a["state"] for a in answers] == ["spawned", "spawned"], answers
    for a in answers:
        assert prompt_of(stack, a["agent_id"]).startswith("Triage Crash on boot (#42)")
