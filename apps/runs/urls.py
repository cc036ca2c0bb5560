from django.urls import path

from apps.runs import views

app_name = "runs"
urlpatterns = [
    path("runs/", views.run_list, name="list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="detail"),
    path("runs/<uuid:run_id>/snapshot/", views.run_snapshot, name="snapshot"),
    path("runs/<uuid:run_id>/cancel/", views.run_cancel, name="cancel"),
    path("runs/<uuid:run_id>/approval/", views.plan_decide, name="plan_decide"),
    path("runs/<uuid:run_id>/steps/<int:index>/replay/", views.step_replay, name="step_replay"),
]
