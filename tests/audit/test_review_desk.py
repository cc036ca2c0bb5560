"""The review desk: why a run is queued, the held-answer preview (reviewers only), filters in the
URL, bulk sign-off with one note, the flag lifecycle, reviewer verification and run evidence
exports, the nav badge and the e-mail on new queued runs."""

from __future__ import annotations

import json
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.models import AuditChainHead, AuditEvent, RunReview
from apps.audit.services import audit_flush, hmac_key
from apps.audit.verify import verify_chain
from apps.runs.models import Run, RunEvent
from apps.runs.review_queue import queue_items
from apps.runs.reviews import review_request, run_review
from apps.runs.selectors import run_content_visible
from tests.audit.test_export import verify_offline
from tests.factories.audit import make_run

SECRET_ANSWER = "The launch code is 0000"


def held_run(team: Any, owner: Any, *, check: str = "pii", action: str = "require_review", **kw: Any) -> Run:
    """A run a guardrail queued: its guardrail.checked event and the review request, as the sink writes."""
    run = make_run(
        team,
        created_by=owner,
        question=kw.pop("question", "Tell me the launch code"),
        answer=kw.pop("answer", SECRET_ANSWER),
        answer_held=action == "require_review",
        **kw,
    )
    RunEvent.objects.create(
        run=run,
        seq=1,
        type="guardrail.checked",
        data={"stage": "output", "checks": [{"name": check, "status": "intervened", "action": action}]},
    )
    review_request(run=run, reason="guardrail", details={"flags": [action]})
    return run


def _visible(user: Any, run: Any) -> bool:
    return run_content_visible(user=user, run=run)


def sampled_run(team: Any, owner: Any, **kw: Any) -> Run:
    run = make_run(team, created_by=owner, question="What is 2+2?", answer="4", **kw)
    review_request(run=run, reason="sampled", details={"sample_rate": 0.1})
    return run


@pytest.mark.django_db
def test_queue_shows_reason_and_preview_to_reviewers(
    client: Any, reviewer: Any, alpha: Any, owner: Any
) -> None:
    run = held_run(alpha, owner)
    sampled = sampled_run(alpha, owner)
    client.force_login(reviewer)
    html = client.get("/audit/reviews/").content.decode()
    item = html.split(f'data-run="{run.pk}"', 1)[1].split("</article>", 1)[0]
    assert "output:pii → require_review" in item  # the rule and the action that queued it
    assert SECRET_ANSWER in item and "answer held" in item
    sampled_item = html.split(f'data-run="{sampled.pk}"', 1)[1].split("</article>", 1)[0]
    assert "sampled at 10%" in sampled_item
    assert "2 total" in html
    # Held answers come first.
    assert html.index(f'data-run="{run.pk}"') < html.index(f'data-run="{sampled.pk}"')


@pytest.mark.django_db
def test_held_answer_never_reaches_non_reviewers(
    client: Any, owner: Any, teammate: Any, policy_admin: Any, outsider: Any, alpha: Any
) -> None:
    run = held_run(alpha, owner)
    for user in (owner, teammate, policy_admin, outsider):
        client.force_login(user)
        html = client.get("/audit/reviews/").content.decode()
        assert SECRET_ANSWER not in html and str(run.pk) not in html
        assert 'data-testid="nav-review"' not in html
        # The preview itself goes through the held-content rule, whoever asks.
        (item,) = queue_items([run], content_visible=partial(_visible, user))
        assert (item.content_visible, item.answer) == (False, "")


@pytest.mark.django_db
def test_filters_by_team_reason_and_age_live_in_the_url(
    client: Any, superuser: Any, alpha: Any, beta: Any, owner: Any, outsider: Any
) -> None:
    guarded = held_run(alpha, owner)
    sampled = sampled_run(alpha, owner)
    beta_held = held_run(beta, outsider)
    old = sampled_run(alpha, owner)
    Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=9))
    client.force_login(superuser)

    def listed(query: str) -> set[Any]:
        response = client.get(f"/audit/reviews/?{query}")
        assert response.status_code == 200
        return {r.pk for r in Run.objects.all() if f'data-run="{r.pk}"' in response.content.decode()}

    assert listed("") == {guarded.pk, sampled.pk, beta_held.pk, old.pk}
    assert listed("team=beta") == {beta_held.pk}
    assert listed("reason=guardrail") == {guarded.pk, beta_held.pk}
    assert listed("reason=sampled&team=alpha") == {sampled.pk, old.pk}
    assert listed("reason=held&team=alpha") == {guarded.pk}
    assert listed("age=24h&reason=sampled") == {sampled.pk}
    assert listed("age=older") == {old.pk}
    # The tabs keep the filters.
    html = client.get("/audit/reviews/?team=beta&reason=guardrail").content.decode()
    assert 'href="?team=beta&amp;reason=guardrail&amp;tab=flagged"' in html


@pytest.mark.django_db
def test_a_reviewer_only_filters_by_teams_they_review(
    client: Any, reviewer: Any, beta: Any, outsider: Any
) -> None:
    held_run(beta, outsider)
    client.force_login(reviewer)
    response = client.get("/audit/reviews/?team=beta")
    html = response.content.decode()
    assert response.status_code == 200 and SECRET_ANSWER not in html
    assert "Select a valid choice" in html  # beta is not among the reviewer's teams


