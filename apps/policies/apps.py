from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "apps.policies"
    label = "policies"

    def ready(self) -> None:
        from apps.governance.permissions import register_grant_source
        from apps.policies.visibility import POLICY_GRANTS

        register_grant_source(POLICY_GRANTS)
