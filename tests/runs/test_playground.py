"""Playground: the planning node's events (plan.started) and the form's replay/compare/local-note."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from django.urls import reverse

from apps.runs import selectors
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.services import run_create, run_wait
from tests.factories.runs import RunFactory
from tests.fakes.base import FakeReply
from tests.fixtures.runs import CONDUCTOR_MODEL, worker_answer


def make_run(**fields: Any) -> Run:
    """A ``RunFactory`` run, typed as the model (factory_boy's stubs type it as the factory)."""
    return cast(Run, RunFactory(**fields))


# Round 1 asks the conductor itself (id 3 in a 3-worker pool) to review; round 2 answers.
ROUND_1 = {
    "model_id": [0, 3],
    "subtasks": ["Draft an answer.", "Review and continue."],
    "access_list": [[], [0]],
}
ROUND_2 = {"model_id": [2], "subtasks": ["Give the final answer."], "access_list": ["all"]}


def _recursive(server: Any) -> None:
    calls: list[int] = []

    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            calls.append(1)
            return FakeReply(json.dumps(ROUND_1 if len(calls) == 1 else ROUND_2))
        return FakeReply(worker_answer(str(req.get("model")), req.get("messages") or []))

    server.responder = respond


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_each_planning_call_is_announced_before_its_plan(
    runtime_workers: Any, fake_pool: Any, owner: Any
) -> None:
    _recursive(fake_pool.server)
    run = run_create(actor=owner, pool=fake_pool.pool, question="Q?", strategy="conductor", preset="ultra")
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)

    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", "data"))
    types = [t for t, _ in events]
    started = [d for t, d in events if t == "plan.started"]
    # Both plans were accepted as sent: two planning calls, no repair, no fallback.
    assert [(d["round"], d["source"], d["error"]) for t, d in events if t == "plan.proposed"] == [
        (1, "conductor", None),
        (2, "conductor", None),
    ]
    assert [d["round"] for d in started] == [1, 2]
    assert started[0]["worker_key"] == "fake-conductor" and started[0]["model"] == "fake-conductor-1"
    assert started[0]["worker_name"] == "Fake conductor"
    # Round 2 continues the indices after the conductor's own step (index 1).
    assert [d["first"] for d in started] == [0, 2]
    # Each plan.started comes before its round's first plan.proposed; the re-plan's after the
    # conductor step started (the node it hangs from), and both after the input check.
    proposed = [i for i, (t, d) in enumerate(events) if t == "plan.proposed"]
    starts = [i for i, t in enumerate(types) if t == "plan.started"]
    assert starts[0] < proposed[0] and starts[1] < proposed[-1] and starts[1] > proposed[0]
    self_started = next(i for i, (t, d) in enumerate(events) if t == "step.started" and d["index"] == 1)
    assert self_started < starts[1]
    assert types.index("guardrail.checked") < starts[0]

    # A late viewer's snapshot carries the planning events (the run page rebuilds the nodes from them).
    snapshot, _ = selectors.run_snapshot(user=owner, run_id=run.id)
    assert [d["type"] for d in snapshot["decisions"] if d["type"] == "plan.started"] == ["plan.started"] * 2


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_strategies_without_a_planning_call_announce_none(
    runtime_workers: Any, run_pool: Any, owner: Any
) -> None:
    run = run_create(actor=owner, pool=run_pool.pool, question="Q?", strategy="single")
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED
    assert not RunEvent.objects.filter(run=run, type="plan.started").exists()


@pytest.mark.django_db
def test_replay_link_fills_the_form_from_the_run(client: Any, fake_pool: Any, owner: Any, alpha: Any) -> None:
    run = make_run(
        team=alpha, pool=fake_pool.pool, created_by=owner, question="Keep <this> question?", preset="ultra"
    )
    client.force_login(owner)
    page = client.get(reverse("playground") + f"?replay={run.id}").content.decode()
    assert 'data-testid="replay-note"' in page
    assert "Keep &lt;this&gt; question?</textarea>" in page
    assert '<option value="conductor-ultra" selected>' in page
    assert f'<option value="{fake_pool.pool.pk}" selected>' in page
    # The replay source is only shown in the form: no live view of it.
    assert "data-run-view" not in page


@pytest.mark.django_db
def test_replay_of_an_invisible_run_fills_nothing(
    client: Any, fake_pool: Any, outsider: Any, alpha: Any
) -> None:
    run = make_run(team=alpha, pool=fake_pool.pool, question="Alpha's secret question?")
    client.force_login(outsider)
    page = client.get(reverse("playground") + f"?replay={run.id}").content.decode()
    assert "Alpha's secret question" not in page and 'data-testid="replay-note"' not in page


@pytest.mark.django_db
def test_compare_shows_both_runs_and_keeps_both_strategies(
    client: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    first = make_run(team=alpha, pool=fake_pool.pool, created_by=owner, question="Same?", preset="mini")
    second = make_run(
        team=alpha, pool=fake_pool.pool, created_by=owner, question="Same?", strategy="single", preset=""
    )
    client.force_login(owner)
    page = client.get(reverse("playground") + f"?run={first.id}&compare={second.id}").content.decode()
    assert page.count("data-run-view ") == 2 and 'data-testid="compare-heading"' in page
    assert '<option value="single" selected>' in page  # the compare select keeps the second strategy
    assert page.count('data-testid="run-cancel"') == 2  # both queued, both the owner's


@pytest.mark.django_db
def test_post_with_compare_starts_two_runs(
    client: Any, fake_pool: Any, owner: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(owner)
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(
            reverse("playground"),
            {"prompt": "Same?", "strategy": "conductor-mini", "compare": "single", "pool": fake_pool.pool.pk},
        )
    assert response.status_code == 302
    assert "run=" in response["Location"] and "compare=" in response["Location"]


@pytest.mark.django_db
def test_local_pool_carries_the_demo_model_note(client: Any, local_pool: Any, owner: Any, alpha: Any) -> None:
    client.force_login(owner)
    page = client.get(reverse("playground")).content.decode()
    assert 'data-testid="local-pool-note"' in page and "not for answers" in page
    model = local_pool.pool_workers.first().worker.model_name
    assert model in page
    run = make_run(team=alpha, pool=local_pool, created_by=owner)
    detail = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert 'data-testid="local-pool-note"' in detail and "tiny model" in detail


@pytest.mark.django_db
def test_no_demo_note_for_a_real_pool(client: Any, fake_pool: Any, owner: Any, alpha: Any) -> None:
    client.force_login(owner)
    assert 'data-testid="local-pool-note"' not in client.get(reverse("playground")).content.decode()
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner)
    assert (
        'data-testid="local-pool-note"'
        not in client.get(reverse("runs:detail", args=[run.id])).content.decode()
    )
