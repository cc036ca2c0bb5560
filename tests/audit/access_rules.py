"""Access rules for the audit pages (format: tests/test_access_matrix.py).

Audit visibility follows ``view_team_audit`` (admins, policy admins and reviewers of the team);
plain members see an empty search and cannot open an event of their team (404, as for outsiders).
Reviews need ``review_team_runs`` (reviewers and admins); seeing the run without it is a 403.
"""

from __future__ import annotations

from typing import Any

from apps.audit.events import AuditEventType


def _alpha_event_seq(ctx: Any) -> dict[str, Any]:
    from apps.audit.models import AuditEvent
    from apps.audit.services import audit_flush, audit_record_standalone

    event = ctx.memo(
        "alpha_event", lambda c: audit_record_standalone(event_type=AuditEventType.POOL_UPDATED, team=c.alpha)
    )
    audit_flush()  # numbered after commit; the URL needs its seq
    return {"seq": AuditEvent.objects.get(pk=event.pk).seq}


def _alpha_run(ctx: Any) -> dict[str, Any]:
    from tests.factories.audit import make_run

    run = ctx.memo("alpha_run", lambda c: make_run(c.alpha, created_by=c.owner))
    return {"run_id": run.pk}


EVERYONE = {
    "anonymous": "login",
    "owner": 200,
    "teammate": 200,
    "outsider": 200,
    "reviewer": 200,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}

RULES: dict[str, Any] = {
    "audit:event_list": {
        **EVERYONE,
        "note": "everyone searches; rows come from AuditEvent.objects.visible_to(user, 'view')",
    },
    "audit:event_detail": {
        "kwargs": _alpha_event_seq,
        "anonymous": "login",
        "owner": 404,
        "teammate": 404,
        "outsider": 404,
        "reviewer": 200,
        "policy_admin": 200,
        "team_admin": 200,
        "superuser": 200,
    },
    "audit:export": {
        "kwargs": {"export_format": "csv"},
        **EVERYONE,
        "note": "streams only the rows the user may see (possibly none); the export is audited",
    },
    "audit:verify": {
        "method": "POST",
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 403,
        "reviewer": 302,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
        "note": "reviewers of any team (review_team_runs) verify the chain; the result names no event",
    },
    "audit:review_queue": {**EVERYONE, "note": "lists only runs the user may review"},
    "audit:run_review": {
        "method": "POST",
        "kwargs": _alpha_run,
        "data": {"status": "approved"},
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 302,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
    },
    "audit:review_bulk": {
        "method": "POST",
        "data": lambda ctx: {"run": [str(_alpha_run(ctx)["run_id"])], "note": "bulk"},
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 302,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
        "note": "a run the user cannot see is a 404; one they see but may not review, a 403",
    },
    "audit:flag_resolve": {
        "method": "POST",
        "kwargs": _alpha_run,
        "data": {"note": "resolved"},
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 302,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
        "note": "reviewers redirect back (with 'no open flag' here: the run was never flagged)",
    },
    "audit:run_export": {
        "kwargs": _alpha_run,
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 200,
        "policy_admin": 403,
        "team_admin": 200,
        "superuser": 200,
        "note": "a run's evidence (events with inclusion proofs) needs review_team_runs",
    },
    "audit:evidence_pack": {
        **EVERYONE,
        "note": "a zip of the rows the user may see (possibly none), proofs, checkpoints, keys; audited",
    },
    "audit:run_evidence_pack": {
        "kwargs": _alpha_run,
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 200,
        "policy_admin": 403,
        "team_admin": 200,
        "superuser": 200,
        "note": "a run's evidence pack needs review_team_runs, as its JSON Lines export",
    },
    "audit:log_keys": {
        "anonymous": 200,
        "owner": 200,
        "teammate": 200,
        "outsider": 200,
        "reviewer": 200,
        "policy_admin": 200,
        "team_admin": 200,
        "superuser": 200,
        "note": "verifier keys are public by design (an auditor needs nothing else)",
    },
    "audit:log_checkpoint": {
        "anonymous": 401,
        "owner": 403,
        "teammate": 403,
        "outsider": 403,
        "reviewer": 200,
        "policy_admin": 200,
        "team_admin": 200,
        "superuser": 200,
        "note": "who may see a team's audit trail (view_team_audit), or an audit:read API key",
    },
}
