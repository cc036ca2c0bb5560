"""The claim: of several deliveries of a run exactly one takes it, with one conditional UPDATE
that also takes its lease; and the outbox row's hand-off, taken the same way."""

from __future__ import annotations

import logging
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from apps.core.compiled import CompiledDelete, CompiledUpdate
from apps.runs.execution.leases import executor_id
from apps.runs.models import Run, RunDispatch, RunStatus

logger = logging.getLogger(__name__)


def _as_uuid(run_id: UUID | str) -> UUID:
    return run_id if isinstance(run_id, UUID) else UUID(str(run_id))


# Sent once per run by the process that accepts it and the one that claims it: compiled once
# (building and compiling the querysets was 3-5% of daphne's and a Celery worker's CPU, issue #15).
# The claim: of several deliveries exactly one changes the row; attempts counts in the database.
_CLAIM = CompiledUpdate(
    Run,
    ("status", "started_at", "lease_owner", "lease_expires_at"),
    where=("pk", "status", "cancel_requested"),
    increment=("attempts",),
)
# The outbox row's hand-off, taken only while nobody has taken it (dispatched_at still NULL).
_DISPATCH_TAKE = CompiledUpdate(
    RunDispatch, ("dispatched_at", "dispatched_by"), increment=("attempts",), is_null=("dispatched_at",)
)
_DISPATCH_DELETE = CompiledDelete(RunDispatch)


def _claim(run_id: UUID | str) -> bool:
    """Take the run: one conditional UPDATE, so of several deliveries exactly one wins."""
    run_id = _as_uuid(run_id)
    now = timezone.now()
    owner = executor_id()
    claimed = bool(
        _CLAIM.execute(
            (run_id, RunStatus.QUEUED, False),
            (RunStatus.RUNNING, now, owner, now + timedelta(seconds=float(settings.RUN_LEASE_S))),
            increments=(1,),
        )
    )
    if claimed:
        _DISPATCH_DELETE.execute(run_id)  # handed off for good
        logger.info("run %s claimed by %s", run_id, owner)
    return claimed
