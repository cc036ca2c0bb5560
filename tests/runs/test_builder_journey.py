"""The builder's daily work in a real browser (Chromium, 1280 px and 390 px) against a live daphne
(and Celery in distributed mode): ask, watch the planning node and the steps, inspect, cancel from
the playground and the run page, replay with changes, compare two strategies side by side.

The fake provider speaks the real OpenAI wire protocol over a loopback socket. Its conductor and
its workers wait on gates the test opens, so "planning", "step 1 running" and "cancel mid-call"
are states the test waits for, not moments it hopes to catch.

Screenshots: with ``CONDUCTOR_SCREENS_DIR=docs/screens`` the test saves the playground and run
page at both widths there (the PNGs linked from the README).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.runs.models import Run, RunEvent
from tests.fakes.base import FakeReply
from tests.fixtures.a11y import serious_violations
from tests.fixtures.runs import CONDUCTOR_MODEL, THREE_STEP_PLAN, worker_answer

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

QUESTION = "How many legs do 3 spiders have?"
GATE_TIMEOUT_S = 60  # a gate nobody opens (a failed test) still lets the fake's threads finish


class Gates:
    """The fake conductor answers when ``plan`` is open, the workers when ``work`` is open."""

    def __init__(self) -> None:
        self.plan = threading.Event()
        self.work = threading.Event()

    def respond(self, req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            self.plan.wait(GATE_TIMEOUT_S)
            return FakeReply(json.dumps(THREE_STEP_PLAN))
        self.work.wait(GATE_TIMEOUT_S)
        return FakeReply(worker_answer(str(req.get("model")), req.get("messages") or []))

    def close(self) -> None:
        self.plan.clear()
        self.work.clear()

    def open(self) -> None:
        self.plan.set()
        self.work.set()


@pytest.fixture
def gates(fake_pool: Any) -> Iterator[Gates]:
    g = Gates()
    fake_pool.server.responder = g.respond
    try:
        yield g
    finally:
        g.open()


@pytest.fixture
def journey_policy(alpha: Any, publish: Any) -> Any:
    """A published policy without input guardrails (an edited subtask may then be replayed)."""
    return publish(alpha, {"constraints": {"max_steps": {"value": 4, "action": "repair"}}})


def save_screen(page: Any, name: str) -> None:
    target = os.environ.get("CONDUCTOR_SCREENS_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)


def in_viewport(page: Any, selector: str) -> dict[str, float]:
    """The element's box; fails unless its top edge is inside the viewport."""
    box = page.locator(selector).bounding_box()
    assert box is not None, f"{selector} is not rendered"
    height = page.viewport_size["height"]
    assert 0 <= box["y"] < height, f"{selector} starts at y={box['y']}, outside the {height} px viewport"
    return box


def server_cancel_seconds(run_id: str) -> float:
    """Cancel request recorded → run ended, on the server (the figure docs/playground.md reports)."""
    run = Run.objects.get(pk=run_id)
    requested = AuditEvent.objects.get(run_id=run_id, event_type="run.cancel_requested").created_at
    assert run.finished_at is not None
    return (run.finished_at - requested).total_seconds()


def ask(page: Any, url: str, *, strategy: str = "conductor-mini", compare: str = "") -> str:
    page.goto(f"{url}/playground/")
    page.fill("[data-testid=prompt-input]", QUESTION)
    page.select_option("[data-testid=strategy-select]", strategy)
    page.select_option("[data-testid=pool-select]", label="Fake pool")
    page.select_option("[data-testid=compare-select]", compare)
    page.click("[data-testid=run-submit]")
    page.wait_for_selector("[data-run-view][data-connected=true]")
    return str(page.get_attribute("[data-run-view]", "data-run-id"))


