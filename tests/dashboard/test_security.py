"""Agent output is untrusted: an XSS corpus in text deltas, thinking, a tool's name, input and
result, and in the agent's label executes nothing and injects no element; the CSP blocks
what would slip through. (Signing in with a token: test_sign_in.py.)"""

from __future__ import annotations

from playwright.async_api import expect

from tests.dashboard.conftest import XSS, SessionFactory, StackFactory

INJECTED = (
    "#view script, #view img, #view iframe, #view object, #view embed, #view style, "
    "#view math, #view input[autofocus], #view a[href^='javascript'], #view [onerror], "
    "#view [onload], #view [ontoggle], #view [onfocus], #view svg circle"
)
LABEL = '<img src=x onerror="window.__xss=20">label<script>window.__xss=21</script>'


async def test_xss_corpus_in_agent_output_executes_nothing(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("xss: render this", label=LABEL)
    await stack.wait_status(agent_id, "done")
    s = await open_session(stack)
    page = s.page

    # fleet: the label is text
    await s.open()
    row = page.locator(f'tr.agent-row[data-agent-id="{agent_id}"]')
    await expect(row.locator(".agent-link")).to_have_text(LABEL)

    # agent page: everything rendered, thinking expanded, the tool inspected
    await row.click()
    await expect(page.locator(".agent-title")).to_have_text(LABEL)
    await expect(page.locator(".tl-finished")).to_be_visible()
    await page.check("#expand-thinking")
    tool = page.locator(".tl-tool")
    await expect(tool).to_have_attribute("data-state", "failed")
    await expect(tool.locator(".tool-name")).to_have_text("Bash" + XSS[1])
    await tool.locator(".tool-row").click()
    inspector = page.locator(".inspector")
    await expect(inspector.locator('[data-field="result"]')).to_contain_text(XSS[0])
    await expect(inspector.locator('[data-field="input"]')).to_contain_text(
        "javascript:window.__xss=3"
    )
    text = "\n".join(await page.locator(".timeline .tl-text .text").all_text_contents())
    for payload in XSS:
        assert payload in text, payload
    thinking = "\n".join(await page.locator(".thinking-text").all_text_contents())
    assert XSS[3] in thinking and XSS[9] in thinking
    result = await inspector.locator('[data-field="result"]').text_content()
    assert result == "\n".join(XSS)
    await s.shot("agent-xss", full_page=False)

    assert await page.locator(INJECTED).count() == 0
    # scripts on the page: only the dashboard's own
    srcs = await page.eval_on_selector_all("script", "els => els.map(e => e.getAttribute('src'))")
    assert srcs == ["/ui/theme.js", "/ui/js/main.js"]
    await s.assert_clean()

    # the same history again after a reload (replayed, not live): still inert
    await page.reload()
    await expect(page.locator(".tl-finished")).to_be_visible()
    assert await page.locator(INJECTED).count() == 0
    await s.assert_clean()


async def test_csp_blocks_inline_script_even_if_injected(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    """Defence in depth: were markup ever parsed, the CSP would refuse to run it."""
    stack = await make_stack()
    s = await open_session(stack)
    await s.open()
    await expect(s.page.locator(".ws-card")).to_have_count(1)
    await s.page.evaluate(
        """() => {
        const el = document.createElement('div');
        el.setAttribute('onclick', 'window.__xss = 99');
        document.body.append(el);
        el.click();
        const sc = document.createElement('script');
        sc.textContent = 'window.__xss = 98';
        document.body.append(sc);
    }"""
    )
    assert await s.page.evaluate("window.__xss") == 0
    violations = await s.page.evaluate("window.__csp")
    assert len(violations) == 2 and all(v.startswith("script-src") for v in violations), violations
