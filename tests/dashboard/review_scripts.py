"""Scripts of the reviewable-changes tests (test_review.py): what real edit and write tool
calls carry, on both wires.

NDJSON (`review:`): Claude-style `Edit` {file_path, old_string, new_string}, `MultiEdit`
{file_path, edits}, `Write` {file_path, content}, a failing `Edit`, a `Bash` that takes a
while, and markdown text around them. ACP (`review:`, supervised): a write announced with
only ACP `diff` content (a new file, no rawInput), then an edit as claude-agent-acp sends it
(rawInput {file_path, old_string, new_string} plus the `diff` content of the whole file) that
asks permission. `mdxss:`: markdown built to smuggle script through links, images and raw
HTML."""

from __future__ import annotations

import json
from typing import Any

from prospero.testkit import acp_scripts as acp
from prospero.testkit import scripts

MODEL = "claude-sonnet-4-6"
BASH_SECONDS = 0.4  # how long the Bash call runs (the test reads its duration)

MARKDOWN = (
    "## Plan\n"
    "I'll **validate** the `amount` and add a needle of tests:\n"
    "\n"
    "- reject *non-positive* amounts\n"
    "- reject unknown currencies\n"
    "  - with a 422\n"
    "\n"
    "| file | change |\n"
    "|---|--:|\n"
    "| refunds.py | validation |\n"
    "\n"
    "See [the API docs](https://example.com/docs/refunds).\n"
    "\n"
    "```python\n"
    "def create_refund(request):  # entry point\n"
    '    return "ok"\n'
    "```\n"
)
CLOSING = "All **done**: the needle was found, 8 tests pass.\n"

REFUNDS_OLD = '    amount = body["amount"]\n'
REFUNDS_NEW = (
    '    amount = body.get("amount")\n'
    "    if not isinstance(amount, int) or amount <= 0:\n"
    '        return error(422, "amount must be a positive integer")\n'
)
LEDGER_EDITS = [
    {"old_string": "def book(entry):\n", "new_string": "def book(entry, *, idempotency_key):\n"},
    {
        "old_string": "    db.insert(entry)\n",
        "new_string": "    db.insert(entry, key=idempotency_key)\n",
    },
]
TEST_FILE = (
    "from payments.refunds import create_refund\n"
    "\n"
    "def test_rejects_zero():\n"
    "    assert create_refund(fake(amount=0)).status == 422\n"
)

# path -> (adds, dels, status) the files-changed list shows (README.md: the edit failed)
CHANGED = {
    "src/payments/refunds.py": (3, 1, "changed"),
    "src/payments/ledger.py": (2, 2, "changed"),
    "tests/test_refunds.py": (4, 0, "changed"),
    "README.md": (1, 1, "not applied"),
}


def _tool(
    tid: str,
    name: str,
    args: dict[str, Any],
    result: str,
    *,
    turn: int,
    error: bool = False,
    runtime: float = 0.05,
) -> scripts.Script:
    raw = json.dumps(args)
    cut = max(1, len(raw) // 2)
    return [
        scripts.tool_call_start(tid, name, turn),
        scripts.tool_call_input_delta(tid, raw[:cut], turn),
        scripts.tool_call_input_delta(tid, raw[cut:], turn),
        scripts.sleep(runtime),  # the tool runs: ToolCallEnd comes after it
        scripts.tool_call_end(tid, result, is_error=error, turn_index=turn),
    ]


def chunks(text: str, n: int) -> list[str]:
    size = max(1, len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)]


def review_script() -> scripts.Script:
    out: scripts.Script = [scripts.turn_start(0, model=MODEL)]
    for part in chunks(MARKDOWN, 7):  # streamed: chunks end mid-line and mid-block
        out += [scripts.text_delta(part, 0, 0), scripts.sleep(0.01)]
    out += _tool(
        "toolu_edit",
        "Edit",
        {
            "file_path": "src/payments/refunds.py",
            "old_string": REFUNDS_OLD,
            "new_string": REFUNDS_NEW,
        },
        "The file src/payments/refunds.py has been updated.",
        turn=0,
    )
    out += _tool(
        "toolu_multi",
        "MultiEdit",
        {"file_path": "src/payments/ledger.py", "edits": LEDGER_EDITS},
        "Applied 2 edits to src/payments/ledger.py",
        turn=0,
    )
    out += _tool(
        "toolu_write",
        "Write",
        {"file_path": "tests/test_refunds.py", "content": TEST_FILE},
        "File created successfully at: tests/test_refunds.py",
        turn=0,
    )
    out += _tool(
        "toolu_bad",
        "Edit",
        {"file_path": "README.md", "old_string": "no such text", "new_string": "x"},
        "String to replace not found in file.",
        turn=0,
        error=True,
    )
    out += _tool(
        "toolu_bash",
        "Bash",
        {"command": "python -m pytest -q tests/test_refunds.py"},
        "8 passed in 0.41s",
        turn=0,
        runtime=BASH_SECONDS,
    )
    out += [
        scripts.turn_end(0, stop_reason="tool_use", input_tokens=2100, output_tokens=300),
        scripts.turn_start(1, model=MODEL),
        scripts.text_delta(CLOSING, 1, 0),
        scripts.turn_end(1, input_tokens=400, output_tokens=30),
        scripts.run_end("EndOfTurn", turn_count=2, input_tokens=2500, output_tokens=330),
    ]
    return out


