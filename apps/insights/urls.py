from django.urls import path

from apps.insights import metrics, views

app_name = "insights"

urlpatterns = [
    path("insights/", views.dashboard, name="dashboard"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
