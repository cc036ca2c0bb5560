"""Celery tasks: ids in, idempotent (the claim in execute_run makes a duplicate a no-op).

`run_execute` is acknowledged late and re-delivered if its worker dies (the lease, not the
message, decides who runs it). Every worker process also runs the lease keeper: heartbeats for
its runs, the re-queue of runs whose executor died, and the dispatch-outbox drain.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready

from apps.runs import execution, retention, sweeper


# Named by execution, which sends it by that name (it cannot import this module: tasks sits above).
@shared_task(
    bind=True,
    name=execution.RUN_EXECUTE_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_execute(self: Any, run_id: str) -> str | None:
    # The run's request id travels as a message header (custom headers become request attributes).
    request_id = getattr(self.request, execution.REQUEST_ID_HEADER, None)
    return execution.execute_run(run_id, request_id=str(request_id or ""))


@shared_task(name="apps.runs.tasks.sweep_stale_runs", ignore_result=True)
def sweep_stale_runs() -> int:
    return sweeper.sweep_stale_runs()


@shared_task(name="apps.runs.tasks.retention_sweep", ignore_result=True)
def retention_sweep() -> int:
    """Idempotent: each run is erased once (``payload_erased_at`` is the claim)."""
    return retention.retention_sweep()


@shared_task(name="apps.runs.tasks.reap_runs", ignore_result=True)
def reap_runs() -> dict[str, int]:
    return execution.reap_runs()


@worker_ready.connect
def _start_lease_keeper(**_: Any) -> None:
    execution.start_lease_keeper(reap=True)
