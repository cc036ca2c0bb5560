from django.urls import path

from apps.tools import views

app_name = "tools"
urlpatterns = [
    path("servers/new/", views.server_create, name="server_create"),
    path("servers/<slug:slug>/discover/", views.server_discover, name="server_discover"),
    path("versions/<int:pk>/accept/", views.version_accept, name="version_accept"),
    path("approvals/", views.approval_desk, name="approval_desk"),
    path("approvals/<int:pk>/decide/", views.approval_decide, name="approval_decide"),
]
