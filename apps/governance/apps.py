from django.apps import AppConfig
from django.db.models.signals import post_save


class GovernanceConfig(AppConfig):
    name = "apps.governance"
    label = "governance"

    def ready(self) -> None:
        from apps.governance.signals import policy_saved

        post_save.connect(policy_saved, sender="policies.Policy", dispatch_uid="governance.policy_saved")
