from django.urls import path

from apps.feedback import views

app_name = "feedback"
urlpatterns = [
    path("teams/<slug:slug>/feedback/", views.team_feedback, name="team"),
]
