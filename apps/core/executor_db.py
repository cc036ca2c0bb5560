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

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from asgiref.sync import SyncToAsync, sync_to_async
from django.conf import settings
from django.db import connection

T = TypeVar("T")


def keep_connection_healthy() -> None:
    """Keep this thread's connection for its next unit of work unless it failed. A long-lived
    thread (a run's sink, a kept v1-request thread) calls this instead of close_old_connections(),
    which with CONN_MAX_AGE=0 reconnects every time: on SQLite a reconnect runs the PRAGMAs and
    the last close checkpoints the WAL (~30 ms measured), more than the work it wraps."""
    if connection.connection is None or not connection.errors_occurred:
        return
    if connection.is_usable():
        connection.errors_occurred = False
    else:
        connection.close()


def pooled() -> bool:
    """Whether this process's connections come from a pool (returned on close, not ended)."""
    return bool(settings.DATABASES["default"].get("OPTIONS", {}).get("pool"))


async def release_while_waiting() -> None:
    """``release_pooled_connection`` on the thread `off_loop` runs the caller's work on when
    that is the caller's own (the kept threads give theirs back after each call); no thread hop
    when there is no pool."""
    if pooled() and _on_callers_thread():
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


@contextmanager
def kept_connection() -> Iterator[None]:
    """A unit of work on a long-lived thread with that thread's kept connection: checked before
    (`keep_connection_healthy`) and, when pooled, given back after (`release_pooled_connection`)."""
    keep_connection_healthy()
    try:
        yield
    finally:
        release_pooled_connection()


def _on_kept_thread(fn: Callable[..., T], executor: ThreadPoolExecutor | None) -> Callable[..., Any]:
    """``fn`` as an awaitable run on a thread of ``executor`` (the loop's default if None) with
    that thread's `kept_connection`."""

    def call(*args: Any, **kwargs: Any) -> T:
        with kept_connection():
            return fn(*args, **kwargs)

    return sync_to_async(call, thread_sensitive=False, executor=executor)


async def in_executor(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on an executor thread with that thread's kept connection."""
    return await _on_kept_thread(fn, None)(*args, **kwargs)  # type: ignore[no-any-return]


_request_threads: tuple[int, ThreadPoolExecutor] | None = None
_request_threads_lock = threading.Lock()


def request_threads() -> ThreadPoolExecutor:
    """This process's threads for the ``/v1`` views' synchronous work (issue 15).

    Django runs a request's thread-sensitive calls on a thread made for that request. Each such
    thread built its own connection wrapper and opened a connection (SQLite: its PRAGMAs), and
    under daphne that cost a served pass-through run about 5 ms of CPU over the same run in
    process. These threads live as long as the process and keep their connections (a pooled one
    goes back after each call). They are not the loop's default executor: a plain run executes
    inline here for as long as its provider takes, and must not hold up websocket handshakes.
    There are enough of them for the inline slots and for the requests waiting for one
    (``V1_INLINE_WAIT_S``); past that, calls queue in arrival order."""
    global _request_threads
    with _request_threads_lock:
        if _request_threads is None or _request_threads[0] != os.getpid():
            size = max(32, 4 * int(settings.V1_INLINE_SLOTS))
            _request_threads = (os.getpid(), ThreadPoolExecutor(size, thread_name_prefix="v1-request"))
        return _request_threads[1]


# Set by conductor_web.handlers.ApiASGIHandler for the requests it serves (they have no
# thread-sensitive context of their own).
_served: contextvars.ContextVar[bool] = contextvars.ContextVar("conductor_served_on_loop", default=False)


@contextmanager
def served_on_loop() -> Iterator[None]:
    """Marks the request being served on the event loop: `off_loop` uses the kept threads."""
    token = _served.set(True)
    try:
        yield
    finally:
        _served.reset(token)


def on_server_loop() -> bool:
    """Whether an ASGI server's event loop serves the request, and outlives its view: work the
    view leaves running (a streamed run executing in this process) goes on after it returns.
    Django's test client runs each call on a loop of its own, closed when the call returns."""
    return not _on_callers_thread()


def _on_callers_thread() -> bool:
    return SyncToAsync.thread_sensitive_context.get(None) is None and not _served.get()


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on one of ``request_threads()``, with that thread's kept connection,
    when an ASGI server serves the request (Django's handler opens a thread-sensitive context per
    request; ``ApiASGIHandler`` marks it `served_on_loop`). Called from synchronous code instead
    (Django's test client, a management command through async_to_sync), it runs on that code's
    own thread, as Django would: that thread already has its connection and may hold the
    transaction the work must see."""
    if _on_callers_thread():
        return await sync_to_async(fn)(*args, **kwargs)
    # Straight to the kept threads, in a copy of the caller's context: asgiref's sync_to_async
    # adds a context round trip and its bookkeeping to every call, a measurable share of a
    # streamed pass-through's CPU (bench/GATEWAY.md). Nothing here needs it: the work runs no
    # async_to_sync and sets no context variable its caller reads back.
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, _kept_call, fn, args, kwargs)
    return await loop.run_in_executor(request_threads(), call)


def _kept_call(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    with kept_connection():
        return fn(*args, **kwargs)
