"""More /v1 clients than the database lets one process connect: they wait for a pooled
connection instead of failing (issue 15). 128 clients on one daphne opened a connection per
request thread, past PostgreSQL's max_connections, and every run failed with 503 "too many
clients already" (bench/API.md). Each process now draws from a bounded pool (DB_POOL_MAX_SIZE),
and a /v1 caller gives its connection back while it waits for its run.

Reproduced small: our daphne logs in as a PostgreSQL role allowed LIMIT connections, with a pool
of POOL, and CLIENTS callers arrive at once. Without the pool (DB_POOL_MAX_SIZE=0, the old
behaviour) the callers past the role's limit get 503s.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection

from tests.fixtures.api import CONDUCTOR_ANSWER
from tests.fixtures.core import _stop, db_vendor, start_daphne, subprocess_env

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

LIMIT = 6  # connections the role may hold at once
POOL = 4  # the daphne's pool: its request threads, sequencer and lease keeper share it
CLIENTS = 24
ROLE = f"conductor_pool_{os.environ.get('CONDUCTOR_TEST_ID', 'main')}".replace("-", "_").lower()
TIMEOUT_S = 180


@pytest.fixture
def limited_role(django_db_setup: Any, django_db_blocker: Any) -> Iterator[str]:
    if db_vendor() != "postgresql":
        pytest.skip("the connection pool is PostgreSQL's; the embedded mode's SQLite has no server limit")
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [ROLE])
        if cur.fetchone():
            cur.execute(f'DROP OWNED BY "{ROLE}"')
            cur.execute(f'DROP ROLE "{ROLE}"')
        cur.execute(f'CREATE ROLE "{ROLE}" LOGIN CONNECTION LIMIT {LIMIT}')
        for grant in ("SCHEMA public", "ALL TABLES IN SCHEMA public", "ALL SEQUENCES IN SCHEMA public"):
            cur.execute(f'GRANT ALL ON {grant} TO "{ROLE}"')
    try:
        yield ROLE
    finally:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [ROLE])
            cur.execute(f'DROP OWNED BY "{ROLE}"')
            cur.execute(f'DROP ROLE "{ROLE}"')


def _limited_server(role: str, log: Path, pool_size: int) -> Any:
    db = connection.settings_dict
    url = f"postgres://{role}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    env = subprocess_env(DB_POOL_MAX_SIZE=str(pool_size))
    env["DATABASE_URL"] = url
    return start_daphne(log, env)


def _burst(url: str, key: str) -> list[httpx.Response]:
    def call(_: int) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "conductor-mini", "messages": [{"role": "user", "content": "Six times seven?"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=TIMEOUT_S,
        )

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(call, range(CLIENTS)))


def test_a_burst_past_the_database_limit_waits_for_pooled_connections(
    limited_role: str, tmp_path: Path, runtime_workers: Any, conductor_fake: Any, api_key: tuple[Any, str]
) -> None:
    server = _limited_server(limited_role, tmp_path / "daphne.log", POOL)
    try:
        responses = _burst(server.url, api_key[1])
    finally:
        _stop(server.proc)
    failed = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
    assert not failed, failed
    assert {r.json()["choices"][0]["message"]["content"] for r in responses} == {CONDUCTOR_ANSWER}
    assert "too many connections" not in (tmp_path / "daphne.log").read_text(errors="replace")
