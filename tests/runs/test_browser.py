"""The playground in a real browser against a live daphne (and Celery in distributed mode)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.runs.models import Run
from tests.fixtures.runs import scripted_plan

pytestmark = [pytest.mark.browser, pytest.mark.runtime]


def test_playground_live_graph_inspector_and_reload(
    transactional_db: Any, runtime_workers: Any, daphne_server: Any, login: Any, fake_pool: Any, owner: Any
) -> None:
    # Each worker answers after 1.5 s and the plan is a chain, so "mid-run" lasts seconds.
    scripted_plan(fake_pool.server, delay=1.5)
    page = login(owner)
    page.goto(f"{daphne_server.url}/playground/")
    page.fill("[data-testid=prompt-input]", "How many legs do 3 spiders have? <i>now</i>")
    page.select_option("[data-testid=strategy-select]", "conductor-mini")
    page.select_option("[data-testid=pool-select]", label="Fake pool")
    page.click("[data-testid=run-submit]")

    page.wait_for_selector("[data-testid=step-graph] .main-svg")
    page.wait_for_selector("[data-testid=step-node-0]")
    # Nodes appear as steps start: step 2 reads step 1, which reads step 0, so it cannot exist yet.
    assert page.locator("[data-testid=step-node-2]").count() == 0
    assert page.get_attribute("[data-testid=final-answer]", "data-ready") == "false"
    assert page.text_content("[data-testid=run-status]").startswith("running")

    # Reload mid-run: the graph comes back from the snapshot and keeps growing.
    page.wait_for_selector("[data-testid=step-node-1]")
    page.reload()
    page.wait_for_selector("[data-testid=step-node-0][data-status=succeeded]")
    page.wait_for_selector("[data-testid=step-node-1]")
    assert page.get_attribute("[data-testid=final-answer]", "data-ready") == "false"
    page.wait_for_selector("[data-testid=step-node-2]")
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=30_000)

    run = Run.objects.get()
    assert run.status == "succeeded"
    answer = page.text_content("[data-testid=final-answer]")
    assert answer == run.answer and answer.startswith("fake-critic-1 says")
    assert page.text_content("[data-testid=run-status]").startswith("succeeded")
    # The plotly graph has one marker per step, plus the conductor's planning node.
    assert page.locator("[data-testid=step-graph] .scatterlayer .trace:last-child .point").count() == 4

    # The inspector shows the exact messages step 1 saw: the question and step 0's output.
    page.click("[data-testid=step-node-1]")
    messages = page.text_content("[data-testid=inspector-messages]")
    stored = run.steps.get(index=1).messages
    for m in stored:
        assert m["content"] in messages
    assert "fake-planner-1 says" in messages and "<i>now</i>" in messages
    assert page.text_content("[data-testid=inspector-access]") == "step 1"
    # Model output is shown as text: the worker's <b> tag is literal, not markup.
    output = page.text_content("[data-testid=inspector-output]")
    assert "<b>" in output
    assert page.locator("[data-testid=step-inspector] b").count() == 0
    assert page.locator("[data-testid=final-answer] b").count() == 0


def test_the_answer_panel_streams_the_released_answer(
    transactional_db: Any, runtime_workers: Any, daphne_server: Any, login: Any, fake_pool: Any, owner: Any
) -> None:
    """Issue 45: the answer panel shows the answer as the output gate releases it, before the
    worker finished (it is paused mid-answer until the panel shows text)."""
    import json
    import threading

    from tests.fakes.base import FakeReply
    from tests.fixtures.runs import CONDUCTOR_MODEL

    resume = threading.Event()
    plan = {"model_id": [0], "subtasks": ["Answer."], "access_list": [[]]}
    answer = FakeReply(chunks=["The answer ", "is forty-two, ", "as computed."], pause_after=2, resume=resume)

    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            return FakeReply(json.dumps(plan))
        return answer

    fake_pool.server.responder = respond
    page = login(owner)
    page.goto(f"{daphne_server.url}/playground/")
    page.fill("[data-testid=prompt-input]", "What is six times seven?")
    page.select_option("[data-testid=strategy-select]", "conductor-mini")
    page.select_option("[data-testid=pool-select]", label="Fake pool")
    try:
        page.click("[data-testid=run-submit]")
        page.wait_for_selector("[data-testid=final-answer][data-streaming=true]", timeout=30_000)
        live = page.text_content("[data-testid=final-answer]")
        assert live.startswith("The answer") and not answer.pause_expired
        assert page.get_attribute("[data-testid=final-answer]", "data-ready") == "false"
    finally:
        resume.set()
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=30_000)
    assert page.text_content("[data-testid=final-answer]") == Run.objects.get().answer


def test_run_page_of_a_failed_and_of_a_partial_run(
    transactional_db: Any, daphne_server: Any, login: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    """Issue 44: a failed run's error sat in the "Answer" box and the page asked "Helpful?"."""
    from django.utils import timezone

    from tests.factories.runs import RunFactory

    error = "Step 2 (Fake solver) timed out: The worker did not answer within 1.0 s."
    ended = {"team": alpha, "pool": fake_pool.pool, "created_by": owner, "finished_at": timezone.now()}
    failed = RunFactory(status="failed", status_reason="step_timed_out", error=error, answer="", **ended)
    partial = RunFactory(
        status="succeeded", status_reason="partial", error=error, answer="Round one's answer.", **ended
    )
    page = login(owner)

    page.goto(f"{daphne_server.url}/runs/{failed.id}/")
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=30_000)
    assert page.text_content("[data-testid=final-answer]") == "(no answer: the run failed)"
    assert error in page.text_content("[data-role=progress]")  # why, where the status is
    assert not page.is_visible("[data-testid=thumbs-up]")
    assert not page.is_visible("[data-testid=partial-note]")

    page.goto(f"{daphne_server.url}/runs/{partial.id}/")
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=30_000)
    assert page.text_content("[data-testid=final-answer]") == "Round one's answer."
    assert page.get_attribute("[data-testid=final-answer]", "data-partial") == "true"
    assert page.is_visible("[data-testid=partial-note]")
    assert "partial answer from an earlier round" in page.text_content("[data-role=progress]")
    assert page.is_visible("[data-testid=thumbs-up]")


