from django.apps import AppConfig


class InsightsConfig(AppConfig):
    name = "apps.insights"
    label = "insights"

    def ready(self) -> None:
        from apps.insights import rollup, services
        from apps.runs import observers
        from conductor_web import metrics, telemetry

        # Rollups commit with the event (never disagree with the run); traces and metric
        # observations happen after commit and can never cost a run anything.
        observers.register("insights.rollup", rollup.on_event, in_transaction=True)
        observers.register("insights.telemetry", telemetry.on_run_event)
        observers.register("insights.metrics", metrics.on_run_event)
        observers.register("insights.budget_alerts", services.on_run_event)
