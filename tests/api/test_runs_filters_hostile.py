"""Hostile values in every /api/runs/ filter get a 200 or a 400 naming the filter, never a 500
(schemathesis found one in the distributed phase: issue 42's new filters on PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.runs.services import run_create
from tests.api.test_rest import session_client

pytestmark = pytest.mark.django_db

FOUND = {  # schemathesis JT5zJr (the key was filtered out of its report)
    "until": "0028-09-02T11:31:41-23:38",
    "worker": "*\U000a3753\U000e4ecc>\x9b\xb9",
    "id": "38d6e695-c913-4585-bf5b-a927ee940601",
    "request_id": "7\U000fc429cv\U000ed8f4\xa3\x8e4\xbb\xa5\xd7A",
    "source": "openai_api",
    "offset": "-372",
    "user": "owner",
    "since": "2026-11-27T23:18:03.187988Z",
}
HOSTILE = ["\x00", "a\x00b", "'", "%", "\\", "\U0010ffff", "x" * 5000, "é" * 300, "=", "a=b\x00", " "]
FILTERS = [
    "q",
    "id",
    "key",
    "model",
    "request_id",
    "metadata",
    "client_user",
    "worker",
    "user",
    "team",
    "pool",
]


@pytest.mark.parametrize("name", FILTERS)
def test_every_filter_answers_hostile_values_with_200_or_400(
    name: str, fake_pool: Any, alpha: Any, owner: Any
) -> None:
    run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="hello there")
    client = session_client(owner)
    for value in HOSTILE:
        response = client.get("/api/runs/", {name: value})
        assert response.status_code in (200, 400), (name, value, response.status_code)
        if response.status_code == 400:
            assert name in response.content.decode(), response.content  # the refusal names the filter


def test_the_schemathesis_case(fake_pool: Any, alpha: Any, owner: Any) -> None:
    run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="hello there")
    client = session_client(owner)
    for key in ("", "\x00", "p0", "[Filtered]"):
        response = client.get("/api/runs/", {**FOUND, "key": key})
        assert response.status_code in (200, 400), (key, response.status_code)


MOMENTS = [
    "2026-01-01T00:00:00-23:38",
    "0001-01-01T00:00:00+10:00",
    "9999-12-31T23:59:59-10:00",
    "2026-13-01",
]


@pytest.mark.parametrize("name", ["since", "until"])
def test_moments_past_what_the_database_holds_are_refused_naming_the_filter(
    name: str, fake_pool: Any, alpha: Any, owner: Any, team_admin: Any
) -> None:
    """PostgreSQL refuses offsets past ±15:59 (the schemathesis case): the filter reads moments
    in UTC, and a moment whose UTC falls outside the years a datetime holds is a 400."""
    run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="hello there")
    runs, audit = session_client(owner), session_client(team_admin)
    for value in MOMENTS:
        for client, url in ((runs, "/api/runs/"), (audit, "/api/audit/events/"), (audit, "/audit/")):
            response = client.get(url, {name: value})
            assert response.status_code in (200, 400), (url, value, response.status_code)
            if response.status_code == 400:
                assert name in response.content.decode(), (url, value)
    kept = runs.get("/api/runs/", {name: "2026-01-01T00:00:00-23:38"})
    assert kept.status_code == 200 and kept.json()["count"] == (1 if name == "since" else 0)
