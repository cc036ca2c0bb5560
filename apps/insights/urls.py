from django.urls import path

from apps.insights import views
from conductor_web import metrics

app_name = "insights"

urlpatterns = [
    path("insights/", views.dashboard, name="dashboard"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
