"""OpenAI Responses (``POST /v1/responses``, ``GET /v1/responses/{id}``) on the run bridge.

A response **is** a run: the same policy, budget, audit trail, review hold and live graph as a
chat completion. Its id is the run's (``resp_<run hex>``), so ``GET /v1/responses/{id}`` and
``previous_response_id`` read the run back under the run's visibility rule: only the key's
team, and a held answer stays held. ``store: false`` hides the response from both, but the run
itself is kept (the audit trail needs it).

Input items (``message`` with ``input_text`` / ``output_text`` parts, ``function_call``,
``function_call_output``) become the bridge's chat messages; function tools become its tools.
Every other parameter is honoured or refused by name (400 with ``param``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.api import selectors as api_sel
from apps.api.models import ApiScope
from apps.api.v1 import auth, bridge, follow, live_stream, shaping, targets
from apps.api.v1.errors import ApiError, error_body, error_response, method_not_allowed
from apps.api.v1.responses_output import finished_response, message_item, response_body, text_part
from apps.api.v1.responses_request import (
    msg_id,
    parse_responses_request,
    response_id,
    run_id_of,
    stored_run,
    with_history,
)
from apps.core.executor_db import off_loop
from apps.runs.models import Run

# Names other modules (and tests) read from here since before the split.
__all__ = [
    "finished_response",
    "parse_responses_request",
    "response_body",
    "response_detail_view",
    "response_id",
    "responses_view",
    "run_id_of",
    "stored_run",
    "with_history",
]


# --- streaming ---------------------------------------------------------------------------------------


class _Events:
    """Responses SSE events, each with its ``sequence_number``."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return shaping.sse(payload, event=kind)


def _opening(
    request: HttpRequest, started: bridge.Started, events: _Events, buffered: str | None
) -> list[bytes]:
    """``response.created`` and ``response.in_progress``: whether the answer streams or is held
    for checks, said at once (issue 45)."""
    run, target = started.run, started.target
    record = bridge.api_request_record(started.req, target)
    conductor = shaping.conductor_info(request, run, target)
    initial = response_body(
        run, record, {**conductor, "answer": shaping.answer_mode(buffered)}, status="in_progress"
    )
    return [events("response.created", response=initial), events("response.in_progress", response=initial)]


def _open_message(run: Run, events: _Events, index: int = 0) -> list[bytes]:
    """The message item and its text part announced (before its first text)."""
    return [
        events("response.output_item.added", output_index=index, item=message_item(run, "", "in_progress")),
        events(
            "response.content_part.added",
            item_id=msg_id(run.id),
            output_index=index,
            content_index=0,
            part=text_part(""),
        ),
    ]


def _delta(events: _Events, item_id: str, text: str, index: int = 0) -> bytes:
    return events(
        "response.output_text.delta",
        item_id=item_id,
        output_index=index,
        content_index=0,
        delta=text,
        logprobs=[],
    )


async def stream_response(
    request: HttpRequest, started: bridge.Started, events: _Events, buffered: str | None = None
) -> AsyncGenerator[bytes, None]:
    """A streamed response from the run's stored events."""
    run = started.run
    for head in _opening(request, started, events, buffered):
        yield head
    final: Any = None
    streamed = shaping.Streamed()
    item_id = msg_id(run.id)
    async for update in follow.follow_run(run):
        if update.kind == "keepalive":
            yield shaping.SSE_KEEPALIVE
        elif update.kind == "event":
            assert update.event is not None
            opened = bool(streamed.parts)  # the message item was announced (its first text came)
            piece = streamed.piece(update.event, buffered)
            if not piece:
                continue
            if not opened:
                for head in _open_message(run, events):
                    yield head
            yield _delta(events, item_id, piece)
        elif update.kind == "final":
            final = update.run
    async for tail in _ending(request, started, events, final, streamed):
        yield tail


