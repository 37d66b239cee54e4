"""A real HTTP receiver on 127.0.0.1 for outbound webhooks (notifications): records each
POST's JSON body and answers the statuses it was given in turn (then 200), optionally with a
`Retry-After`."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


class Receiver:
    def __init__(self, statuses: list[int] | None = None, retry_after: str | None = None) -> None:
        self.statuses = list(statuses or [])
        self.retry_after = retry_after
        self.bodies: list[dict[str, Any]] = []  # answered 2xx
        self.attempts = 0
        self.paths: list[str] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> Receiver:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hooks/T000/B000/secretpart"
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length)
                self.attempts += 1
                self.paths.append(lines[0].split(" ")[1] if " " in lines[0] else "")
                status = self.statuses.pop(0) if self.statuses else 200
                if status < 300:
                    self.bodies.append(orjson.loads(body))
                extra = f"Retry-After: {self.retry_after}\r\n" if self.retry_after else ""
                writer.write(
                    f"HTTP/1.1 {status} X\r\n{extra}Content-Length: 2\r\n\r\nno".encode("latin-1")
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def events(self) -> list[str]:
        return [str(b.get("event")) for b in self.bodies]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
