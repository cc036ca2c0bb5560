import sys

from django.apps import AppConfig
from django.conf import settings

SERVER_COMMANDS = ("daphne", "runserver", "uvicorn")


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from apps.runs.models import Run
        from apps.runs.policy_ports import install_policy_ports
        from apps.runs.ports import install_audit_port
        from apps.runs.sink import on_run_saved

        install_audit_port()
        install_policy_ports()  # run history and workers for policies (below runs)

        # Held answers (issue 13): a review decision reaches the run's live viewers.
        post_save.connect(on_run_saved, sender=Run, dispatch_uid="runs.review_notice")

        # Servers keep runs alive in both modes: re-queue runs whose executor died (a restarted
        # embedded server picks up its own orphans at once) and drain the dispatch outbox (runs
        # accepted while the broker was down). Embedded servers also sweep (Celery beat does it
        # in the distributed mode). Not for management commands or tests; Celery workers start
        # the keeper from apps.runs.tasks on worker_ready.
        if any(cmd in " ".join(sys.argv[:2]) for cmd in SERVER_COMMANDS):
            from apps.runs.execution import start_lease_keeper, start_sweeper

            start_lease_keeper(reap=True)
            if settings.EXECUTION_BACKEND == "thread":
                start_sweeper()
