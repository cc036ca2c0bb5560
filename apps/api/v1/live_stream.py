"""The fast pass-through (issue 45), one for every ``/v1`` protocol.

A streamed run on a one-worker pass-through pool, with nothing that needs the whole answer,
executes in the process serving its client (``bridge.start_run(live=True)`` hands back an inline
slot) and its released answer text goes to the stream from a tap on the run's sink
(``apps.runs.live``): no database write, publish or read stands between a token and its client.
What is protocol-neutral lives here: accepting the request and executing it on the same thread (``accept``), keep-alives,
following a run that was given back or paused, and handing the ending to the protocol. A protocol
says how its stream opens, how one content piece is framed (``Frame``: the bytes around the text,
rendered once per stream) and how it ends (the same ending code its events path uses).

``X-Conductor-Stream`` (``STREAM_HEADER``) tells the client which path served it: ``direct`` (this
one) or ``events`` (the run's stored events, as any other stream).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from django.http import HttpRequest, StreamingHttpResponse

from apps.api.models import ApiKey
from apps.api.v1 import bridge, follow, shaping
from apps.api.v1.run_request import RunRequest
from apps.core.executor_db import off_loop, on_server_loop
from apps.runs import live
from apps.runs.models import Run

logger = logging.getLogger(__name__)

# How a stream's answer reached it: "direct" (the fast pass-through: executed in this process, the
# released text handed over as it comes) or "events" (read from the run's stored events).
STREAM_HEADER = "X-Conductor-Stream"
DIRECT = "direct"
EVENTS = "events"

# Executions of live streams (a task is only weakly held by the loop): each runs to its end
# whether or not its client stays.
_live_runs: set[asyncio.Future[Run | None]] = set()

Buffered = Callable[[bridge.Started], "str | None"]


class Live:
    """A run accepted for execution here: its tap and its execution (see ``accept``)."""

    def __init__(self, tap: live.LiveTap, execution: asyncio.Future[Run | None]) -> None:
        self.tap = tap
        self.execution = execution


async def accept(
    request: HttpRequest,
    parse: Callable[[bytes], RunRequest],
    prepare: Callable[[RunRequest, ApiKey], RunRequest] | None = None,
    *,
    buffered: Buffered = bridge.answer_buffered,
) -> tuple[bridge.Started, Live | None, str | None]:
    """Accept the request (``bridge.start_run``): the run, its live execution when this process
    executes it (None: follow its events), and for a stream why its answer is buffered (None: it
    streams). Raises what ``start_run`` raises (an ApiError for a refusal).

    On a server's loop (which outlives the view: the stream is written after it returns) the
    thread that accepts a streamed pass-through goes straight on to execute it: the run is handed
    to the loop and the provider is called without waiting for the view. Three thread crossings
    before the provider call (accept, back to the loop, execute) become one."""
    if not on_server_loop():  # Django's test client: its loop ends with the call
        started = await off_loop(bridge.start_run, request, parse, prepare)
        reason = await off_loop(buffered, started) if started.req.stream else None
        return started, None, reason
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[tuple[bridge.Started, Live | None, str | None]] = loop.create_future()

    def hand_over(value: Any, exc: BaseException | None = None) -> None:
        def settle() -> None:
            if accepted.done():
                return
            if exc is not None:
                accepted.set_exception(exc)
            else:
                accepted.set_result(value)

        loop.call_soon_threadsafe(settle)

    def accept_and_execute() -> Run | None:
        try:
            started = bridge.start_run(request, parse, prepare, live=True)
        except BaseException as exc:  # the refusal is the view's to render
            hand_over(None, exc)
            return None
        reason: str | None = None
        if started.req.stream:
            try:
                reason = buffered(started)
            except Exception:
                # Accepted already, so it runs; its events (which hold what the policy holds)
                # serve the stream.
                logger.exception("run %s: could not tell whether its answer streams", started.run.id)
                reason = "the policy in force could not be read"
        if started.live_slot is None:
            hand_over((started, None, reason))
            return None
        # Registered before execution starts: the run's sink looks for its tap once.
        tap = live.open_tap(started.run.id, loop)
        hand_over((started, Live(tap, execution), reason))
        try:
            return bridge.execute_live(started)
        finally:
            tap.end()
            live.close_tap(started.run.id)

    execution: asyncio.Future[Run | None] = asyncio.ensure_future(off_loop(accept_and_execute))
    _live_runs.add(execution)
    execution.add_done_callback(_live_runs.discard)
    return await accepted


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


def body_for(
    headers: dict[str, str],
    started: bridge.Started,
    running: Live | None,
    buffered: str | None,
    *,
    live: Callable[[], LiveProtocol],
    events: Callable[[], AsyncGenerator[bytes, None]],
) -> AsyncGenerator[bytes, None]:
    """A stream's body: the fast path (``live()`` frames it) when ``path_for`` allows it, else the
    run's events (``events()``); the headers say which and whether the answer is buffered."""
    path = path_for(running, buffered)
    stream_headers(headers, path=path, buffered=buffered)
    if running is not None and path == DIRECT:
        return stream_live(started, running, live())
    return events()


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
