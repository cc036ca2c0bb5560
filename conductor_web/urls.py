from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from apps.runs import views as run_views
from conductor_web import health, views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("playground/", run_views.playground, name="playground"),
    path("", include("apps.runs.urls")),
    path("pools/", include("apps.workers.urls")),
    path("", include("apps.governance.urls")),
    path("policies/", include("apps.policies.urls")),
    path("audit/", include("apps.audit.urls")),
    path("", include("apps.api.urls")),
    path("", include("apps.insights.urls")),
    path("learning/", include("apps.learning.urls")),
    path("", include("apps.feedback.urls")),
    path("experiments/", include("apps.experiments.urls")),
    path("tools/", include("apps.tools.urls")),
]

handler403 = "conductor_web.views.permission_denied"
handler404 = "conductor_web.views.page_not_found"
handler500 = "conductor_web.views.server_error"
