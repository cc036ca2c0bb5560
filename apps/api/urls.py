"""Mounted at the project root: ``/v1/`` (OpenAI-compatible), ``/api/`` (REST, schema, docs) and the
team key pages ``/teams/<slug>/keys/``."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import include, path, re_path, register_converter
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.api import views
from apps.api.rest import audit, keys, policies, pools, runs, teams
from apps.api.v1 import chat, embeddings, messages, responses
from apps.api.v1 import feedback as v1_feedback
from apps.api.v1.errors import error_response, unknown_url_error
from apps.feedback import views as feedback_views

app_name = "api"


class RunRefConverter:
    """A run id: the full UUID, or the short id the pages show (8+ hex characters; the views
    resolve it against the runs the caller may see, apps.runs.search)."""

    regex = "[0-9a-fA-F]{8}(?:[0-9a-fA-F-]{0,28})"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: object) -> str:
        return str(value)


register_converter(RunRefConverter, "run_ref")

# Named in the answer to any other /v1 path (keep in step with ``v1`` below).
V1_ENDPOINTS = [
    "GET /v1/models",
    "GET /v1/models/{model}",
    "POST /v1/chat/completions",
    "POST /v1/responses",
    "GET /v1/responses/{response_id}",
    "POST /v1/messages",
    "POST /v1/embeddings",
    "POST /v1/feedback",
]


@csrf_exempt
def v1_unknown(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Every other /v1 path: OpenAI's error shape, naming the endpoints that exist."""
    return error_response(unknown_url_error(request.method or "GET", request.path, V1_ENDPOINTS))


v1 = [
    path("models", chat.models_view, name="v1_models"),
    path("models/<str:model>", chat.model_detail_view, name="v1_model"),
    path("chat/completions", chat.chat_completions_view, name="v1_chat_completions"),
    path("responses", responses.responses_view, name="v1_responses"),
    path("responses/<str:response_id>", responses.response_detail_view, name="v1_response"),
    path("messages", messages.messages_view, name="v1_messages"),
    path("embeddings", embeddings.embeddings_view, name="v1_embeddings"),
    path("feedback", v1_feedback.feedback_view, name="v1_feedback"),
]

rest = [
    # teams, memberships, API keys
    path("teams/", teams.TeamListCreate.as_view(), name="team_list"),
    path("teams/<slug:slug>/", teams.TeamDetail.as_view(), name="team_detail"),
    path("teams/<slug:slug>/members/", teams.MemberListCreate.as_view(), name="member_list"),
    path("teams/<slug:slug>/members/<str:username>/", teams.MemberDetail.as_view(), name="member_detail"),
    path("teams/<slug:slug>/keys/", keys.ApiKeyListCreate.as_view(), name="apikey_list"),
    path("teams/<slug:slug>/keys/<int:key_id>/", keys.ApiKeyDetail.as_view(), name="apikey_detail"),
    path("teams/<slug:slug>/keys/<int:key_id>/revoke/", keys.ApiKeyRevoke.as_view(), name="apikey_revoke"),
    # providers, workers, pools
    path("providers/", pools.ProviderListCreate.as_view(), name="provider_list"),
    path("providers/<slug:slug>/", pools.ProviderDetail.as_view(), name="provider_detail"),
    path("workers/", pools.WorkerListCreate.as_view(), name="worker_list"),
    path("workers/<slug:slug>/", pools.WorkerDetail.as_view(), name="worker_detail"),
    path("workers/<slug:slug>/health-check/", pools.WorkerHealthCheck.as_view(), name="worker_health_check"),
    path("pools/", pools.PoolListCreate.as_view(), name="pool_list"),
    path("pools/<slug:slug>/", pools.PoolDetail.as_view(), name="pool_detail"),
    # policies
    path("policies/", policies.PolicyList.as_view(), name="policy_list"),
    path("policies/<int:policy_id>/", policies.PolicyDetail.as_view(), name="policy_detail"),
    path("policies/<int:policy_id>/diff/", policies.PolicyDiff.as_view(), name="policy_diff"),
    path(
        "policies/<int:policy_id>/versions/",
        policies.PolicyVersionListCreate.as_view(),
        name="policy_versions",
    ),
    path(
        "policies/<int:policy_id>/versions/<int:number>/",
        policies.PolicyVersionDetail.as_view(),
        name="policy_version_detail",
    ),
    path(
        "policies/<int:policy_id>/versions/<int:number>/publish/",
        policies.PolicyVersionPublish.as_view(),
        name="policy_version_publish",
    ),
    # runs
    path("runs/", runs.RunListCreate.as_view(), name="run_list"),
    path("runs/<run_ref:run_id>/", runs.RunDetail.as_view(), name="run_detail"),
    path("runs/<run_ref:run_id>/steps/", runs.RunSteps.as_view(), name="run_steps"),
    path("runs/<run_ref:run_id>/events/", runs.RunEvents.as_view(), name="run_events"),
    path("runs/<run_ref:run_id>/cancel/", runs.RunCancel.as_view(), name="run_cancel"),
    path("runs/<run_ref:run_id>/review/", runs.RunReview.as_view(), name="run_review"),
    path("runs/<run_ref:run_id>/approval/", runs.RunApproval.as_view(), name="run_approval"),
    path("runs/<uuid:run_id>/feedback/", feedback_views.RunFeedback.as_view(), name="run_feedback"),
    # audit
    path("audit/events/", audit.AuditEventList.as_view(), name="audit_event_list"),
    path("audit/events/<int:seq>/", audit.AuditEventDetail.as_view(), name="audit_event_detail"),
    path("audit/export/", audit.AuditExport.as_view(), name="audit_export"),
    # schema and docs (docs assets come from drf-spectacular-sidecar: no CDN)
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="redoc"),
]

urlpatterns = [
    path("v1/", include(v1)),
    re_path(r"^v1(?:/(?P<rest>.*))?$", v1_unknown, name="v1_unknown"),  # after every /v1 route
    path("api/", include(rest)),
    path("teams/<slug:slug>/keys/", views.key_list, name="key_list"),
    path("teams/<slug:slug>/keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("teams/<slug:slug>/keys/<int:key_id>/budget/", views.key_budget, name="key_budget"),
]