@pytest.mark.django_db
def test_bulk_sign_off_with_one_audited_note(client: Any, reviewer: Any, alpha: Any, owner: Any) -> None:
    first, second = held_run(alpha, owner), sampled_run(alpha, owner)
    client.force_login(reviewer)
    response = client.post(
        "/audit/reviews/bulk/",
        {"run": [str(first.pk), str(second.pk)], "note": "Checked with legal", "next": "/audit/reviews/"},
    )
    assert response.status_code == 302 and response["Location"] == "/audit/reviews/"
    audit_flush()
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.review_status, first.answer_held) == ("approved", False)
    assert second.review_status == "approved"
    events = AuditEvent.objects.filter(event_type=AuditEventType.RUN_REVIEWED).order_by("seq")
    assert [(e.payload["comment"], e.payload["bulk"], e.actor_id) for e in events] == [
        ("Checked with legal", 2, reviewer.pk)
    ] * 2
    assert AuditEvent.objects.filter(event_type=AuditEventType.RUN_RELEASED, run_id=first.pk).exists()
    assert verify_chain(key=hmac_key()).ok
    assert "Signed off 2 runs. 1 held answer released." in client.get("/audit/reviews/").content.decode()


@pytest.mark.django_db
def test_bulk_sign_off_is_all_or_nothing(
    client: Any, reviewer: Any, alpha: Any, beta: Any, owner: Any, outsider: Any, teammate: Any
) -> None:
    mine, theirs = held_run(alpha, owner), held_run(beta, outsider)
    client.force_login(reviewer)
    # A run the reviewer cannot see: 404, and the visible one stays unreviewed.
    response = client.post("/audit/reviews/bulk/", {"run": [str(mine.pk), str(theirs.pk)], "note": "ok"})
    assert response.status_code == 404
    # A note is required.
    response = client.post("/audit/reviews/bulk/", {"run": [str(mine.pk)], "note": " "}, follow=True)
    assert "Write the note that goes with this sign-off." in response.content.decode()
    # A member sees the run but may not review it: 403 naming the permission.
    client.force_login(teammate)
    response = client.post("/audit/reviews/bulk/", {"run": [str(mine.pk)], "note": "ok"})
    assert response.status_code == 403 and "review_team_runs" in response.content.decode()
    mine.refresh_from_db()
    assert (mine.review_status, mine.answer_held) == ("pending", True)
    assert not RunReview.objects.exists()


@pytest.mark.django_db
def test_flag_lifecycle_flagged_then_resolved(client: Any, reviewer: Any, alpha: Any, owner: Any) -> None:
    run = held_run(alpha, owner)
    client.force_login(reviewer)
    client.post(
        f"/audit/runs/{run.pk}/review/",
        {"status": "flagged", "reason": "Leaks a code", "next": "/audit/reviews/"},
    )
    assert f'data-run="{run.pk}"' not in client.get("/audit/reviews/").content.decode()
    flagged = client.get("/audit/reviews/?tab=flagged").content.decode()
    assert f'data-run="{run.pk}"' in flagged and "Leaks a code" in flagged and "1 total" in flagged

    response = client.post(
        f"/audit/runs/{run.pk}/resolve/", {"note": "", "next": "/audit/reviews/?tab=flagged"}
    )
    assert response.status_code == 302 and RunReview.objects.get().resolved_at is None
    response = client.post(
        f"/audit/runs/{run.pk}/resolve/", {"note": "Rotated the code", "next": "/audit/reviews/?tab=flagged"}
    )
    assert response.status_code == 302
    flag = RunReview.objects.get()
    assert flag.resolved_by == reviewer and flag.resolution_note == "Rotated the code"
    assert f'data-run="{run.pk}"' not in client.get("/audit/reviews/?tab=flagged").content.decode()
    resolved = client.get("/audit/reviews/?tab=resolved").content.decode()
    assert f'data-run="{run.pk}"' in resolved and "Rotated the code" in resolved

    audit_flush()
    event = AuditEvent.objects.get(event_type=AuditEventType.RUN_FLAG_RESOLVED)
    assert event.run_id == run.pk and event.actor_id == reviewer.pk
    assert event.payload["note"] == "Rotated the code" and event.payload["flag_reason"] == "Leaks a code"
    assert event.payload["review_ids"] == [flag.pk]
    assert flag.resolution_audit_event_id == event.pk
    # Nothing left to resolve: said, not silently accepted.
    response = client.post(f"/audit/runs/{run.pk}/resolve/", {"note": "again"}, follow=True)
    assert "This run has no open flag to resolve." in response.content.decode()
    assert AuditEvent.objects.filter(event_type=AuditEventType.RUN_FLAG_RESOLVED).count() == 1
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_only_reviewers_resolve_flags(
    client: Any, reviewer: Any, owner: Any, outsider: Any, alpha: Any
) -> None:
    run = held_run(alpha, owner)
    run_review(actor=reviewer, run=run, status="flagged", reason="Wrong")
    client.force_login(owner)
    response = client.post(f"/audit/runs/{run.pk}/resolve/", {"note": "fine by me"})
    assert response.status_code == 403 and "review_team_runs" in response.content.decode()
    client.force_login(outsider)
    assert client.post(f"/audit/runs/{run.pk}/resolve/", {"note": "x"}).status_code == 404
    assert RunReview.objects.get().resolved_at is None


