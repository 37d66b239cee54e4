"""The command line of the fake caliband (`python -m prospero.testkit.fake_caliband ...`, see
`prospero.testkit.fake_caliband`): options and the caliband environment variables, scripts and
scenarios, Unix or TLS + token listening, `ready <endpoint>`, SIGINT / SIGTERM / `shutdown`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prospero.core.discovery import socket_path_for
from prospero.core.drivers import acp_sdk_logs
from prospero.core.transport import describe
from prospero.core.wire.control import SpawnSpec
from prospero.testkit import fake_caliband, scripts
from prospero.testkit.acp_scripts import AcpScript
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.testkit.faults import FaultPlan, Scenario


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="fake_caliband", description=(fake_caliband.__doc__ or "").split("\n")[0]
    )
    p.add_argument(
        "--workspace-root", default=None, help="workspace root (socket path is derived from it)"
    )
    p.add_argument(
        "--socket", "--socket-path", dest="socket", default=None, help="control socket path"
    )
    p.add_argument("--script", default=None, help="NDJSON script every spawned agent plays")
    p.add_argument("--line-delay", type=float, default=0.0, help="seconds between script lines")
    p.add_argument("--data-base", default=None, help="where agent session dirs go")
    p.add_argument(
        "--listen", default=env("CALIBAN_DAEMON_LISTEN"), help="HOST:PORT (network mode)"
    )
    p.add_argument("--advertise-host", default=env("CALIBAN_DAEMON_ADVERTISE_HOST"))
    p.add_argument("--agent-port-base", type=int, default=env("CALIBAN_DAEMON_AGENT_PORT_BASE"))
    p.add_argument("--tls-cert", default=env("CALIBAN_DAEMON_TLS_CERT"))
    p.add_argument("--tls-key", default=env("CALIBAN_DAEMON_TLS_KEY"))
    p.add_argument("--token", default=env("CALIBAN_DAEMON_TOKEN"))
    p.add_argument(
        "--acp-command",
        default=None,
        help='bridge every ACP agent to this stdio ACP command, e.g. "node path/agent.js"',
    )
    p.add_argument("--acp-script", default=None, help="JSON AcpScript the scripted ACP agents play")
    p.add_argument(
        "--scenario", default=None, help="JSON faults.Scenario: script + fault plan per prompt"
    )
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


async def _amain(args: argparse.Namespace) -> int:
    script = scripts.load_script(args.script) if args.script else None
    kwargs: dict[str, Any] = {"script": script, "line_delay": args.line_delay}
    if args.acp_command:
        kwargs["acp_command"] = shlex.split(args.acp_command)
    if args.acp_script:
        acp_script = AcpScript.load(args.acp_script)
        kwargs["acp_script_for"] = lambda _spec: acp_script
    if args.data_base:
        kwargs["data_dir"] = args.data_base
    if args.scenario:
        scenario = Scenario.load(args.scenario)

        def entry_script(spec: SpawnSpec) -> Sequence[dict[str, Any] | str]:
            e = scenario.entry(spec.initial_prompt)
            if e is not None:
                return e.script.build()
            return script if script is not None else scripts.default_script()

        def entry_plan(spec: SpawnSpec) -> FaultPlan | None:
            e = scenario.entry(spec.initial_prompt)
            return e.plan if e is not None else None

        kwargs["script_for"] = entry_script
        kwargs["fault_plan_for"] = entry_plan
    root = args.workspace_root
    if args.listen:
        token = (args.token or "").strip()
        if not token or not args.tls_cert or not args.tls_key:
            print(
                "fake_caliband: network mode needs --token, --tls-cert and --tls-key",
                file=sys.stderr,
            )
            return 78
        host, _, port = args.listen.rpartition(":")
        if not host or not port.isdigit():
            print(f"fake_caliband: bad --listen address {args.listen!r}", file=sys.stderr)
            return 64
        fake = await FakeCaliband.start_tcp(
            host.strip("[]"),
            int(port),
            args.tls_cert_pem,
            args.tls_key_pem,
            token,
            root=root,
            advertise_host=args.advertise_host,
            agent_port_base=args.agent_port_base,
            **kwargs,
        )
    else:
        if args.socket:
            path = args.socket
        elif root:
            path = socket_path_for(root)  # hashed verbatim, as caliband does
        else:
            print("fake_caliband: need --socket or --workspace-root", file=sys.stderr)
            return 64
        Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fake = await FakeCaliband.start_unix(path, root=root, **kwargs)
    print(f"ready {describe(fake.endpoint)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(fake.wait_shutdown())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for w in waiters:
        w.cancel()
    await fake.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    args.tls_cert_pem = Path(args.tls_cert).read_bytes() if args.tls_cert else None
    args.tls_key_pem = Path(args.tls_key).read_bytes() if args.tls_key else None
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    for handler in logging.getLogger().handlers:
        acp_sdk_logs.install(handler)
    try:
        return asyncio.run(_amain(args))
    except KeyboardInterrupt:
        return 130
