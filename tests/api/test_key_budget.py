"""Per-key dollar budgets (issue 42): the official ``openai`` client against a live daphne. A key
whose hard budget is spent is refused before any model call with OpenAI's error shape naming the
key's budget; a reached soft budget only warns. Team admins set them on the key page, audited."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import openai
import pytest
from django.test import Client

from apps.api.models import ApiKey
from apps.audit.models import AuditEvent
from apps.runs.models import Run
from apps.workers.models import Worker
from tests.factories.api import make_api_key

PROMPT = [{"role": "user", "content": "What is six times seven?"}]


def _priced(fake_pool: Any) -> None:
    Worker.objects.filter(pk__in=[w.pk for w in [*fake_pool.workers, fake_pool.conductor]]).update(
        input_price_per_mtok=Decimal("3"), output_price_per_mtok=Decimal("15")
    )


@pytest.fixture
def client_for(api_server: Any, runtime_workers: Any) -> Any:
    def make(key: str) -> openai.OpenAI:
        # max_retries=0: the SDK would retry a 429 (x-should-retry says no, but be explicit).
        return openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=key, max_retries=0, timeout=90)

    return make


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_spent_hard_key_budget_refuses_in_openais_shape_and_soft_warns(
    conductor_fake: Any, alpha: Any, team_admin: Any, client_for: Any
) -> None:
    _priced(conductor_fake)
    created = make_api_key(
        alpha,
        name="nightly job",
        principal=team_admin,
        budget_period="daily",
        budget_soft_usd=Decimal("0.000001"),
        budget_hard_usd=Decimal("0.000002"),
    )
    client = client_for(created.plaintext)

    first = client.chat.completions.with_raw_response.create(model="conductor-mini", messages=PROMPT)
    assert first.parse().choices[0].message.content
    assert "x-conductor-budget-warning" not in first.headers  # nothing spent before it
    run = Run.objects.get(pk=first.headers["x-conductor-run"])
    assert run.api_key_id == created.api_key.pk and run.cost_usd and run.cost_usd > Decimal("0.000002")

    calls = len(conductor_fake.server.chat_requests())
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="conductor-mini", messages=PROMPT)
    err = refused.value
    assert err.status_code == 429
    body = err.body if isinstance(err.body, dict) else {}
    assert body["type"] == "insufficient_quota" and body["code"] == "budget_exhausted"
    assert body["message"].startswith(
        f"The API key 'nightly job' (cw_{created.api_key.prefix}_…) has spent its daily budget ($0.000002;"
    )
    assert err.response.headers["x-should-retry"] == "false"
    assert int(err.response.headers["retry-after"]) > 0
    # Refused before anything was stored or any model called; the refusal is audited.
    assert Run.objects.filter(api_key=created.api_key).count() == 1
    assert len(conductor_fake.server.chat_requests()) == calls
    denied = AuditEvent.objects.get(event_type="apikey.denied", api_key_id=created.api_key.pk)
    assert denied.payload["reason"] == "budget_exhausted"

    # Raised above the spend, the hard budget lets it run; the soft one, reached, warns.
    ApiKey.objects.filter(pk=created.api_key.pk).update(budget_hard_usd=Decimal("5"))
    again = client.chat.completions.with_raw_response.create(model="conductor-mini", messages=PROMPT)
    assert again.parse().choices[0].message.content
    assert again.headers["x-conductor-budget-warning"].startswith(
        "the API key's daily soft budget ($0.000001) is reached"
    )


@pytest.mark.django_db
def test_team_admin_sets_a_key_budget_on_the_key_page_audited(
    alpha: Any, team_admin: Any, owner: Any
) -> None:
    key = make_api_key(alpha, name="report job", principal=team_admin).api_key
    browser = Client()
    browser.force_login(team_admin)
    url = f"/teams/alpha/keys/{key.pk}/budget/"
    p = f"k{key.pk}-"
    # Soft above hard: refused naming the field, nothing saved.
    bad = browser.post(
        url, {p + "budget_period": "monthly", p + "budget_soft_usd": "9", p + "budget_hard_usd": "2"}
    )
    assert bad.status_code == 400
    assert (
        "Soft (USD): The soft budget (a warning) must not be above the hard budget." in bad.content.decode()
    )
    assert ApiKey.objects.get(pk=key.pk).budget_hard_usd is None

    ok = browser.post(
        url, {p + "budget_period": "monthly", p + "budget_soft_usd": "1.5", p + "budget_hard_usd": "2"}
    )
    assert ok.status_code == 302
    key.refresh_from_db()
    assert (key.budget_period, key.budget_soft_usd, key.budget_hard_usd) == (
        "monthly",
        Decimal("1.5"),
        Decimal("2"),
    )
    event = AuditEvent.objects.get(event_type="apikey.budget_changed")
    assert event.actor == team_admin
    assert event.payload["before"]["budget_hard_usd"] is None
    assert event.payload["after"] == {
        "budget_period": "monthly",
        "budget_soft_usd": "1.5",
        "budget_hard_usd": "2",
    }
    page = browser.get("/teams/alpha/keys/").content.decode()
    assert "$0.0000 spent this UTC month" in page and "hard $2" in page

    # Not a team admin: refused, naming who may.
    member = Client()
    member.force_login(owner)
    assert member.post(url, {p + "budget_period": "daily"}).status_code == 403


@pytest.mark.django_db
def test_rest_run_create_refuses_a_spent_key_budget_and_warns_on_a_soft_one(
    fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    created = make_api_key(
        alpha,
        name="rest job",
        principal=team_admin,
        role="run",
        budget_soft_usd=Decimal("0.5"),
        budget_hard_usd=Decimal("1"),
    )
    client = Client(HTTP_AUTHORIZATION=f"Bearer {created.plaintext}")
    first = client.post("/api/runs/", {"question": "What is 6*7?"}, content_type="application/json")
    assert first.status_code == 201 and "X-Conductor-Budget-Warning" not in first
    Run.objects.filter(pk=first.json()["id"]).update(cost_usd=Decimal("0.75"))  # the run cost this much
    soft = client.post("/api/runs/", {"question": "And 7*8?"}, content_type="application/json")
    assert soft.status_code == 201
    assert soft["X-Conductor-Budget-Warning"].startswith("the API key's monthly soft budget ($0.5")
    Run.objects.filter(pk=soft.json()["id"]).update(cost_usd=Decimal("0.25"))
    refused = client.post("/api/runs/", {"question": "And 8*9?"}, content_type="application/json")
    assert refused.status_code == 429
    assert refused.json()["code"] == "budget_exhausted"
    assert (
        "The API key 'rest job'" in refused.json()["detail"]
        and "monthly budget ($1" in refused.json()["detail"]
    )
    assert Run.objects.filter(api_key=created.api_key).count() == 2
