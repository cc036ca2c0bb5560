"""The browser harness: a real Chromium logs in to a live daphne server and sees the navigation."""

from __future__ import annotations

import pytest


@pytest.mark.browser
@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_login_shows_navigation(login, owner, daphne_server) -> None:  # type: ignore[no-untyped-def]
    page = login(owner)
    nav = page.locator("[data-testid=main-nav]")
    for label in ("Playground", "Runs", "Pools", "Policies", "Audit"):
        assert nav.get_by_role("link", name=label).is_visible()
    assert page.locator("[data-testid=current-user]").inner_text() == owner.username
    # Static files (CSS and the bundled plotly.js) come from the same server, no CDN.
    assert page.evaluate("() => getComputedStyle(document.querySelector('.topbar')).display") == "flex"
    status = page.evaluate("async () => (await fetch('/static/vendor/plotly.min.js')).status")
    assert status == 200


@pytest.mark.browser
@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_anonymous_browser_is_sent_to_login(browser_page, daphne_server) -> None:  # type: ignore[no-untyped-def]
    browser_page.goto(f"{daphne_server.url}/runs/")
    assert "/accounts/login/" in browser_page.url
    assert browser_page.locator("#id_username").is_visible()
