"""The sweep: ends runs still queued/running past their deadline (a dead worker, a lost task), and
whatever else has expired (a held plan nobody decided). Celery beat runs it in the distributed
mode (apps.runs.tasks); in the embedded mode one timer thread per process does (``start_sweeper``),
together with audit retention and the periodic chain verification.

Higher layers add their own expiry with ``register_expiry`` at app ready (approvals, above
execution, ends held plans past their timeout), so the sweep imports nothing above it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from apps.audit.tasks import audit_verify
from apps.runs.endings import run_finish_externally
from apps.runs.models import Run, RunStatus
from apps.runs.retention import retention_sweep

logger = logging.getLogger(__name__)

Expiry = Callable[[], int]  # ends what expired; returns how many runs it ended

_expiries: dict[str, Expiry] = {}
_sweeper_started = False
_sweeper_lock = threading.Lock()


def run_job(job: Callable[[], object], what: str) -> None:
    """One pass of a background job on a fresh connection, given back after; a failure is logged,
    never raised (the next tick tries again)."""
    try:
        close_old_connections()
        job()
    except Exception:
        logger.exception("%s failed", what)
    finally:
        connection.close()


def register_expiry(name: str, expire: Expiry) -> None:
    """Add ``expire`` to every sweep (once by name: app ready may run twice in tests)."""
    _expiries[name] = expire


def sweep_stale_runs() -> int:
    """End runs whose deadline + grace passed while still queued/running (dead worker, lost
    task), then run the registered expiries. Returns how many runs were ended."""
    cutoff = timezone.now() - timedelta(seconds=settings.RUN_SWEEP_GRACE_S)
    stale = list(
        Run.objects.filter(
            status__in=[RunStatus.QUEUED, RunStatus.RUNNING], deadline_at__lt=cutoff
        ).values_list("pk", "status", "deadline_at")[:500]
    )
    ended = 0
    for pk, status, deadline in stale:
        reason = (
            f"The run was still {status} {settings.RUN_SWEEP_GRACE_S} s after its deadline "
            f"({deadline:%Y-%m-%d %H:%M:%S} UTC); its worker process probably died."
        )
        if run_finish_externally(run_id=pk, status=RunStatus.TIMED_OUT, reason="swept", error=reason):
            ended += 1
    for expire in list(_expiries.values()):
        ended += expire()
    return ended


def start_sweeper() -> None:
    """Embedded mode: one timer thread per process does what Celery beat does when distributed —
    the stale-run sweep, audit retention and the periodic chain verification."""
    global _sweeper_started
    if settings.EXECUTION_BACKEND == "celery":
        return
    with _sweeper_lock:
        if _sweeper_started:
            return
        _sweeper_started = True

    jobs: list[tuple[str, float, Any]] = [
        ("run sweep", float(settings.RUN_SWEEP_INTERVAL_S), sweep_stale_runs),
        ("audit retention", float(settings.AUDIT_RETENTION_INTERVAL_S), retention_sweep),
        ("audit verify", float(settings.AUDIT_VERIFY_INTERVAL_S), audit_verify),
    ]

    def loop() -> None:
        last_run = {name: time.monotonic() for name, _, _ in jobs}
        tick = max(1.0, min(interval for _, interval, _ in jobs))
        while True:
            time.sleep(tick)
            for name, interval, job in jobs:
                if time.monotonic() - last_run[name] < interval:
                    continue
                last_run[name] = time.monotonic()
                run_job(job, name)

    threading.Thread(target=loop, daemon=True, name="run-sweeper").start()
