"""Celery tasks: ids in, idempotent (the claim in execute_run makes a duplicate a no-op)."""

from __future__ import annotations

from celery import shared_task

from apps.runs import execution


@shared_task(name="apps.runs.tasks.run_execute", acks_late=True, ignore_result=True)
def run_execute(run_id: str) -> str | None:
    return execution.execute_run(run_id)


@shared_task(name="apps.runs.tasks.sweep_stale_runs", ignore_result=True)
def sweep_stale_runs() -> int:
    return execution.sweep_stale_runs()
