"""The background threads every server process runs, started once Django is set up.

Called from the ASGI entry point (``conductor_web.asgi``), which only servers load (daphne,
``runserver``, uvicorn), after ``get_asgi_application()`` has set Django up. They used to start
from ``AppConfig.ready()``, while later apps were still loading: their first queries ran before
the registry was ready, and Django warned about exactly that on every ``make demo``.
"""

from __future__ import annotations

from django.conf import settings

from apps.audit.sequencer import start_sequencer_thread
from apps.runs.execution import start_lease_keeper
from apps.runs.sweeper import start_sweeper


def start_server_background() -> None:
    # Embedded servers sequence the audit log and publish tree heads. In the distributed mode the
    # Celery workers sequence (beat publishes) and servers stand by for when none does.
    distributed = settings.EXECUTION_BACKEND == "celery"
    start_sequencer_thread(publish=not distributed, standby=distributed)
    # Re-queue runs whose executor died and drain the dispatch outbox (runs accepted while the
    # broker was down). Celery workers start their own keeper (apps.runs.tasks, on worker_ready).
    start_lease_keeper(reap=True)
    start_sweeper()  # embedded servers only: Celery beat sweeps in the distributed mode
