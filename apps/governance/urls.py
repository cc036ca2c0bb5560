from django.urls import path

from apps.governance import views

app_name = "governance"
urlpatterns = [
    path("teams/", views.team_list, name="team_list"),
    path("teams/new/", views.team_create, name="team_create"),
    path("teams/<slug:slug>/", views.team_detail, name="team_detail"),
    path("teams/<slug:slug>/members/add/", views.member_add, name="member_add"),
    path("teams/<slug:slug>/members/<int:user_id>/role/", views.member_role, name="member_role"),
    path("teams/<slug:slug>/members/<int:user_id>/remove/", views.member_remove, name="member_remove"),
    path("teams/<slug:slug>/default-pool/", views.default_pool, name="default_pool"),
]
