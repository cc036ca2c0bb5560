from django.urls import path

from apps.workers import views

app_name = "workers"
urlpatterns = [
    path("", views.pool_list, name="pool_list"),
]
