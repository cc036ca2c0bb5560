"""Run reviews: sign-off, flags, held answers, the queue and sampling."""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.template.loader import render_to_string
from django.test import RequestFactory

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent, RunReview
from apps.audit.services import audit_flush, hmac_key
from apps.audit.verify import verify_chain
from apps.runs.models import ReviewStatus
from apps.runs.reviews import maybe_sample_for_review, review_request, run_review
from tests.factories.audit import make_run


@pytest.mark.django_db
def test_approving_a_held_answer_releases_it(reviewer: Any, alpha: Any, owner: Any) -> None:
    run = make_run(alpha, created_by=owner, answer_held=True, review_status=ReviewStatus.PENDING)
    review = run_review(actor=reviewer, run=run, status="approved", comment="Looks fine")
    audit_flush()
    run.refresh_from_db()
    assert (run.review_status, run.answer_held) == ("approved", False)
    assert review.released_answer and review.reviewer == reviewer
    reviewed = AuditEvent.objects.get(event_type=AuditEventType.RUN_REVIEWED, run_id=run.pk)
    assert reviewed.actor_id == reviewer.pk and reviewed.team_id == alpha.pk
    assert reviewed.payload["status"] == "approved" and reviewed.payload["comment"] == "Looks fine"
    assert reviewed.payload["changes"]["answer_held"] == {"before": True, "after": False}
    assert review.audit_seq == reviewed.seq
    released = AuditEvent.objects.get(event_type=AuditEventType.RUN_RELEASED, run_id=run.pk)
    assert released.seq == reviewed.seq + 1
    assert "Paris" not in str(released.payload) and released.payload["answer"]["chars"] == len(run.answer)
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_flag_needs_a_reason_and_does_not_release(reviewer: Any, alpha_run: Any) -> None:
    alpha_run.answer_held = True
    alpha_run.save(update_fields=["answer_held"])
    with pytest.raises(ValidationError) as exc:
        run_review(actor=reviewer, run=alpha_run, status="flagged")
    assert "reason" in exc.value.message_dict
    with pytest.raises(ValidationError):
        run_review(actor=reviewer, run=alpha_run, status="maybe")
    run_review(actor=reviewer, run=alpha_run, status="flagged", reason="Cites no source")
    alpha_run.refresh_from_db()
    assert (alpha_run.review_status, alpha_run.answer_held) == ("flagged", True)
    assert not AuditEvent.objects.filter(event_type=AuditEventType.RUN_RELEASED).exists()


@pytest.mark.django_db
def test_only_reviewers_may_review(owner: Any, outsider: Any, team_admin: Any, alpha_run: Any) -> None:
    for user in (owner, outsider):
        with pytest.raises(PermissionDenied):
            run_review(actor=user, run=alpha_run, status="approved")
    run_review(actor=team_admin, run=alpha_run, status="needs_follow_up")  # admins hold review_team_runs
    assert RunReview.objects.filter(run=alpha_run).count() == 1


@pytest.mark.django_db
def test_review_view(client: Any, reviewer: Any, owner: Any, outsider: Any, alpha_run: Any) -> None:
    url = f"/audit/runs/{alpha_run.pk}/review/"
    client.force_login(outsider)
    assert client.post(url, {"status": "approved"}).status_code == 404
    client.force_login(owner)
    assert client.post(url, {"status": "approved"}).status_code == 403
    client.force_login(reviewer)
    response = client.post(url, {"status": "flagged", "reason": ""})
    assert response.status_code == 400
    assert "Say why you flag this run." in response.content.decode()
    response = client.post(
        url, {"status": "flagged", "reason": "Wrong <script>alert(1)</script>", "next": "/audit/reviews/"}
    )
    assert response.status_code == 302 and response["Location"] == "/audit/reviews/"
    response = client.post(url, {"status": "approved", "next": "https://evil.example/"})
    assert response["Location"] == f"/runs/{alpha_run.pk}/"
    alpha_run.refresh_from_db()
    assert alpha_run.review_status == "approved"
    assert RunReview.objects.filter(run=alpha_run).count() == 2


@pytest.mark.django_db
def test_review_panel_partial(reviewer: Any, owner: Any, alpha_run: Any) -> None:
    run_review(actor=reviewer, run=alpha_run, status="flagged", reason="<b>bold</b> claim")
    request = RequestFactory().get(f"/runs/{alpha_run.pk}/")
    request.user = reviewer
    from apps.audit.views import review_panel_context

    html = render_to_string(
        "audit/_review_panel.html", review_panel_context(request, alpha_run), request=request
    )
    assert 'data-testid="review-form"' in html and f"/audit/runs/{alpha_run.pk}/review/" in html
    assert "&lt;b&gt;bold&lt;/b&gt; claim" in html
    request.user = owner
    html = render_to_string(
        "audit/_review_panel.html", review_panel_context(request, alpha_run), request=request
    )
    assert 'data-testid="review-form"' not in html and 'data-testid="review-history"' in html

    # Included with only ``run`` (as the run page does): reviews and permission come from selectors.
    request.user = reviewer
    html = render_to_string("audit/_review_panel.html", {"run": alpha_run}, request=request)
    assert 'data-testid="review-form"' in html and "&lt;b&gt;bold&lt;/b&gt; claim" in html
    assert (
        'name="status" value="flagged"' in html and 'name="reason"' in html and "csrfmiddlewaretoken" in html
    )
    request.user = owner
    html = render_to_string("audit/_review_panel.html", {"run": alpha_run}, request=request)
    assert 'data-testid="review-form"' not in html and 'data-testid="review-history"' in html


@pytest.mark.django_db
def test_review_queue(client: Any, reviewer: Any, outsider: Any, alpha: Any, beta: Any) -> None:
    pending = make_run(alpha, review_status=ReviewStatus.PENDING)
    done = make_run(alpha, review_status=ReviewStatus.APPROVED)
    other = make_run(beta, review_status=ReviewStatus.PENDING)
    client.force_login(reviewer)
    html = client.get("/audit/reviews/").content.decode()
    assert str(pending.pk) in html and str(done.pk) not in html and str(other.pk) not in html
    client.force_login(outsider)
    assert str(other.pk) not in client.get("/audit/reviews/").content.decode()  # members do not review


@pytest.mark.django_db
def test_sampling_queues_runs_for_review(settings: Any, alpha: Any) -> None:
    run = make_run(alpha)
    settings.AUDIT_REVIEW_SAMPLE_RATE = 0.0
    assert maybe_sample_for_review(run) is False
    settings.AUDIT_REVIEW_SAMPLE_RATE = 0.5
    assert maybe_sample_for_review(run, rng=random.Random(1)) is (random.Random(1).random() < 0.5)
    settings.AUDIT_REVIEW_SAMPLE_RATE = 1.0
    fresh = make_run(alpha)
    assert maybe_sample_for_review(fresh) is True
    fresh.refresh_from_db()
    assert fresh.review_status == "pending"
    event = AuditEvent.objects.get(event_type=AuditEventType.RUN_REVIEW_REQUESTED, run_id=fresh.pk)
    assert event.payload == {"reason": "sampled", "sample_rate": 1.0}
    assert maybe_sample_for_review(fresh) is False  # already queued
    assert review_request(run=fresh, reason="guardrail") is False
