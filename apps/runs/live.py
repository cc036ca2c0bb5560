"""A run's released answer text handed straight to the /v1 stream this process serves (issue 45).

A streamed pass-through run (``apps.api.v1.chat``'s fast path) executes in the process that holds
the client's connection. Its sink still stores and publishes every event as for any run (the
run's record, viewers, audit), but the answer's released text also goes to the client from here,
as the engine emits it: no database write, channel-layer publish or read stands between a token
and its client. Only text the output gate released reaches a tap (the sink hands it the
``step.delta`` events marked ``answer``), so what a tap carries is what a follower would read.

The engine's thread pushes; the event loop's stream takes. A burst of pushes wakes the loop once
and is taken as one piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

_taps: dict[str, LiveTap] = {}
_lock = threading.Lock()


class LiveTap:
    """One run's released answer text, from the engine's thread to one stream on ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pieces: list[str] = []
        self._ended = False
        self._woken = False  # a wake-up is on its way to the loop
        self._lock = threading.Lock()
        self._ready = asyncio.Event()  # touched on the loop only

    # -- the engine's side (any thread) -----------------------------------------------------------

    def push(self, text: str) -> None:
        if text:
            self._add(text, end=False)

    def end(self) -> None:
        """The run's execution returned (ended, paused or given back): no more text comes."""
        self._add("", end=True)

    def _add(self, text: str, *, end: bool) -> None:
        with self._lock:
            if text:
                self._pieces.append(text)
            self._ended = self._ended or end
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(RuntimeError):  # a closed loop: the stream is gone, nobody reads
            self.loop.call_soon_threadsafe(self._ready.set)

    # -- the stream's side (the loop) ------------------------------------------------------------

    async def take(self, timeout: float) -> tuple[str, bool] | None:
        """Everything pushed since the last take and whether the run's execution is over; None
        when nothing came for ``timeout`` seconds (the caller sends a keep-alive)."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return None
        self._ready.clear()
        with self._lock:
            pieces, self._pieces = self._pieces, []
            self._woken = False
            ended = self._ended
        return "".join(pieces), ended


def open_tap(run_id: Any, loop: asyncio.AbstractEventLoop) -> LiveTap:
    """Register a tap for ``run_id`` (before its execution starts: the sink looks once)."""
    tap = LiveTap(loop)
    with _lock:
        _taps[str(run_id)] = tap
    return tap


def close_tap(run_id: Any) -> None:
    with _lock:
        _taps.pop(str(run_id), None)


def tap_for(run_id: Any) -> LiveTap | None:
    if not _taps:  # the common case, with no lock
        return None
    with _lock:
        return _taps.get(str(run_id))


__all__ = ["LiveTap", "close_tap", "open_tap", "tap_for"]