@pytest.mark.django_db
def test_reviewers_verify_the_chain_and_others_learn_why_not(
    client: Any, reviewer: Any, teammate: Any, alpha: Any, owner: Any
) -> None:
    held_run(alpha, owner)
    client.force_login(teammate)
    page = client.get("/audit/").content.decode()
    assert 'data-testid="verify-now"' not in page
    response = client.post("/audit/verify/")
    assert response.status_code == 403
    assert (
        "review_team_runs" in response.content.decode()
        and 'data-testid="error-reason"' in response.content.decode()
    )
    client.force_login(reviewer)
    assert 'data-testid="verify-now"' in client.get("/audit/").content.decode()
    assert client.post("/audit/verify/").status_code == 302
    head = AuditChainHead.objects.get(pk=1)
    assert head.last_verified_ok is True and head.last_verified_seq == head.seq > 0


@pytest.mark.django_db
def test_run_evidence_export_verifies_offline(
    client: Any, reviewer: Any, teammate: Any, alpha: Any, owner: Any, tmp_path: Path
) -> None:
    run = held_run(alpha, owner)
    other = held_run(alpha, owner)
    run_review(actor=reviewer, run=run, status="approved", comment="ok")
    client.force_login(teammate)
    assert client.get(f"/audit/runs/{run.pk}/evidence.jsonl").status_code == 403
    client.force_login(reviewer)
    response = client.get(f"/audit/runs/{run.pk}/evidence.jsonl")
    assert response.status_code == 200 and "attachment" in response["Content-Disposition"]
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [line for line in lines if "seq" in line and "proof" in line]
    types = [r["content"]["event_type"] for r in rows]
    assert types == ["run.review_requested", "run.reviewed", "run.released"]
    assert all(r["content"]["run_id"] == str(run.pk) for r in rows) and str(other.pk) not in path.read_text()
    assert SECRET_ANSWER not in path.read_text()
    result = verify_offline(path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The download itself is recorded.
    exported = AuditEvent.objects.get(event_type=AuditEventType.AUDIT_EXPORTED)
    assert exported.payload["filters"] == {"run": str(run.pk)} and exported.actor_id == reviewer.pk


@pytest.mark.django_db
def test_nav_badge_counts_runs_awaiting_the_viewers_review(
    client: Any, reviewer: Any, owner: Any, alpha: Any, beta: Any, outsider: Any
) -> None:
    client.force_login(reviewer)
    html = client.get("/audit/").content.decode()
    assert 'data-testid="nav-review"' in html and 'data-testid="review-badge"' not in html
    held_run(alpha, owner)
    sampled_run(alpha, owner)
    held_run(beta, outsider)  # not the reviewer's team
    html = client.get("/audit/").content.decode()
    badge = html.split('data-testid="review-badge"', 1)[1].split("</span>", 1)[0]
    assert ">2<" in badge


@pytest.mark.django_db
def test_new_queued_run_emails_the_teams_reviewers(
    settings: Any,
    reviewer: Any,
    team_admin: Any,
    owner: Any,
    alpha: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.REVIEW_NOTIFY_EMAIL = True
    with django_capture_on_commit_callbacks(execute=True):
        run = held_run(alpha, owner)
    assert sorted(m.to[0] for m in mail.outbox) == sorted([reviewer.email, team_admin.email])
    body = mail.outbox[0].body
    assert str(run.pk) in body and "guardrail" in body and "/audit/reviews/?team=alpha" in body
    assert SECRET_ANSWER not in body and "launch code" not in body
    # Already queued: no second mail. Disabled: none at all.
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert not review_request(run=run, reason="guardrail")
    settings.REVIEW_NOTIFY_EMAIL = False
    with django_capture_on_commit_callbacks(execute=True):
        held_run(alpha, owner)
    assert mail.outbox == []


@pytest.mark.django_db
def test_run_page_panel_resolves_every_open_flag(client: Any, reviewer: Any, owner: Any, alpha: Any) -> None:
    run = held_run(alpha, owner)
    run_review(actor=reviewer, run=run, status="flagged", reason="First concern")
    run_review(actor=reviewer, run=run, status="flagged", reason="Second concern")
    client.force_login(reviewer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="panel-resolve-form"' in page
    client.post(f"/audit/runs/{run.pk}/resolve/", {"note": "Both handled", "next": f"/runs/{run.pk}/"})
    assert set(RunReview.objects.values_list("resolution_note", flat=True)) == {"Both handled"}
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert page.count('data-testid="flag-resolution"') == 2 and 'data-testid="panel-resolve-form"' not in page
    client.force_login(owner)  # sees the run and the resolution, never a form
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Both handled" in page and 'data-testid="panel-resolve-form"' not in page
