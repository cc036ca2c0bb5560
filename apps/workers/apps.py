from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "apps.workers"
    label = "workers"

    def ready(self) -> None:
        from apps.workers.egress import install_default_policy

        install_default_policy()
