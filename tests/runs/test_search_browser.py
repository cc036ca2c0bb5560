"""Issue 42 in a real Chromium at 1280 and 390 px: finding a run by its words and by the short id
the pages show (never by a held answer), and one set of numbers on the run page (steps from 1,
durations written one way, no "succeeded (completed)"); no serious accessibility violation."""

from __future__ import annotations

from typing import Any

import pytest

from apps.runs.models import Run
from tests.factories.runs import RunEventFactory, RunFactory, StepFactory
from tests.runs.test_builder_journey import save_screen

pytestmark = [pytest.mark.browser, pytest.mark.runtime]


def _serious(page: Any, context: str = "main") -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
        for v in Axe().run(page, context=context).response["violations"]
        if v.get("impact") in ("serious", "critical")
    ]


def _fits(page: Any, width: int) -> None:
    # Nothing spills sideways out of the page (tables scroll inside their own wrapper).
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("width", (1280, 390))
def test_find_a_run_by_words_and_short_id(
    width: int, transactional_db: Any, daphne_server: Any, login: Any, owner: Any, fake_pool: Any
) -> None:
    team = owner.memberships.first().team
    found = RunFactory(
        team=team,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        question="Which glacier feeds the Rhône?",
        answer="The Rhône Glacier.",
        latency_ms=97177,
    )
    RunFactory(
        team=team,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        question="Summarise the memo",
        answer="The glacier budget leaked.",
        answer_held=True,
    )
    RunFactory(team=team, pool=fake_pool.pool, created_by=owner, status="succeeded", question="Other?")
    page = login(owner)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/runs/")
    page.fill("[data-testid=run-search]", "glacier")
    page.click("[data-testid=run-search-submit]")
    page.wait_for_url("**/runs/?q=glacier*")
    rows = page.locator("[data-testid=run-row]")
    # The held answer mentions "glacier" too; its author is no reviewer, so it is not found.
    assert rows.count() == 1
    assert page.inner_text("[data-testid=run-question]") == "Which glacier feeds the Rhône?"
    assert "97.2 s" in rows.first.inner_text()
    short = page.inner_text("[data-testid=run-link]")
    assert short == str(found.pk)[:8]
    _fits(page, width)
    assert _serious(page) == []
    save_screen(page, f"runs-search-{width}")

    # The 8 characters the page shows find the run, and lead to it.
    page.fill("[data-testid=run-search]", short)
    page.click("[data-testid=run-search-submit]")
    page.wait_for_url(f"**/runs/?q={short}*")
    assert page.locator("[data-testid=run-row]").count() == 1
    page.goto(f"{daphne_server.url}/runs/{short}/")
    assert page.url.endswith(f"/runs/{found.pk}/")


@pytest.mark.parametrize("width", (1280, 390))
def test_the_run_page_numbers_steps_from_one_and_writes_durations_one_way(
    width: int, transactional_db: Any, daphne_server: Any, login: Any, owner: Any, fake_pool: Any
) -> None:
    team = owner.memberships.first().team
    run = RunFactory(
        team=team,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        status_reason="completed",
        answer="42",
        latency_ms=97177,
        step_count=3,
        last_seq=4,
    )
    for i in range(3):
        StepFactory(run=run, index=i, worker_key=f"fake-w{i}", access=[], latency_ms=1500 + i, output=f"o{i}")
    plan = {"steps": [{"index": i, "worker": f"fake-w{i}", "access": []} for i in range(3)]}
    started = {"round": 1, "worker_key": "fake-planner", "first": 0}
    RunEventFactory(run=run, seq=1, type="plan.started", data=started)
    RunEventFactory(
        run=run, seq=2, type="plan.validated", data={"round": 1, "plan": plan, "action": "accepted"}
    )
    RunEventFactory(
        run=run, seq=3, type="guardrail.checked", data={"stage": "step_output", "step": 0, "checks": []}
    )
    RunEventFactory(
        run=run,
        seq=4,
        type="run.finished",
        data={"status": "succeeded", "answer": "42", "totals": {"steps": 3, "latency_ms": 97177}},
    )
    page = login(owner)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/runs/{run.pk}/")
    page.wait_for_selector("[data-testid=step-node-2]")
    labels = [page.inner_text(f"[data-testid=step-node-{i}]") for i in range(3)]
    assert [label.split(" · ")[0] for label in labels] == ["Step 1", "Step 2", "Step 3"], labels
    assert "round" not in labels[0]  # one round: no round to name
    # Three steps that read nothing from each other stand side by side (one column, three rows),
    # not in a line that reads as a chain; the plan node is left of them.
    page.wait_for_selector("[data-testid=step-graph] .main-svg")
    points = page.evaluate(
        """() => { const t = document.querySelector('[data-testid=step-graph]').data[1];
                   return t.customdata.map((k, n) => [String(k), t.x[n], t.y[n]]); }"""
    )
    steps = {k: (x, y) for k, x, y in points if not k.startswith("p")}
    plan = [(x, y) for k, x, y in points if k.startswith("p")]
    assert len({x for x, _ in steps.values()}) == 1 and len({y for _, y in steps.values()}) == 3, points
    assert plan and plan[0][0] < next(iter(steps.values()))[0]
    page.click("[data-testid=step-node-0]")
    title = page.locator(f"#inspector-title-{run.pk}")
    assert title.inner_text() == "Step 1"
    assert page.inner_text("[data-run-view] [data-field=latency]") == "1.5 s"
    status = page.inner_text("[data-testid=run-status]")
    assert status.startswith("succeeded") and "completed" not in status
    assert page.inner_text("[data-testid=run-elapsed]") == "97.2 s"
    _fits(page, width)
    assert _serious(page) == []
    assert Run.objects.get(pk=run.pk).step_count == 3
