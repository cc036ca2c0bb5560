"""Run reviews: a reviewer signs a run off, flags it or resolves a flag; runs are queued for
review by a guardrail or at random. The feature writes its own audit rows (``audit_run_event`` in
the decision's transaction); the review rows are audit's ``RunReview`` (the evidence it exports).
Moved from ``apps.audit.services`` (issue 41): the log knows no features."""

from __future__ import annotations

import random
from functools import partial
from typing import Any, NoReturn

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from apps.audit.chain import content_sha256
from apps.audit.duties import ReleaseRefused, would_release_own
from apps.audit.events import AuditEventType
from apps.audit.models import ReviewDecision, RunReview
from apps.audit.notify import notify_review_requested
from apps.audit.services import audit_run_event
from apps.core.types import Actor, stored_user
from apps.runs.models import ReviewStatus, Run

REVIEW_TEXT_MAX = 2000


def _review_errors(status: str, reason: str, comment: str) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if status not in ReviewDecision.values:
        errors["status"] = ["Choose approved, flagged or needs follow-up."]
    if status == ReviewDecision.FLAGGED and not reason:
        errors["reason"] = ["Say why you flag this run."]
    if len(reason) > REVIEW_TEXT_MAX:
        errors["reason"] = [f"Keep the reason under {REVIEW_TEXT_MAX} characters."]
    if len(comment) > REVIEW_TEXT_MAX:
        errors["comment"] = [f"Keep the comment under {REVIEW_TEXT_MAX} characters."]
    return errors


def _review_locked(
    *, actor: Actor, run: Run, status: str, reason: str, comment: str, extra: dict[str, Any] | None = None
) -> RunReview:
    """One review inside the caller's transaction: lock the run, save the review, audit it."""

    locked = Run.objects.select_for_update().get(pk=run.pk)
    if would_release_own(actor, locked, status, ReviewDecision.APPROVED):
        raise ReleaseRefused([locked])  # held since the caller looked (apps.audit.duties)
    before = {"review_status": locked.review_status, "answer_held": locked.answer_held}
    release = status == ReviewDecision.APPROVED and locked.answer_held
    locked.review_status = status
    if release:
        locked.answer_held = False
    locked.save(update_fields=["review_status", "answer_held"])
    user = stored_user(actor)
    review = RunReview.objects.create(
        run=locked,
        reviewer=user,
        reviewer_label=user.get_username() if user else "system",
        status=status,
        reason=reason,
        comment=comment,
        released_answer=release,
    )
    # Review text is the reviewer's own judgement (not run content), so it is kept as evidence.
    event = audit_run_event(
        event_type=AuditEventType.RUN_REVIEWED,
        run=locked,
        actor=actor,
        payload={
            "review_id": review.pk,
            "status": status,
            "reason": reason,
            "comment": comment,
            **(extra or {}),
        },
        before=before,
        after={"review_status": locked.review_status, "answer_held": locked.answer_held},
    )
    # The event is numbered after commit; the review links to it by id until then.
    RunReview.objects.filter(pk=review.pk).update(audit_event_id=event.pk)
    review.audit_event_id = event.pk
    if release:
        audit_run_event(
            event_type=AuditEventType.RUN_RELEASED,
            run=locked,
            actor=actor,
            payload={"review_id": review.pk, "answer": content_sha256(locked.answer)},
        )
    run.review_status, run.answer_held = locked.review_status, locked.answer_held
    return review


def _can_review_run(actor: Actor, run: Run) -> bool:
    return bool(Run.objects.allows(actor, "review", run))


def _refuse_release(actor: Actor, refused: ReleaseRefused, **payload: Any) -> NoReturn:
    """Audit a refused release (its own transaction: the decision's rolled back), then raise it."""
    with transaction.atomic():
        for run in refused.runs:
            audit_run_event(
                event_type=AuditEventType.RUN_RELEASE_REFUSED,
                run=run,
                actor=actor,
                payload={"rule": refused.rule, "status": ReviewDecision.APPROVED, **payload},
            )
    raise refused


def run_review(*, actor: Actor, run: Run, status: str, reason: str = "", comment: str = "") -> RunReview:
    """A reviewer signs a run off (``approved``), ``flagged`` (reason required) or ``needs_follow_up``.

    Sets ``Run.review_status``; approving a run whose answer a ``require_review`` guardrail held
    releases the answer (a second event, ``run.released``).
    """
    if not _can_review_run(actor, run):
        raise PermissionDenied("You may not review this run: it needs the review_team_runs permission.")
    reason, comment = (reason or "").strip(), (comment or "").strip()
    if errors := _review_errors(status, reason, comment):
        raise ValidationError(errors)
    try:
        if would_release_own(actor, run, status, ReviewDecision.APPROVED):
            raise ReleaseRefused([run])
        with transaction.atomic():
            return _review_locked(actor=actor, run=run, status=status, reason=reason, comment=comment)
    except ReleaseRefused as denial:
        _refuse_release(actor, denial)


BULK_REVIEW_MAX = 100


