"""run_create's refusals and what it stores (execution itself: test_execution.py)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.runs.models import Run, RunStatus
from apps.runs.services import RunRefused, run_create

pytestmark = pytest.mark.django_db


def _no_dispatch(monkeypatch: Any) -> list[Any]:
    sent: list[Any] = []
    monkeypatch.setattr(
        "apps.runs.execution.outbox.dispatch_run", lambda run_id, request_id="": sent.append(run_id)
    )
    return sent


def test_run_is_stored_queued_with_deadline_and_audit(
    fake_pool: Any, owner: Any, monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    sent = _no_dispatch(monkeypatch)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_create(
            actor=owner, pool=fake_pool.pool, question="  Why is the sky blue?  ", strategy="moa"
        )
    assert sent == [run.id]  # dispatched once, after commit
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.team.slug == "alpha" and run.created_by == owner
    assert run.question == "Why is the sky blue?" and run.preset == "" and run.deadline_at > run.created_at
    event = AuditEvent.objects.get(run_id=run.id)
    assert event.event_type == "run.created" and event.actor == owner
    assert event.payload["question"]["chars"] == len("Why is the sky blue?")
    assert "sky" not in str(event.payload)


def test_team_and_pool_default_from_the_user(fake_pool: Any, owner: Any, monkeypatch: Any) -> None:
    _no_dispatch(monkeypatch)
    run = run_create(actor=owner, question="hi")
    assert run.pool == fake_pool.pool and run.strategy == "conductor" and run.preset == "mini"


@pytest.mark.parametrize("who", ["outsider", "reviewer"])
def test_users_who_may_not_run_are_refused_and_it_is_audited(fake_pool: Any, request: Any, who: str) -> None:
    user = request.getfixturevalue(who)
    with pytest.raises(RunRefused) as info:
        run_create(actor=user, pool=fake_pool.pool, question="hi")
    assert info.value.code == "pool_not_allowed"
    assert not Run.objects.exists()
    assert AuditEvent.objects.filter(event_type="run.refused", actor=user).exists()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"question": "   "}, "empty"),
        ({"question": "x" * 40_000}, "longer than"),
        ({"question": "hi", "strategy": "bogus"}, "Unknown strategy"),
        ({"question": "hi", "preset": "mega"}, "mini"),
        ({"question": "hi", "replay_messages": [{"role": "user"}]}, "Replay messages"),
    ],
)
def test_invalid_requests_say_what_is_wrong(
    fake_pool: Any, owner: Any, kwargs: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(RunRefused) as info:
        run_create(actor=owner, pool=fake_pool.pool, **kwargs)
    assert info.value.code == "invalid" and fragment in info.value.message
    assert not Run.objects.exists()


def test_disabled_pool_is_unavailable(fake_pool: Any, owner: Any) -> None:
    fake_pool.pool.enabled = False
    fake_pool.pool.save(update_fields=["enabled"])
    with pytest.raises(RunRefused) as info:
        run_create(actor=owner, pool=fake_pool.pool, question="hi")
    assert info.value.code == "pool_unavailable" and "disabled" in info.value.message


def test_budget_refusal_names_the_budget(fake_pool: Any, owner: Any, monkeypatch: Any) -> None:
    from apps.runs import integration

    def spent(team: Any, policy: Any) -> None:
        raise integration.BudgetRefusal(
            "daily_cost_usd", "The team's daily cost budget ($5.00) is spent.", 3600
        )

    monkeypatch.setattr(integration, "check_budget", spent)
    with pytest.raises(RunRefused) as info:
        run_create(actor=owner, pool=fake_pool.pool, question="hi")
    assert info.value.code == "budget_exhausted" and info.value.retry_after_s == 3600
    assert "daily cost budget" in info.value.message
    assert not Run.objects.exists() and fake_pool.server.requests == []
    assert AuditEvent.objects.get(event_type="run.refused").payload["budget"] == "daily_cost_usd"
