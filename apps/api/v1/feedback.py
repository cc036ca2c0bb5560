"""``POST /v1/feedback``: a client scores a run it started (issue 19, "feedback as data").

Body ``{"run_id", "metric", "value", "comment"?, "step_index"?}``; API-key auth like every
``/v1`` endpoint; errors in OpenAI's shape. A run the key's team does not own answers exactly as
a run that does not exist (404 ``run_not_found``), so a key cannot probe other teams' run ids.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.api import selectors as api_sel
from apps.api.models import ApiKey, ApiScope
from apps.api.v1 import auth
from apps.api.v1.errors import ApiError, BodyRules, error_response, json_body, method_not_allowed
from apps.feedback.models import FeedbackSource
from apps.feedback.services import FeedbackInvalid, feedback_record

BODY_RULES = BodyRules(
    required=("run_id", "metric", "value"),
    known=frozenset({"run_id", "metric", "value", "comment", "step_index"}),
    neutral={},
    reasons={},
)


def feedback_object(item: Any) -> dict[str, Any]:
    return {
        "id": item.pk,
        "object": "feedback",
        "run_id": str(item.run_id),
        "metric": item.metric.name,
        "value": item.value,
        "step_index": item.step_index,
        "source": item.source,
        "created_at": int(item.created_at.timestamp()),
    }


def _run_for(key: ApiKey, run_id: Any) -> Any:
    not_found = ApiError(
        404, f"No run with id '{str(run_id)[:64]}' for this API key.", param="run_id", code="run_not_found"
    )
    try:
        pk = uuid.UUID(str(run_id)) if isinstance(run_id, str) else None
    except ValueError:
        pk = None
    if pk is None:
        raise not_found
    run = api_sel.runs_for(key.created_by, key).select_related("team").filter(pk=pk).first()
    if run is None:
        raise not_found
    return run


def record(request: HttpRequest) -> dict[str, Any]:
    key = auth.authenticate(request)
    body = json_body(request.body, BODY_RULES)
    refusal = api_sel.scope_refusal(key, ApiScope.RUNS_WRITE)
    if refusal is not None:
        raise auth.deny(key, 403, "insufficient_scope", refusal, detail=ApiScope.RUNS_WRITE)
    run = _run_for(key, body["run_id"])
    try:
        item = feedback_record(
            run=run,
            metric_name=body["metric"],
            value=body["value"],
            comment=body.get("comment"),
            source=FeedbackSource.API,
            user=key.created_by,
            api_key=key,
            step_index=body.get("step_index"),
        )
    except FeedbackInvalid as err:
        raise ApiError(400, err.message, param=err.param, code=err.code) from None
    return feedback_object(item)


@csrf_exempt
def feedback_view(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return method_not_allowed("POST")
    try:
        return JsonResponse(record(request), status=201)
    except ApiError as err:
        return error_response(err)
