"""Django's PostgreSQL backend, with a cheaper check of the connections its pool hands out.

psycopg_pool's check (what ``CONN_HEALTH_CHECKS`` selects for a pool) sends an empty query on
every checkout: one round trip to PostgreSQL each time a thread takes a connection, and the kept
threads take one per unit of work (a ``/v1`` request's start and its answer, a sequencer look).
That was 3 to 5% of a busy daphne's CPU (issue #15).

A connection the server has given up on says so on its socket: ``pg_terminate_backend``, a server
shutdown or restart send a FATAL message and close it, and a dropped TCP connection reads as
end-of-file. An idle pooled connection is sent nothing else (none of them ``LISTEN``s), so an
idle connection whose socket has nothing to read is as usable as the round trip would have found
it, and is handed out without one. Anything else (something to read, not idle, known closed) gets
the round trip, and a connection that fails it is discarded and the next one taken, as with
psycopg_pool's check. What no local look can see, a peer gone without a word, the round trip
would not have caught either: it would have waited for the same TCP timeout.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool


def quiet_socket(conn: Any) -> bool:
    """Whether ``conn`` is open, idle and has nothing waiting on its socket."""
    if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):  # a closed descriptor
        return False
    return not readable


def usable(conn: Any) -> bool:
    """A quiet socket, or else psycopg_pool's round trip."""
    if quiet_socket(conn):
        return True
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        return False
    return True


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: Any) -> Any:
        conn = super().get_new_connection(conn_params)
        pool = self.pool
        if pool is None:
            return conn
        # Each failed one is discarded; the pool opens replacements. Bounded: a server that is
        # down fails the next statement truthfully instead of this looping.
        for _ in range(int(pool.max_size)):
            if usable(conn):
                return conn
            conn.close()
            pool.putconn(conn)  # closed: the pool drops it and opens another in the background
            conn = super().get_new_connection(conn_params)
        return conn
