from django.apps import AppConfig


class LearningConfig(AppConfig):
    """The learned router: a per-team contextual bandit over strategies and workers."""

    name = "apps.learning"
    label = "learning"
