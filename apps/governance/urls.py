from django.urls import path

from apps.governance import views

app_name = "governance"
urlpatterns = [
    path("teams/", views.team_list, name="team_list"),
]