@pytest.mark.parametrize("width", [1280, 390])
def test_builder_journey(
    width: int,
    transactional_db: Any,
    runtime_workers: Any,
    daphne_server: Any,
    login: Any,
    fake_pool: Any,
    gates: Gates,
    owner: Any,
    journey_policy: Any,
) -> None:
    url = daphne_server.url
    page = login(owner)
    page.set_viewport_size({"width": width, "height": 900})
    wide = width >= 1000

    # --- ask, and watch the conductor plan: a node of its own, long before plan.proposed ---------
    run_id = ask(page, url)
    page.wait_for_selector("[data-testid=plan-node-1][data-status=running]")
    assert "Planning with worker Fake conductor" in page.text_content("[data-testid=run-progress]")
    assert page.locator("[data-testid^=step-node-]").count() == 0
    assert not RunEvent.objects.filter(run_id=run_id, type="plan.proposed").exists()
    # A late viewer (a reload is one) sees the running planning node from the snapshot.
    page.reload()
    page.wait_for_selector("[data-testid=plan-node-1][data-status=running]")

    # Inspect the planning node: the inspector opens beside the graph (below it when narrow), in view.
    page.click("[data-testid=plan-node-1]")
    page.wait_for_selector("[data-testid=step-inspector]:not([hidden])")
    inspector = in_viewport(page, "[data-testid=step-inspector]")
    graph = page.locator("[data-testid=step-graph]").bounding_box()
    if wide:
        assert inspector["x"] >= graph["x"] + graph["width"] - 1, "the inspector is not beside the graph"
    else:
        assert inspector["y"] >= graph["y"] + graph["height"] - 1, "the inspector is not below the graph"
    assert page.text_content("[data-testid=inspector-status]") == "running"
    assert page.text_content("[data-testid=inspector-worker]").startswith("fake-conductor")

    # The plan arrives; step 0 runs while the workers wait: "step 1 of 3".
    gates.plan.set()
    page.wait_for_selector("[data-testid=plan-node-1][data-status=succeeded]")
    page.wait_for_selector("[data-testid=step-node-0][data-status=running]")
    assert page.text_content("[data-testid=run-progress]").startswith("Step 1 of 3")
    # The planning node now carries its tokens (the conductor call's usage) and its plan.
    assert not page.text_content("[data-testid=inspector-tokens]").startswith("0 in")
    assert "Outline how to answer." in page.text_content("[data-testid=inspector-output]")
    gates.work.set()
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=30_000)
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded"
    assert page.text_content("[data-testid=run-progress]").startswith("Finished: succeeded")
    assert page.locator("[data-testid=step-graph] .scatterlayer .trace:last-child .point").count() == 4

    # Inspect a step from the graph itself (a plotly click), not only from the list.
    page.locator("[data-testid=step-graph] .scatterlayer .trace:last-child .point").nth(2).click(force=True)
    page.wait_for_selector("[data-testid=step-inspector][data-kind=step]")
    in_viewport(page, "[data-testid=step-inspector]")
    assert page.text_content("[data-testid=inspector-access]") == "step 1"
    assert serious_violations(page) == []
    page.click("[data-testid=inspector-close]")
    save_screen(page, f"playground-{width}")

    # --- the run page: policy version as its number, with a link --------------------------------
    page.click("[data-testid=run-page-link]")
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]")
    version = page.locator("[data-testid=run-policy-version] a")
    assert version.text_content() == f"v{journey_policy.number}"
    assert (version.get_attribute("href") or "").endswith(f"?b={journey_policy.number}")
    page.click("[data-testid=plan-node-1]")
    in_viewport(page, "[data-testid=step-inspector]")
    assert serious_violations(page) == []
    save_screen(page, f"run-{width}")

    # --- replay one step with a changed subtask: the question stays ------------------------------
    page.click("[data-testid=step-node-2]")
    page.fill("[data-testid=replay-instruction]", "Reply with the number only.")
    page.click("[data-testid=step-replay]")
    page.wait_for_selector("[data-run-view][data-connected=true]")
    assert page.input_value("[data-testid=prompt-input]") == QUESTION
    replay = Run.objects.get(pk=page.get_attribute("[data-run-view]", "data-run-id"))
    assert replay.question == QUESTION and replay.replay_messages is not None
    assert replay.replay_messages[-1]["content"] == "Reply with the number only."
    page.wait_for_selector("[data-testid=final-answer][data-ready=true]")
    assert fake_pool.server.chat_requests()[-1].messages[-1]["content"] == "Reply with the number only."

    # --- replay the whole run with another strategy: the form keeps the question -----------------
    page.goto(f"{url}/runs/{run_id}/")
    page.click("[data-testid=run-replay]")
    page.wait_for_selector("[data-testid=replay-note]")
    assert page.input_value("[data-testid=prompt-input]") == QUESTION
    assert page.input_value("[data-testid=strategy-select]") == "conductor-mini"

    # --- compare: one question through two strategies, both graphs, costs and answers ------------
    page.select_option("[data-testid=compare-select]", "single")
    page.click("[data-testid=run-submit]")
    page.wait_for_selector("[data-testid=compare-heading]")
    views = page.locator("[data-run-view]")
    assert views.count() == 2
    for i in range(2):
        views.nth(i).locator("[data-testid=final-answer][data-ready=true]").wait_for(timeout=30_000)
        assert views.nth(i).locator("[data-testid=step-graph] .main-svg").count() > 0
        assert not views.nth(i).locator("[data-testid=run-tokens]").text_content().startswith("0 in")
        assert views.nth(i).locator("[data-testid=run-cost]").text_content().strip() != ""
    assert "Conductor · mini" in views.nth(0).locator("[data-testid=run-title]").text_content()
    assert "Single worker" in views.nth(1).locator("[data-testid=run-title]").text_content()
    rows = page.locator("[data-testid=compare-summary] tbody tr")
    assert rows.count() == 2
    assert [rows.nth(i).get_attribute("data-status") for i in range(2)] == ["succeeded", "succeeded"]
    assert rows.nth(0).locator("th").text_content() == "Conductor · mini"
    assert rows.nth(1).locator("td").nth(1).text_content() == "1"  # one step for the single worker
    # Only the conductor plans: the single-worker run has no planning node.
    assert views.nth(1).locator("[data-testid=plan-node-1]").count() == 0
    assert {r.strategy for r in Run.objects.filter(question=QUESTION, replay_messages__isnull=True)} >= {
        "conductor",
        "single",
    }
    save_screen(page, f"playground-compare-{width}")

    # --- cancel from the playground while the conductor is still planning ------------------------
    gates.close()
    planning = ask(page, url)
    page.wait_for_selector("[data-testid=plan-node-1][data-status=running]")
    clicked = time.monotonic()
    page.click("[data-testid=run-cancel]")
    page.wait_for_selector("[data-testid=run-status][data-status=cancelled]")
    shown = time.monotonic() - clicked
    print(
        f"\ncancel while planning ({width} px): click → shown {shown:.2f} s, server {server_cancel_seconds(planning):.2f} s"
    )
    assert page.get_attribute("[data-testid=plan-node-1]", "data-status") == "cancelled"
    assert Run.objects.get(pk=planning).status == "cancelled"
    assert page.locator("[data-testid=run-cancel]").is_hidden()
    # A later viewer rebuilds the same ending from the snapshot: the planning node is not "running".
    page.reload()
    page.wait_for_selector("[data-testid=plan-node-1][data-status=cancelled]")

    # --- cancel from the run page while a worker is busy -----------------------------------------
    gates.plan.set()
    busy = ask(page, url)
    page.wait_for_selector("[data-testid=step-node-0][data-status=running]")
    page.goto(f"{url}/runs/{busy}/")
    page.wait_for_selector("[data-testid=step-node-0][data-status=running]")
    clicked = time.monotonic()
    page.click("[data-testid=run-cancel]")
    page.wait_for_selector("[data-testid=run-status][data-status=cancelled]")
    shown = time.monotonic() - clicked
    print(
        f"cancel mid-step ({width} px): click → shown {shown:.2f} s, server {server_cancel_seconds(busy):.2f} s"
    )
    assert Run.objects.get(pk=busy).status == "cancelled"
    assert page.text_content("[data-testid=run-progress]").startswith("Finished: cancelled")
