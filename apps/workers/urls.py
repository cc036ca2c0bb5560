from django.urls import path

from apps.workers import views

app_name = "workers"
# Fixed prefixes first: a pool slug can never be "new", "workers" or "providers" (reserved).
urlpatterns = [
    path("", views.pool_list, name="pool_list"),
    path("new/", views.pool_create, name="pool_create"),
    path("providers/", views.provider_list, name="provider_list"),
    path("providers/new/", views.provider_create, name="provider_create"),
    path("providers/<slug:slug>/edit/", views.provider_edit, name="provider_edit"),
    path("workers/<slug:slug>/edit/", views.worker_edit, name="worker_edit"),
    path("workers/<slug:slug>/test/", views.worker_test, name="worker_test"),
    path("<slug:slug>/", views.pool_detail, name="pool_detail"),
    path("<slug:slug>/edit/", views.pool_edit, name="pool_edit"),
    path("<slug:slug>/toggle/", views.pool_toggle, name="pool_toggle"),
    path("<slug:slug>/workers/add/", views.pool_worker_add, name="pool_worker_add"),
    path(
        "<slug:slug>/workers/<slug:worker_slug>/remove/", views.pool_worker_remove, name="pool_worker_remove"
    ),
]