def run_review_bulk(*, actor: Actor, runs: list[Run], note: str) -> list[RunReview]:
    """Sign several runs off (``approved``) with one note, all or none, in one transaction.

    Every run gets its own ``run.reviewed`` event (a run's export must carry its own sign-off);
    each names the batch size and the shared note, so the note is audited once per run it covers.
    """
    note = (note or "").strip()
    if not runs:
        raise ValidationError({"runs": ["Select at least one run."]})
    if len(runs) > BULK_REVIEW_MAX:
        raise ValidationError({"runs": [f"Sign off at most {BULK_REVIEW_MAX} runs at once."]})
    if errors := _review_errors(ReviewDecision.APPROVED, "", note):
        raise ValidationError({"note": errors["comment"]})
    if not note:
        raise ValidationError({"note": ["Write the note that goes with this sign-off."]})
    refused = [str(run.pk) for run in runs if not _can_review_run(actor, run)]
    if refused:
        raise PermissionDenied(
            f"You may not review {len(refused)} of these runs: it needs the review_team_runs permission."
        )
    try:
        own = [
            run
            for run in runs
            if would_release_own(actor, run, ReviewDecision.APPROVED, ReviewDecision.APPROVED)
        ]
        if own:
            raise ReleaseRefused(
                own,
                f"Separation of duties (rule separation_of_duties): you asked {len(own)} of these runs' "
                "questions, so another reviewer must release their held answers. Nothing was signed off.",
            )
        with transaction.atomic():
            return [
                _review_locked(
                    actor=actor,
                    run=run,
                    status=ReviewDecision.APPROVED,
                    reason="",
                    comment=note,
                    extra={"bulk": len(runs)},
                )
                for run in runs
            ]
    except ReleaseRefused as denial:
        _refuse_release(actor, denial, bulk=len(runs))


def run_flag_resolve(*, actor: Actor, run: Run, note: str) -> RunReview:
    """Close a run's open flags with a note (flagged → resolved), audited as ``run.flag_resolved``.

    The run keeps ``review_status = flagged`` (the finding stands in its history); each open flag
    review records who resolved it, when and why, so resolved flags stay findable. Returns the
    latest of them.
    """
    if not _can_review_run(actor, run):
        raise PermissionDenied("You may not resolve this flag: it needs the review_team_runs permission.")
    note = (note or "").strip()
    if not note:
        raise ValidationError({"note": ["Say how the flag was resolved."]})
    if len(note) > REVIEW_TEXT_MAX:
        raise ValidationError({"note": [f"Keep the note under {REVIEW_TEXT_MAX} characters."]})
    with transaction.atomic():
        flags = list(
            RunReview.objects.select_for_update()
            .filter(run_id=run.pk, status=ReviewDecision.FLAGGED, resolved_at__isnull=True)
            .order_by("-created_at", "-id")
        )
        if not flags:
            raise ValidationError({"note": ["This run has no open flag to resolve."]})
        user = stored_user(actor)
        event = audit_run_event(
            event_type=AuditEventType.RUN_FLAG_RESOLVED,
            run=run,
            actor=actor,
            payload={
                "review_ids": [f.pk for f in flags],
                "flag_reason": flags[0].reason,
                "note": note,
            },
        )
        now = timezone.now()
        for flag in flags:
            flag.resolved_at = now
            flag.resolved_by = user
            flag.resolved_by_label = user.get_username() if user else "system"
            flag.resolution_note = note
            flag.resolution_audit_event_id = event.pk
        RunReview.objects.bulk_update(
            flags,
            [
                "resolved_at",
                "resolved_by",
                "resolved_by_label",
                "resolution_note",
                "resolution_audit_event_id",
            ],
        )
    return flags[0]


def review_request(
    *, run: Run, reason: str, actor: Actor = None, details: dict[str, Any] | None = None
) -> bool:
    """Queue a run for review (``review_status`` → ``pending``) unless it already has a review state.

    ``reason`` is a short code (``sampled``, ``guardrail``...). Returns whether the run was queued.
    """
    with transaction.atomic():
        queued = Run.objects.filter(pk=run.pk, review_status=ReviewStatus.NONE).update(
            review_status=ReviewStatus.PENDING
        )
        if queued:
            audit_run_event(
                event_type=AuditEventType.RUN_REVIEW_REQUESTED,
                run=run,
                actor=actor,
                payload={"reason": reason, **(details or {})},
            )
            transaction.on_commit(partial(notify_review_requested, run=run, reason=reason))
    if queued:
        run.review_status = ReviewStatus.PENDING
    return bool(queued)


def review_sample_rate() -> float:
    """The share of runs sampled for review at their end (``AUDIT_REVIEW_SAMPLE_RATE``); at 0 a
    caller need not even read the run."""
    return float(getattr(settings, "AUDIT_REVIEW_SAMPLE_RATE", 0.0) or 0.0)


def maybe_sample_for_review(run: Run, *, rng: random.Random | None = None) -> bool:
    """At run end: queue a random share (``AUDIT_REVIEW_SAMPLE_RATE``, 0.0 to 1.0) of runs for review."""
    rate = review_sample_rate()
    if rate <= 0.0 or run.review_status:
        return False
    draw = (rng or _SAMPLER).random()
    if draw >= rate:
        return False
    return review_request(run=run, reason="sampled", details={"sample_rate": rate})


_SAMPLER = random.SystemRandom()
