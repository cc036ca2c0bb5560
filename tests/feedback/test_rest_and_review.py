"""``/api/runs/<id>/feedback/`` (visibility, keys, validation) and reviewers' verdicts as feedback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.feedback.models import Feedback, Metric
from apps.runs.reviews import run_review
from tests.factories.api import make_api_key
from tests.factories.runs import StepFactory

pytestmark = pytest.mark.django_db


def _url(run: Any) -> str:
    return f"/api/runs/{run.pk}/feedback/"


def _post(client: Any, run: Any, body: dict[str, Any], **headers: Any) -> Any:
    return client.post(_url(run), data=json.dumps(body), content_type="application/json", **headers)


def test_session_thumbs_are_recorded_listed_and_audited(client: Any, teammate: Any, alpha_run: Any) -> None:
    client.force_login(teammate)
    response = _post(
        client, alpha_run, {"metric": "helpful", "value": False, "comment": "wrong", "source": "thumbs"}
    )
    assert response.status_code == 201, response.content
    item = Feedback.objects.get()
    assert (item.source, item.value, item.author, item.comment) == ("thumbs", 0.0, teammate, "wrong")
    listed = client.get(_url(alpha_run)).json()
    assert [(f["metric"], f["value"], f["who"], f["source"], f["comment"]) for f in listed] == [
        ("helpful", 0.0, teammate.username, "thumbs", "wrong")
    ]
    assert AuditEvent.objects.filter(event_type="feedback.recorded", run_id=alpha_run.pk).count() == 1


def test_outsider_gets_404_and_writes_nothing(client: Any, outsider: Any, alpha_run: Any) -> None:
    client.force_login(outsider)
    assert client.get(_url(alpha_run)).status_code == 404
    assert _post(client, alpha_run, {"metric": "helpful", "value": True}).status_code == 404
    assert not Feedback.objects.exists()


def test_validation_names_the_field(client: Any, owner: Any, alpha_run: Any, alpha: Any) -> None:
    client.force_login(owner)
    response = _post(client, alpha_run, {"metric": "nope", "value": True})
    assert response.status_code == 400 and "nope" in response.json()["metric"][0]
    response = _post(client, alpha_run, {"metric": "helpful", "value": "maybe"})
    assert response.status_code == 400 and "true, false" in response.json()["value"][0]
    Metric.objects.create(team=alpha, name="step_ok", kind="boolean", level="step")
    response = _post(client, alpha_run, {"metric": "step_ok", "value": True})
    assert response.status_code == 400 and "step_index" in response.json()
    response = _post(client, alpha_run, {"metric": "step_ok", "value": True, "step_index": 3})
    assert response.status_code == 400 and "no step 3" in response.json()["step_index"][0]
    StepFactory(run=alpha_run, index=3)
    response = _post(client, alpha_run, {"metric": "step_ok", "value": True, "step_index": 3})
    assert response.status_code == 201 and response.json()["step_index"] == 3


def test_keys_need_their_scopes_and_source_is_api(
    client: Any, alpha: Any, team_admin: Any, alpha_run: Any, beta_run: Any
) -> None:
    reader = make_api_key(alpha, name="reader", scopes=["runs:read"], principal=team_admin).plaintext
    writer = make_api_key(alpha, name="writer", principal=team_admin).plaintext
    body = {"metric": "helpful", "value": True, "source": "thumbs"}
    assert _post(client, alpha_run, body, HTTP_AUTHORIZATION=f"Bearer {reader}").status_code == 403
    assert client.get(_url(alpha_run), HTTP_AUTHORIZATION=f"Bearer {reader}").status_code == 200
    response = _post(client, alpha_run, body, HTTP_AUTHORIZATION=f"Bearer {writer}")
    assert response.status_code == 201 and response.json()["source"] == "api"  # a key never claims thumbs
    assert _post(client, beta_run, body, HTTP_AUTHORIZATION=f"Bearer {writer}").status_code == 404


def test_reviewer_sign_off_and_flag_become_review_approved_feedback(
    reviewer: Any, alpha_run: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        run_review(actor=reviewer, run=alpha_run, status="approved", comment="fine")
    with django_capture_on_commit_callbacks(execute=True):
        run_review(actor=reviewer, run=alpha_run, status="flagged", reason="made up a source")
    with django_capture_on_commit_callbacks(execute=True):
        run_review(actor=reviewer, run=alpha_run, status="needs_follow_up", comment="ask legal")
    rows = list(Feedback.objects.order_by("id").values_list("metric__name", "value", "source", "author"))
    assert rows == [
        ("review_approved", 1.0, "reviewer", reviewer.pk),
        ("review_approved", 0.0, "reviewer", reviewer.pk),
    ]
    types = list(
        AuditEvent.objects.filter(run_id=alpha_run.pk).order_by("id").values_list("event_type", flat=True)
    )
    # Each verdict's feedback is recorded after the review itself committed.
    assert types == ["run.reviewed", "feedback.recorded", "run.reviewed", "feedback.recorded", "run.reviewed"]


def test_default_metrics_exist_for_every_team(alpha: Any, beta: Any, alpha_run: Any) -> None:
    from apps.feedback.selectors import metrics_of_team

    assert {"helpful", "review_approved"} <= set(metrics_of_team(beta).values_list("name", flat=True))
    helpful = Metric.objects.get(team=alpha, name="helpful")
    assert (helpful.kind, helpful.optimize, helpful.level) == ("boolean", "max", "run")


def test_comments_on_a_held_run_are_withheld_from_who_may_not_see_its_content(
    client: Any, owner: Any, reviewer: Any, alpha_run: Any
) -> None:
    from apps.feedback.services import feedback_record

    alpha_run.answer_held = True
    alpha_run.save(update_fields=["answer_held"])
    feedback_record(
        run=alpha_run, metric_name="helpful", value=True, comment="it says 42", source="thumbs", user=reviewer
    )
    client.force_login(owner)
    assert [f["comment"] for f in client.get(_url(alpha_run)).json()] == [None]
    client.force_login(reviewer)
    assert [f["comment"] for f in client.get(_url(alpha_run)).json()] == ["it says 42"]


def test_run_page_and_playground_carry_the_thumbs_control(client: Any, owner: Any, alpha_run: Any) -> None:
    client.force_login(owner)
    for url in (f"/runs/{alpha_run.pk}/", f"/playground/?run={alpha_run.pk}"):
        page = client.get(url).content.decode()
        assert 'data-testid="thumbs-up"' in page and 'data-testid="thumbs-down"' in page, url
        assert f'data-url="{_url(alpha_run)}"' in page and "js/feedback.js" in page
