"""Database work of websocket handshakes, in parallel on the loop's executor threads (issue 14).

Channels' `database_sync_to_async` runs on daphne's one thread-sensitive worker thread (which
every sync HTTP view shares) unless told otherwise, and opens and closes a connection around
every call. For a burst of handshakes both serialise: a thousand sockets spent a third of their
time connecting to SQLite, and PostgreSQL handshakes queued past daphne's connect timeout. Here
each executor thread keeps one connection (as `CONN_MAX_AGE=None` would), replaced when it has
failed — the check Django itself makes between requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

T = TypeVar("T")


def _with_thread_connection(fn: Callable[..., T]) -> Callable[..., T]:
    def call(*args: Any, **kwargs: Any) -> T:
        if connection.connection is not None and connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()
        return fn(*args, **kwargs)

    return call


async def in_executor(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on an executor thread with that thread's kept connection."""
    return await sync_to_async(_with_thread_connection(fn), thread_sensitive=False)(*args, **kwargs)
