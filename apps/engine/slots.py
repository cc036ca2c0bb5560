"""Worker slots: how many calls a worker takes at once (issue 44).

A local llama model runs one generation at a time (its context is not thread-safe), and an
operator may cap an HTTP worker the same way (``WorkerInfo.concurrency``). A *slot* is that
capacity, shared by every run in the process: a step that finds its worker's slots taken is
*waiting* (``step.waiting``), not running, and its call timeout starts only when its call does
(``step.running``); the run's own deadline bounds the wait. Without a capacity (most HTTP
workers) there is no slot and a step's call starts at once.

The executor takes a slot for a step before the call and hands it to the call through
``held()``: a provider that guards its own capacity (the local model) sees that its caller already
holds the slot and does not take it a second time. Any other caller (a health check, a judge)
takes the slot inside the provider.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# How often a waiter re-checks whether its caller gave up (a release wakes it at once).
POLL_S = 0.25


class Slot:
    """A counting semaphore with a name, a capacity and the number of callers waiting."""

    __slots__ = ("_cond", "_in_use", "_waiting", "capacity", "key")

    def __init__(self, key: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a slot's capacity must be >= 1")
        self.key = key
        self.capacity = capacity
        self._in_use = 0
        self._waiting = 0
        self._cond = threading.Condition()

    def __repr__(self) -> str:
        return f"Slot({self.key!r}, {self._in_use}/{self.capacity} in use, {self._waiting} waiting)"

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        return self._waiting

    def try_acquire(self) -> bool:
        with self._cond:
            if self._in_use < self.capacity:
                self._in_use += 1
                return True
            return False

    def acquire(self, *, timeout: float | None = None, give_up: Callable[[], bool] | None = None) -> bool:
        """Wait for a free slot. False when ``timeout`` passed or ``give_up()`` became true first
        (checked every ``POLL_S``): the caller was abandoned while it waited."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._waiting += 1
            try:
                while self._in_use >= self.capacity:
                    if give_up is not None and give_up():
                        return False
                    left = POLL_S if end is None else min(POLL_S, end - time.monotonic())
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                self._in_use += 1
                return True
            finally:
                self._waiting -= 1

    def release(self) -> None:
        with self._cond:
            if self._in_use <= 0:
                raise RuntimeError(f"slot {self.key!r} released more often than acquired")
            self._in_use -= 1
            self._cond.notify()


_SLOTS: dict[str, Slot] = {}
_SLOTS_LOCK = threading.Lock()


def slot(key: str, capacity: int | None) -> Slot | None:
    """The process-wide slot for ``key`` (created on first use); None for unlimited capacity.
    A capacity changed by configuration applies to the next call."""
    if capacity is None:
        return None
    with _SLOTS_LOCK:
        found = _SLOTS.get(key)
        if found is None:
            found = _SLOTS[key] = Slot(key, capacity)
        elif found.capacity != capacity:
            with found._cond:
                found.capacity = max(1, capacity)
                found._cond.notify_all()
        return found


def worker_slot(worker: Any) -> Slot | None:
    """A worker's slot: its own ``slot()`` (the local model's, shared by every worker of the same
    model file), else one per worker key when its ``info.concurrency`` is set, else None."""
    get = getattr(worker, "slot", None)
    if callable(get):
        found: Slot | None = get()
        return found
    inner = getattr(worker, "inner", None)
    if inner is not None:  # a wrapper (the resume journal, a replay): the wrapped worker's slot
        return worker_slot(inner)
    return slot(f"worker:{worker.info.key}", worker.info.concurrency)


_held: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "engine_slots_held", default=frozenset()
)


@contextmanager
def held(found: Slot | None) -> Iterator[None]:
    """Within this block the current call holds ``found`` (taken by the caller)."""
    if found is None:
        yield
        return
    token = _held.set(_held.get() | {found.key})
    try:
        yield
    finally:
        _held.reset(token)


def holds(found: Slot) -> bool:
    """Whether the current call's caller already took ``found`` for it."""
    return found.key in _held.get()
