"""`python -m prospero.testkit.fake_kube`: the fake apiserver (and, with `--operator`, the
fake operator) on 127.0.0.1, until SIGTERM or SIGINT.

Prints one JSON line on stdout once it serves: `{"url": ..., "kubeconfig": ..., "pid": ...}`;
the kubeconfig is written to `--dir` (default: a fresh temporary directory, removed at exit).
`--endpoint host:port` makes the operator point every Running CalibanTask at that caliband.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from prospero.testkit.fake_kube.server import FakeKube


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m prospero.testkit.fake_kube")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--dir", help="where to write the kubeconfig (default: a temp dir)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--operator", action="store_true", help="run the fake operator")
    p.add_argument("--endpoint", help="status.calibandEndpoint the operator sets (host:port)")
    p.add_argument("--step-delay", type=float, default=0.2)
    p.add_argument("--bookmark-interval", type=float, default=60.0)
    p.add_argument("--no-crds", action="store_true", help="start without the caliban CRDs")
    args = p.parse_args(argv)
    own_dir = args.dir is None
    directory = Path(args.dir or tempfile.mkdtemp(prefix="fake-kube-"))
    endpoint = args.endpoint
    kube = FakeKube(
        port=args.port,
        bookmark_interval=args.bookmark_interval,
        install_crds=not args.no_crds,
        operator=args.operator or bool(endpoint),
        endpoint=(lambda _task: endpoint) if endpoint else None,
        step_delay=args.step_delay,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await kube.start()
    try:
        path = kube.write_kubeconfig(directory, args.namespace)
        print(json.dumps({"url": kube.url, "kubeconfig": str(path), "pid": os.getpid()}), flush=True)
        await stop.wait()
    finally:
        await kube.stop()
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
