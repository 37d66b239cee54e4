"""Test kit: a faithful fake caliband (control plane + per-agent streams, NDJSON or ACP), a
scripted ACP agent, TLS material and script builders. Importable lazily as `prospero.testkit.FakeCaliband` etc."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AcpAgentListener",
    "AcpScript",
    "CertBundle",
    "FakeAcpAgent",
    "FakeAgentWorker",
    "FakeCaliband",
    "make_certs",
    "make_self_signed",
]


def __getattr__(name: str) -> Any:
    if name == "FakeCaliband":
        from prospero.testkit.fake_caliband import FakeCaliband

        return FakeCaliband
    if name == "FakeAgentWorker":
        from prospero.testkit.fake_agent import FakeAgentWorker

        return FakeAgentWorker
    if name == "FakeAcpAgent":
        from prospero.testkit.fake_acp import FakeAcpAgent

        return FakeAcpAgent
    if name == "AcpAgentListener":
        from prospero.testkit.fake_acp_listener import AcpAgentListener

        return AcpAgentListener
    if name == "AcpScript":
        from prospero.testkit.acp_scripts import AcpScript

        return AcpScript
    if name in ("CertBundle", "make_certs", "make_self_signed"):
        from prospero.testkit import certs

        return getattr(certs, name)
    raise AttributeError(name)
