"""Issue 42 item 4: the same number written the same way on every page — durations (never
"97177 ms" beside "147.3 s"), policy versions by their number (never a database id)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import transaction

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.sequencer import sequence_pass
from apps.audit.services import audit_record
from apps.runs.models import RunStatus
from apps.runs.templatetags.run_format import duration
from tests.factories.runs import RunFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (97177, "97.2 s"),
        (147300.0, "147.3 s"),
        (999.4, "999 ms"),
        (1000, "1.0 s"),
        (0, "0 ms"),
        (None, "—"),
        ("x", "—"),
    ],
)
def test_one_duration_format(ms: Any, shown: str) -> None:
    assert duration(ms) == shown


def test_runs_list_writes_latency_as_the_run_page_does(client: Any, fake_pool: Any, owner: Any) -> None:
    RunFactory(
        team=fake_pool.pool.team,
        pool=fake_pool.pool,
        created_by=owner,
        status=RunStatus.SUCCEEDED,
        latency_ms=97177,
    )
    client.force_login(owner)
    page = client.get("/runs/").content.decode()
    assert "97.2 s" in page and "97177 ms" not in page


def test_audit_event_names_the_policy_version_by_number(
    client: Any, alpha: Any, reviewer: Any, publish: Any
) -> None:
    publish(alpha, {"constraints": {"max_steps": {"value": 4, "action": "repair"}}})
    version = publish(alpha, {"constraints": {"max_steps": {"value": 3, "action": "repair"}}})
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.POLICY_PUBLISHED, team=alpha, policy_version_id=version.pk, payload={}
        )
    while sequence_pass() > 0:
        pass
    event = AuditEvent.objects.filter(policy_version_id=version.pk).exclude(seq=None).order_by("-seq").first()
    client.force_login(reviewer)
    page = client.get(f"/audit/events/{event.seq}/").content.decode()
    shown = re.search(r'data-testid="event-policy-version">(.*?)</dd>', page, re.S)
    assert shown is not None and shown.group(1) == f"v{version.number} of team {alpha.slug}'s policy"
