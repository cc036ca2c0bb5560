from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "apps.workers"
    label = "workers"
