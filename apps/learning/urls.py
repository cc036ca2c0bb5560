from django.urls import path

from apps.learning import views

app_name = "learning"

urlpatterns = [
    path("<slug:team_slug>/", views.router_page, name="router"),
    path("<slug:team_slug>/action/", views.router_action, name="router_action"),
]
