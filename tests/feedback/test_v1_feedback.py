"""``POST /v1/feedback``: API-key auth, OpenAI-shaped errors, audit row, learning hook on commit."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.feedback.models import Feedback, Metric
from tests.factories.api import make_api_key

pytestmark = pytest.mark.django_db

URL = "/v1/feedback"


def _post(client: Any, key: str, body: Any) -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(URL, data=data, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_own_run_201_audited_and_learned_on_commit(
    client: Any, api_key: Any, alpha_run: Any, learned: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    key, raw = api_key
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(
            client,
            raw,
            {"run_id": str(alpha_run.pk), "metric": "helpful", "value": True, "comment": "SECRET-NOTE"},
        )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["run_id"] == str(alpha_run.pk) and body["metric"] == "helpful" and body["value"] == 1.0
    assert body["source"] == "api" and isinstance(body["id"], int) and isinstance(body["created_at"], int)
    item = Feedback.objects.get(pk=body["id"])
    assert item.api_key_id == key.pk and item.comment == "SECRET-NOTE"
    event = AuditEvent.objects.get(event_type="feedback.recorded", run_id=alpha_run.pk)
    assert event.payload["feedback_id"] == item.pk and event.payload["metric"] == "helpful"
    assert event.payload["value"] == 1.0 and event.payload["source"] == "api"
    assert "SECRET-NOTE" not in json.dumps(event.payload)  # a hash, never the text
    assert learned == [(alpha_run.pk, alpha_run.team_id, "helpful", 1.0)]


def test_foreign_and_unknown_runs_are_the_same_404(client: Any, api_key: Any, beta_run: Any) -> None:
    _, raw = api_key
    answers = []
    for run_id in (str(beta_run.pk), str(uuid.uuid4()), "not-a-uuid"):
        response = _post(client, raw, {"run_id": run_id, "metric": "helpful", "value": True})
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "run_not_found" and error["param"] == "run_id"
        assert error["type"] == "invalid_request_error"
        answers.append(json.dumps(response.json()).replace(run_id, "<id>"))
    assert len(set(answers)) == 1  # a foreign run is indistinguishable from a missing one
    assert not Feedback.objects.exists()


def test_undefined_metric_is_400_naming_the_metric_and_the_team_metrics(
    client: Any, api_key: Any, alpha_run: Any
) -> None:
    _, raw = api_key
    response = _post(client, raw, {"run_id": str(alpha_run.pk), "metric": "accuracy", "value": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "metric" and error["code"] == "metric_not_found"
    assert "'accuracy'" in error["message"] and "helpful" in error["message"]


@pytest.mark.parametrize("value", ["yes", 2, 0.5, None, [], {"v": 1}])
def test_bad_boolean_value_is_400(client: Any, api_key: Any, alpha_run: Any, value: Any) -> None:
    _, raw = api_key
    response = _post(client, raw, {"run_id": str(alpha_run.pk), "metric": "helpful", "value": value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "value" and "true, false, 1 or 0" in error["message"]


def test_float_metric_takes_finite_numbers_only(
    client: Any, api_key: Any, alpha_run: Any, alpha: Any
) -> None:
    _, raw = api_key
    Metric.objects.create(team=alpha, name="latency_score", kind="float", optimize="min")
    ok = _post(client, raw, {"run_id": str(alpha_run.pk), "metric": "latency_score", "value": 0.25})
    assert ok.status_code == 201 and ok.json()["value"] == 0.25
    nan = '{"run_id": "%s", "metric": "latency_score", "value": NaN}'.replace("%s", str(alpha_run.pk))
    response = _post(client, raw, nan)  # JSON has no NaN; whether the parser or the rule refuses it
    assert response.status_code == 400, response.content
    response = _post(client, raw, {"run_id": str(alpha_run.pk), "metric": "latency_score", "value": "fast"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "value"


def test_malformed_json_missing_fields_and_unknown_fields(client: Any, api_key: Any, alpha_run: Any) -> None:
    _, raw = api_key
    response = _post(client, raw, b"{not json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    response = _post(client, raw, {"run_id": str(alpha_run.pk), "value": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "metric"
    response = _post(client, raw, {"run_id": str(alpha_run.pk), "metric": "helpful", "value": True, "x": 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "x"
    response = _post(
        client, raw, {"run_id": str(alpha_run.pk), "metric": "helpful", "value": 1, "comment": "c" * 1001}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "comment"


def test_auth_and_scope(client: Any, alpha: Any, team_admin: Any, alpha_run: Any) -> None:
    body = {"run_id": str(alpha_run.pk), "metric": "helpful", "value": True}
    response = client.post(URL, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"
    reader = make_api_key(alpha, name="reader", scopes=["runs:read"], principal=team_admin).plaintext
    response = _post(client, reader, body)
    assert response.status_code == 403 and "runs:write" in response.json()["error"]["message"]
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {reader}").status_code == 405


def test_a_failing_learner_never_fails_the_request(
    client: Any,
    api_key: Any,
    alpha_run: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    import importlib

    def boom(*args: Any) -> None:
        raise RuntimeError("learner down")

    monkeypatch.setattr(
        importlib.import_module("apps.learning.services"), "learn_from_feedback", boom, raising=False
    )
    _, raw = api_key
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(client, raw, {"run_id": str(alpha_run.pk), "metric": "helpful", "value": False})
    assert response.status_code == 201 and Feedback.objects.get().value == 0.0
