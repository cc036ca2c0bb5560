from django.urls import path

from apps.experiments import views

app_name = "experiments"
urlpatterns = [
    path("", views.experiment_list, name="list"),
    path("datasets/", views.dataset_upload, name="dataset_upload"),
    path("<int:pk>/", views.experiment_detail, name="detail"),
    path("<int:pk>/questions/<int:index>/", views.experiment_question, name="question"),
    path("<int:pk>/progress/", views.experiment_progress, name="progress"),
    path("<int:pk>/cancel/", views.experiment_cancel, name="cancel"),
    path("<int:pk>/teach/", views.experiment_teach, name="teach"),
    path("training-export/<slug:team_slug>/", views.training_export, name="training_export"),
]