# Markdown that would run script if links, images or raw HTML went through unchecked. Every
# payload sets window.__xss when it executes.
MD_XSS = (
    "# <svg onload=window.__xss=41>heading\n"
    "[click](javascript:window.__xss=30) [caps](JaVaScRiPt:window.__xss=31) "
    "[spaced](  javascript:window.__xss=32) "
    "[data](data:text/html;base64,PHNjcmlwdD53aW5kb3cuX194c3M9MzM8L3NjcmlwdD4=) "
    "[vb](vbscript:msgbox) [file](file:///etc/passwd) [rel](/api/fleet) "
    "[entity](&#106;avascript:window.__xss=44) [tab](java\tscript:window.__xss=45)\n"
    "![img](javascript:window.__xss=34) ![img2](x onerror=window.__xss=35) "
    '<javascript:window.__xss=36> <img src=x onerror="window.__xss=37">\n'
    "**<iframe src=javascript:window.__xss=42>** "
    "[nested [inner](javascript:window.__xss=43)](https://example.com/outer)\n"
    "\n"
    "<script>window.__xss=38</script>\n"
    "\n"
    "| a | b |\n"
    "|---|---|\n"
    "| <img src=x onerror=window.__xss=40> | [t](javascript:window.__xss=46) |\n"
    "\n"
    "```html\n"
    "<script>window.__xss=39</script>\n"
    "```\n"
    "\n"
    '[safe](https://example.com/safe "a title") and https://example.org/bare.\n'
)


def md_xss_script() -> scripts.Script:
    return [
        scripts.turn_start(0, model=MODEL),
        *[scripts.text_delta(part, 0, 0) for part in chunks(MD_XSS, 5)],
        scripts.turn_end(0),
        scripts.run_end("EndOfTurn", turn_count=1),
    ]


# --------------------------------------------------------------------------------------- ACP

ACP_WRITE_PATH = "src/health.py"
ACP_WRITE_TEXT = "def health():\n    return {'ok': True}\n"
ACP_EDIT_OLD_FILE = "def handle(items):\n    # TODO: handle empty input\n    return items[0]\n"
ACP_EDIT_NEW_FILE = (
    "def handle(items):\n    if not items:\n        return None\n    return items[0]\n"
)
ACP_EDIT_INPUT = {
    "file_path": "src/app.py",
    "old_string": "    # TODO: handle empty input\n",
    "new_string": "    if not items:\n        return None\n",
}
ACP_EDIT_TITLE = "Edit src/app.py"


def acp_review_script(root: str) -> acp.AcpScript:
    write_diff = [{"type": "diff", "path": f"{root}/{ACP_WRITE_PATH}", "newText": ACP_WRITE_TEXT}]
    edit_diff = [
        {
            "type": "diff",
            "path": f"{root}/src/app.py",
            "oldText": ACP_EDIT_OLD_FILE,
            "newText": ACP_EDIT_NEW_FILE,
        }
    ]
    return acp.AcpScript(
        turns=[
            [
                acp.text("Adding a **health** check, then the `handle` fix."),
                acp.tool_call(
                    "w1", f"Write {ACP_WRITE_PATH}", "edit", status="pending", content=write_diff
                ),
                acp.tool_update("w1", status="in_progress"),
                acp.sleep(0.2),
                acp.tool_update("w1", status="completed", raw_output="created"),
                acp.tool_call(
                    "e1",
                    ACP_EDIT_TITLE,
                    "edit",
                    raw_input=ACP_EDIT_INPUT,
                    status="pending",
                    content=edit_diff,
                ),
                acp.permission(
                    "e1",
                    title=ACP_EDIT_TITLE,
                    kind="edit",
                    raw_input=ACP_EDIT_INPUT,
                    on_allow=[
                        acp.tool_update("e1", status="completed"),
                        acp.text(" Edit applied."),
                    ],
                    on_reject=[
                        acp.tool_update("e1", status="failed", raw_output="Permission denied")
                    ],
                ),
                acp.stop("end_turn"),
            ]
        ]
    )
