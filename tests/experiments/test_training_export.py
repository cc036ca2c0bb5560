"""Training export (issue 19): conductor prompts and plans with rewards (GRPO-style) and approved
answers in OpenAI chat fine-tuning format — never a held answer, erased content, an unapproved
answer or a masked question's original text; audited with counts only; team admins only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

EMAIL = "jane@example.com"


def _run(fake_pool: Any, owner: Any, alpha: Any, question: str) -> Any:
    from apps.runs.services import run_create, run_wait

    run = run_wait(
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question=question, source="playground").id,
        60,
    )
    assert run.status == "succeeded", (run.status, run.error)
    return run


def _lines(response: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.content.decode().splitlines() if line.strip()]


def test_export_pairs_prompts_plans_and_rewards_and_keeps_what_must_not_leave(
    runtime_workers: Any, fake_pool: Any, owner: Any, team_admin: Any, reviewer: Any, alpha: Any
) -> None:
    from apps.audit.models import AuditEvent
    from apps.feedback.services import feedback_record
    from apps.runs.models import Run
    from tests.factories.policies import publish_policy
    from tests.fixtures.runs import scripted_plan

    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}})
    good = _run(fake_pool, owner, alpha, "What is 6 times 7?")
    bad = _run(fake_pool, owner, alpha, "What is the capital of Peru?")
    masked = _run(fake_pool, owner, alpha, f"Write to {EMAIL} about 6 times 7")
    unrated = _run(fake_pool, owner, alpha, "Unrated question")
    held = _run(fake_pool, owner, alpha, "Held question")
    erased = _run(fake_pool, owner, alpha, "Erased question")
    Run.objects.filter(pk=held.pk).update(answer_held=True)
    Run.objects.filter(pk=erased.pk).update(payload_erased_at=timezone.now())
    for run, value in ((good, True), (bad, False), (masked, True), (held, True), (erased, True)):
        feedback_record(run=run, metric_name="helpful", value=value, comment="", source="thumbs", user=owner)

    admin = Client()
    admin.force_login(team_admin)
    url = reverse("experiments:training_export", args=[alpha.slug])
    conductor = admin.get(url, {"kind": "conductor"})
    assert conductor.status_code == 200 and conductor["Content-Type"].startswith("application/x-ndjson")
    rows = {r["run_id"]: r for r in _lines(conductor)}
    assert set(rows) == {str(good.pk), str(bad.pk), str(masked.pk)}
    assert rows[str(good.pk)]["reward"] == 1.0 and rows[str(bad.pk)]["reward"] == 0.0
    assert rows[str(good.pk)]["reward_source"] == "feedback:helpful"
    prompt = rows[str(good.pk)]["prompt"]
    assert prompt[0]["role"] == "system" and prompt[-1] == {"role": "user", "content": "What is 6 times 7?"}
    assert rows[str(good.pk)]["plan"]["steps"] and rows[str(good.pk)]["completion"]
    # The masked question goes out as the conductor saw it, never the address.
    assert EMAIL not in conductor.content.decode()
    assert "unrated" not in conductor.content.decode().lower()
    skipped = conductor["X-Export-Skipped"]
    assert "answer held for review: 1" in skipped and "content erased by retention: 1" in skipped

    chat = admin.get(url, {"kind": "chat"})
    messages = [r["messages"] for r in _lines(chat)]
    questions = [m[0]["content"] for m in messages]
    assert "What is 6 times 7?" in questions and "What is the capital of Peru?" not in questions
    assert all(m[1]["role"] == "assistant" and m[1]["content"] for m in messages)
    assert EMAIL not in chat.content.decode() and any("6 times 7" in q and "[" in q for q in questions)
    assert str(unrated.pk) not in chat.content.decode()

    audit = AuditEvent.objects.filter(event_type="training.exported").order_by("id")
    assert [a.payload["kind"] for a in audit] == ["conductor", "chat"]
    assert audit[0].payload["rows"] == 3 and "What is" not in json.dumps(audit[0].payload)

    # Reviewers and members may not export; an unknown kind is a 400 naming the field.
    other = Client()
    other.force_login(reviewer)
    refused = other.get(url, {"kind": "chat"})
    assert refused.status_code == 403 and "governance.manage_team" in refused.content.decode()
    assert admin.get(url, {"kind": "everything"}).status_code == 400
