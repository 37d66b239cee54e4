"""Fault suite: its counts (randomised combinations, SIGKILL runs, fault kinds) are printed in
pytest's terminal summary, with or without `-s`."""

from __future__ import annotations

from typing import Any

from tests.faults.history import SUMMARY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SUMMARY:
        terminalreporter.section("fault suite")
        for line in SUMMARY:
            terminalreporter.write_line(line)
