from django.urls import path

from apps.audit import views

app_name = "audit"
urlpatterns = [
    path("", views.event_list, name="event_list"),
    path("events/<int:seq>/", views.event_detail, name="event_detail"),
    path("export.<str:export_format>", views.event_export, name="export"),
    path("verify/", views.verify_now, name="verify"),
    path("reviews/", views.review_queue, name="review_queue"),
    path("reviews/bulk/", views.review_bulk, name="review_bulk"),
    path("runs/<uuid:run_id>/review/", views.run_review, name="run_review"),
    path("runs/<uuid:run_id>/resolve/", views.flag_resolve, name="flag_resolve"),
    path("runs/<uuid:run_id>/evidence.jsonl", views.run_export, name="run_export"),
]
