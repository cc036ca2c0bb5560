"""Search: the shared filter function, the FilterSet, the /audit/ page, detail and verification."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.filters import AuditEventFilterSet, filter_audit_events
from apps.audit.models import AuditChainHead, AuditEvent
from apps.audit.selectors import PAGE_SIZE, page_of_events
from apps.audit.services import audit_flush, audit_record_standalone
from apps.runs.review_queue import audit_events_for_run
from tests.factories.audit import append_events


@pytest.mark.django_db
def test_filters_each_parameter(alpha: Any, beta: Any, owner: Any, teammate: Any) -> None:
    run_id = uuid.uuid4()
    audit_record_standalone(
        event_type=AuditEventType.RUN_CREATED,
        actor=owner,
        team=alpha,
        run_id=run_id,
        object_type="runs.run",
        object_id=str(run_id),
    )
    audit_record_standalone(
        event_type=AuditEventType.POOL_UPDATED,
        actor=teammate,
        team=alpha,
        object_type="workers.pool",
        object_id="7",
    )
    audit_record_standalone(
        event_type=AuditEventType.POOL_CREATED, team=beta, object_type="workers.pool", object_id="8"
    )
    audit_flush()  # time filters map onto seq ranges: only numbered rows are found
    qs = AuditEvent.objects.all()

    def seqs(**params: str) -> set[str]:
        return set(filter_audit_events(qs, params).values_list("event_type", flat=True))

    assert seqs(run=str(run_id)) == {"run.created"}
    assert "pool.created" in seqs(team="beta") and "pool.updated" not in seqs(team="beta")
    assert seqs(team=str(beta.pk)) == seqs(team="beta")
    assert seqs(actor="teammate") == {"pool.updated"}
    assert seqs(actor=str(owner.pk)) == {"run.created"}
    assert "run.created" not in seqs(actor="system")
    assert seqs(type="pool.") == {"pool.updated", "pool.created"}
    assert seqs(type="pool.updated") == {"pool.updated"}
    assert seqs(object="workers.pool:7") == {"pool.updated"}
    assert seqs(object="workers.pool") == {"pool.updated", "pool.created"}
    tomorrow = (timezone.now() + timedelta(days=1)).date().isoformat()
    yesterday = (timezone.now() - timedelta(days=1)).date().isoformat()
    assert seqs(since=tomorrow) == set()
    assert seqs(until=yesterday) == set()
    assert "run.created" in seqs(since=yesterday, until=tomorrow)
    assert seqs(team="no-such-team") == set()


@pytest.mark.django_db
def test_bad_parameters_name_every_field() -> None:
    with pytest.raises(ValidationError) as exc:
        filter_audit_events(AuditEvent.objects.all(), {"run": "x", "since": "last tuesday", "object": "pool"})
    assert set(exc.value.message_dict) == {"run", "since", "object"}


@pytest.mark.django_db
def test_filterset_uses_the_same_semantics(alpha: Any, beta: Any) -> None:
    append_events(2, team=alpha, event_type=AuditEventType.POLICY_PUBLISHED)
    append_events(1, team=beta, event_type=AuditEventType.POLICY_PUBLISHED)
    fs = AuditEventFilterSet(
        data={"type": "policy.published", "team": "alpha"}, queryset=AuditEvent.objects.all()
    )
    assert fs.qs.count() == 2
    from rest_framework.exceptions import ValidationError as DRFValidationError

    with pytest.raises(DRFValidationError):
        _ = AuditEventFilterSet(data={"until": "soon"}, queryset=AuditEvent.objects.all()).qs


@pytest.mark.django_db
def test_keyset_pagination_walks_every_event_once(alpha: Any) -> None:
    append_events(PAGE_SIZE * 2 + 7, team=alpha)
    qs = AuditEvent.objects.all()
    seen: list[int] = []
    page = page_of_events(qs)
    while True:
        seen.extend(e.seq for e in page.events)
        if page.older is None:
            break
        page = page_of_events(qs, before=page.older)
    assert seen == sorted(qs.values_list("seq", flat=True), reverse=True)
    back = page_of_events(qs, after=page.events[0].seq)
    assert [e.seq for e in back.events] == seen[-len(page.events) - PAGE_SIZE : -len(page.events)]


@pytest.mark.django_db
def test_page_shows_only_visible_events(
    client: Any, reviewer: Any, outsider: Any, owner: Any, alpha: Any, beta: Any
) -> None:
    append_events(2, team=alpha, event_type=AuditEventType.POOL_UPDATED, object_repr="alpha-pool-x")
    append_events(2, team=beta, event_type=AuditEventType.POOL_UPDATED, object_repr="beta-pool-y")
    client.force_login(reviewer)
    page = client.get("/audit/").content.decode()
    assert "alpha-pool-x" in page and "beta-pool-y" not in page
    client.force_login(outsider)  # a plain member of beta has no audit permission
    page = client.get("/audit/").content.decode()
    assert "alpha-pool-x" not in page and "beta-pool-y" not in page
    client.force_login(owner)
    assert "alpha-pool-x" not in client.get("/audit/").content.decode()


@pytest.mark.django_db
def test_page_filters_and_field_errors(client: Any, reviewer: Any, alpha: Any) -> None:
    append_events(1, team=alpha, event_type=AuditEventType.POOL_UPDATED, object_repr="the-pool")
    append_events(1, team=alpha, event_type=AuditEventType.POLICY_PUBLISHED, object_repr="the-policy")
    client.force_login(reviewer)
    page = client.get("/audit/", {"type": "policy."}).content.decode()
    assert "the-policy" in page and "the-pool" not in page
    response = client.get("/audit/", {"run": "nope", "since": "yesterday-ish"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="error-run"' in html and "Enter a run id" in html
    assert 'data-testid="error-since"' in html


@pytest.mark.django_db
def test_event_detail_shows_masked_changes_chain_and_run_link(
    client: Any, reviewer: Any, alpha: Any, beta: Any
) -> None:
    run_id = uuid.uuid4()
    event = audit_record_standalone(
        event_type=AuditEventType.PROVIDER_UPDATED,
        team=alpha,
        run_id=run_id,
        before={"api_key": "sk-before-secret-000000", "name": "Old <b>name</b>"},
        after={"api_key": "sk-after-secret-111111", "name": "New"},
    )
    audit_flush()
    event.refresh_from_db()
    client.force_login(reviewer)
    html = client.get(f"/audit/events/{event.seq}/").content.decode()
    assert "sk-before-secret" not in html and "sk-after-secret" not in html
    assert "Old &lt;b&gt;name&lt;/b&gt;" in html  # escaped, never rendered as markup
    assert event.digest in html and event.prev_digest in html
    assert f'href="/runs/{run_id}/"' in html
    (hidden,) = append_events(1, team=beta)
    assert client.get(f"/audit/events/{hidden.seq}/").status_code == 404


@pytest.mark.django_db
def test_verify_now_is_for_reviewers_and_superusers(client: Any, superuser: Any, teammate: Any) -> None:
    # Reviewers of a team may verify too (issue 17): tests/audit/test_review_desk.py.
    append_events(3)
    client.force_login(teammate)
    assert 'data-testid="verify-now"' not in client.get("/audit/").content.decode()
    assert client.post("/audit/verify/").status_code == 403
    client.force_login(superuser)
    page = client.get("/audit/").content.decode()
    assert "not verified yet" in page and 'data-testid="verify-now"' in page
    response = client.post("/audit/verify/", follow=True)
    assert response.status_code == 200
    head = AuditChainHead.objects.get(pk=1)
    assert head.last_verified_ok is True and head.last_verified_at is not None
    assert 'data-testid="chain-status">intact' in response.content.decode()


@pytest.mark.django_db
def test_audit_events_for_run(owner: Any, reviewer: Any, outsider: Any, alpha_run: Any) -> None:
    audit_record_standalone(
        event_type=AuditEventType.RUN_FINISHED, team=alpha_run.team, run_id=alpha_run.pk, obj=alpha_run
    )
    assert audit_events_for_run(owner, alpha_run).filter(event_type="run.finished").exists()
    assert audit_events_for_run(reviewer, alpha_run).filter(event_type="run.finished").exists()
    assert not audit_events_for_run(outsider, alpha_run).exists()
