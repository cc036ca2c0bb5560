"""Queries per /v1 run (issue 15): what does not change per request (the effective policy by
version, the pool and its workers by ``updated_at``, the API key by its hash) is read once per
process, so a run costs a bounded number of queries. Counted across every thread of this process
(the embedded runtime executes the run here)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from apps.engine.providers.gate import gate_without_policy
from tests.fixtures.queries import Queries
from tests.runtime import MODE

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def _ask(client: Client, key: str, model: str = "conductor-mini") -> dict[str, Any]:
    resp = client.post(
        "/v1/chat/completions",
        data=json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "What is six times seven?"}]}
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert resp.status_code == 200, resp.content
    return resp.json()


# What a warm run (second of the process) may cost at most; ~115 measured when this was written
# (~170 before the rollup upserts and the caches). Above it, something started reading per event.
BUDGET = 130


@pytest.mark.skipif(MODE != "embedded", reason="the run executes in this process only when embedded")
def test_queries_per_v1_run(conductor_fake: Any, api_key: tuple[Any, str], queries: Queries) -> None:
    client = Client()
    _ask(client, api_key[1])  # the first run of the process fills the caches
    queries.clear()
    answer = _ask(client, api_key[1])
    assert answer["choices"][0]["message"]["content"]
    common = queries.common()
    assert len(queries) <= BUDGET, common
    # The policy and the pool's worker rows: nothing read while the access version (read with the
    # key and with the run) is current: no version ids, no freshness token, no membership reads.
    assert queries.count(r'FROM "policies_policyversion"') == 0, common
    assert queries.count(r'FROM "policies_policy"') == 0, common
    assert queries.count(r'FROM "workers_poolworker"') == 0, common
    assert queries.count(r'MAX\("workers_worker"."updated_at"\)') == 0, common
    # Read with the key and with the run; the sink's counter UPDATE of each batch returns it too
    # (the version its viewers compare: apps.runs.ws_access), in the same statement.
    assert queries.count(r'^SELECT .*FROM "governance_accessversion"') == 2, common
    assert queries.count(r'FROM "governance_accessversion"') == 2 + queries.count(
        r'^UPDATE "runs_run" SET "last_seq"'
    ), common
    # The key: one query with its membership folded in.
    assert queries.count(r'FROM "api_apikey"') == 1, common
    assert (
        queries.count(r'SELECT .* FROM "governance_membership" WHERE \("governance_membership"."team_id"')
        == 0
    )
    # The rollups: one upsert per table per event, never a read-then-update.
    assert queries.count(r'^SELECT .* FROM "insights_') == 0, common
    assert queries.count(r'^UPDATE "insights_') == 0, common


def test_a_published_policy_is_in_force_at_once(alpha: Any, queries: Queries) -> None:
    from apps.policies.selectors import effective_policy_cached
    from apps.policies.services import policy_rollback
    from apps.runs.integration import policy_in_force
    from tests.factories.policies import publish_policy

    v1 = publish_policy(alpha, {"constraints": {"max_steps": {"value": 4}}})
    assert policy_in_force(alpha).effective.spec.constraints.max_steps.value == 4
    assert policy_in_force(alpha).version_id == v1.pk
    queries.clear()
    assert effective_policy_cached(alpha) is effective_policy_cached(alpha)  # cached: same object
    assert len(queries) == 2  # the current version ids, nothing else
    v2 = publish_policy(alpha, {"constraints": {"max_steps": {"value": 3}}})
    assert policy_in_force(alpha).effective.spec.constraints.max_steps.value == 3
    assert policy_in_force(alpha).version_id == v2.pk
    v3 = policy_rollback(actor=None, policy=v1.policy, to_version=v1)
    assert policy_in_force(alpha).version_id == v3.pk
    assert policy_in_force(alpha).effective.spec.constraints.max_steps.value == 4
    publish_policy(None, {"constraints": {"max_steps": {"value": 2}}})  # the platform tightens
    assert policy_in_force(alpha).effective.spec.constraints.max_steps.value == 2


def test_pool_rows_follow_every_edit(fake_pool: Any, alpha: Any, queries: Queries) -> None:
    from apps.runs.integration import PoolUnavailableError, build_pool, check_pool_available
    from apps.workers.models import Pool
    from apps.workers.selectors import pool_rows
    from apps.workers.services import pool_update, worker_update

    def fresh() -> Any:
        return Pool.objects.get(pk=fake_pool.pool.pk)

    first = pool_rows(fresh())
    queries.clear()
    assert pool_rows(fresh()) is first
    assert queries.count(r'FROM "workers_poolworker"') == 0
    check_pool_available(fresh())
    assert len(build_pool(fresh(), gate=gate_without_policy()).workers) == len(first.entries)

    solver = next(w for w in fake_pool.workers if w.slug == "fake-solver")
    worker_update(actor=None, worker=solver, enabled=False)
    with pytest.raises(PoolUnavailableError, match="disabled"):
        check_pool_available(fresh())
    worker_update(actor=None, worker=solver, enabled=True)
    check_pool_available(fresh())

    dropped = next(w for w in fake_pool.workers if w.pk != fresh().default_worker_id)
    others = [w for w in fake_pool.workers if w.pk != dropped.pk]
    pool_update(actor=None, pool=fresh(), workers=others)
    rows = pool_rows(fresh())
    assert [e.worker.slug for e in rows.entries] == [w.slug for w in others]
    assert len(build_pool(fresh(), gate=gate_without_policy()).workers) == len(others)
