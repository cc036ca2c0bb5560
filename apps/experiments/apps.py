from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    """Evaluation sets and experiments: a team's labelled questions run through strategies."""

    name = "apps.experiments"
    label = "experiments"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py loads before the app registry is ready.
        from apps.experiments import services
        from apps.runs import observers

        # Each experiment run is scored once its final rows committed (never slows the run).
        observers.register("experiments.score", services.on_run_event)
