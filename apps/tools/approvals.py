"""Tool calls held for an approver (issue 43 item 4), by the rules plans follow (apps.runs.approvals):

- who decides: a holder of ``governance.review_team_runs`` on the call's team, never the person the
  call acts for (separation of duties: ``separation_of_duties``);
- how long it waits: ``constraints.approval.timeout_s`` of the team's policy, then it expires;
- what an approval allows: exactly one call of that tool with arguments of that digest. The first
  identical call after the approval consumes it with one conditional update, so it runs once;
- every request, decision and expiry is audited with the state change.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, User, Viewer, stored_user
from apps.governance.visibility import has_object_perm, is_active_user, is_platform_admin, teams_with
from apps.policies.spec import EffectivePolicy
from apps.tools.models import ApprovalState, ToolApproval, ToolCall

APPROVE_PERMISSION = "governance.review_team_runs"
MAX_NOTE_CHARS = 2000


class ToolApprovalError(Exception):
    def __init__(self, message: str, *, rule: str, status: int = 409) -> None:
        super().__init__(message)
        self.rule, self.status = rule, status


def _payload(a: ToolApproval) -> dict[str, Any]:
    return {
        "approval": a.pk,
        "tool": a.qualified_name,
        "arguments_sha256": a.arguments_digest,
        "rule": a.rule,
        "state": a.state,
        "deadline_at": a.deadline_at.isoformat() if a.deadline_at else None,
    }


def request_approval(
    *, call: ToolCall, requested_by: Actor, rule: str, effective: EffectivePolicy
) -> ToolApproval:
    """Inside the transaction that records the held call."""
    timeout = effective.spec.constraints.approval.timeout_s
    approval = ToolApproval.objects.create(
        team=call.team,
        call=call,
        qualified_name=call.qualified_name,
        arguments_digest=call.arguments_digest,
        requested_by=stored_user(requested_by),
        rule=rule,
        deadline_at=timezone.now() + timedelta(seconds=float(timeout)) if timeout else None,
    )
    audit_record(
        event_type=AuditEventType.TOOL_APPROVAL_REQUESTED,
        actor=approval.requested_by,
        team=call.team,
        obj=approval,
        run_id=call.run_id,
        api_key_id=call.api_key_id,
        payload=_payload(approval),
    )
    return approval


def _scoped(qs: QuerySet[ToolApproval], run_id: Any) -> QuerySet[ToolApproval]:
    """A run's calls wait on and consume only that run's approvals (the approver approved this
    call of this run, seen with its context); calls from /mcp only approvals asked outside runs."""
    return qs.filter(call__run_id=run_id) if run_id is not None else qs.filter(call__run_id__isnull=True)


def open_approval(team: Any, qualified: str, digest: str, *, run_id: Any = None) -> ToolApproval | None:
    """A pending approval for this very call (a retry waits on it instead of asking again)."""
    return (
        _scoped(
            ToolApproval.objects.filter(
                team=team, qualified_name=qualified, arguments_digest=digest, state=ApprovalState.PENDING
            ),
            run_id,
        )
        .filter(_not_expired())
        .first()
    )


def decided_against(run_id: Any, qualified: str, digest: str) -> tuple[str, str] | None:
    """(rule, message) when an approver refused this call of this run, or its window passed
    undecided; None otherwise."""
    last = (
        ToolApproval.objects.filter(call__run_id=run_id, qualified_name=qualified, arguments_digest=digest)
        .filter(state__in=[ApprovalState.REJECTED, ApprovalState.EXPIRED])
        .select_related("decided_by")
        .order_by("-requested_at")
        .first()
    )
    if last is None:
        return None
    if last.state == ApprovalState.EXPIRED:
        return (
            "constraints.approval.timeout_s",
            f"no approver decided on {qualified} in time; the call was not run",
        )
    who = last.decided_by.get_username() if last.decided_by else "an approver"
    note = f": {last.note}" if last.note else ""
    return ("tools.approval_rejected", f"{who} refused the call to {qualified}{note}")


def _not_expired() -> Any:
    from django.db.models import Q

    return Q(deadline_at__isnull=True) | Q(deadline_at__gt=timezone.now())


def consume_approval(team: Any, qualified: str, digest: str, *, run_id: Any = None) -> ToolApproval | None:
    """The approved, unused approval for exactly this call, marked used; None when there is none.
    One conditional update: two identical calls racing cannot both run."""
    for candidate in _scoped(
        ToolApproval.objects.filter(
            team=team, qualified_name=qualified, arguments_digest=digest, state=ApprovalState.APPROVED
        ),
        run_id,
    ).order_by("decided_at"):
        if ToolApproval.objects.filter(pk=candidate.pk, state=ApprovalState.APPROVED).update(
            state=ApprovalState.USED
        ):
            candidate.state = ApprovalState.USED
            return candidate
    return None


def approvals_for_desk(user: Viewer) -> QuerySet[ToolApproval]:
    """Pending tool approvals the user may decide here: calls from /mcp. A run's call pauses its
    run and is decided on the review desk with the run's other approvals (apps.runs.approvals)."""
    qs = ToolApproval.objects.filter(state=ApprovalState.PENDING, call__run_id__isnull=True).filter(
        _not_expired()
    )
    if not is_platform_admin(user):
        qs = qs.filter(team__in=teams_with(user, APPROVE_PERMISSION))
    return qs.select_related("team", "requested_by", "call").order_by("requested_at")


