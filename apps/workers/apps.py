from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "apps.workers"
    label = "workers"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py loads before the app registry is ready.
        from apps.governance.permissions import register_grant_source
        from apps.workers.egress import install_default_policy
        from apps.workers.grants import POOL_GRANTS

        install_default_policy()
        register_grant_source(POOL_GRANTS)
