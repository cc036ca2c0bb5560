"""Playground form, runs list and run page (rendering, filters, escaping)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.runs.models import Run, RunStatus
from tests.factories.runs import RunEventFactory, RunFactory, StepFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch: Any) -> None:
    monkeypatch.setattr("apps.runs.execution.outbox.dispatch_run", lambda run_id, request_id="": None)


def test_playground_offers_only_usable_pools(client: Any, fake_pool: Any, owner: Any, outsider: Any) -> None:
    client.force_login(owner)
    page = client.get(reverse("playground")).content.decode()
    assert 'data-testid="prompt-input"' in page and "Fake pool" in page
    client.force_login(outsider)
    page = client.get(reverse("playground")).content.decode()
    assert "Fake pool" not in page and 'data-testid="no-pools"' in page


def test_playground_post_creates_and_redirects_to_the_live_view(
    client: Any, fake_pool: Any, owner: Any
) -> None:
    client.force_login(owner)
    response = client.post(
        reverse("playground"),
        {"prompt": "hi", "strategy": "conductor-ultra", "pool": fake_pool.pool.pk, "compare": "moa"},
    )
    runs = list(Run.objects.order_by("created_at"))
    assert [(r.strategy, r.preset) for r in runs] == [("conductor", "ultra"), ("moa", "")]
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('playground')}?run={runs[0].id}&compare={runs[1].id}"
    page = client.get(response["Location"]).content.decode()
    assert page.count("data-run-view") == 2 and 'data-testid="step-graph"' in page


def test_playground_errors_are_field_specific(client: Any, fake_pool: Any, owner: Any) -> None:
    client.force_login(owner)
    page = client.post(
        reverse("playground"),
        {
            "prompt": "",
            "strategy": "moa",
            "pool": fake_pool.pool.pk,
            "compare": "moa",
            "worker": fake_pool.workers[0].pk,
        },
    ).content.decode()
    assert "Write a prompt to run." in page
    assert "only chosen for the single-worker strategy" in page
    assert "Choose a different strategy" in page
    assert not Run.objects.exists()


def test_run_list_filters_and_visibility(
    client: Any, fake_pool: Any, owner: Any, teammate: Any, outsider: Any, alpha: Any
) -> None:
    mine = RunFactory(
        team=alpha,
        pool=fake_pool.pool,
        created_by=owner,
        status=RunStatus.SUCCEEDED,
        strategy="moa",
        preset="",
    )
    theirs = RunFactory(team=alpha, pool=fake_pool.pool, created_by=teammate, status=RunStatus.FAILED)
    StepFactory(run=theirs, index=0, worker_key="fake-critic")
    client.force_login(owner)

    def ids(**query: Any) -> set[str]:
        page = client.get(reverse("runs:list"), query).content.decode()
        return {str(r.id) for r in (mine, theirs) if str(r.id) in page}

    assert ids() == {str(mine.id), str(theirs.id)}
    assert ids(status="failed") == {str(theirs.id)}
    assert ids(strategy="moa") == {str(mine.id)}
    assert ids(user="teammate") == {str(theirs.id)}
    assert ids(worker="fake-critic") == {str(theirs.id)}
    assert ids(team="beta") == set()
    assert ids(date_from=(timezone.now() + timedelta(days=1)).date().isoformat()) == set()
    page = client.get(
        reverse("runs:list"), {"date_from": "2026-02-02", "date_to": "2026-01-01"}
    ).content.decode()
    assert "The end date is before the start date." in page
    client.force_login(outsider)
    page = client.get(reverse("runs:list")).content.decode()
    assert str(mine.id) not in page and str(theirs.id) not in page


def test_run_list_paginates_without_counting(client: Any, fake_pool: Any, owner: Any, alpha: Any) -> None:
    for _ in range(55):
        RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner)
    client.force_login(owner)
    first = client.get(reverse("runs:list")).content.decode()
    assert first.count('data-testid="run-row"') == 50 and 'rel="next"' in first
    second = client.get(reverse("runs:list"), {"page": 2}).content.decode()
    assert (
        second.count('data-testid="run-row"') == 5 and 'rel="next"' not in second and 'rel="prev"' in second
    )


def test_run_page_shows_decisions_and_escapes_untrusted_text(
    client: Any, fake_pool: Any, owner: Any, outsider: Any, alpha: Any
) -> None:
    run = RunFactory(
        team=alpha,
        pool=fake_pool.pool,
        created_by=owner,
        status=RunStatus.SUCCEEDED,
        question="<script>alert(1)</script>",
    )
    plan = {
        "steps": [
            {
                "index": 0,
                "worker": 0,
                "worker_key": "fake-planner",
                "instruction": "<img src=x onerror=1>",
                "access": [],
            }
        ]
    }
    repaired = {
        "steps": [
            {"index": 0, "worker": 1, "worker_key": "fake-solver", "instruction": "Solve", "access": []}
        ]
    }
    RunEventFactory(
        run=run,
        seq=1,
        type="plan.validated",
        data={
            "round": 1,
            "action": "repaired",
            "violations": [
                {"code": "worker_not_allowed", "message": "fake-planner is not allowed", "step": 0}
            ],
            "original": plan,
            "plan": repaired,
            "reason": None,
        },
    )
    RunEventFactory(
        run=run,
        seq=2,
        type="guardrail.checked",
        data={
            "stage": "input",
            "step": None,
            "checks": [
                {"name": "pii", "stage": "input", "status": "not_run", "action": "none", "detail": ""}
            ],
            "blocked": False,
            "flags": [],
        },
    )
    client.force_login(owner)
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page and "&lt;img src=x onerror=1&gt;" in page
    assert "worker_not_allowed" in page and "Plan repaired" in page and "fake-solver" in page
    assert "pii: not_run" in page
    assert 'data-testid="run-cancel"' not in page  # finished runs cannot be cancelled
    assert client.get(reverse("runs:detail", args=[run.id])).status_code == 200
    client.force_login(outsider)
    assert client.get(reverse("runs:detail", args=[run.id])).status_code == 404


def test_cancel_button_and_post(client: Any, fake_pool: Any, owner: Any, alpha: Any) -> None:
    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner)
    client.force_login(owner)
    assert 'data-testid="run-cancel"' in client.get(reverse("runs:detail", args=[run.id])).content.decode()
    response = client.post(reverse("runs:cancel", args=[run.id]))
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_replay_creates_a_single_step_run_with_the_exact_messages(
    client: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.SUCCEEDED)
    exact = [
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "Now step 1."},
    ]
    StepFactory(run=run, index=1, worker_key="fake-critic", messages=exact)
    client.force_login(owner)
    response = client.post(reverse("runs:step_replay", args=[run.id, 1]))
    new = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302 and str(new.id) in response["Location"]
    assert new.replay_messages == exact and new.strategy == "single" and new.worker.slug == "fake-critic"
