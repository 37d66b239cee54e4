"""Fault suite (issue 9, deliverable 10): fault plans in the fake worker
(`prospero.testkit.faults`) driven through the real stack.

- test_fault_plans: the fake's plans behave as documented (cuts, refused windows, detached
  exit, slow-reader broadcast drops, crashes, bad frames; the transcript holds every line).
- test_randomised: >= 200 seeded (cut plan x script) combinations, periodic and > 1024-line
  runs included, local and "remote" (transcript unreadable) agents.
- test_fault_kinds: one test per fault kind of the issue.
- test_sigkill: a real prosperod SIGKILLed at >= 10 moments against a fake caliband process.

Counts are printed (`-s`) and collected in pytest's terminal summary ("fault suite").
"""
