from django.urls import path

from apps.runs import views

app_name = "runs"
urlpatterns = [
    path("runs/", views.run_list, name="list"),
]
