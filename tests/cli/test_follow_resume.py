"""`prospero follow` survives dropped connections: it resumes with `?from=last+1` and
`Last-Event-ID`, prints every event exactly once and stops after `agent_finished`.

A small TCP proxy between the CLI and the real server cuts connections after a given number
of response bytes (random points, seeded), mid-event or mid-headers."""

from __future__ import annotations

import json
import random
import re
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.cli.conftest import Cli, LiveStack


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to the server; connection i is cut after cuts[i] bytes."""

    def __init__(self, upstream: str, cuts: list[int]) -> None:
        host, _, port = upstream.removeprefix("http://").rpartition(":")
        self.upstream = (host, int(port))
        self.cuts = list(cuts)
        self.sent: list[bytearray] = []  # what each client connection sent (request heads)
        self.cut_count = 0
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.closed = True
        self.sock.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                idx = len(self.sent)
                self.sent.append(bytearray())
            limit = self.cuts[idx] if idx < len(self.cuts) else None
            threading.Thread(target=self._serve, args=(client, idx, limit), daemon=True).start()

    def _serve(self, client: socket.socket, idx: int, limit: int | None) -> None:
        try:
            up = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return

        def upstream_pump() -> None:
            try:
                while data := client.recv(65536):
                    self.sent[idx] += data
                    up.sendall(data)
            except OSError:
                pass
            finally:
                with_suppressed(lambda: up.shutdown(socket.SHUT_WR))

        threading.Thread(target=upstream_pump, daemon=True).start()
        passed = 0
        try:
            while data := up.recv(65536):
                if limit is not None and passed + len(data) >= limit:
                    client.sendall(data[: max(0, limit - passed)])
                    with self.lock:
                        self.cut_count += 1
                    break
                client.sendall(data)
                passed += len(data)
        except OSError:
            pass
        finally:
            with_suppressed(lambda: client.shutdown(socket.SHUT_RDWR))
            client.close()
            up.close()


def with_suppressed(fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except OSError:
        pass


@pytest.fixture
def proxy_factory(live: LiveStack) -> Iterator[list[CuttingProxy]]:
    made: list[CuttingProxy] = []
    yield made
    for p in made:
        p.close()


def spawn_paced(live: LiveStack, ws: str = "alpha") -> str:
    r = httpx.post(
        f"{live.url}/api/workspaces/{ws}/agents",
        json={"prompt": "paced output please", "isolation": "shared"},
        timeout=20,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["agent_id"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_follow_json_resumes_without_gap_or_duplicate(
    cli: Cli, live: LiveStack, proxy_factory: list[CuttingProxy], seed: int
) -> None:
    rnd = random.Random(seed)
    # Connection 0 carries the existence check and the first stream; later ones are cut at
    # random points (some inside the response headers), then one is left alone.
    cuts = [rnd.randint(900, 2500)] + [rnd.randint(100, 2500) for _ in range(4)]
    proxy = CuttingProxy(live.url, cuts)
    proxy_factory.append(proxy)
    agent_id = spawn_paced(live)

    res = cli("follow", agent_id, "-o", "json", addr=proxy.url)
    assert res.exit_code == 0, res.output
    events = [json.loads(ln) for ln in res.stdout.splitlines()]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # no gap, no duplicate
    assert events[-1]["kind"]["kind"] == "agent_finished"
    chunks = [e["kind"]["chunk"] for e in events if e["kind"]["kind"] == "output"]
    assert chunks == [f"chunk {i:03d}\n" for i in range(40)]
    # exactly the stored history up to agent_finished (the poll may store the status change
    # to done afterwards; follow ends at agent_finished)
    stored = live.events(agent_id)
    assert seqs == [e["seq"] for e in stored[: len(seqs)]]
    assert {e["kind"]["kind"] for e in stored[len(seqs) :]} <= {"status_changed"}

    assert proxy.cut_count >= 2
    heads = [bytes(s).decode(errors="replace") for s in proxy.sent]
    resumed = [h for h in heads if "Last-Event-ID:" in h or "last-event-id:" in h]
    assert resumed, heads
    for h in resumed:
        last = int(re.search(r"(?i)last-event-id: (\d+)", h).group(1))  # type: ignore[union-attr]
        assert f"from={last + 1}" in h


def test_follow_text_reconnects_visibly(
    cli: Cli, live: LiveStack, proxy_factory: list[CuttingProxy]
) -> None:
    proxy = CuttingProxy(live.url, [1500, 2600])
    proxy_factory.append(proxy)
    agent_id = spawn_paced(live, "beta")
    res = cli("follow", agent_id, addr=proxy.url)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "[reconnecting] resuming from seq " in out
    for i in range(40):
        assert out.count(f"chunk {i:03d}\n") == 1, out
    assert out.rstrip().splitlines()[-1].startswith("[finished] EndOfTurn — $")
