"""Run writes: create (permission → team → policy → budget → store → dispatch), cancel, wait."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core import compiled
from apps.governance import selectors as gov
from apps.runs import integration
from apps.runs.endings import terminal_event
from apps.runs.execution import dispatch_pending, executor_id
from apps.runs.journal import forget as forget_calls
from apps.runs.models import Preset, Run, RunDispatch, RunSource, RunStatus, Strategy
from apps.runs.sink import publish
from apps.tools.models import ToolApproval
from apps.workers.models import Pool

MAX_QUESTION_CHARS = 32_000


class RunRefused(Exception):
    """A request that was not accepted; nothing was stored or called. ``message`` is user-safe."""

    CODES = ("budget_exhausted", "pool_not_allowed", "pool_unavailable", "invalid")

    def __init__(self, code: str, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


def _refuse(
    *, actor: Any, team: Any, code: str, message: str, retry_after_s: int | None = None, **extra: Any
) -> RunRefused:
    """Record the refusal in the audit trail (its own transaction: there is no run to attach)."""
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.RUN_REFUSED,
            actor=actor,
            team=team,
            object_type="runs.run",
            payload={"code": code, "message": message, **extra},
        )
    return RunRefused(code, message, retry_after_s)


def _resolve_team(actor: Any, team: Any, pool: Any) -> Any:
    if team is not None:
        return team
    runnable = gov.teams_runnable_by(actor)
    if pool is not None and pool.team_id and runnable.filter(pk=pool.team_id).exists():
        return pool.team
    return runnable.order_by("slug").first()


def run_create(
    *,
    actor: Any,
    team: Any = None,
    pool: Any = None,
    question: str,
    strategy: str = Strategy.CONDUCTOR,
    preset: str = Preset.MINI,
    worker: Any = None,
    source: str = RunSource.PLAYGROUND,
    api_key: Any = None,
    classification: str = "",
    replay_messages: list[dict[str, Any]] | None = None,
    request_id: str = "",
    api_request: dict[str, Any] | None = None,
    pool_allowed: bool = False,
    team_allowed: bool = False,
    access_stamp: int | None = None,
    execute_here: bool = False,
) -> Run:
    """Accept a request: store it `queued` with its audit event and dispatch it on commit.

    ``pool_allowed``: the caller already checked that ``actor`` may use ``pool`` with a check at
    least as narrow as this one (``/v1``'s ``resolve_model``: the key's pools within the actor's),
    so the verdict is passed instead of read twice per request (issue #15). ``team_allowed``
    likewise: the caller asked ``can_run_on_team(actor, team)`` for this very actor and team
    (``/v1`` asks it with the pool, cached by access version). ``access_stamp``: the access
    version the caller read (apps.governance.access_version); pool rows and the policy in force
    are then answered from this process's cache while it is current.

    ``execute_here``: the caller executes the run on its own thread right after this returns
    (``apps.runs.execution.execute_here``, a plain ``/v1`` request): the run is stored already
    claimed by this process, ``running`` under its lease, in the transaction that accepts it, and
    nothing is dispatched. A crash before or during execution leaves a lease that the reaper
    re-queues, as for any run.

    Raises RunRefused before anything is stored or any model is called.
    """
    question = (question or "").strip()
    if not question and not replay_messages:
        raise RunRefused("invalid", "The prompt is empty.")
    if len(question) > MAX_QUESTION_CHARS:
        raise RunRefused("invalid", f"The prompt is longer than {MAX_QUESTION_CHARS:,} characters.")
    if strategy not in Strategy.values:
        raise RunRefused(
            "invalid", f"Unknown strategy “{strategy}”; choose one of {', '.join(Strategy.values)}."
        )
    if strategy == Strategy.CONDUCTOR:
        if preset not in (Preset.MINI, Preset.ULTRA):
            raise RunRefused("invalid", "The conductor strategy needs the preset “mini” or “ultra”.")
    else:
        preset = Preset.NONE
    if source not in RunSource.values:
        raise RunRefused("invalid", f"Unknown source “{source}”.")
    if replay_messages is not None and not _valid_messages(replay_messages):
        raise RunRefused("invalid", "Replay messages must be a non-empty list of {role, content} objects.")

    team = _resolve_team(actor, team, pool)
    if team is None or not (team_allowed or gov.can_run_on_team(actor, team)):
        raise _refuse(
            actor=actor, team=team, code="pool_not_allowed", message="You may not start runs for this team."
        )
    if pool is None:
        pool = team.default_pool
    if pool is None:
        raise _refuse(
            actor=actor,
            team=team,
            code="pool_not_allowed",
            message="Choose a pool: the team has no default pool.",
        )
    if not pool_allowed and not Pool.objects.visible_to(actor, "use").filter(pk=pool.pk).exists():
        raise _refuse(
            actor=actor,
            team=team,
            code="pool_not_allowed",
            message=f"You may not run on the pool “{pool.slug}”.",
        )
    if worker is not None and not pool.pool_workers.filter(worker=worker).exists():
        raise RunRefused("invalid", f"The worker “{worker.slug}” is not in the pool “{pool.slug}”.")
    if strategy == Strategy.SINGLE and worker is None:
        worker = pool.default_worker
    try:
        integration.check_pool_available(pool, access_stamp)
    except integration.PoolUnavailableError as exc:
        raise _refuse(
            actor=actor, team=team, code="pool_unavailable", message=str(exc), pool=pool.slug
        ) from None

    policy = integration.policy_in_force(team, access_stamp)
    try:
        integration.check_budget(team, policy)
    except integration.BudgetRefusal as exc:
        raise _refuse(
            actor=actor,
            team=team,
            code="budget_exhausted",
            message=exc.message,
            retry_after_s=exc.retry_after_s,
            budget=exc.budget_name,
        ) from None

    now = timezone.now()
    claim: dict[str, Any] = {"status": RunStatus.QUEUED}
    if execute_here:
        claim = {
            "status": RunStatus.RUNNING,
            "started_at": now,
            "lease_owner": executor_id(),
            "lease_expires_at": now + timedelta(seconds=float(settings.RUN_LEASE_S)),
            "attempts": 1,
        }
    with transaction.atomic():
        # The ORM's create() compiled its INSERT for every run (issue #15); the signals still go.
        run = compiled.create(
            Run,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
            api_key=api_key,
            team=team,
            pool=pool,
            policy_version_id=policy.version_id,
            source=source,
            strategy=strategy,
            preset=preset,
            worker=worker,
            classification=classification,
            question=question,
            replay_messages=replay_messages,
            request_id=request_id[:64],
            api_request=api_request,
            deadline_at=now + timedelta(seconds=settings.RUN_TIMEOUT_S),
            **claim,
        )
        audit_record(
            event_type=AuditEventType.RUN_CREATED,
            actor=actor,
            team=team,
            obj=run,
            run_id=run.id,
            policy_version_id=policy.version_id,
            api_key_id=getattr(api_key, "pk", None),
            payload={
                "source": source,
                "strategy": strategy,
                "preset": preset,
                "pool": pool.slug,
                "worker": getattr(worker, "slug", None),
                "classification": classification,
                "question": content_sha256(question),
                "replay": replay_messages is not None,
            },
        )
        if not execute_here:
            # The outbox row makes the hand-off survive a broker outage or a crash before dispatch.
            compiled.create(RunDispatch, run=run)
            run_id, request_id = run.id, run.request_id or ""
            transaction.on_commit(lambda: _dispatch(run_id, request_id))
    run.access_stamp = access_stamp  # what execution's caches are keyed by
    return run


def _valid_messages(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    )


def _dispatch(run_id: UUID, request_id: str) -> None:
    """On commit: hand the run to an executor. Never raises — if the broker is down the client
    still gets its run id and the outbox row is retried by the lease keeper / beat."""
    dispatch_pending(run_id, request_id)


def run_cancel(*, actor: Any, run: Run) -> Run:
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
