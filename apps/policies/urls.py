from django.urls import path

from apps.policies import views

app_name = "policies"
urlpatterns = [
    path("", views.policy_list, name="policy_list"),
    path("platform/", views.policy_edit, name="platform_edit"),
    path("team/<slug:team_slug>/", views.policy_edit, name="team_edit"),
    path("team/<slug:team_slug>/budget/", views.budget_page, name="budget"),
    path("<int:policy_id>/history/", views.policy_history, name="policy_history"),
    path("<int:policy_id>/rollback/<int:number>/", views.policy_rollback_view, name="policy_rollback"),
]
