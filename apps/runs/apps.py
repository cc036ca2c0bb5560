import sys

from django.apps import AppConfig
from django.conf import settings

SERVER_COMMANDS = ("daphne", "runserver", "uvicorn")


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"

    def ready(self) -> None:
        # Embedded mode: the server process sweeps stale runs (Celery beat does it in the
        # distributed mode). Not for management commands, tests or Celery workers.
        if settings.EXECUTION_BACKEND == "thread" and any(
            cmd in " ".join(sys.argv[:2]) for cmd in SERVER_COMMANDS
        ):
            from apps.runs.execution import start_sweeper

            start_sweeper()
