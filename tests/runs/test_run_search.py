"""Finding runs (issue 42 item 2): full-text search over question and answer on both databases'
indexes, never over content the viewer may not see; filters for key, pool, model, request id and
/v1 metadata; the 8-character ids the pages show accepted wherever a run id is."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.api.models import ApiKey
from apps.runs.models import Run, RunStatus
from apps.runs.retention import run_payload_erase
from tests.factories.runs import RunFactory, StepFactory

pytestmark = pytest.mark.django_db


def _run(pool: Any, **fields: Any) -> Run:
    fields.setdefault("status", RunStatus.SUCCEEDED)
    return RunFactory(team=pool.team, pool=pool, **fields)


def _page_ids(client: Any, **params: str) -> set[str]:
    response = client.get("/runs/", params)
    assert response.status_code == 200
    return {str(r.pk) for r in response.context["runs"]}


def _api_ids(client: Any, **params: str) -> set[str]:
    response = client.get("/api/runs/", params)
    assert response.status_code == 200, response.content
    return {r["id"] for r in response.json()["results"]}


@pytest.fixture
def corpus(fake_pool: Any, owner: Any) -> dict[str, Run]:
    pool = fake_pool.pool
    return {
        "open": _run(
            pool, created_by=owner, question="How tall is Everest?", answer="Everest is 8849 metres."
        ),
        "held": _run(
            pool,
            created_by=owner,
            question="Summarise the incident report",
            answer="The Everest account leaked zanzibar credentials.",
            answer_held=True,
        ),
        "other": _run(pool, created_by=owner, question="Capital of France?", answer="Paris."),
    }


def test_text_search_matches_question_and_visible_answer_on_the_list_and_the_api(
    client: Any, corpus: dict[str, Run], teammate: Any, reviewer: Any
) -> None:
    open_, held = str(corpus["open"].pk), str(corpus["held"].pk)
    client.force_login(teammate)
    # "everest" is in open's question and answer, and in the held answer: the held one stays hidden.
    assert _page_ids(client, q="everest") == {open_}
    assert _api_ids(client, q="Everest") == {open_}
    assert _page_ids(client, q="zanzibar") == set() and _api_ids(client, q="zanzibar credentials") == set()
    # Every word must match; the question of the held run is visible to all who may view it.
    assert _page_ids(client, q="incident report") == {held}
    assert _page_ids(client, q="everest paris") == set()
    # The list shows the question column.
    page = client.get("/runs/", {"q": "everest"}).content.decode()
    assert "How tall is Everest?" in page and 'data-testid="run-question"' in page

    # A reviewer may see held answers (to decide on them), so may find them.
    client.force_login(reviewer)
    assert _page_ids(client, q="everest") == {open_, held}
    assert _api_ids(client, q="zanzibar") == {held}


def test_released_and_erased_answers_follow_the_run(
    client: Any, corpus: dict[str, Run], teammate: Any
) -> None:
    held = corpus["held"]
    client.force_login(teammate)
    assert _api_ids(client, q="zanzibar") == set()
    # A reviewer releases it: the answer becomes visible, and searchable.
    Run.objects.filter(pk=held.pk).update(answer_held=False)
    assert _api_ids(client, q="zanzibar") == {str(held.pk)}
    # Erased content is gone from the index (the SQLite triggers follow the update).
    run_payload_erase(run=Run.objects.get(pk=held.pk), reason="test")
    assert _api_ids(client, q="zanzibar") == set()
    assert _page_ids(client, q="incident") == set()
    # The id of an erased run still finds it.
    assert _page_ids(client, q=str(held.pk)[:8]) == {str(held.pk)}


def test_search_never_crosses_teams_and_treats_operators_as_words(
    client: Any, corpus: dict[str, Run], outsider: Any, owner: Any
) -> None:
    client.force_login(outsider)
    assert _page_ids(client, q="everest") == set() and _api_ids(client, q="everest") == set()
    client.force_login(owner)
    # tsquery / FTS5 syntax is not interpreted: quotes, operators and stars are just separators.
    for text in ('everest" OR "paris', "everest & !paris", "ever*", "question : everest", "'", '"', "(|)"):
        assert client.get("/runs/", {"q": text}).status_code == 200
        assert client.get("/api/runs/", {"q": text}).status_code == 200
    assert _api_ids(client, q='everest" OR "paris') == set()  # words: everest, or, paris: none has all
    assert _api_ids(client, q="everest!") == {str(corpus["open"].pk)}
    assert client.get("/api/runs/", {"q": "x" * 201}).status_code == 400


def test_short_ids_are_accepted_wherever_a_run_id_is(client: Any, corpus: dict[str, Run], owner: Any) -> None:
    run = corpus["open"]
    short = str(run.pk)[:8]
    client.force_login(owner)
    # The run URL.
    response = client.get(f"/runs/{short}/")
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert client.get(f"/runs/{short.upper()}/").status_code == 302
    # The REST API: detail and steps.
    assert client.get(f"/api/runs/{short}/").json()["id"] == str(run.pk)
    assert client.get(f"/api/runs/{short}/steps/").status_code == 200
    assert _api_ids(client, id=short) == {str(run.pk)}
    assert _page_ids(client, id=short) == {str(run.pk)}
    assert _page_ids(client, q=short) == {str(run.pk)}
    # Bad ids are a clear 400 / form error, never a 500.
    assert client.get("/api/runs/", {"id": "nothex!"}).status_code == 400
    page = client.get("/runs/", {"id": "abc"})
    assert page.status_code == 200 and "first 8 characters" in page.content.decode()
    assert list(page.context["runs"]) == []
    # A short id of no run you may see: 404.
    missing = "0123abcd" if not str(run.pk).startswith("0123abcd") else "fedc3210"
    assert client.get(f"/runs/{missing}/").status_code == 404
    assert client.get(f"/api/runs/{missing}/").status_code == 404


def test_short_ids_are_not_seen_across_teams(client: Any, corpus: dict[str, Run], outsider: Any) -> None:
    short = str(corpus["open"].pk)[:8]
    client.force_login(outsider)
    assert client.get(f"/runs/{short}/").status_code == 404
    assert client.get(f"/api/runs/{short}/").status_code == 404


def test_audit_search_takes_the_short_id(
    client: Any, corpus: dict[str, Run], team_admin: Any, reviewer: Any
) -> None:
    run = corpus["open"]
    from apps.runs.reviews import run_review

    run_review(actor=team_admin, run=run, status="approved", reason="", comment="ok")
    from apps.audit.sequencer import sequence_pass

    while sequence_pass() > 0:
        pass
    client.force_login(reviewer)
    response = client.get("/api/audit/events/", {"run": str(run.pk)[:8]})
    assert response.status_code == 200, response.content
    events = response.json()["results"]
    assert events and {e["run_id"] for e in events} == {str(run.pk)}
    page = client.get("/audit/", {"run": str(run.pk)[:8]})
    assert page.status_code == 200 and "Enter a run id" not in page.content.decode()
    assert client.get("/api/audit/events/", {"run": "zz"}).status_code == 400


def test_filters_for_key_pool_model_request_id_and_metadata(
    client: Any, fake_pool: Any, owner: Any, api_key: Any
) -> None:
    pool = fake_pool.pool
    key: ApiKey = api_key[0]
    worker = fake_pool.workers[0]
    by_key = _run(
        pool,
        created_by=owner,
        api_key=key,
        request_id="req-42",
        api_request={"options": {}, "metadata": {"customer": "acme", "user": "end-user-7"}},
    )
    by_model = _run(pool, created_by=owner)
    StepFactory(run=by_model, index=0, worker=worker, worker_key=worker.slug)
    old = _run(pool, created_by=owner, status=RunStatus.FAILED)
    Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=10))
    client.force_login(owner)
    for params, expected in [
        ({"key": key.prefix}, {by_key}),
        ({"key": key.name}, {by_key}),
        ({"request_id": "req-42"}, {by_key}),
        ({"metadata": "customer=acme"}, {by_key}),
        ({"metadata": "customer=other"}, set()),
        ({"client_user": "end-user-7"}, {by_key}),
        ({"model": worker.model_name}, {by_model}),
        ({"model": worker.slug}, {by_model}),
        ({"pool": pool.slug, "status": "failed"}, {old}),
        ({"date_from": (timezone.now() - timedelta(days=1)).date().isoformat()}, {by_key, by_model}),
    ]:
        want = {str(r.pk) for r in expected}
        assert _page_ids(client, **params) == want, params
        api_params = dict(params)
        if "date_from" in api_params:
            api_params = {"since": api_params.pop("date_from")}
        assert _api_ids(client, **api_params) == want, params
    assert client.get("/api/runs/", {"metadata": "no-equals"}).status_code == 400


def test_api_key_searches_its_own_team_only(client: Any, corpus: dict[str, Run], api_key: Any) -> None:
    keyed = Client(HTTP_AUTHORIZATION=f"Bearer {api_key[1]}")
    ids = {r["id"] for r in keyed.get("/api/runs/", {"q": "everest"}).json()["results"]}
    # The key's creator is a team admin, who may review: the held answer is theirs to see.
    assert ids == {str(corpus["open"].pk), str(corpus["held"].pk)}
