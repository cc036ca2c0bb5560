"""An experiment on a 20-question set from the UI (Chromium at 390 px, live daphne, Celery when
distributed): upload, start, watch progress, see the table and the scatter; cancel another one.

The fake workers wait on a gate the test opens, so "in progress" is a state the test observes,
not a moment it hopes to catch."""

from __future__ import annotations

from typing import Any

import pytest

from apps.experiments.models import Experiment, ExperimentRun
from apps.runs.models import Run
from tests.experiments.helpers import Responder, jsonl, wait_runs_settled
from tests.fixtures.a11y import serious_violations

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

TWENTY = [
    (f"What is {i} + {i}?", str(2 * i), "math")
    if i % 2
    else (f"What is the capital of land {i}?", f"City{i}", "geo")
    for i in range(1, 21)
]


def _start(page: Any, url: str) -> int:
    page.goto(f"{url}/experiments/")
    page.select_option("#id_dataset", label="twenty (20 rows)")
    page.select_option("#id_pool", "fake")
    page.check("input[name=arms][value='single:fake-solver']")
    page.check("input[name=arms][value='single:fake-planner']")
    page.click("[data-testid=experiment-start]")
    page.wait_for_selector("[data-testid=experiment-progress]")
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def test_experiment_from_the_ui(
    transactional_db: Any, runtime_workers: Any, daphne_server: Any, login: Any, fake_pool: Any, owner: Any
) -> None:
    responder = Responder(TWENTY, gated=True)
    fake_pool.server.responder = responder
    url = daphne_server.url
    page = login(owner)
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        page.click("label.nav-toggle-label")
        page.click("[data-testid=nav-experiments]")
        page.wait_for_selector("[data-testid=dataset-form]")

        # A malformed file is refused line by line; nothing is stored.
        page.select_option("#id_team", "alpha")
        page.fill("#id_name", "broken")
        page.set_input_files(
            "#id_file",
            files=[
                {"name": "bad.jsonl", "mimeType": "application/jsonl", "buffer": b'{"input": "ok"}\n{bad\n'}
            ],
        )
        page.click("[data-testid=dataset-upload]")
        errors = page.locator("[data-testid=dataset-error]").all_text_contents()
        assert errors == [
            "line 2: invalid JSON (Expecting property name enclosed in double quotes at column 2)"
        ]

        page.fill("#id_name", "twenty")
        page.set_input_files(
            "#id_file",
            files=[{"name": "twenty.jsonl", "mimeType": "application/jsonl", "buffer": jsonl(TWENTY)}],
        )
        page.click("[data-testid=dataset-upload]")
        page.wait_for_selector("text=20 questions")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert serious_violations(page) == []

        exp_id = _start(page, url)
        assert page.text_content("[data-testid=progress-total]") == "40"
        assert page.text_content("[data-testid=progress-done]") == "0"
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert serious_violations(page) == []

        responder.gate.set()  # the workers answer: the page polls, then reloads with the results
        page.wait_for_selector("[data-testid=results-table]", timeout=60_000)
        assert page.text_content("[data-testid=experiment-status]") == "succeeded"
        rows = page.locator("[data-testid=results-row]")
        assert rows.count() == 2
        acc = {
            rows.nth(i).get_attribute("data-arm"): rows.nth(i)
            .locator("[data-testid=accuracy]")
            .text_content()
            for i in range(2)
        }
        assert acc == {"single:fake-solver": "50 %", "single:fake-planner": "50 %"}
        page.wait_for_selector("[data-testid=scatter][data-ready=true]")
        assert page.get_attribute("[data-testid=scatter]", "data-points") == "2"
        assert page.locator("[data-testid=disagreement]").count() == 20
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert serious_violations(page) == []
        assert Experiment.objects.get(pk=exp_id).status == "succeeded"

        # Another experiment, cancelled while its runs wait.
        responder.gate.clear()
        other = _start(page, url)
        page.click("[data-testid=experiment-cancel]")
        page.wait_for_selector("[data-testid=experiment-status]:has-text('cancelled')")
        run_ids = ExperimentRun.objects.filter(experiment_id=other).values("run_id")
        assert Run.objects.filter(pk__in=run_ids, cancel_requested=False).count() == 0
    finally:
        responder.gate.set()
        wait_runs_settled()
