"""How a pooled PostgreSQL connection is checked before it is handed out
(``apps.core.backends.postgresql``, issue #15): by a look at its socket, with a round trip only
when the socket shows something, and a connection the server has ended is never handed out."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from apps.core.executor_db import pooled
from tests.fixtures.core import test_database_url as database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_pid() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return int(cur.fetchone()[0])


def test_a_quiet_connection_costs_no_round_trip_and_an_ended_one_is_never_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if connection.vendor != "postgresql" or not pooled():
        pytest.skip("the connection pool is the distributed mode's (PostgreSQL)")
    round_trips: list[int] = []
    real = ConnectionPool.check_connection

    def counted(conn: Any) -> None:
        round_trips.append(conn.info.backend_pid)
        real(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    _backend_pid()
    connection.close()  # back to the pool, idle

    _backend_pid()  # taken again: its socket is quiet, so no empty query was sent first
    assert round_trips == []
    connection.close()

    # End every idle connection of this process's pool on the server, as a restart would.
    pool = connection.pool
    held = [pool.getconn() for _ in range(pool.get_stats()["pool_available"])]
    ended = {conn.info.backend_pid for conn in held}
    for conn in held:
        pool.putconn(conn)
    with psycopg.connect(database_url().replace("postgres://", "postgresql://"), autocommit=True) as side:
        side.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(ended)])
    time.sleep(0.2)  # the FATAL message and the close reach the sockets

    pid = _backend_pid()  # no error: the ended ones were checked, failed and were discarded
    assert ended and pid not in ended
    assert set(round_trips) <= ended and round_trips, round_trips
