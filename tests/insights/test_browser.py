"""/insights/ in a real browser against the live daphne (and Celery in distributed mode), at
desktop and phone widths: each chart has data, a filter changes it, a click drills into runs."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apps.runs.models import RunStatus
from apps.runs.services import run_create, run_wait
from apps.workers.models import Worker
from tests.fixtures.runs import scripted_plan

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screens" / "insights-1280.png"
CHARTS = ("spend", "orchestration", "latency", "plans")


@pytest.mark.parametrize("width", [1280, 390])
def test_insights_charts_filter_and_drill_down(
    transactional_db: Any,
    runtime_workers: Any,
    daphne_server: Any,
    login: Any,
    fake_pool: Any,
    owner: Any,
    width: int,
) -> None:
    scripted_plan(fake_pool.server)
    Worker.objects.filter(pk__in=[w.pk for w in [*fake_pool.workers, fake_pool.conductor]]).update(
        input_price_per_mtok=Decimal("3"), output_price_per_mtok=Decimal("15")
    )
    for strategy in ("conductor", "conductor", "single"):
        run = run_wait(
            run_create(actor=owner, pool=fake_pool.pool, question="How?", strategy=strategy).id, 60
        )
        assert run.status == RunStatus.SUCCEEDED, run.error

    page = login(owner)  # at desktop width: the login fixture waits for the (then visible) nav
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/insights/")
    for cid in CHARTS:
        chart = page.wait_for_selector(f"[data-testid=chart-{cid}][data-ready=true]")
        assert int(chart.get_attribute("data-points") or 0) >= 1, cid
        assert chart.query_selector(".main-svg") is not None
    assert page.text_content("[data-testid=total-runs]") == "3"
    assert page.text_content("[data-testid=total-cost]") != "$0.000000"  # priced workers: spend shows
    assert page.locator("[data-testid=strategy-row]").count() == 2
    if width == 1280 and os.environ.get("CONDUCTOR_WRITE_SCREENS") == "1":
        # Only on request: a test run must not rewrite tracked files (both phases run at once).
        page.screenshot(path=str(SCREENSHOT), full_page=True)

    # A filter (kept in the URL) changes the numbers and the charts.
    page.select_option("#id_strategy", "single")
    page.click("[data-testid=insight-apply]")
    page.wait_for_url("**strategy=single**")
    page.wait_for_selector("[data-testid=chart-orchestration][data-ready=true]")
    assert page.text_content("[data-testid=total-runs]") == "1"
    assert page.get_attribute("[data-testid=chart-plans]", "data-points") == "1"

    # Clicking the worker-work bar opens the runs list filtered to that strategy.
    # plotly's drag layer lies over the bars and turns a click at the bar into plotly_click.
    bar = page.locator("[data-testid=chart-orchestration] .trace.bars .point path").last
    bar.scroll_into_view_if_needed()
    box = bar.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_url("**/runs/?**strategy=single**")
    assert page.locator("[data-testid=run-row]").count() == 1
