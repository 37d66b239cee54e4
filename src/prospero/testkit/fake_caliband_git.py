"""Where a spawn works, as caliband decides it: the spec's `source` directory under the
workspace root, and for an isolated spawn a fresh git worktree on its own branch
(`.caliban/worktrees/<id>`, branch `caliban/<id>`), removed with its branch when the agent
ends."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import uuid
from pathlib import Path

from prospero.core.wire.control import SpawnSpec
from prospero.testkit.fake_caliband_records import AgentEntry, SpawnFailed

log = logging.getLogger(__name__)

_SOURCE_RE = re.compile(r"^[^/\\]+$")


def resolve_source(root: Path | None, spec: SpawnSpec) -> Path | None:
    """The directory a spawn works from: the workspace root, or its `source` child."""
    if spec.source is None:
        return root
    if not _SOURCE_RE.match(spec.source) or spec.source in (".", ".."):
        raise SpawnFailed(f"source resolve: invalid source name {spec.source!r}")
    if root is None:
        raise SpawnFailed("source resolve: no workspace root")
    path = root / spec.source
    if not path.is_dir():
        raise SpawnFailed(f"source resolve: {path} is not a directory")
    return path


async def git(cwd: Path, *args: str) -> tuple[int, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            "git",
            "-C",
            str(cwd),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        return 127, str(e)
    out, err = await proc.communicate()
    return proc.returncode or 0, (err or out).decode(errors="replace").strip()


async def create_worktree(source: Path | None) -> tuple[Path, str]:
    if source is None:
        raise SpawnFailed("worktree create: no workspace root configured")
    name = uuid.uuid4().hex
    wt = source / ".caliban" / "worktrees" / name
    branch = f"caliban/{name}"
    code, msg = await git(source, "worktree", "add", "-q", "-b", branch, str(wt), "HEAD")
    if code != 0:
        raise SpawnFailed(f"worktree create: {msg or f'git exited {code}'}")
    return wt, branch


async def remove_worktree(agent: AgentEntry) -> None:
    if agent.worktree is None or agent.git_dir is None:
        return
    code, msg = await git(agent.git_dir, "worktree", "remove", "--force", str(agent.worktree))
    if code != 0:
        log.warning("fake caliband: worktree remove failed: %s", msg)
        shutil.rmtree(agent.worktree, ignore_errors=True)
        await git(agent.git_dir, "worktree", "prune")
    if agent.branch:
        code, msg = await git(agent.git_dir, "branch", "-D", agent.branch)
        if code != 0:
            log.warning("fake caliband: branch delete failed: %s", msg)
