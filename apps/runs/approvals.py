"""Plans held for an approver (issue 17: plan checks before execution).

A plan over a plan-check limit whose policy action is ``require_approval`` (the cost/token
forecast, or labelled data leaving the team's data boundary) pauses the run before any worker is
called: the engine emits ``run.awaiting_approval`` and the sink calls ``approval_requested`` in
the event's transaction (through the hook ``install_approval_hooks`` sets at app ready: the sink
and the sweep sit below this module). The run holds no lease while it waits. Then, exactly one of:

- ``plan_approve``: the run is queued again (outbox, same transaction); the next attempt replays
  the planning call from the resume journal, so the same plan comes back, and the hooks let the
  plan with the approved digest through. Counters are reset as on a re-queue (the replay rebuilds
  them, each call billed once).
- ``plan_reject``: the run ends ``blocked`` naming the approver's refusal.
- ``expire_approvals`` (the sweep): past ``constraints.approval.timeout_s`` the run ends blocked.
- ``run_cancel`` withdraws the plan with the run.

Every transition is audited in its own transaction with the state change, and shown live on the
run's websocket (``run.plan_decided``, then the resumed attempt's events or ``run.finished``).

Who approves: a team admin or reviewer (``governance.review_team_runs`` on the run's team), never
the person who asked (separation of duties).

A tool call that needs an approver (issue 43) pauses the run the same way (``kind="tool"``, linked
to the call's ``ToolApproval``): same desk, badge, timeout, cancel and audit. What differs is the
outcome of a refusal or a timeout: the run is queued again as on an approval, and the resumed
attempt (replaying its journal up to the held call) has the call refused naming the rule
(``tools.approval_rejected`` / ``constraints.approval.timeout_s``); the worker reads the refusal
as the tool's result and the step goes on. An approval lets exactly that call (tool + arguments
digest) of that run run, once.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.notify import notify_review_requested
from apps.audit.services import audit_record
from apps.core.types import Actor, User, Viewer
from apps.engine.events import EventType
from apps.governance import selectors as gov
from apps.governance.visibility import is_active_user
from apps.runs import observers, sweeper
from apps.runs.endings import run_finish_externally, stored_event
from apps.runs.execution import dispatch_pending, reset_for_next_attempt
from apps.runs.journal import forget as forget_calls
from apps.runs.models import ApprovalDecision, PlanApproval, Run, RunStatus
from apps.runs.sink import publish, publish_review
from apps.tools.approvals import decide_run_hold
from apps.tools.models import ApprovalState, ToolApproval

logger = logging.getLogger(__name__)

APPROVE_PERMISSION = "governance.review_team_runs"
MAX_NOTE_CHARS = 2000


class ApprovalError(Exception):
    """A decision that cannot be taken; ``rule`` names what refused it, ``status`` the HTTP code."""

    def __init__(self, message: str, *, rule: str, status: int = 409) -> None:
        super().__init__(message)
        self.rule = rule
        self.status = status


def approval_requested(
    *,
    run_id: UUID,
    team_id: int,
    policy_version_id: int | None,
    owner: str | None,
    at: datetime,
    data: dict[str, Any],
) -> PlanApproval | None:
    """Pause the run on a held plan (inside the sink's transaction, under the run's row lock)."""
    hold = data.get("hold") or {}
    totals = data.get("totals") or {}
    tool_hold = hold.get("kind") == "tool"
    held_call: ToolApproval | None = None
    if tool_hold:
        held_call = ToolApproval.objects.filter(pk=hold.get("tool_approval")).first()
    paused = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING)
    if owner is not None:
        paused = paused.filter(lease_owner=owner)
    if not paused.update(
        status=RunStatus.AWAITING_APPROVAL,
        status_reason="approval_required",
        error=str(data.get("error") or ""),
        lease_owner="",
        lease_expires_at=None,
        input_tokens=int(totals.get("input_tokens") or 0),
        output_tokens=int(totals.get("output_tokens") or 0),
        cost_usd=totals.get("cost_usd"),
        priced=bool(totals.get("priced", True)),
    ):
        return None  # ended meanwhile (cancel, sweep): nothing waits
    timeout = hold.get("timeout_s")
    wait = hold.get("api_wait_s")
    deadline = at + timedelta(seconds=float(timeout)) if timeout else None
    if held_call is not None:
        deadline = held_call.deadline_at  # the call's window (constraints.approval.timeout_s)
    approval = PlanApproval.objects.create(
        run_id=run_id,
        kind="tool" if tool_hold else "plan",
        tool_approval=held_call,
        round=int(data.get("round") or 1),
        digest=str(hold.get("digest") or ""),
        reason=str(data.get("error") or "the plan needs an approver"),
        violations=list(data.get("violations") or []),
        fields=[str(hold.get("rule") or "")] if tool_hold else list(hold.get("fields") or []),
        plan=data.get("plan"),
        forecast=hold.get("forecast"),
        requested_at=at,
        deadline_at=deadline,
        api_wait_until=at + timedelta(seconds=float(wait or 0)),
    )
    audit_record(
        event_type=AuditEventType.RUN_APPROVAL_REQUESTED,
        team=team_id,
        object_type="runs.run",
        object_id=str(run_id),
        run_id=run_id,
        policy_version_id=policy_version_id,
        payload={
            "approval": approval.pk,
            "kind": approval.kind,
            "round": approval.round,
            "plan_digest": approval.digest,
            "tool": held_call.qualified_name if held_call else None,
            "tool_approval": held_call.pk if held_call else None,
            "fields": approval.fields,
            "violations": [v.get("message") for v in approval.violations if isinstance(v, dict)],
            "forecast": approval.forecast,
            "deadline_at": approval.deadline_at.isoformat() if approval.deadline_at else None,
        },
    )
    what = "tool call awaiting approval" if tool_hold else "plan awaiting approval"
    transaction.on_commit(lambda: _announce(run_id, what))
    return approval


def _announce(run_id: UUID, what: str = "plan awaiting approval") -> None:
    """Reviewers' badge and (optionally) e-mail: a plan or a tool call waits for them."""
    try:
        publish_review(run_id)
        run = Run.objects.select_related("team").get(pk=run_id)
        notify_review_requested(run=run, reason=what)
    except Exception:  # a notification never costs the run anything
        logger.exception("approval notification for run %s failed", run_id)


