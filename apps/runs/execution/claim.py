"""The claim: of several deliveries of a run exactly one takes it, with one conditional UPDATE
that also takes its lease; and the outbox row's hand-off, taken the same way."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import NamedTuple
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from apps.core.compiled import CompiledDelete, CompiledUpdate
from apps.runs.execution.leases import executor_id
from apps.runs.models import Run, RunDispatch, RunStatus

logger = logging.getLogger(__name__)


def _as_uuid(run_id: UUID | str) -> UUID:
    return run_id if isinstance(run_id, UUID) else UUID(str(run_id))


class ClaimKey(NamedTuple):
    """Which row the claim may take (its WHERE): this run, still queued, no cancel asked."""

    pk: UUID
    status: str
    cancel_requested: bool


class Lease(NamedTuple):
    """What taking a run writes (the claim's SET; a run accepted to execute here is stored with
    it): running, under this executor's lease, which its heartbeat then renews."""

    status: str
    started_at: datetime
    lease_owner: str
    lease_expires_at: datetime

    @classmethod
    def taken_now(cls, now: datetime) -> Lease:
        return cls(
            status=RunStatus.RUNNING,
            started_at=now,
            lease_owner=executor_id(),
            lease_expires_at=now + timedelta(seconds=float(settings.RUN_LEASE_S)),
        )


# Sent once per run by the process that accepts it and the one that claims it: compiled once
# (building and compiling the querysets was 3-5% of daphne's and a Celery worker's CPU, issue #15).
# The claim: of several deliveries exactly one changes the row; attempts counts in the database.
# Its columns are the named tuples' fields, so the values passed line up with them by name.
_CLAIM = CompiledUpdate(Run, Lease._fields, where=ClaimKey._fields, increment=("attempts",))


class Handoff(NamedTuple):
    """What taking an outbox row writes: when, and by which executor."""

    dispatched_at: datetime
    dispatched_by: str


# The outbox row's hand-off, taken only while nobody has taken it (dispatched_at still NULL).
_DISPATCH_TAKE = CompiledUpdate(
    RunDispatch, Handoff._fields, increment=("attempts",), is_null=("dispatched_at",)
)
_DISPATCH_DELETE = CompiledDelete(RunDispatch)


def _claim(run_id: UUID | str) -> bool:
    """Take the run: one conditional UPDATE, so of several deliveries exactly one wins."""
    lease = Lease.taken_now(timezone.now())
    where = ClaimKey(pk=_as_uuid(run_id), status=RunStatus.QUEUED, cancel_requested=False)
    claimed = bool(_CLAIM.execute(where, lease, increments=(1,)))
    if claimed:
        _DISPATCH_DELETE.execute(where.pk)  # handed off for good
        logger.info("run %s claimed by %s", where.pk, lease.lease_owner)
    return claimed
