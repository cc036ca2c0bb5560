"""The Content-Security-Policy in a real browser: the playground loads plotly and draws a run's
graph, and Chromium reports no CSP violation (issue 13)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.runs import scripted_plan

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

# Installed before any page script: collects every violation the browser reports.
COLLECT_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push({directive: e.violatedDirective, blocked: e.blockedURI, sample: e.sample});
});
"""


def test_playground_draws_the_graph_under_the_csp_without_violations(
    transactional_db: Any,
    runtime_workers: Any,
    daphne_server: Any,
    browser_page: Any,
    login: Any,
    fake_pool: Any,
    owner: Any,
) -> None:
    scripted_plan(fake_pool.server)
    browser_page.add_init_script(COLLECT_VIOLATIONS)  # the login page is checked too
    console: list[str] = []
    browser_page.on("console", lambda msg: console.append(msg.text))
    page = login(owner)
    assert page.evaluate("window.__cspViolations") == []
    response = page.goto(f"{daphne_server.url}/playground/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src", 1)[1].split(";")[0]

    page.fill("[data-testid=prompt-input]", "How many legs do 3 spiders have?")
    page.select_option("[data-testid=strategy-select]", "conductor-mini")
    page.select_option("[data-testid=pool-select]", label="Fake pool")
    page.click("[data-testid=run-submit]")

    # plotly loaded (from our own static files) and drew the step graph.
    page.wait_for_selector("[data-testid=step-graph] .main-svg")
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=30_000)
    assert page.evaluate("typeof window.Plotly") == "object"
    assert page.locator("[data-testid=step-graph] .scatterlayer .point").count() >= 1

    assert page.evaluate("window.__cspViolations") == []
    assert not [line for line in console if "Content Security Policy" in line]
