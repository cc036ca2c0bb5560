from django.urls import path, re_path

from apps.runs import views

app_name = "runs"
urlpatterns = [
    path("runs/", views.run_list, name="list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="detail"),
    # The short id the pages show (8 or more hex characters).
    re_path(r"^runs/(?P<ref>[0-9a-fA-F]{8,32})/$", views.run_by_short_id, name="short"),
    path("runs/<uuid:run_id>/snapshot/", views.run_snapshot, name="snapshot"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel, name="cancel"),
    path("runs/<uuid:run_id>/approval/", views.plan_decide, name="plan_decide"),
    path("runs/<uuid:run_id>/steps/<int:index>/replay/", views.step_replay, name="step_replay"),
]
