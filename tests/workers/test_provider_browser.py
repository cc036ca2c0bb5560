"""Issue 42 item 9 in a real Chromium at 1280 and 390 px: the provider form shows only the chosen
kind's fields, "Test connection" checks the unsaved settings against a loopback fake OpenAI server
(the official SDK on the wire) and reports a failing one in plain words without the key; the page
passes axe-core (no serious/critical violation) and fits 390 px. Without JavaScript the same form
works: the kind switch and the test are answered by the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.workers.models import Provider
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fixtures.a11y import serious_violations
from tests.fixtures.screens import screens_dir
from tests.fixtures.workers import FAKE_PROVIDER_KEY

pytestmark = [pytest.mark.browser, pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)
WRONG_KEY = "sk-wrong-PLANTED-key-4242"


def _visible(page: Any, name: str) -> bool:
    return bool(page.locator(f".field[data-field={name}]").is_visible())


@pytest.mark.parametrize("width", WIDTHS)
def test_policy_admin_picks_a_kind_tests_the_connection_and_saves(
    width: int,
    login: Any,
    daphne_server: Any,
    policy_admin: Any,
    alpha: Any,
    fake_pool_server: FakeOpenAIServer,
    tmp_path: Path,
) -> None:
    out = screens_dir(tmp_path)
    page = login(policy_admin)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/pools/providers/new/")
    assert page.locator("label[for=id_base_url]").inner_text() == "Base URL"

    # Each kind shows only its fields.
    page.select_option("#id_kind", "local")
    assert _visible(page, "model_path") and not _visible(page, "base_url") and not _visible(page, "api_key")
    page.select_option("#id_kind", "openai_compatible")
    assert _visible(page, "base_url") and _visible(page, "api_key") and not _visible(page, "model_path")
    assert "Required: the endpoint" in page.inner_text(".field[data-field=base_url]")

    page.select_option("#id_team", str(alpha.pk))
    page.fill("#id_slug", "ollama-box")
    page.fill("#id_name", "Ollama box")
    page.fill("#id_base_url", fake_pool_server.base_url)
    page.fill("#id_api_key", FAKE_PROVIDER_KEY)
    page.fill("#id_test_model", "llama3.1:8b")
    fake_pool_server.script("OK")
    page.click("[data-testid=test-connection]")
    page.wait_for_selector(
        "[data-testid=test-result][data-ok=true], [data-testid=test-result][data-ok=false]"
    )
    assert page.get_attribute("[data-testid=test-result]", "data-ok") == "true", page.inner_text(
        "[data-testid=test-result]"
    )
    result = page.inner_text("[data-testid=test-result]")
    assert "reachable" in result and "llama3.1:8b answered" in result and " ms)" in result
    assert fake_pool_server.chat_requests()[-1].json["model"] == "llama3.1:8b"
    assert not Provider.objects.filter(slug="ollama-box").exists()  # a test saves nothing
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    assert serious_violations(page) == []
    page.screenshot(path=str(out / f"provider-form-{width}.png"), full_page=True)

    # A failing provider: the reason in plain words, never the key.
    page.fill("#id_api_key", WRONG_KEY)
    page.click("[data-testid=test-connection]")
    page.wait_for_selector('[data-testid=test-result][data-ok="false"]')
    assert "failed" in page.inner_text("[data-testid=test-result]")
    assert WRONG_KEY not in page.inner_text("body")

    page.fill("#id_api_key", FAKE_PROVIDER_KEY)
    page.click("[data-testid=save]")
    page.wait_for_url("**/pools/providers/")
    assert Provider.objects.get(slug="ollama-box").base_url == fake_pool_server.base_url


def test_without_javascript_the_form_and_the_test_still_work(
    browser: Any, daphne_server: Any, policy_admin: Any, alpha: Any, fake_pool_server: FakeOpenAIServer
) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 900}, java_script_enabled=False)
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        page.goto(f"{daphne_server.url}/accounts/login/")
        page.fill("#id_username", policy_admin.get_username())
        page.fill("#id_password", "pw-for-tests-123")
        page.click("[data-testid=login-submit]")
        page.goto(f"{daphne_server.url}/pools/providers/new/")
        assert _visible(page, "base_url") and not _visible(page, "model_path")  # OpenAI first
        page.select_option("#id_kind", "local")
        page.click("[data-testid=show-kind-fields]")
        assert _visible(page, "model_path") and not _visible(page, "base_url")
        page.select_option("#id_kind", "openai_compatible")
        page.click("[data-testid=show-kind-fields]")
        page.select_option("#id_team", str(alpha.pk))
        page.fill("#id_slug", "nojs")
        page.fill("#id_name", "No JS")
        page.fill("#id_base_url", fake_pool_server.base_url)
        page.fill("#id_api_key", FAKE_PROVIDER_KEY)
        page.fill("#id_test_model", "m-1")
        fake_pool_server.script("OK")
        page.click("[data-testid=test-connection]")
        result = page.inner_text("[data-testid=test-result]")
        assert "reachable" in result and "enter the key again" in result
        assert FAKE_PROVIDER_KEY not in page.content()
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    finally:
        context.close()