async def _ending(
    request: HttpRequest, started: bridge.Started, events: _Events, final: Run, streamed: shaping.Streamed
) -> AsyncGenerator[bytes, None]:
    """A stream's last events once its run ended, on either path: ``response.failed`` (the
    error: blocked, failed …), or the rest of the output items and ``response.completed`` /
    ``response.incomplete``."""
    await auth.count_tokens(started.key, final)
    body, error = await finished_response(request, final, started.target)
    if error is not None:
        yield events("response.failed", response=body)
        return
    opened = bool(streamed.parts)  # the message item was announced (its first released text came)
    items = body["output"]
    for index, item in enumerate(items):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            if not (opened and index == 0):
                for head in _open_message(final, events, index):
                    yield head
                streamed = shaping.Streamed()
            rest = streamed.rest(text)
            if rest:
                yield _delta(events, item["id"], rest, index)
            yield events(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
            yield events(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=text_part(text),
            )
        else:
            yield events("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            yield events(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=item["arguments"],
            )
            yield events(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield events("response.output_item.done", output_index=index, item=item)
    ending = "response.completed" if body["status"] == "completed" else "response.incomplete"
    yield events(ending, response=body)


class ResponsesLive:
    """The Responses API on the fast pass-through (``live_stream``): ``stream_response``'s
    opening and ending; each text delta one event from a frame rendered once (its sequence
    number and text the only parts written per piece)."""

    keepalive = shaping.SSE_KEEPALIVE

    def __init__(self, request: HttpRequest, started: bridge.Started, events: _Events) -> None:
        self.request, self.started, self.events = request, started, events
        item_id = msg_id(started.run.id)
        self._frame = live_stream.Frame(
            lambda seq, text: shaping.sse(
                {
                    "type": "response.output_text.delta",
                    "sequence_number": seq,
                    "item_id": item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                },
                event="response.output_text.delta",
            ),
            slots=2,
        )

    def opening(self) -> Iterable[bytes]:
        return _opening(self.request, self.started, self.events, None)

    def open_content(self) -> Iterable[bytes]:
        return _open_message(self.started.run, self.events)

    def piece(self, text: str) -> bytes:
        seq, self.events.seq = self.events.seq, self.events.seq + 1
        return self._frame(seq, text)

    def ending(self, final: Run, streamed: shaping.Streamed) -> AsyncIterator[bytes]:
        return _ending(self.request, self.started, self.events, final, streamed)


ENDINGS = (b"event: response.completed\n", b"event: response.incomplete\n", b"event: response.failed\n")


# --- views -------------------------------------------------------------------------------------------


@csrf_exempt
async def responses_view(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return method_not_allowed("POST")
    try:
        # A streamed pass-through may execute in this process (see live_stream.accept).
        started, running, buffered = await live_stream.accept(request, parse_responses_request, with_history)
    except ApiError as err:
        return error_response(err)
    run, target = started.run, started.target
    headers = auth.run_headers(run, shaping.run_url(request, run.id))
    response: HttpResponseBase
    if started.req.stream:
        events = _Events()
        stream = live_stream.body_for(
            headers,
            started,
            running,
            buffered,
            live=lambda: ResponsesLive(request, started, events),
            events=lambda: stream_response(request, started, events, buffered),
        )

        def on_failure(exc: BaseException) -> list[bytes]:
            err = shaping.follow_failure_error(request, run, target, exc)
            return [events("error", **error_body(err)["error"], conductor=err.conductor)]

        response = live_stream.event_stream(
            stream, is_end=lambda piece: piece.startswith(ENDINGS), on_failure=on_failure
        )
    else:
        try:
            final = await follow.wait_for_run(run, started.ended)
            await auth.count_tokens(started.key, final)
            body, error = await finished_response(request, final, target)
            response = error_response(error) if error is not None else JsonResponse(body)
        except Exception as exc:
            response = error_response(shaping.follow_failure_error(request, run, target, exc))
    for name, value in headers.items():
        response[name] = value
    return response


def _retrieve(request: HttpRequest, resp_id: str) -> tuple[Run, targets.Target]:
    key = auth.authenticate(request)
    refusal = api_sel.scope_refusal(key, ApiScope.RUNS_READ)
    if refusal is not None:
        raise auth.deny(key, 403, "insufficient_scope", refusal, detail=ApiScope.RUNS_READ)
    run = stored_run(key, resp_id)
    preset = run.preset or "mini"
    return run, targets.Target(
        preset=preset, pool=run.pool, model=str((run.api_request or {})["protocol"].get("model"))
    )


@csrf_exempt
async def response_detail_view(request: HttpRequest, response_id: str) -> HttpResponseBase:
    if request.method != "GET":
        return method_not_allowed("GET")
    try:
        run, target = await off_loop(_retrieve, request, response_id)
    except ApiError as err:
        return error_response(err)
    if run.is_terminal:
        body, _ = await finished_response(request, run, target)
    else:
        conductor = shaping.conductor_info(request, run, target)
        record = run.api_request if isinstance(run.api_request, dict) else {}
        body = response_body(run, record, conductor, status="in_progress")
    response = JsonResponse(body)
    for name, value in auth.run_headers(run, shaping.run_url(request, run.id)).items():
        response[name] = value
    return response
