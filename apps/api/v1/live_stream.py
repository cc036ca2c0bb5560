"""The fast pass-through (issue 45), one for every ``/v1`` protocol.

A streamed run on a one-worker pass-through pool, with nothing that needs the whole answer,
executes in the process serving its client (``bridge.start_run(live=True)`` hands back an inline
slot) and its released answer text goes to the stream from a tap on the run's sink
(``apps.runs.live``): no database write, publish or read stands between a token and its client.
What is protocol-neutral lives here: starting the execution and its tap (``begin``), keep-alives,
following a run that was given back or paused, and handing the ending to the protocol. A protocol
says how its stream opens, how one content piece is framed (``Frame``: the bytes around the text,
rendered once per stream) and how it ends (the same ending code its events path uses).

``X-Conductor-Stream`` (``STREAM_HEADER``) tells the client which path served it: ``direct`` (this
one) or ``events`` (the run's stored events, as any other stream).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Protocol

from django.http import StreamingHttpResponse

from apps.api.v1 import bridge, follow, shaping
from apps.core.executor_db import off_loop
from apps.runs import live
from apps.runs.models import Run

# How a stream's answer reached it: "direct" (the fast pass-through: executed in this process, the
# released text handed over as it comes) or "events" (read from the run's stored events).
STREAM_HEADER = "X-Conductor-Stream"
DIRECT = "direct"
EVENTS = "events"

# Executions of live streams (a task is only weakly held by the loop): each runs to its end
# whether or not its client stays.
_live_runs: set[asyncio.Future[Run | None]] = set()


def execute_live(started: bridge.Started, tap: live.LiveTap | None) -> asyncio.Future[Run | None]:
    """Start executing a run ``start_run(live=True)`` accepted for this process, on a request
    thread; its released answer goes to ``tap`` as it comes. The future is the run as it ended
    (None: it is followed as any other run). A client that goes away does not stop it: the run
    ends as it would have (and its record says so)."""
    run_id = started.run.id

    async def execute() -> Run | None:
        try:
            ended: Run | None = await off_loop(bridge.execute_live, started)
            return ended
        finally:
            if tap is not None:
                tap.end()
                live.close_tap(run_id)

    task = asyncio.ensure_future(execute())
    _live_runs.add(task)
    task.add_done_callback(_live_runs.discard)
    return task


class Live:
    """A run accepted for execution here: its tap and its execution (see ``begin``)."""

    def __init__(self, tap: live.LiveTap, execution: asyncio.Future[Run | None]) -> None:
        self.tap = tap
        self.execution = execution


def begin(started: bridge.Started) -> Live | None:
    """When ``start_run`` accepted the run for this process, start executing it now, whatever
    the stream does next (the tap is registered first: the run's sink looks for it once)."""
    if started.live_slot is None:
        return None
    tap = live.open_tap(started.run.id, asyncio.get_running_loop())
    return Live(tap, execute_live(started, tap))


def path_for(running: Live | None, buffered: str | None) -> str:
    """``direct`` only when nothing needs the whole answer: a buffered answer comes with the
    verdict, which the run's events carry (its tap receives nothing)."""
    return DIRECT if running is not None and buffered is None else EVENTS


class Frame:
    """The bytes of one content event around its variable parts, rendered once per stream.

    ``render(*markers)`` renders the event with a marker in each slot; a slot is filled later
    with ``json.dumps`` of a string (the text) or an integer written bare (a sequence number)."""

    def __init__(self, render: Callable[..., bytes], slots: int = 1) -> None:
        markers = [f"\u0000SLOT{i}\u0000" for i in range(slots)]
        rest = render(*markers)
        self.parts: list[bytes] = []
        for marker in markers:
            head, _, rest = rest.partition(json.dumps(marker).encode())
            self.parts.append(head)
        self.parts.append(rest)

    def __call__(self, *values: str | int) -> bytes:
        out = [self.parts[0]]
        for value, part in zip(values, self.parts[1:], strict=True):
            out.append(json.dumps(value).encode() if isinstance(value, str) else str(value).encode())
            out.append(part)
        return b"".join(out)


class LiveProtocol(Protocol):
    """How one protocol's stream opens, frames a content piece, stays alive and ends."""

    keepalive: bytes

    def opening(self) -> Iterable[bytes]:
        """The stream's first events (sent before any text: they name the run)."""
        ...

    def open_content(self) -> Iterable[bytes]:
        """Sent once, before the first content piece (e.g. a content block's start)."""
        ...

    def piece(self, text: str) -> bytes:
        """One content event carrying ``text``."""
        ...

    def ending(self, final: Run, streamed: shaping.Streamed) -> AsyncIterator[bytes]:
        """The protocol's ending for the run as it ended (its events path's own code)."""
        ...


async def stream_live(
    started: bridge.Started, running: Live, proto: LiveProtocol
) -> AsyncGenerator[bytes, None]:
    """The stream of a run executing here: its released answer written as the engine emits it,
    each piece one event framed once. What the client gets and how the stream ends are the
    events path's: the same checks released the same text."""
    for head in proto.opening():
        yield head
    streamed = shaping.Streamed()
    while True:
        taken = await running.tap.take(follow.KEEPALIVE_S)
        if taken is None:
            yield proto.keepalive
            continue
        text, ended = taken
        if text:
            if not streamed.parts:
                for head in proto.open_content():
                    yield head
            streamed.parts.append(text)
            yield proto.piece(text)
        if ended:
            break
    final = await running.execution
    if final is None or not final.is_terminal:
        # Given back to the queue or paused: follow it to its end as any other stream does (the
        # text it released here is already sent; its events are read only for the ending).
        async for update in follow.follow_run(started.run):
            if update.kind == "keepalive":
                yield proto.keepalive
            elif update.kind == "final":
                final = update.run
    assert final is not None  # follow_run always ends with the run as it is
    async for tail in proto.ending(final, streamed):
        yield tail


def stream_headers(headers: dict[str, str], *, path: str, buffered: str | None) -> None:
    """The headers every /v1 stream says how it is served with."""
    headers[shaping.ANSWER_HEADER] = "buffered" if buffered else "streamed"
    headers[STREAM_HEADER] = path


def event_stream(
    body: AsyncGenerator[bytes, None],
    *,
    is_end: Callable[[bytes], bool],
    on_failure: Callable[[BaseException], Iterable[bytes]],
) -> StreamingHttpResponse:
    """A /v1 stream's response: ``body`` guarded (``shaping.guarded_stream``: whatever fails after
    the run exists, the protocol's error ends it), never cached or buffered by a proxy."""
    response = StreamingHttpResponse(
        shaping.guarded_stream(body, is_end=is_end, on_failure=on_failure), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    return response
