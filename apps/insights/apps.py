from django.apps import AppConfig


class InsightsConfig(AppConfig):
    name = "apps.insights"
    label = "insights"

    def ready(self) -> None:
        from django.db.models.signals import post_save, pre_save

        # Imported here, not at the top: apps.py loads before the app registry is ready.
        from apps.audit.models import RunReview
        from apps.insights import metrics, reviews, rollup, services, telemetry
        from apps.runs import observers
        from apps.runs.models import Run

        # Rollups commit with the event (never disagree with the run); traces and metric
        # observations happen after commit and can never cost a run anything.
        observers.register_batch("insights.rollup", rollup.on_batch)
        observers.register("insights.telemetry", telemetry.on_run_event)
        observers.register("insights.metrics", metrics.on_run_event)
        observers.register("insights.budget_alerts", services.on_run_event)
        observers.register_viewer_gauge("insights.metrics", metrics.websocket_viewer)
        # A reviewer's verdict saves the run: its review rollup follows in the same transaction.
        pre_save.connect(reviews.on_run_pre_save, sender=Run, dispatch_uid="insights.review_pre")
        post_save.connect(reviews.on_run_post_save, sender=Run, dispatch_uid="insights.review_post")
        post_save.connect(reviews.on_review_saved, sender=RunReview, dispatch_uid="insights.review_fact")
