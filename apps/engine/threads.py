"""Kept daemon threads for the engine's blocking provider calls.

Every step and every conductor call waits on a provider on a thread of its own, so a call that
overruns its timeout can be abandoned (SDK and llama calls cannot be interrupted). Starting a
thread per call cost more than the call's bookkeeping: ``Thread.start`` waits until the new
thread holds the GIL, which on a busy server can take a whole switch interval (issue #15). Here a
finished thread parks for a while and takes the next call instead.

The pool is unbounded on purpose: an abandoned call keeps its thread until the provider returns,
and a new call never waits behind it. Each call runs in a copy of the context it was spawned
from (issue 44: the run's request id stays on the log lines of its provider calls), never in what
an earlier call on the same thread left, so nothing one run set is seen by the next. A parked
thread that gets no call within ``IDLE_S`` ends.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

# How long a parked thread waits for another call before it ends.
IDLE_S = 60.0

_Task = tuple[Callable[[], None], str, contextvars.Context]

_lock = threading.Lock()
_parked: list[_Kept] = []  # LIFO: the most recently used (warm) thread goes first
_cleanup: Callable[[], None] | None = None
_started = 0  # threads started (tests and benches read it)


def set_task_cleanup(fn: Callable[[], None] | None) -> None:
    """Called on the thread after each call (the Django side closes the thread's database
    connections there: a kept thread must not keep one, as a thread that ended would not)."""
    global _cleanup
    _cleanup = fn


def started() -> int:
    """How many threads this process has started for calls."""
    return _started


def spawn(target: Callable[[], None], *, name: str) -> None:
    """Run ``target`` on a kept daemon thread (a parked one, or a new one). Never waits for it;
    ``target`` reports its own outcome (the engine's callers hand results over a queue). It runs
    in a copy of the caller's context: what the caller set (its request id) is seen, what the
    call sets stays with the call."""
    task = (target, name, contextvars.copy_context())
    with _lock:
        kept = _parked.pop() if _parked else None
    if kept is not None:
        kept.inbox.put(task)
        return
    _start(task)


def _start(task: _Task) -> None:
    global _started
    kept = _Kept()
    thread = threading.Thread(target=kept.serve, args=(task,), daemon=True, name=task[1])
    with _lock:
        _started += 1
    thread.start()


class _Kept:
    __slots__ = ("inbox",)

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Task] = queue.SimpleQueue()

    def serve(self, task: _Task) -> None:
        while True:
            target, name, context = task
            threading.current_thread().name = name
            try:
                context.run(target)
            except Exception:  # the engine's targets catch their own; keep the thread regardless
                logger.exception("an engine call raised on %s", name)
            finally:
                cleanup = _cleanup
                if cleanup is not None:
                    try:
                        cleanup()
                    except Exception:
                        logger.exception("engine thread cleanup failed")
            with _lock:
                _parked.append(self)
            try:
                task = self.inbox.get(timeout=IDLE_S)
            except queue.Empty:
                with _lock:
                    if self in _parked:
                        _parked.remove(self)
                        return
                # spawn() took this thread between the timeout and the lock: its call is on the way.
                task = self.inbox.get()


def _forget_parked() -> None:
    """A forked child has none of the parent's threads: handing a call to one would lose it."""
    global _lock
    _lock = threading.Lock()
    _parked.clear()


os.register_at_fork(after_in_child=_forget_parked)
