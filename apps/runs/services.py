"""Run writes: create (``admit_run`` checks in apps.runs.admission, ``create_run`` stores and
dispatches), cancel, wait."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core import compiled
from apps.core.types import Actor, stored_user
from apps.runs.admission import (
    MAX_QUESTION_CHARS,
    AccessProof,
    AccessProofMismatch,
    Admission,
    IssuedKey,
    RunRefused,
    admit_run,
)
from apps.runs.endings import terminal_event
from apps.runs.execution import Lease, dispatch_pending
from apps.runs.journal import forget as forget_calls
from apps.runs.models import Preset, Run, RunDispatch, RunSource, RunStatus, Strategy
from apps.runs.sink import publish
from apps.tools.models import ToolApproval

if TYPE_CHECKING:
    from apps.governance.models import Team
    from apps.workers.models import Pool, Worker

# Re-exported: callers import the refusal (and the limit) from the services module.
__all__ = [
    "MAX_QUESTION_CHARS",
    "AccessProof",
    "AccessProofMismatch",
    "Admission",
    "RunRefused",
    "admit_run",
    "create_run",
    "run_cancel",
    "run_create",
    "run_wait",
]


def run_create(
    *,
    actor: Actor,
    team: Team | None = None,
    pool: Pool | None = None,
    question: str,
    strategy: str = Strategy.CONDUCTOR,
    preset: str = Preset.MINI,
    worker: Worker | None = None,
    source: str = RunSource.PLAYGROUND,
    api_key: IssuedKey | None = None,
    classification: str = "",
    replay_messages: list[dict[str, Any]] | None = None,
    request_id: str = "",
    api_request: dict[str, Any] | None = None,
    pool_allowed: bool = False,
    team_allowed: bool = False,
    access_stamp: int | None = None,
    execute_here: bool = False,
) -> Run:
    """Accept a request: ``admit_run`` checks it, ``create_run`` stores it `queued` with its audit
    event and dispatches it on commit. Raises RunRefused before anything is stored or any model
    is called.

    ``pool_allowed`` / ``team_allowed``: the ``/v1`` caller's verdicts (``resolve_model``: the
    key's pools within the actor's; ``can_run_on_team`` for the key's principal and team), passed
    instead of read twice per request (issue #15). They are no bare trust: they become an
    ``AccessProof`` of ``api_key`` (a pool verdict must be the one ``resolve_model`` annotated on
    this very row), which admission asserts is about this actor, team, pool and ``access_stamp``.
    ``access_stamp``: the access version the caller read (apps.governance.access_version).
    ``execute_here``: see ``admit_run`` and ``apps.runs.execution.execute_here``.
    """
    proof = None
    if pool_allowed or team_allowed:
        if api_key is None:
            raise AccessProofMismatch(
                "pool_allowed / team_allowed vouch for an API key's verdict: pass api_key"
            )
        proof = AccessProof.from_api_key(
            key=api_key, pool=pool, team_allowed=team_allowed, pool_allowed=pool_allowed
        )
    admission = admit_run(
        actor=actor,
        team=team,
        pool=pool,
        question=question,
        strategy=strategy,
        preset=preset,
        worker=worker,
        source=source,
        api_key=api_key,
        classification=classification,
        replay_messages=replay_messages,
        request_id=request_id,
        api_request=api_request,
        proof=proof,
        access_stamp=access_stamp,
        execute_here=execute_here,
    )
    return create_run(admission)


def create_run(admission: Admission) -> Run:
    """Store an admitted request: the ``Run`` and its audit event in one transaction, and (unless
    it executes here) its outbox row, dispatched on commit.

    ``admission.execute_here``: the caller executes the run on its own thread right after this
    returns (``apps.runs.execution.execute_here``, a plain ``/v1`` request): the run is stored
    already claimed by this process, ``running`` under its lease, in the transaction that accepts
    it, and nothing is dispatched. A crash before or during execution leaves a lease that the
    reaper re-queues, as for any run."""
    if not isinstance(admission, Admission) or not admission.sealed:
        raise AccessProofMismatch("create_run stores only what admit_run admitted")
    a = admission
    now = timezone.now()
    claim: dict[str, Any] = {"status": RunStatus.QUEUED}
    if a.execute_here:
        claim = {**Lease.taken_now(now)._asdict(), "attempts": 1}
    with transaction.atomic():
        # The ORM's create() compiled its INSERT for every run (issue #15); the signals still go.
        run = compiled.create(
            Run,
            created_by=stored_user(a.actor),
            api_key=a.api_key,
            team=a.team,
            pool=a.pool,
            policy_version_id=a.policy.version_id,
            source=a.source,
            strategy=a.strategy,
            preset=a.preset,
            worker=a.worker,
            classification=a.classification,
            question=a.question,
            replay_messages=a.replay_messages,
            request_id=a.request_id[:64],
            api_request=a.api_request,
            deadline_at=now + timedelta(seconds=settings.RUN_TIMEOUT_S),
            **claim,
        )
        audit_record(
            event_type=AuditEventType.RUN_CREATED,
            actor=a.actor,
            team=a.team,
            obj=run,
            run_id=run.id,
            policy_version_id=a.policy.version_id,
            api_key_id=getattr(a.api_key, "pk", None),
            payload={
                "source": a.source,
                "strategy": a.strategy,
                "preset": a.preset,
                "pool": a.pool.slug,
                "worker": getattr(a.worker, "slug", None),
                "classification": a.classification,
                "question": content_sha256(a.question),
                "replay": a.replay_messages is not None,
            },
        )
        if not a.execute_here:
            # The outbox row makes the hand-off survive a broker outage or a crash before dispatch.
            compiled.create(RunDispatch, run=run)
            run_id, request_id = run.id, run.request_id or ""
            transaction.on_commit(lambda: _dispatch(run_id, request_id))
    run.access_stamp = a.access_stamp  # type: ignore[attr-defined]  # what execution's caches are keyed by
    return run


def _dispatch(run_id: UUID, request_id: str) -> None:
    """On commit: hand the run to an executor. Never raises — if the broker is down the client
    still gets its run id and the outbox row is retried by the lease keeper / beat."""
    dispatch_pending(run_id, request_id)


def run_cancel(*, actor: Actor, run: Run) -> Run:
    """Cancel a run: a queued run ends `cancelled` now; a running one stops at the next step boundary."""
    if not Run.objects.allows(actor, "cancel", run):
        raise PermissionError("You may not cancel this run.")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.is_terminal:
            return locked
        now = timezone.now()
        if locked.status in (RunStatus.QUEUED, RunStatus.AWAITING_APPROVAL):
            # No executor holds it: it ends now (a held plan is withdrawn with it).
            waiting = locked.status == RunStatus.AWAITING_APPROVAL
            locked.status = RunStatus.CANCELLED
            locked.status_reason = "cancelled"
            locked.error = (
                "The run was cancelled while its plan waited for an approver."
                if waiting
                else "The run was cancelled before it started."
            )
            if waiting:
                # A held tool call (issue 43) is withdrawn with the run: it never runs.
                ToolApproval.objects.filter(
                    run_holds__run=locked, run_holds__decision="pending", state="pending"
                ).update(state="rejected", decided_by=actor, decided_at=now, note="withdrawn: run cancelled")
                locked.approvals.filter(decision="pending").update(
                    decision="rejected", decided_by=actor, decided_at=now, note="withdrawn: run cancelled"
                )
                forget_calls(locked.id)
            locked.finished_at = now
            locked.cancel_requested = True
            locked.last_seq += 1
            locked.save(
                update_fields=[
                    "status",
                    "status_reason",
                    "error",
                    "finished_at",
                    "cancel_requested",
                    "last_seq",
                ]
            )
            event = terminal_event(locked, now)
        else:
            locked.cancel_requested = True
            locked.save(update_fields=["cancel_requested"])
            event = None
        audit_record(
            event_type=AuditEventType.RUN_CANCEL_REQUESTED,
            actor=actor,
            team=locked.team_id,
            obj=locked,
            run_id=locked.id,
            payload={"status_before": run.status, "immediate": event is not None},
        )
        if event is not None:
            transaction.on_commit(lambda: publish(locked.id, event))
    return locked


def run_wait(run_id: UUID | str, timeout_s: float) -> Run:
    """Block until the run is terminal or ``timeout_s`` passed; returns the run as it is then."""
    end = time.monotonic() + max(0.0, timeout_s)
    delay = 0.05
    while True:
        run = Run.objects.get(pk=run_id)
        if run.is_terminal or time.monotonic() >= end:
            return run
        time.sleep(min(delay, max(0.0, end - time.monotonic())))
        delay = min(delay * 1.5, 0.5)
