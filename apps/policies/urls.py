from django.urls import path

from apps.policies import views

app_name = "policies"
urlpatterns = [
    path("", views.policy_list, name="policy_list"),
]
