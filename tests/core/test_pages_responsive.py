"""Every main page at 1280 px and 390 px in a real Chromium: no horizontal overflow at 390 px,
no serious or critical axe-core violation on the list pages, list totals shown, and the 403 page
naming the missing permission. Screenshots of the review desk and the audit trail at both widths
go to ``docs/screens/`` when ``CONDUCTOR_WRITE_SCREENS=1`` (else to the test's tmp dir)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.runs.models import RunEvent
from apps.runs.reviews import review_request, run_review
from tests.factories.api import make_api_key
from tests.factories.audit import make_run
from tests.fixtures.screens import screens_dir

pytestmark = [pytest.mark.browser, pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)
LONG = "A long answer that goes on " * 40 + "https://example.test/" + "x" * 160


@pytest.fixture
def desk(alpha: Any, owner: Any, team_admin: Any, reviewer: Any, fake_pool: Any) -> dict[str, Any]:
    """A lived-in team: a held run with a long answer, a sampled run, a flagged run, a key, a pool
    (``fake_pool``)."""
    held = make_run(alpha, created_by=owner, question="Summarise our incident report " * 5, answer=LONG)
    held.answer_held = True
    held.save(update_fields=["answer_held"])
    RunEvent.objects.create(
        run=held,
        seq=1,
        type="guardrail.checked",
        data={
            "stage": "output",
            "checks": [{"name": "pii_regex", "status": "intervened", "action": "require_review"}],
        },
    )
    review_request(run=held, reason="guardrail", details={"flags": ["require_review"]})
    sampled = make_run(alpha, created_by=owner, question="What is 2+2?", answer="4")
    review_request(run=sampled, reason="sampled", details={"sample_rate": 0.05})
    flagged = make_run(alpha, created_by=owner, question="Quote the contract", answer="Clause 7 says...")
    review_request(run=flagged, reason="sampled", details={"sample_rate": 0.05})
    run_review(actor=reviewer, run=flagged, status="flagged", reason="Misquotes clause 7")
    make_api_key(alpha, principal=team_admin, name="ci-" + "k" * 40)
    audit_flush()
    event = AuditEvent.objects.filter(team=alpha, seq__isnull=False).order_by("-seq").first()
    assert event is not None
    return {"held": held, "sampled": sampled, "flagged": flagged, "event_seq": event.seq}


def _pages(desk: dict[str, Any]) -> dict[str, str]:
    held = desk["held"]
    return {
        "playground": "/playground/",
        "runs": "/runs/",
        "run": f"/runs/{held.pk}/",
        "pools": "/pools/",
        "policies": "/policies/",
        "audit": "/audit/",
        "audit-event": f"/audit/events/{desk['event_seq']}/",
        "review-desk": "/audit/reviews/",
        "review-flagged": "/audit/reviews/?tab=flagged",
        "teams": "/teams/",
        "keys": "/teams/alpha/keys/",
    }


LIST_PAGES = ("review-desk", "audit", "runs", "keys", "pools", "policies")
TOTALS = {"review-desk": "2 total", "runs": "3 total", "keys": "1 total", "pools": "1 total"}


def _scroll_width(page: Any) -> int:
    return int(page.evaluate("() => document.documentElement.scrollWidth"))


def test_main_pages_fit_390px_and_list_pages_pass_axe(
    login: Any, team_admin: Any, daphne_server: Any, desk: dict[str, Any], tmp_path: Path
) -> None:
    page = login(team_admin)
    axe = Axe()
    overflow: dict[str, int] = {}
    violations: dict[str, list[str]] = {}
    out = screens_dir(tmp_path)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in _pages(desk).items():
            response = page.goto(f"{daphne_server.url}{path}")
            assert response is not None and response.status == 200, (name, path)
            page.wait_for_load_state("load")
            if width == 390 and _scroll_width(page) > 390:
                overflow[name] = _scroll_width(page)
            if name in LIST_PAGES:
                assert page.locator("[data-testid=list-total]").count() == 1, f"{name} shows no total"
                total = page.locator("[data-testid=list-total]").inner_text()
                assert "total" in total, (name, total)
                if name in TOTALS:
                    assert TOTALS[name] in total, (name, total)
                serious = [
                    f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']} {v['nodes'][0]['failureSummary'][:160]}"
                    for v in axe.run(page).response["violations"]
                    if v["impact"] in ("serious", "critical")
                ]
                if serious:
                    violations[f"{name}@{width}"] = serious
            if name in ("review-desk", "audit"):
                page.screenshot(path=str(out / f"{name}-{width}.png"), full_page=True)
    assert overflow == {}, f"pages wider than 390 px (scrollWidth): {overflow}"
    assert violations == {}, violations


def test_403_page_names_the_missing_permission(
    login: Any, teammate: Any, daphne_server: Any, desk: dict[str, Any]
) -> None:
    page = login(teammate)
    page.set_viewport_size({"width": 390, "height": 800})
    response = page.goto(f"{daphne_server.url}/audit/runs/{desk['held'].pk}/evidence.jsonl")
    assert response is not None and response.status == 403
    reason = page.locator("[data-testid=error-reason]").inner_text()
    assert "review_team_runs" in reason and "reviewer or admin role" in reason
    assert _scroll_width(page) <= 390
