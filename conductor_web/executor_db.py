"""Database work of websocket handshakes, in parallel on the loop's executor threads (issue 14).

Channels' `database_sync_to_async` runs on daphne's one thread-sensitive worker thread (which
every sync HTTP view shares) unless told otherwise, and opens and closes a connection around
every call. For a burst of handshakes both serialise: a thousand sockets spent a third of their
time connecting to SQLite, and PostgreSQL handshakes queued past daphne's connect timeout. Here
each executor thread keeps one connection (as `CONN_MAX_AGE=None` would), replaced when it has
failed — the check Django itself makes between requests. With a connection pool (PostgreSQL,
DB_POOL_MAX_SIZE) the connection goes back to the pool after each call instead: a kept one would
pin a pool slot per thread for the process's life.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

T = TypeVar("T")


def pooled() -> bool:
    """Whether this process's connections come from a pool (returned on close, not ended)."""
    return bool(settings.DATABASES["default"].get("OPTIONS", {}).get("pool"))


async def release_while_waiting() -> None:
    """``release_pooled_connection`` on the caller's thread-sensitive thread (the one holding
    the request's connection); no thread hop when there is no pool."""
    if pooled():
        await sync_to_async(release_pooled_connection)()


# What a forked child inherited from its parent (see forget_parent_connections): kept referenced so
# nothing finalises them; a fork child ends with os._exit.
_INHERITED: list[Any] = []


def forget_parent_connections() -> None:
    """In a forked child (audit verify's chunk processes, Celery's prefork children): drop the
    parent's connection and pool without any I/O. Their sockets are the parent's: a query, a
    rollback on return to the pool or a close from the child would land in the parent's session
    (a verify child hung in exactly that rollback). The child opens its own on first use."""
    if not pooled():
        return  # without a pool the parent closes its connection before forking (verify, Celery)
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _INHERITED.append(conn.connection)
            conn.connection = None
    pools: dict[str, Any] = DatabaseWrapper._connection_pools  # type: ignore[attr-defined]  # Django's pool registry, unstubbed
    _INHERITED.append(dict(pools))
    pools.clear()


def release_pooled_connection() -> None:
    """Give this thread's connection back to the pool before a long wait, so idle waiters
    (a /v1 caller waiting for its run) do not hold the slots the work needs. A no-op without
    a pool (closing would cost a reconnect) or inside a transaction."""
    if pooled() and connection.connection is not None and not connection.in_atomic_block:
        connection.close()


def _with_thread_connection(fn: Callable[..., T]) -> Callable[..., T]:
    def call(*args: Any, **kwargs: Any) -> T:
        if connection.connection is not None and connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()
        try:
            return fn(*args, **kwargs)
        finally:
            release_pooled_connection()

    return call


async def in_executor(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on an executor thread with that thread's kept connection."""
    return await sync_to_async(_with_thread_connection(fn), thread_sensitive=False)(*args, **kwargs)
