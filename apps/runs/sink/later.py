"""Stores that wait: a run's buffered events stored at a due time, unless the engine stored
them first (``RunSink._store_deferred_start``).

A one-step run whose client waits in this process (a plain ``/v1`` pass-through executed on its
request's thread, or a stream served from a tap) does not store its first events before the
provider call: they go with the answer, one transaction instead of two, and no transaction
stands before the call (issue 45). Only a call still running ``DEFERRED_START_FLUSH_S`` later
has them stored from here, so the run's live graph shows the step while a slow model works.

One daemon thread per process holds the due stores in time order; a store it runs takes the
sink's lock like any other, so it never interleaves with the engine's own.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

_heap: list[tuple[float, int, Callable[[], None]]] = []
_order = itertools.count()  # ties in due time keep their scheduling order
_cond = threading.Condition()
_thread: threading.Thread | None = None


def call_later(delay_s: float, fn: Callable[[], None]) -> None:
    """Run ``fn`` on this process's deferred-store thread ``delay_s`` seconds from now."""
    global _thread
    with _cond:
        entry = (time.monotonic() + delay_s, next(_order), fn)
        heapq.heappush(_heap, entry)
        # is_alive is False in a forked child (a Celery worker): it starts its own.
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve, daemon=True, name="run-sink-later")
            _thread.start()
        if _heap[0] is entry:  # due first: the thread sleeps until a later one, so wake it
            _cond.notify()


def _serve() -> None:
    while True:
        with _cond:
            while not _heap:
                _cond.wait()
            due, _, fn = _heap[0]
            wait = due - time.monotonic()
            if wait > 0:
                _cond.wait(wait)
                continue
            heapq.heappop(_heap)
        try:
            fn()
        except Exception:
            # The events stay buffered: the engine's next store takes them.
            logger.exception("a deferred run-event store failed")
