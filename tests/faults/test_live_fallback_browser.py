"""Redis down: the run page still follows its run, by polling the snapshot over HTTP.

Our own daphne reaches Redis only through a closed `TcpProxy` (see test_degrade), so every
websocket handshake fails at `group_add`; the page must notice and poll `/runs/<id>/snapshot/`.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.faults.test_degrade import PROMPT, TIMEOUT_S, redis_down_server  # noqa: F401 (fixture)
from tests.faults.test_endings import ProxiedServer

pytestmark = [pytest.mark.browser, pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def test_run_page_polls_when_the_live_channel_is_down(
    redis_down_server: ProxiedServer,  # noqa: F811
    conductor_fake: Any,
    api_key: tuple[Any, str],
    owner: Any,
    browser_page: Any,
) -> None:
    server = redis_down_server
    _key, plaintext = api_key
    reply = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "conductor-mini", "messages": PROMPT},
        headers={"Authorization": f"Bearer {plaintext}"},
        timeout=TIMEOUT_S,
    )
    assert reply.status_code == 200, reply.text
    run_id = reply.headers["X-Conductor-Run"]

    page = browser_page
    page.goto(f"{server.url}/accounts/login/")
    page.fill("#id_username", owner.get_username())
    page.fill("#id_password", "pw-for-tests-123")
    page.click("[data-testid=login-submit]")
    page.wait_for_selector("[data-testid=main-nav]")
    page.goto(f"{server.url}/runs/{run_id}/")

    status = page.locator("[data-testid=run-status]")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=run-status]').getAttribute('data-status') === 'succeeded'",
        timeout=60_000,
    )
    assert page.locator("[data-run-view]").get_attribute("data-live") == "polling"
    # It got there by polling: the websocket never opened while Redis was unreachable.
    assert page.locator("[data-run-view]").get_attribute("data-connected") != "true"
    assert "succeeded" in status.inner_text()
    assert page.locator("[data-role=answer]").inner_text().strip()
