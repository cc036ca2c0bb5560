from django.apps import AppConfig


class ConductorWebConfig(AppConfig):
    name = "conductor_web"
    verbose_name = "Conductor Web"
