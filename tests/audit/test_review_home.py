"""Issue 42 items 5 and 6: a reviewer who cannot start runs lands on the review desk, the nav
badge and the desk give one count (answers to review + plans to decide, never the viewer's own),
and one nav item is current."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.runs.models import PlanApproval, RunStatus
from tests.factories.runs import RunFactory

pytestmark = pytest.mark.django_db


def _login(client: Any, user: Any) -> str:
    response = client.post(
        "/accounts/login/", {"username": user.get_username(), "password": "pw-for-tests-123"}
    )
    assert response.status_code == 302
    landing = client.get(response["Location"])
    return landing["Location"] if landing.status_code == 302 else response["Location"]


def test_a_reviewer_lands_on_the_review_desk_a_member_on_the_playground(
    client: Any, fake_pool: Any, reviewer: Any, owner: Any
) -> None:
    assert _login(client, reviewer) == "/audit/reviews/"
    client.logout()
    assert _login(client, owner) == "/playground/"


def _held_plan(pool: Any, author: Any) -> Any:
    run = RunFactory(team=pool.team, pool=pool, created_by=author, status=RunStatus.AWAITING_APPROVAL)
    return PlanApproval.objects.create(
        run=run,
        digest="d" * 64,
        reason="The forecast (120 tokens) is over constraints.forecast.max_tokens (50).",
        fields=["constraints.forecast.max_tokens"],
        requested_at=timezone.now(),
        deadline_at=timezone.now() + timedelta(hours=1),
    )


def _current_nav_items(page: str) -> list[str]:
    nav = page.split('data-testid="main-nav"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'<a href="([^"]+)"[^>]*aria-current="page"', nav)


def test_badge_and_desk_count_the_same_plans_and_one_nav_item_is_current(
    client: Any, fake_pool: Any, reviewer: Any, owner: Any
) -> None:
    _held_plan(fake_pool.pool, owner)
    _held_plan(fake_pool.pool, reviewer)  # their own: they may not decide it, so it is not counted
    client.force_login(reviewer)
    page = client.get("/audit/reviews/").content.decode()
    badge = re.search(r'data-testid="review-badge"[^>]*>(\d+)', page)
    assert badge is not None and badge.group(1) == "1"
    assert page.count('data-testid="approval-row"') == 1
    assert "1 waiting for you: 0 answers to review, 1 plan to decide." in page
    assert "Nothing awaits your review" not in page and "the plan above waits for your decision" in page
    assert _current_nav_items(page) == ["/audit/reviews/"]
    audit = client.get("/audit/").content.decode()
    assert _current_nav_items(audit) == ["/audit/"]
