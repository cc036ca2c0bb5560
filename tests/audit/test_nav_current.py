"""Issue 42 item 5: one nav item is current on every review page (a run's review form re-shown
with an error used to mark Audit, not Review)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.factories.audit import make_run

pytestmark = pytest.mark.django_db


def _current(page: str) -> list[str]:
    nav = page.split('data-testid="main-nav"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'<a href="([^"]+)"[^>]*aria-current="page"', nav)


def test_a_runs_review_form_marks_review_not_audit(
    client: Any, alpha: Any, owner: Any, reviewer: Any
) -> None:
    run = make_run(alpha, created_by=owner, question="q", answer="a")
    client.force_login(reviewer)
    resp = client.post(f"/audit/runs/{run.pk}/review/", {"status": "no-such-status"})
    assert resp.status_code == 400
    assert _current(resp.content.decode()) == ["/audit/reviews/"]
    assert _current(client.get("/audit/").content.decode()) == ["/audit/"]
    assert _current(client.get("/audit/reviews/?tab=flagged").content.decode()) == ["/audit/reviews/"]
