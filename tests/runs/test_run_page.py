"""Run page: the policy version as its number, cancel in place (JSON), step replay with a new subtask."""

from __future__ import annotations

from typing import Any, cast

import pytest
from django.urls import reverse

from apps.runs.models import Run, RunStatus
from tests.factories.runs import RunFactory, StepFactory


def make_run(**fields: Any) -> Run:
    """A ``RunFactory`` run, typed as the model (factory_boy's stubs type it as the factory)."""
    return cast(Run, RunFactory(**fields))


pytestmark = pytest.mark.django_db

EXACT = [
    {"role": "user", "content": "How many legs?"},
    {"role": "user", "content": "Outline."},
    {"role": "assistant", "content": "An outline."},
    {"role": "user", "content": "Answer using the outline."},
]


def test_policy_version_shows_its_number_and_links_to_it(
    client: Any, fake_pool: Any, owner: Any, alpha: Any, alpha_policy: Any
) -> None:
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner, policy_version=alpha_policy)
    client.force_login(owner)
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    history = reverse("policies:policy_history", args=[alpha_policy.policy_id])
    assert f'<a href="{history}?b={alpha_policy.number}">v{alpha_policy.number}</a>' in page
    assert f"of team {alpha.slug}'s policy" in page


def test_run_without_a_policy_version_says_platform_default(
    client: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner, policy_version=None)
    client.force_login(owner)
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert 'data-testid="run-policy-version">platform default<' in page


def test_cancel_in_place_answers_json(client: Any, fake_pool: Any, owner: Any, alpha: Any) -> None:
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.RUNNING)
    client.force_login(owner)
    response = client.post(reverse("runs:cancel", args=[run.id]), HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response.json() == {"id": str(run.id), "status": "running", "cancel_requested": True}
    run.refresh_from_db()
    assert run.cancel_requested


def test_cancel_refusal_names_the_rule(
    client: Any, fake_pool: Any, owner: Any, reviewer: Any, alpha: Any
) -> None:
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner)
    client.force_login(reviewer)
    assert (
        'data-testid="run-cancel"' not in client.get(reverse("runs:detail", args=[run.id])).content.decode()
    )
    response = client.post(reverse("runs:cancel", args=[run.id]), HTTP_ACCEPT="application/json")
    assert response.status_code == 403 and b"may not cancel" in response.content
    run.refresh_from_db()
    assert not run.cancel_requested and run.status == RunStatus.QUEUED


def test_step_replay_with_a_new_subtask_keeps_the_question(
    client: Any, fake_pool: Any, owner: Any, alpha: Any, django_capture_on_commit_callbacks: Any
) -> None:
    run = make_run(
        team=alpha,
        pool=fake_pool.pool,
        created_by=owner,
        status=RunStatus.SUCCEEDED,
        question="How many legs?",
    )
    StepFactory(
        run=run, index=1, worker_key="fake-solver", instruction="Answer using the outline.", messages=EXACT
    )
    client.force_login(owner)
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(
            reverse("runs:step_replay", args=[run.id, 1]), {"instruction": "  Reply with the number only. "}
        )
    new = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302 and f"run={new.id}" in response["Location"]
    assert new.question == "How many legs?"
    assert new.replay_messages == [*EXACT[:-1], {"role": "user", "content": "Reply with the number only."}]
    assert new.strategy == "single" and new.worker is not None and new.worker.slug == "fake-solver"
    # The stored step is untouched.
    assert run.steps.get(index=1).messages == EXACT
    # The playground it lands on keeps the question in the form.
    page = client.get(response["Location"]).content.decode()
    assert "How many legs?</textarea>" in page


def test_an_edited_subtask_is_refused_where_input_guardrails_apply(
    client: Any, fake_pool: Any, owner: Any, alpha: Any, alpha_policy: Any
) -> None:
    # alpha_policy redacts PII on input; replayed messages are sent verbatim, past that check.
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.SUCCEEDED)
    StepFactory(
        run=run, index=1, worker_key="fake-solver", instruction="Answer using the outline.", messages=EXACT
    )
    client.force_login(owner)
    url = reverse("runs:step_replay", args=[run.id, 1])
    response = client.post(url, {"instruction": "My card is 4111 1111 1111 1111."}, follow=True)
    assert "checks input with guardrails.input.pii" in response.content.decode()
    assert Run.objects.count() == 1
    # An unchanged replay is still offered (the stored messages already passed the checks).
    assert client.post(url, {"instruction": "Answer using the outline."}).status_code == 302
    assert Run.objects.exclude(pk=run.pk).get().replay_messages == EXACT


def test_step_replay_refuses_an_overlong_subtask(client: Any, fake_pool: Any, owner: Any, alpha: Any) -> None:
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.SUCCEEDED)
    StepFactory(run=run, index=0, worker_key="fake-solver", instruction="Do it.", messages=EXACT)
    client.force_login(owner)
    response = client.post(
        reverse("runs:step_replay", args=[run.id, 0]), {"instruction": "x" * 4001}, follow=True
    )
    assert "The subtask is too long (4000 characters at most)." in response.content.decode()
    assert Run.objects.count() == 1


def test_run_view_offers_replay_with_changes_and_inspector_controls(
    client: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner)
    client.force_login(owner)
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert f'href="{reverse("playground")}?replay={run.id}"' in page
    for testid in ("run-progress", "replay-instruction", "inspector-close", "run-cancel"):
        assert f'data-testid="{testid}"' in page
    assert page.count('data-testid="run-cancel"') == 1


def test_a_guarded_team_is_offered_only_the_unchanged_replay(
    client: Any, fake_pool: Any, owner: Any, alpha: Any, publish: Any
) -> None:
    # Issue 42 item 7: the edit that step_replay would refuse is not offered; the form says why.
    run = make_run(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.SUCCEEDED)
    StepFactory(run=run, index=0, worker_key="fake-solver", messages=EXACT)
    client.force_login(owner)
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert 'data-testid="replay-guarded"' not in page and "edit to change it" in page
    publish(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}})
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert 'data-testid="replay-guarded"' in page and "guardrails.input.pii" in page
    assert "edit to change it" not in page
    textarea = page.split('data-testid="replay-instruction"', 1)[1].split(">", 1)[0]
    assert "readonly" in textarea
