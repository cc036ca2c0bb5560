"""/insights/, second pass (issue 42 item 10), in Chromium at 1280 and 390 px against the live
daphne (Celery when distributed): runs on unpriced workers leave a "no spend" note instead of bare
axes from -1 to 1; strategies are named as in the playground; workers' axis labels are not cut;
Worker is a dropdown; spend per model and per API key, with the key's dollar budget."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from apps.runs.models import RunSource, RunStatus
from apps.runs.services import run_create, run_wait
from apps.workers.models import Worker
from tests.factories.api import make_api_key
from tests.fixtures.runs import scripted_plan
from tests.runs.test_builder_journey import save_screen, serious_violations

pytestmark = [pytest.mark.browser, pytest.mark.runtime]


def _run(owner: Any, fake_pool: Any, strategy: str, **kw: Any) -> None:
    run = run_wait(
        run_create(actor=owner, pool=fake_pool.pool, question="How?", strategy=strategy, **kw).id, 60
    )
    assert run.status == RunStatus.SUCCEEDED, run.error


def _labels_inside(page: Any, cid: str) -> bool:
    """Every category label (the y axis: horizontal bars) lies inside the chart's drawing."""
    return page.evaluate(
        """(cid) => {
          const root = document.querySelector(`[data-testid=chart-${cid}] .main-svg`);
          const box = root.getBoundingClientRect();
          const ticks = [...document.querySelectorAll(`[data-testid=chart-${cid}] .ytick text`)];
          return ticks.length > 0 && ticks.every(t => {
            const b = t.getBoundingClientRect();
            return b.bottom <= box.bottom + 0.5 && b.left >= box.left - 0.5 && b.right <= box.right + 0.5;
          });
        }""",
        cid,
    )


@pytest.mark.parametrize("width", [1280, 390])
def test_empty_spend_names_and_spend_per_model_and_key(
    transactional_db: Any,
    runtime_workers: Any,
    daphne_server: Any,
    login: Any,
    fake_pool: Any,
    owner: Any,
    alpha: Any,
    team_admin: Any,
    width: int,
) -> None:
    scripted_plan(fake_pool.server)
    # Unpriced workers: runs cost $0.
    _run(owner, fake_pool, "conductor")
    _run(owner, fake_pool, "single")

    page = login(owner)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/insights/")
    page.wait_for_selector("[data-testid=chart-orchestration][data-ready=true]")
    # $0 everywhere: a note, not a plot with axes from -1 to 1.
    assert page.text_content("[data-testid=chart-empty-spend]") == (
        "No spend in this range: no runs, or only runs on unpriced workers ($0)."
    )
    assert page.locator("[data-testid=chart-spend]").count() == 0
    assert (
        page.text_content("[data-testid=key-spend-empty]") == "No runs started with an API key in this range."
    )
    # Strategies as the playground names them.
    names = page.locator("[data-testid=strategy-row] td:first-child").all_text_contents()
    assert names == ["Conductor", "Single worker"]
    assert page.locator("[data-testid=chart-orchestration] .xtick text").all_text_contents() == [
        "Conductor",
        "Single worker",
    ]
    # Worker is a dropdown of the workers with steps, like the other filters.
    assert page.eval_on_selector("#id_worker", "el => el.tagName") == "SELECT"
    options = page.locator("#id_worker option").all_text_contents()
    assert options[0] == "any" and "fake-solver" in options
    assert serious_violations(page) == []

    # Priced workers, and a key with a budget: its runs show per key and per model.
    Worker.objects.filter(pk__in=[w.pk for w in [*fake_pool.workers, fake_pool.conductor]]).update(
        input_price_per_mtok=Decimal("3"), output_price_per_mtok=Decimal("15")
    )
    key = make_api_key(
        alpha, name="nightly job", principal=team_admin, budget_hard_usd=Decimal("0.000001")
    ).api_key
    _run(owner, fake_pool, "single", api_key=key, source=RunSource.REST_API)
    page.goto(f"{daphne_server.url}/insights/")
    page.wait_for_selector("[data-testid=chart-spend][data-ready=true]")
    row = page.locator(f"[data-testid=key-spend-row][data-key='{key.prefix}']")
    assert row.locator("a").text_content() == "nightly job"
    assert row.locator("[data-testid=key-spend]").text_content() != "$0.000000"
    budget = row.locator("[data-testid=key-spend-budget]").text_content() or ""
    assert "of $0.000001 hard this UTC month" in budget and "spent: calls refused" in budget
    models = page.locator("[data-testid=model-spend-row]")
    assert "fake-solver-1" in [models.nth(i).get_attribute("data-model") for i in range(models.count())]
    solver = page.locator(
        "[data-testid=model-spend-row][data-model='fake-solver-1'] [data-testid=model-spend]"
    )
    assert solver.text_content() != "$0.000000"
    page.wait_for_selector("[data-testid=chart-latency][data-ready=true]")
    labels = page.locator("[data-testid=chart-latency] .ytick text").all_text_contents()
    assert sorted(labels) == [
        "run · Conductor",
        "run · Single worker",
        "worker · fake-critic",
        "worker · fake-planner",
        "worker · fake-solver",
    ]
    assert _labels_inside(page, "latency"), "worker labels are cut"
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert serious_violations(page) == []
    save_screen(page, f"insights-spend-{width}")

    # The worker filter narrows the worker bars to the chosen one.
    page.select_option("#id_worker", "fake-solver")
    page.click("[data-testid=insight-apply]")
    page.wait_for_url("**worker=fake-solver**")
    page.wait_for_selector("[data-testid=chart-latency][data-ready=true]")
    ticks = page.locator("[data-testid=chart-latency] .ytick text").all_text_contents()
    assert [t for t in ticks if t.startswith("worker")] == ["worker · fake-solver"]
