"""Through a real browser: a policy admin adds a worker to the team's pool and tests its
connection against the fake OpenAI server; a member sees no edit controls and is refused (403)
when posting the form anyway; an outsider sees nothing of the team."""

from __future__ import annotations

import re
from typing import Any

import pytest

from apps.workers.models import Worker
from tests.fakes.openai_server import openai_error

pytestmark = [pytest.mark.browser, pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def _csrf(page: Any) -> str:
    # Every signed-in page carries the logout form, hence a CSRF token.
    return page.locator("input[name=csrfmiddlewaretoken]").first.get_attribute("value")


def test_policy_admin_adds_worker_and_tests_connection(
    login: Any, daphne_server: Any, fake_pool: Any, policy_admin: Any
) -> None:
    page = login(policy_admin)
    page.goto(f"{daphne_server.url}/pools/fake/")
    page.click("[data-testid=add-worker]")

    # First a submit with mistakes: each field says what is wrong.
    page.select_option("#id_new-provider", label="Fake OpenAI")
    page.fill("#id_new-slug", "Not A Slug")
    page.fill("#id_new-display_name", "")
    page.fill("#id_new-model_name", "")
    page.click("[data-testid=create-worker]")
    assert "Use lowercase letters" in page.inner_text("[data-testid=error-slug]")
    assert "display name" in page.inner_text("[data-testid=error-display_name]")
    assert "model name" in page.inner_text("[data-testid=error-model_name]")

    page.fill("#id_new-slug", "fake-analyst")
    page.fill("#id_new-display_name", "Fake analyst")
    page.fill("#id_new-model_name", "fake-analyst-1")
    page.fill("#id_new-strengths", "Reads tables and explains numbers.")
    page.fill("#id_new-tags", "external")
    page.click("[data-testid=create-worker]")
    page.wait_for_selector("tr[data-worker=fake-analyst]")
    assert Worker.objects.get(slug="fake-analyst").pools.filter(slug="fake").exists()

    fake_pool.server.script("OK")
    page.click("[data-testid=test-fake-analyst]")
    health = page.locator("[data-testid=health-fake-analyst]")
    health.wait_for()
    assert "Reachable" in health.inner_text()
    assert re.search(r"\d+ ms", health.inner_text())
    request = fake_pool.server.chat_requests()[-1]
    assert request.json["model"] == "fake-analyst-1"

    # A failing provider is reported in plain words on the page, not as a crash.
    fake_pool.server.script(openai_error("model_not_found", model="fake-analyst-1"))
    page.click("[data-testid=test-fake-analyst]")
    page.wait_for_selector("[data-testid=health-fake-analyst] .badge-error")
    assert page.locator("[data-testid=health-fake-analyst]").inner_text().strip() != ""


def test_member_sees_no_edit_button_and_gets_403(
    login: Any, daphne_server: Any, fake_pool: Any, owner: Any
) -> None:
    page = login(owner)
    resp = page.goto(f"{daphne_server.url}/pools/fake/")
    assert resp is not None and resp.status == 200
    assert page.locator("[data-testid=add-worker]").count() == 0
    assert page.locator("[data-testid=edit-pool]").count() == 0
    assert page.get_by_text("Test connection").count() == 0
    token = _csrf(page)
    resp = page.request.post(
        f"{daphne_server.url}/pools/fake/workers/add/",
        form={
            "csrfmiddlewaretoken": token,
            "mode": "existing",
            "existing-worker": str(fake_pool.conductor.pk),
        },
        headers={"Referer": f"{daphne_server.url}/pools/fake/", "X-CSRFToken": token},
    )
    assert resp.status == 403
    assert "CSRF" not in resp.text()  # refused for permission, not for a missing token
    assert not fake_pool.pool.workers.filter(pk=fake_pool.conductor.pk).exists()
    page.goto(f"{daphne_server.url}/pools/fake/edit/")
    assert "Not allowed" in page.content()


def test_outsider_sees_nothing_of_the_team(
    login: Any, daphne_server: Any, fake_pool: Any, outsider: Any
) -> None:
    page = login(outsider)
    page.goto(f"{daphne_server.url}/pools/")
    assert "Fake pool" not in page.content()
    page.goto(f"{daphne_server.url}/teams/")
    assert page.locator("tr[data-team=alpha]").count() == 0
    assert page.locator("tr[data-team=beta]").count() == 1
    for path in (
        "/pools/fake/",
        "/teams/alpha/",
        "/pools/providers/fake-openai/edit/",
        "/pools/workers/fake-solver/edit/",
    ):
        resp = page.goto(f"{daphne_server.url}{path}")
        assert resp is not None and resp.status == 404, path
    page.goto(f"{daphne_server.url}/pools/providers/")
    assert "Fake OpenAI" not in page.content()
