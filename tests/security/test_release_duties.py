"""Separation of duties for held answers (issue 39, item 7): a team admin could release the held
answer to his own question (he could not approve his own held plan). Now nobody releases the
answer to their own question, on every surface (REST, the run page's review form, the review
desk's bulk sign-off); each refusal is a 403 naming the rule and is audited, and the answer stays
held until another admin (or a reviewer) releases it.

Against a live daphne: the admin asks through the playground, the run executes in the mode's
runtime on the fake OpenAI server, the output guardrail holds the answer; every decision is an
HTTP request of a signed-in browser.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client

from apps.audit.models import AuditEvent
from apps.governance.models import Role
from apps.runs.models import Run
from tests.factories.governance import member_of
from tests.factories.policies import publish_policy
from tests.fixtures.api import PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

TIMEOUT = 90
HOLD_POLICY = {
    "guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 10}}}
}
RULE = "separation_of_duties"


class Browser:
    def __init__(self, server: Any, user: Any) -> None:
        client = Client()
        client.force_login(user)
        self.server = server
        self.http = httpx.Client(
            base_url=server.url,
            cookies={settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value},
            timeout=TIMEOUT,
        )

    def post(self, path: str, data: dict[str, Any], *, page: str) -> httpx.Response:
        self.http.get(page)  # sets the CSRF cookie
        token = self.http.cookies.get(settings.CSRF_COOKIE_NAME) or ""
        return self.http.post(
            path, data=data, headers={"X-CSRFToken": token, "Referer": self.server.url + page}
        )


def _held_run_asked_by(server: Any, pool: Any, user: Any) -> Run:
    browser = Browser(server, user)
    response = browser.post(
        "/playground/",
        {"prompt": "What is six times seven?", "strategy": "conductor-mini", "pool": str(pool.pk)},
        page="/playground/",
    )
    assert response.status_code == 302, response.text[:2000]
    run_id = response.headers["location"].split("run=")[1].split("&")[0]
    deadline = time.monotonic() + TIMEOUT
    while (run := Run.objects.get(pk=run_id)).status in ("queued", "running"):
        assert time.monotonic() < deadline, "the run did not finish"
        time.sleep(0.1)
    assert run.status == "succeeded" and run.answer_held and run.created_by_id == user.pk
    return run


def _refusals(run: Run) -> list[dict[str, Any]]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk, event_type="run.release_refused").values_list(
            "payload", flat=True
        )
    )


def test_a_team_admin_cannot_release_the_answer_to_his_own_question_another_admin_can(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    answer = f"Final: HELD{uuid.uuid4().hex[:8]} is the answer"
    fake_pool.server.responder = lambda req: PLAN_TEXT if req.get("model") == "fake-conductor-1" else answer
    publish_policy(alpha, HOLD_POLICY)
    run = _held_run_asked_by(daphne_server, fake_pool.pool, team_admin)
    asker = Browser(daphne_server, team_admin)
    page = f"/runs/{run.pk}/"

    # REST.
    rest = asker.post(f"/api/runs/{run.pk}/review/", {"status": "approved"}, page=page)
    assert rest.status_code == 403 and RULE in rest.json()["detail"], rest.text
    # The run page's review form.
    form = asker.post(f"/audit/runs/{run.pk}/review/", {"status": "approved", "next": page}, page=page)
    assert form.status_code == 403 and RULE in form.text, form.status_code
    # The review desk's bulk sign-off: all or none, so none.
    bulk = asker.post("/audit/reviews/bulk/", {"run": [str(run.pk)], "note": "fine"}, page="/audit/reviews/")
    assert bulk.status_code == 403 and RULE in bulk.text, bulk.status_code

    run.refresh_from_db()
    assert run.answer_held and run.review_status != "approved"
    assert not AuditEvent.objects.filter(run_id=run.pk, event_type="run.released").exists()
    refusals = _refusals(run)
    assert len(refusals) == 3 and all(p["rule"] == RULE and p["status"] == "approved" for p in refusals)
    assert [p.get("bulk") for p in refusals].count(1) == 1
    assert (
        AuditEvent.objects.filter(run_id=run.pk, event_type="run.release_refused", actor=team_admin).count()
        == 3
    )
    # What he may still do: flag it (nothing is released).
    flag = asker.post(f"/api/runs/{run.pk}/review/", {"status": "flagged", "reason": "check it"}, page=page)
    assert flag.status_code == 201 and flag.json()["released_answer"] is False
    # The page tells him instead of offering the release.
    assert "another reviewer must release" in asker.http.get(page).text

    # Another admin of the team releases it.
    other = Browser(daphne_server, member_of(alpha, Role.ADMIN, username="second_admin"))
    released = other.post(f"/api/runs/{run.pk}/review/", {"status": "approved"}, page=page)
    assert released.status_code == 201 and released.json()["released_answer"] is True, released.text
    run.refresh_from_db()
    assert not run.answer_held
    assert AuditEvent.objects.filter(run_id=run.pk, event_type="run.released").count() == 1
