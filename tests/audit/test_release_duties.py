"""Separation of duties for held answers (apps.audit.duties), at the service: the rule, the race
it closes on the locked row, bulk sign-off, and what stays open to the person who asked. The live
server's surfaces are in tests/security/test_release_duties.py."""

from __future__ import annotations

from typing import Any

import pytest

from apps.audit.duties import SEPARATION_OF_DUTIES, ReleaseRefused
from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush, hmac_key
from apps.audit.verify import verify_chain
from apps.runs.models import ReviewStatus, Run
from apps.runs.reviews import run_review, run_review_bulk
from tests.factories.audit import make_run

pytestmark = pytest.mark.django_db


def _refused(run: Run) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(run_id=run.pk, event_type=AuditEventType.RUN_RELEASE_REFUSED))


@pytest.mark.parametrize("who", ["team_admin", "reviewer", "superuser"])
def test_nobody_releases_the_answer_to_their_own_question(request: Any, alpha: Any, who: str) -> None:
    asker = request.getfixturevalue(who)
    run = make_run(alpha, created_by=asker, answer_held=True, review_status=ReviewStatus.PENDING)
    with pytest.raises(ReleaseRefused, match=SEPARATION_OF_DUTIES):
        run_review(actor=asker, run=run, status="approved")
    run.refresh_from_db()
    assert run.answer_held and run.review_status == ReviewStatus.PENDING
    [refusal] = _refused(run)
    assert refusal.actor_id == asker.pk and refusal.team_id == alpha.pk
    assert refusal.payload["rule"] == SEPARATION_OF_DUTIES and refusal.payload["status"] == "approved"
    audit_flush()
    assert verify_chain(key=hmac_key()).ok


def test_held_after_the_caller_read_it_is_refused_on_the_locked_row(alpha: Any, team_admin: Any) -> None:
    run = make_run(alpha, created_by=team_admin, review_status=ReviewStatus.PENDING)
    Run.objects.filter(pk=run.pk).update(answer_held=True)  # the caller's copy still says not held
    with pytest.raises(ReleaseRefused):
        run_review(actor=team_admin, run=run, status="approved")
    assert Run.objects.get(pk=run.pk).answer_held
    assert len(_refused(run)) == 1 and not AuditEvent.objects.filter(event_type="run.reviewed").exists()


def test_the_person_who_asked_may_still_flag_or_sign_off_what_is_not_held(
    alpha: Any, team_admin: Any
) -> None:
    held = make_run(alpha, created_by=team_admin, answer_held=True, review_status=ReviewStatus.PENDING)
    assert run_review(actor=team_admin, run=held, status="flagged", reason="odd").released_answer is False
    plain = make_run(alpha, created_by=team_admin, review_status=ReviewStatus.PENDING)
    assert run_review(actor=team_admin, run=plain, status="approved").status == "approved"
    assert not _refused(held) and not _refused(plain)


def test_bulk_sign_off_with_an_own_held_answer_signs_nothing_off(
    alpha: Any, team_admin: Any, owner: Any
) -> None:
    mine = make_run(alpha, created_by=team_admin, answer_held=True, review_status=ReviewStatus.PENDING)
    theirs = make_run(alpha, created_by=owner, answer_held=True, review_status=ReviewStatus.PENDING)
    with pytest.raises(ReleaseRefused, match="1 of these runs"):
        run_review_bulk(actor=team_admin, runs=[theirs, mine], note="all fine")
    assert Run.objects.filter(answer_held=True).count() == 2
    assert [e.payload["bulk"] for e in _refused(mine)] == [2] and not _refused(theirs)
    # Without it, the other run is released as before.
    [review] = run_review_bulk(actor=team_admin, runs=[theirs], note="fine")
    assert review.released_answer