def tool_approval_decide(
    *, actor: Actor, approval: ToolApproval, approve: bool, note: str = ""
) -> ToolApproval:
    if len(note) > MAX_NOTE_CHARS:
        raise ToolApprovalError(f"note: at most {MAX_NOTE_CHARS} characters.", rule="note", status=400)
    # (a holder is always an active user: the second test only narrows the type)
    if not has_object_perm(actor, APPROVE_PERMISSION, approval.team) or not is_active_user(actor):
        raise ToolApprovalError(
            f"Deciding a held tool call needs the team permission {APPROVE_PERMISSION}.",
            rule=APPROVE_PERMISSION,
            status=403,
        )
    if approval.call.run_id is not None:
        raise ToolApprovalError(
            "This call belongs to a run: decide it on the review desk, where the run waits for it.",
            rule="approval.run_hold",
        )
    if approval.requested_by_id is not None and approval.requested_by_id == actor.pk:
        raise ToolApprovalError(
            "You asked for this call: someone else must approve it (separation of duties).",
            rule="separation_of_duties",
            status=403,
        )
    with transaction.atomic():
        locked = ToolApproval.objects.select_for_update().get(pk=approval.pk)
        if locked.state != ApprovalState.PENDING:
            raise ToolApprovalError(
                f"This call was already {locked.get_state_display().lower()}.", rule="approval.state"
            )
        now = timezone.now()
        if locked.deadline_at is not None and locked.deadline_at <= now:
            locked.state = ApprovalState.EXPIRED
            locked.save(update_fields=["state"])
            audit_record(
                event_type=AuditEventType.TOOL_APPROVAL_EXPIRED,
                team=locked.team,
                obj=locked,
                payload=_payload(locked),
            )
            raise ToolApprovalError("The approval window has passed.", rule="constraints.approval.timeout_s")
        locked.state = ApprovalState.APPROVED if approve else ApprovalState.REJECTED
        locked.decided_by = actor
        locked.decided_at = now
        locked.note = note
        locked.save(update_fields=["state", "decided_by", "decided_at", "note"])
        audit_record(
            event_type=AuditEventType.TOOL_CALL_APPROVED if approve else AuditEventType.TOOL_CALL_REJECTED,
            actor=actor,
            team=locked.team,
            obj=locked,
            run_id=locked.call.run_id,
            payload={**_payload(locked), "note_chars": len(note)},
        )
    return locked


def expire_tool_approvals() -> int:
    """The sweep: pending approvals past their deadline expire (audited)."""
    n = 0
    # A paused run's held call expires with the run's hold (apps.runs.approvals.expire_approvals),
    # which also resumes the run: not here.
    due = ToolApproval.objects.filter(state=ApprovalState.PENDING, deadline_at__lte=timezone.now()).exclude(
        run_holds__decision="pending"
    )
    for a in due:
        with transaction.atomic():
            if ToolApproval.objects.filter(pk=a.pk, state=ApprovalState.PENDING).update(
                state=ApprovalState.EXPIRED
            ):
                a.state = ApprovalState.EXPIRED
                audit_record(
                    event_type=AuditEventType.TOOL_APPROVAL_EXPIRED, team=a.team, obj=a, payload=_payload(a)
                )
                n += 1
    return n


def decide_run_hold(*, approval_id: int, state: str, actor: User | None, note: str) -> ToolApproval | None:
    """The review desk decided a run's held tool call (apps.runs.approvals checked who may, in
    its transaction): the approval takes ``state`` and is audited. None if it was decided already."""
    locked = ToolApproval.objects.select_for_update().filter(pk=approval_id).select_related("call").first()
    if locked is None or locked.state != ApprovalState.PENDING:
        return None
    locked.state = state
    if state != ApprovalState.EXPIRED:
        locked.decided_by = actor
        locked.decided_at = timezone.now()
        locked.note = note
    locked.save(update_fields=["state", "decided_by", "decided_at", "note"])
    event = {  # keyed by the state's value: ``state`` arrives as a plain string
        ApprovalState.APPROVED.value: AuditEventType.TOOL_CALL_APPROVED,
        ApprovalState.REJECTED.value: AuditEventType.TOOL_CALL_REJECTED,
    }.get(state, AuditEventType.TOOL_APPROVAL_EXPIRED)
    audit_record(
        event_type=event,
        actor=actor if getattr(actor, "pk", None) else None,
        team=locked.team_id,
        obj=locked,
        run_id=locked.call.run_id,
        payload={**_payload(locked), "note_chars": len(note)},
    )
    return locked
