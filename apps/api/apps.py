from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "apps.api"
    label = "api"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py loads before the app registry is ready.
        # Registers the OpenAPI description of API key authentication with drf-spectacular.
        from apps.api import schema  # noqa: F401
