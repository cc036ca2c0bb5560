from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "apps.policies"
    label = "policies"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py loads before the app registry is ready.
        from apps.governance.permissions import register_grant_source
        from apps.policies.grants import POLICY_GRANTS

        register_grant_source(POLICY_GRANTS)