def can_approve(user: Viewer, run: Run) -> bool:
    return gov.can_review_team_runs(user, run.team)


def pending_approval(run: Run) -> PlanApproval | None:
    return run.approvals.filter(decision=ApprovalDecision.PENDING).order_by("-requested_at").first()


def check_may_decide(actor: Actor, run: Run) -> User:
    """Raise ApprovalError (403) unless ``actor`` may decide the run's held plans; the decider."""
    # (an approver is always an active user: the second test only narrows the type)
    if not can_approve(actor, run) or not is_active_user(actor):
        raise ApprovalError(
            f"Deciding a held plan needs the team permission {APPROVE_PERMISSION} "
            "(team admin or reviewer role).",
            rule=APPROVE_PERMISSION,
            status=403,
        )
    if run.created_by_id is not None and run.created_by_id == actor.pk:
        raise ApprovalError(
            "Separation of duties: the person who asked cannot approve or refuse their own run's plan.",
            rule="separation_of_duties",
            status=403,
        )
    return actor


def _locked_waiting(run_id: UUID) -> tuple[Run, PlanApproval]:
    run = Run.objects.select_for_update().select_related("team").get(pk=run_id)
    approval = pending_approval(run)
    if run.status != RunStatus.AWAITING_APPROVAL or approval is None:
        raise ApprovalError(
            f"The run is {run.get_status_display().lower()}: there is no plan waiting for a decision.",
            rule="run.status",
        )
    return run, approval


def _decide(approval: PlanApproval, decision: str, *, actor: User | None, at: datetime, note: str) -> None:
    approval.decision = decision
    approval.decided_by = actor
    approval.decided_at = at
    approval.note = note
    approval.save(update_fields=["decision", "decided_by", "decided_at", "note"])


def _decided_event(run: Run, now: datetime, data: dict[str, Any]) -> dict[str, Any]:
    run.last_seq += 1
    Run.objects.filter(pk=run.pk).update(last_seq=F("last_seq") + 1)
    return stored_event(run, EventType.RUN_PLAN_DECIDED.value, data, now)


def _clean_note(note: str) -> str:
    note = (note or "").strip()
    if len(note) > MAX_NOTE_CHARS:
        raise ApprovalError(f"note: at most {MAX_NOTE_CHARS} characters.", rule="note", status=400)
    return note


