"""Experiments, second pass (issue 42 item 8), in Chromium at 1280 and 390 px against the live
daphne (Celery when distributed): the form names its fields as it labels them, an LLM judge is a
scorer beside exact and regex, and every question opens to each strategy's answer, score,
latency, cost and run, also where every strategy agrees (before, only disagreements had a path)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.experiments.models import Dataset, DatasetItem, Experiment, ExperimentRun
from apps.feedback.evaluators import JUDGE_SYSTEM
from tests.experiments.helpers import wait_runs_settled
from tests.fakes.base import FakeReply
from tests.fixtures.a11y import serious_violations
from tests.fixtures.runs import CONDUCTOR_MODEL, THREE_STEP_PLAN
from tests.runs.test_builder_journey import save_screen

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

QUESTIONS = [("What is 2 + 2?", "4"), ("Name a primary colour.", "red")]


def responder(req: dict[str, Any]) -> Any:
    messages = req.get("messages") or []
    if str(req.get("model")) == CONDUCTOR_MODEL:
        return FakeReply(json.dumps(THREE_STEP_PLAN))
    if messages and messages[0].get("content") == JUDGE_SYSTEM:
        return FakeReply("The answer meets most of the rubric.\nSCORE: 0.75")
    text = " ".join(str(m.get("content", "")) for m in messages)
    return FakeReply("4" if "2 + 2" in text else "red")


def _dataset(team: Any, owner: Any) -> Dataset:
    dataset = Dataset.objects.create(team=team, name="pair", created_by=owner, row_count=2)
    for i, (q, ref) in enumerate(QUESTIONS, start=1):
        DatasetItem.objects.create(
            dataset=dataset, index=i, messages=[{"role": "user", "content": q}], reference=ref
        )
    return dataset


@pytest.mark.parametrize("width", [1280, 390])
def test_judge_scorer_and_every_question_drill_down(
    transactional_db: Any,
    runtime_workers: Any,
    daphne_server: Any,
    login: Any,
    fake_pool: Any,
    owner: Any,
    alpha: Any,
    width: int,
) -> None:
    fake_pool.server.responder = responder
    _dataset(alpha, owner)
    page = login(owner)
    page.set_viewport_size({"width": width, "height": 900})
    try:
        page.goto(f"{daphne_server.url}/experiments/")
        # The field is labelled "Strategies": its error says so, never "Arms".
        page.select_option("#id_pool", "fake")
        page.click("[data-testid=experiment-start]")
        errors = page.text_content("[data-testid=experiment-errors]") or ""
        assert "Strategies: Pick at least one strategy to compare." in errors
        assert "Arms" not in errors
        # Strategies by the playground's names.
        assert page.locator("label:has-text('Single worker · fake-solver')").count() == 1
        assert page.locator("label:has-text('Mixture of agents')").count() == 1

        # The LLM judge needs a worker and a rubric, each refusal naming its field.
        page.check("input[name=arms][value='single:fake-solver']")
        page.check("input[name=arms][value='single:fake-planner']")
        page.select_option("#id_evaluator", "judge")
        page.click("[data-testid=experiment-start]")
        errors = page.text_content("[data-testid=experiment-errors]") or ""
        assert "Judge worker: The LLM judge needs a judge worker." in errors
        assert "Rubric: The LLM judge needs a rubric" in errors
        assert serious_violations(page) == []
        save_screen(page, f"experiments-form-{width}")

        page.check("input[name=arms][value='single:fake-solver']")
        page.check("input[name=arms][value='single:fake-planner']")
        page.select_option("#id_evaluator", "judge")
        page.select_option("#id_judge", "fake/fake-critic")
        page.fill("#id_rubric", "Correct and short.")
        page.click("[data-testid=experiment-start]")
        page.wait_for_selector("[data-testid=results-table]", timeout=60_000)
        exp = Experiment.objects.get()
        assert (exp.evaluator, exp.judge_worker, exp.rubric) == ("judge", "fake-critic", "Correct and short.")
        assert page.text_content("[data-testid=judge-worker]") == "fake-critic"
        accuracy = page.locator("[data-testid=accuracy]").all_text_contents()
        assert accuracy == ["75 %", "75 %"]
        # Both strategies agree on every question: no disagreement, yet every question opens.
        assert page.locator("[data-testid=no-disagreements]").count() == 1
        assert page.locator("[data-testid=question-row]").count() == 2
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert serious_violations(page) == []
        save_screen(page, f"experiment-results-{width}")

        page.click("[data-testid=question-link] >> nth=0")
        page.wait_for_selector("[data-testid=question-arm]")
        assert page.locator("[data-testid=question-arm]").count() == 2
        solver = page.locator("[data-testid=question-arm][data-arm='single:fake-solver']")
        assert solver.locator("h2").text_content() == "Single worker · fake-solver"
        assert solver.locator("[data-testid=arm-answer]").text_content() == "4"
        assert solver.locator("[data-testid=arm-score]").text_content() == "0.75"
        assert solver.locator("[data-testid=arm-note]").text_content() == "judge score 0.75"
        assert page.text_content("[data-testid=question-reference]") == "4"
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert serious_violations(page) == []
        save_screen(page, f"experiment-question-{width}")
        page.click("[data-testid=arm-run-link] >> nth=0")
        page.wait_for_url("**/runs/**")

        # Every judge call went to the chosen worker through the outbound gate, one per answer.
        judged = [
            r
            for r in fake_pool.server.chat_requests()
            if r.messages[:1] == [{"role": "system", "content": JUDGE_SYSTEM}]
        ]
        assert len(judged) == 4 and {(r.json or {})["model"] for r in judged} == {"fake-critic-1"}
        assert ExperimentRun.objects.filter(experiment=exp, score=0.75).count() == 4
        assert AuditEvent.objects.filter(
            event_type="experiment.started", payload__judge="fake/fake-critic"
        ).exists()
    finally:
        wait_runs_settled()
