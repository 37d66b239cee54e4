"""The real kubectl as the tests run it: its own HOME and cache dir (nothing of the machine's
own kubeconfig or discovery cache leaks in), a kubeconfig for a fake API server, a bounded wait.
A machine without kubectl fails the tests that use it with what to install (never a skip)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

INSTALL = "apt-get install kubernetes-client (.ci/run does)"


def kubectl_path() -> str:
    path = shutil.which("kubectl")
    assert path is not None, f"kubectl is missing: {INSTALL}"
    return path


class Kubectl:
    """`await kubectl(*args)` -> (returncode, stdout, stderr); `await kubectl.ok(*args)` ->
    stdout, asserting success. `kubeconfig` None: kubectl's own lookup under `tmp` (as HOME)."""

    def __init__(self, tmp: Path, kubeconfig: Path | None = None, timeout: float = 30.0) -> None:
        self.base = [kubectl_path(), "--cache-dir", str(tmp / "kube-cache")]
        if kubeconfig is not None:
            self.base[1:1] = ["--kubeconfig", str(kubeconfig)]
        self.env = {**os.environ, "HOME": str(tmp)}
        self.timeout = timeout

    async def __call__(self, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *self.base,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await asyncio.wait_for(proc.communicate(stdin), self.timeout)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def ok(self, *args: str, stdin: bytes | None = None) -> str:
        rc, out, err = await self(*args, stdin=stdin)
        assert rc == 0, f"kubectl {' '.join(args)}: {err}"
        return out
