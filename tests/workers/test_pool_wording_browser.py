"""Issue 42 item 9, end to end: after the pool served a real run (the official OpenAI SDK against
``/v1`` on a live daphne, workers answered by the loopback fake provider), the pool pages at 1280
and 390 px read "ready", never "not checked" nor "N of N workers not passing"; a worker that
answered calls but was never tested by hand reads "answering calls", one never used reads "not
used yet". axe-core: no serious/critical violation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fixtures.a11y import serious_violations
from tests.fixtures.screens import screens_dir

pytestmark = [pytest.mark.browser, pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def test_after_serving_a_run_the_pool_reads_ready(
    login: Any,
    daphne_server: Any,
    runtime_workers: Any,  # Celery executes the run in the distributed phase
    policy_admin: Any,
    conductor_fake: Any,
    api_key: Any,
    tmp_path: Path,
) -> None:
    out = screens_dir(tmp_path)
    _, key = api_key
    client = openai.OpenAI(base_url=f"{daphne_server.url}/v1", api_key=key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="conductor-mini", messages=[{"role": "user", "content": "What is six times seven?"}]
    )
    assert reply.choices[0].message.content
    called = {r.json["model"] for r in conductor_fake.server.chat_requests()}
    assert "fake-conductor-1" in called and "fake-planner-1" not in called
    page = login(policy_admin)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{daphne_server.url}/pools/")
        assert page.get_attribute("[data-testid=pool-state-fake]", "data-state") == "ready"
        page.goto(f"{daphne_server.url}/pools/fake/")
        assert page.get_attribute("[data-testid=pool-health]", "data-state") == "ready"
        body = page.inner_text("main") if page.locator("main").count() else page.inner_text("body")
        assert "not checked" not in body.lower() and "not passing" not in body, body
        assert "passing" in page.inner_text("[data-testid=pool-conductor]")
        workers = page.inner_text("[data-testid=pool-workers]")
        assert "answering calls" in workers and "not used yet" in workers  # the planner was not called
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        assert serious_violations(page) == []
        page.screenshot(path=str(out / f"pool-detail-served-{width}.png"), full_page=True)
