from django.urls import path

from apps.api.rest.audit import LogCheckpoint
from apps.audit import views

app_name = "audit"
urlpatterns = [
    path("", views.event_list, name="event_list"),
    path("events/<int:seq>/", views.event_detail, name="event_detail"),
    path("export.<str:export_format>", views.event_export, name="export"),
    path("evidence.zip", views.evidence_pack, name="evidence_pack"),
    path("verify/", views.verify_now, name="verify"),
    # The log itself (c2sp.org/tlog-tiles serves <prefix>/checkpoint): public keys for anyone,
    # the checkpoint for reviewers and audit:read keys (apps.core.middleware lets /audit/log/
    # through without a session; these views answer for themselves).
    path("log/keys", views.log_keys, name="log_keys"),
    path("log/checkpoint", LogCheckpoint.as_view(), name="log_checkpoint"),
    path("reviews/", views.review_queue, name="review_queue"),
    path("reviews/bulk/", views.review_bulk, name="review_bulk"),
    path("runs/<uuid:run_id>/review/", views.run_review, name="run_review"),
    path("runs/<uuid:run_id>/resolve/", views.flag_resolve, name="flag_resolve"),
    path("runs/<uuid:run_id>/evidence.jsonl", views.run_export, name="run_export"),
    path("runs/<uuid:run_id>/evidence.zip", views.run_evidence_pack, name="run_evidence_pack"),
]
