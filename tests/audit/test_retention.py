"""Retention: run content older than the team's retention is erased; the chain still verifies."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import hmac_key
from apps.audit.verify import verify_chain
from apps.runs.models import Run, RunEvent, RunStatus, Step
from apps.runs.retention import retention_sweep as audit_retention_sweep
from tests.factories.audit import add_steps_and_events, make_run
from tests.factories.governance import TeamFactory

pytestmark = pytest.mark.runtime


def aged(run: Run, days: int) -> Run:
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(days=days))
    run.refresh_from_db()
    return run


@pytest.mark.django_db
def test_sweep_erases_old_content_and_keeps_the_chain() -> None:
    team = TeamFactory(slug="short", retention_days=30)
    keep_team = TeamFactory(slug="forever")
    question, answer = "Confidential merger question", "Confidential merger answer"
    old = aged(make_run(team, question=question, answer=answer, error="provider said: Confidential"), 40)
    add_steps_and_events(old, instruction="Summarise the confidential memo", output="The memo says X")
    recent = aged(make_run(team, question="recent q"), 5)
    running = aged(make_run(team, question="still running", status=RunStatus.RUNNING), 40)
    untouched = aged(make_run(keep_team, question="kept forever"), 400)

    assert audit_retention_sweep() == 1

    old.refresh_from_db()
    assert (old.question, old.answer, old.error) == ("", "", "")
    assert old.payload_erased_at is not None
    step = Step.objects.get(run=old)
    assert (step.instruction, step.output, step.messages) == ("", "", [])
    data = {ev.type: ev.data for ev in RunEvent.objects.filter(run=old)}
    assert data["run.started"] == {"question": "", "strategy": "conductor"}
    assert data["step.finished"]["output"] == "" and data["step.finished"]["usage"] == {"input_tokens": 3}
    assert data["run.finished"] == {"status": "succeeded", "answer": ""}
    for run, text in ((recent, "recent q"), (running, "still running"), (untouched, "kept forever")):
        run.refresh_from_db()
        assert run.question == text and run.payload_erased_at is None

    (erased,) = AuditEvent.objects.filter(event_type=AuditEventType.RUN_PAYLOAD_ERASED)
    assert erased.run_id == old.pk and erased.team_id == team.pk
    assert erased.payload["run"]["question"] == content_sha256(question)
    assert erased.payload["run"]["answer"] == content_sha256(answer)
    assert erased.payload["steps"][0]["output"] == content_sha256("The memo says X")
    assert erased.payload["events"]["changed"] == 3
    assert erased.payload["retention_days"] == 30
    everything = str(list(AuditEvent.objects.values_list("payload", flat=True)))
    assert "Confidential" not in everything and "memo says" not in everything

    assert verify_chain(key=hmac_key()).ok
    assert audit_retention_sweep() == 0  # idempotent


@pytest.mark.django_db
def test_command_and_task_run_the_sweep() -> None:
    team = TeamFactory(slug="brief", retention_days=1)
    for _ in range(3):
        aged(make_run(team, question="old"), 3)
    out = StringIO()
    call_command("audit_retention_sweep", "--limit", "2", stdout=out)
    assert "erased the content of 2 run(s)" in out.getvalue()
    from apps.runs.tasks import retention_sweep as task

    assert task.run() == 1
    assert not Run.objects.filter(payload_erased_at__isnull=True).exists()
    assert AuditEvent.objects.filter(event_type=AuditEventType.RUN_PAYLOAD_ERASED).count() == 3
