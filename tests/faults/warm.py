"""Pre-imported prosperod processes for the SIGKILL suite's restarts.

A prosperod process spends ~2.5 s importing its modules before it reads its config or touches
its data dir. A *standby* is `python -c STANDBY <the prosperod arguments>`: it imports
`prospero.daemon.main` and then blocks on stdin; `go()` releases it, and from there it runs
exactly `prospero.daemon.main.main(<the arguments>)`, as `python -m prospero.daemon` does (same
interpreter, environment, arguments and log file as `Fleet.start_prosperod`). Nothing of the
data dir, the store or the fake caliband is touched before the release, so a standby imported
while the previous prosperod still runs restarts in ~0.1 s instead of ~2.6 s.
"""

from __future__ import annotations

import asyncio

from tests.faults.procs import PYTHON, URL_RE, Fleet, log_file, poll

STANDBY = (
    "import sys\n"
    "from prospero.daemon.main import main\n"
    "if sys.stdin.readline() == 'go\\n':\n"
    "    sys.exit(main(sys.argv[1:]))\n"
)


async def standby(fleet: Fleet, name: str, *args: str) -> asyncio.subprocess.Process:
    """A prosperod for `fleet` importing in the background, waiting for `go()`; stopped with
    the fleet's other processes if never released."""
    log = fleet.tmp / f"prosperod-{name}.log"
    with log_file(log) as fh:
        proc = await asyncio.create_subprocess_exec(
            PYTHON, "-c", STANDBY, "--no-autostart", "--addr", "127.0.0.1:0",
            "--poll-interval-ms", "200", "--log-level", "info", *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=fh,
            env=fleet.env,
        )  # fmt: skip
    fleet.procs.append(proc)
    return proc


async def go(fleet: Fleet, proc: asyncio.subprocess.Process, name: str) -> str:
    """Release a standby; returns its URL once it listens."""
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    proc.stdin.close()
    log = fleet.tmp / f"prosperod-{name}.log"

    def url() -> str | None:
        m = URL_RE.search(log.read_text(errors="replace"))
        if proc.returncode is not None:
            raise AssertionError(f"prosperod {name} exited early:\n{log.read_text()[-3000:]}")
        return m.group(1) if m else None

    return await poll(url, 60, f"prosperod {name} ready")
