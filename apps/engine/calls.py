"""Cancelling a provider call the executor abandoned (issue 44).

The executor gives up on a call at its timeout, at the run's deadline, on cancellation or when a
block ends the run. Until then the call was left running on its thread: a local generation kept
the model's one slot busy for the steps behind it, and an HTTP request stayed open. Each call now
runs inside a ``CallScope``; abandoning it ``cancel()``s the scope, which

- sets a flag the local model checks at every streamed token (closing llama's stream), so the
  generation stops and frees the slot;
- runs the cancellers registered on it: the HTTP client registers one per socket read or write
  that shuts the socket down (``apps.engine.providers._egress_http``), so a blocked SDK call
  returns at once and the connection is dropped, which the provider sees as the client leaving.

A provider that finds its scope cancelled raises ``ProviderCancelled``; nobody waits for it.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)


class CallScope:
    __slots__ = ("_cancelled", "_cancellers", "_lock", "reason")

    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self._cancellers: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self.reason = ""

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, reason: str = "the executor abandoned the call") -> None:
        with self._lock:
            if self._cancelled.is_set():
                return
            self.reason = reason
            self._cancelled.set()
            cancellers = list(self._cancellers.values())
        for fn in cancellers:
            try:
                fn()
            except Exception:  # a canceller that fails leaves the call to its own timeout
                logger.warning("a call canceller failed", exc_info=True)

    @contextmanager
    def on_cancel(self, fn: Callable[[], None]) -> Iterator[None]:
        """Run ``fn`` if the call is cancelled during this block (at once if it already is)."""
        key = id(fn)
        with self._lock:
            self._cancellers[key] = fn
            already = self._cancelled.is_set()
        if already:
            fn()
        try:
            yield
        finally:
            with self._lock:
                self._cancellers.pop(key, None)


_current: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("engine_call_scope", default=None)


def current() -> CallScope | None:
    return _current.get()


def cancelled() -> bool:
    scope = _current.get()
    return scope is not None and scope.cancelled


@contextmanager
def scope(call: CallScope) -> Iterator[CallScope]:
    """Run a provider call inside ``call`` (the executor does, on the call's thread)."""
    token = _current.set(call)
    try:
        yield call
    finally:
        _current.reset(token)


@contextmanager
def on_cancel(fn: Callable[[], None]) -> Iterator[None]:
    """Register ``fn`` on the current call's scope for this block; nothing without a scope."""
    call = _current.get()
    if call is None:
        yield
        return
    with call.on_cancel(fn):
        yield