def test_steps_behind_a_one_slot_worker_show_as_waiting_not_running(
    transactional_db: Any, runtime_workers: Any, daphne_server: Any, login: Any, fake_pool: Any, owner: Any
) -> None:
    """Issue 44: two parallel steps on a worker that takes one call at a time. The one without the
    slot is *waiting* (its node, its colour in the graph, the progress line, and after a reload
    from the stored step), never "running in parallel"; once the slot frees, it runs."""
    import json
    import threading

    from django.utils import timezone

    from apps.workers.models import Pool, Worker
    from tests.fakes.base import FakeReply
    from tests.fixtures.runs import CONDUCTOR_MODEL, worker_answer

    Worker.objects.filter(slug="fake-solver").update(max_concurrency=1)
    Pool.objects.filter(pk=fake_pool.pool.pk).update(updated_at=timezone.now())  # rebuild the pool
    hold = threading.Event()
    plan = {
        "model_id": [1, 1, 2],
        "subtasks": ["Solve part one.", "Solve part two.", "Check both."],
        "access_list": [[], [], [0, 1]],
    }

    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            return FakeReply(json.dumps(plan))
        reply = worker_answer(str(req.get("model")), req.get("messages") or [])
        return FakeReply(reply, hold=hold if req.get("model") == "fake-solver-1" else None)

    fake_pool.server.responder = respond
    page = login(owner)
    try:
        page.goto(f"{daphne_server.url}/playground/")
        page.fill("[data-testid=prompt-input]", "Two parts on one model?")
        page.select_option("[data-testid=strategy-select]", "conductor-mini")
        page.select_option("[data-testid=pool-select]", label="Fake pool")
        page.click("[data-testid=run-submit]")
        page.wait_for_selector("[data-testid=step-graph] .main-svg")
        waiting = page.wait_for_selector("[data-role=nodes] [data-status=waiting]", timeout=30_000)
        assert "— waiting" in (waiting.text_content() or "")
        page.wait_for_selector("[data-role=nodes] [data-status=running]")
        progress = page.text_content("[data-role=progress]") or ""
        assert "wait for the model Fake solver" in progress or "waits for the model Fake solver" in progress
        assert "in parallel" not in progress
        colours = page.evaluate(
            "() => document.querySelector('[data-testid=step-graph]').data[1].marker.color"
        )
        assert "#9dbcf0" in colours and "#2f6fde" in colours  # one waiting, one running
        # A late viewer sees the same: the stored step says waiting.
        page.reload()
        page.wait_for_selector("[data-role=nodes] [data-status=waiting]", timeout=30_000)
    finally:
        hold.set()
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=30_000)
    run = Run.objects.get(question="Two parts on one model?")
    assert run.status == "succeeded"
    assert {s.index: s.status for s in run.steps.all()} == {0: "succeeded", 1: "succeeded", 2: "succeeded"}
    assert page.locator("[data-role=nodes] [data-status=waiting]").count() == 0