def plan_approve(*, actor: Actor, run: Run, note: str = "") -> Run:
    """Let the held plan run: the run is queued again and resumes from its journal."""
    decider = check_may_decide(actor, run)
    note = _clean_note(note)
    now = timezone.now()
    with transaction.atomic():
        locked, approval = _locked_waiting(run.pk)
        _decide(approval, ApprovalDecision.APPROVED, actor=decider, at=now, note=note)
        if approval.kind == "tool":
            # Audited as the call's approval (tool.call_approved, with the run): exactly this call.
            _decide_tool(approval, ApprovalState.APPROVED, actor=decider, note=note)
            _resume(locked, approval, now, decided="approved", actor=decider, note=note)
            return Run.objects.get(pk=run.pk)
        # As a re-queue; its time limit starts now, not when the run first asked.
        reset_for_next_attempt(
            locked.pk,
            status=RunStatus.QUEUED,
            status_reason="",
            error="",
            deadline_at=now + timedelta(seconds=float(settings.RUN_TIMEOUT_S)),
        )
        audit_record(
            event_type=AuditEventType.RUN_PLAN_APPROVED,
            actor=decider,
            team=locked.team_id,
            obj=locked,
            run_id=locked.id,
            policy_version_id=locked.policy_version_id,
            payload={
                "approval": approval.pk,
                "round": approval.round,
                "plan_digest": approval.digest,
                "note": note,
            },
        )
        event = _decided_event(
            locked,
            now,
            {"decision": "approved", "by": decider.get_username(), "note": note, "round": approval.round},
        )
        run_id, request_id = locked.pk, locked.request_id or ""
        transaction.on_commit(lambda: publish(run_id, event))
        # The run's request id, not the approver's request's.
        transaction.on_commit(lambda: dispatch_pending(run_id, request_id))
    return Run.objects.get(pk=run.pk)


def plan_reject(*, actor: Actor, run: Run, note: str = "") -> Run:
    """Refuse the held plan: the run ends blocked, naming who refused it and why."""
    decider = check_may_decide(actor, run)
    note = _clean_note(note)
    if not note:
        raise ApprovalError(
            "note: say why the plan is refused (it is shown to the person who asked).",
            rule="note",
            status=400,
        )
    now = timezone.now()
    with transaction.atomic():
        locked, approval = _locked_waiting(run.pk)
        _decide(approval, ApprovalDecision.REJECTED, actor=decider, at=now, note=note)
        if approval.kind == "tool":
            # The call is refused (tools.approval_rejected) when the resumed run reaches it.
            _decide_tool(approval, ApprovalState.REJECTED, actor=decider, note=note)
            _resume(locked, approval, now, decided="rejected", actor=decider, note=note)
            return Run.objects.get(pk=run.pk)
        audit_record(
            event_type=AuditEventType.RUN_PLAN_REJECTED,
            actor=decider,
            team=locked.team_id,
            obj=locked,
            run_id=locked.id,
            policy_version_id=locked.policy_version_id,
            payload={
                "approval": approval.pk,
                "round": approval.round,
                "plan_digest": approval.digest,
                "note": note,
            },
        )
        _end_blocked(
            locked,
            now,
            reason="approval_rejected",
            error=f"The plan was refused by {decider.get_username()}: {note}",
            decided={
                "decision": "rejected",
                "by": decider.get_username(),
                "note": note,
                "round": approval.round,
            },
        )
    return Run.objects.get(pk=run.pk)


def _decide_tool(approval: PlanApproval, state: str, *, actor: User | None, note: str) -> None:
    if approval.tool_approval_id is not None:
        decide_run_hold(approval_id=approval.tool_approval_id, state=state, actor=actor, note=note)


def _resume(
    run: Run, approval: PlanApproval, now: datetime, *, decided: str, actor: User | None, note: str
) -> None:
    """Inside the caller's transaction: a run paused on a tool call is queued again whatever the
    decision; its next attempt replays the journal up to the call, which then runs (approved) or
    is refused naming the rule."""
    reset_for_next_attempt(
        run.pk,
        status=RunStatus.QUEUED,
        status_reason="",
        error="",
        deadline_at=now + timedelta(seconds=float(settings.RUN_TIMEOUT_S)),
    )
    event = _decided_event(
        run,
        now,
        {
            "decision": decided,
            "by": actor.get_username() if actor is not None else None,
            "note": note,
            "round": approval.round,
            "kind": "tool",
        },
    )
    run_id, request_id = run.pk, run.request_id or ""
    transaction.on_commit(lambda: publish(run_id, event))
    transaction.on_commit(lambda: dispatch_pending(run_id, request_id))


