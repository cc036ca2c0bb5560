from django.apps import AppConfig


class FeedbackConfig(AppConfig):
    """Feedback as data: team metrics, feedback items (thumbs, API, reviewers, evaluators)."""

    name = "apps.feedback"
    label = "feedback"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        # Imported here, not at the top: apps.py loads before the app registry is ready.
        from apps.feedback import evaluators, services
        from apps.runs import observers

        # A reviewer's sign-off / flag becomes `review_approved` feedback, in the review's own
        # transaction (the review service needs no change).
        post_save.connect(services.on_review_saved, sender="audit.RunReview", dispatch_uid="feedback.review")
        # Every team starts with the default metrics (existing teams got them by migration).
        post_save.connect(services.on_team_saved, sender="governance.Team", dispatch_uid="feedback.team")
        # Evaluators run after the run's final rows committed: they can never break the run.
        observers.register("feedback.evaluators", evaluators.on_run_event)
