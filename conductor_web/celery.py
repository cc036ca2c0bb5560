"""Celery app. Tasks take ids only and use the JSON serializer (see settings.base)."""

import logging
import os
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from apps.core.logging import RedactSecretsFilter, RequestIdFilter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.local")

app = Celery("conductor_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _project_log_lines(logger: logging.Logger, **_: Any) -> None:
    """A worker replaces the root logger's handlers with its own: give them the project's filters
    and the request id (issue 44: a run's lines on a worker named no request, and secrets were
    not redacted there), keeping Celery's own prefix."""
    for handler in logger.handlers:
        if any(isinstance(f, RequestIdFilter) for f in handler.filters):
            continue  # set up already (Celery calls this for the root and the task logger)
        handler.addFilter(RedactSecretsFilter())
        handler.addFilter(RequestIdFilter())
        formatter = handler.formatter
        fmt = getattr(formatter, "_fmt", None)
        if formatter is not None and fmt and "%(request_id)s" not in fmt:
            # In place: Celery's formatter (its colours, its task fields) stays as it is.
            fmt = fmt.replace("%(message)s", "%(name)s%(request_id)s %(message)s", 1)
            formatter._fmt = fmt
            formatter._style._fmt = fmt