def _end_blocked(run: Run, now: datetime, *, reason: str, error: str, decided: dict[str, Any]) -> None:
    """Inside the caller's transaction: run.plan_decided, then the run ends blocked."""
    event = _decided_event(run, now, decided)
    run_id = run.pk
    transaction.on_commit(lambda: publish(run_id, event))
    run_finish_externally(run_id=run_id, status=RunStatus.BLOCKED, reason=reason, error=error)
    forget_calls(run_id)


def expire_approvals(now: datetime | None = None) -> int:
    """End runs whose held plan passed ``constraints.approval.timeout_s`` undecided (the sweep)."""
    now = now or timezone.now()
    due = list(
        PlanApproval.objects.filter(
            decision=ApprovalDecision.PENDING, deadline_at__lt=now, run__status=RunStatus.AWAITING_APPROVAL
        ).values_list("run_id", flat=True)[:200]
    )
    ended = 0
    for run_id in due:
        with transaction.atomic():
            try:
                locked, approval = _locked_waiting(run_id)
            except ApprovalError:
                continue  # decided meanwhile
            if approval.deadline_at is None or approval.deadline_at >= now:
                continue
            _decide(approval, ApprovalDecision.EXPIRED, actor=None, at=now, note="")
            if approval.kind == "tool":
                # Refused as constraints.approval.timeout_s when the resumed run reaches it.
                _decide_tool(approval, ApprovalState.EXPIRED, actor=None, note="")
                _resume(locked, approval, now, decided="expired", actor=None, note="")
                ended += 1
                continue
            waited = (now - approval.requested_at).total_seconds()
            audit_record(
                event_type=AuditEventType.RUN_APPROVAL_EXPIRED,
                team=locked.team_id,
                obj=locked,
                run_id=locked.id,
                policy_version_id=locked.policy_version_id,
                payload={"approval": approval.pk, "round": approval.round, "waited_s": round(waited, 1)},
            )
            _end_blocked(
                locked,
                now,
                reason="approval_timeout",
                error=(
                    f"constraints.approval.timeout_s: no approver decided within {waited:.0f} s; "
                    "the held plan was not run."
                ),
                decided={"decision": "expired", "by": None, "note": "", "round": approval.round},
            )
            ended += 1
    return ended


def tool_hold_view(approval: PlanApproval, *, content_visible: bool) -> dict[str, Any] | None:
    """What an approver sees of a held tool call: the tool, its server and accepted version, the
    arguments' digest and — only for who may see the run's content (arguments are user content) —
    the arguments as the input gate let them through."""
    held = approval.tool_approval
    if approval.kind != "tool" or held is None:
        return None
    call = held.call
    tool = call.tool
    return {
        "tool": held.qualified_name,
        "server": tool.server.name if tool is not None else "",
        "version": call.version.number if call.version is not None else None,
        "rule": held.rule,
        "digest": held.arguments_digest,
        "arguments": call.arguments if content_visible else None,
    }


def approvals_waiting_for(user: Viewer) -> QuerySet[PlanApproval]:
    """Held plans the user may decide (teams where they approve), oldest first."""
    teams = gov.teams_reviewable_by(user)
    return (
        PlanApproval.objects.filter(
            decision=ApprovalDecision.PENDING, run__status=RunStatus.AWAITING_APPROVAL, run__team__in=teams
        )
        .select_related(
            "run",
            "run__team",
            "run__created_by",
            "tool_approval__call__tool__server",
            "tool_approval__call__version",
        )
        .order_by("requested_at")
    )


def approvals_to_decide(user: Viewer) -> QuerySet[PlanApproval]:
    """Held plans waiting for ``user``'s decision: theirs to decide, not their own runs (nobody
    decides on their own run). The nav badge and the review desk count exactly these."""
    if not is_active_user(user):  # reviews no team (teams_reviewable_by): nothing to decide
        return PlanApproval.objects.none()
    return approvals_waiting_for(user).exclude(run__created_by=user)


def install_approval_hooks() -> None:
    """At app ready: the sink (below) pauses a held plan through ``approval_requested``, and the
    sweep (below) ends held plans past their timeout through ``expire_approvals``."""
    observers.register_plan_hold(approval_requested)
    sweeper.register_expiry("runs.approvals", expire_approvals)
