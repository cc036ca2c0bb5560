from django.apps import AppConfig


class GovernanceConfig(AppConfig):
    name = "apps.governance"
    label = "governance"
    # Object permissions are granted by services (apps.governance.services.grant_object_perms),
    # never by a signal: every grant is audited in the transaction that made it (issue #16).

    def ready(self) -> None:
        # Imported here, not at the top: apps.py loads before the app registry is ready.
        from apps.governance.ports import install

        install()
