"""OpenAI Chat Completions (``POST /v1/chat/completions``) and the model list (``GET /v1/models``).

Existing OpenAI clients drop in unchanged: requests and responses follow OpenAI's wire format,
errors use its shape and status codes, and a streamed answer is server-sent events in the chunk
format ending with ``data: [DONE]``. Every parameter is honoured or refused by name (400 with
``param``), never silently ignored: see ``parse_chat_request``.

Models: ``conductor-mini`` / ``conductor-ultra`` run the conductor (that preset) on the key's
team's default pool; ``conductor-mini:<pool>`` / ``conductor-ultra:<pool>`` or a bare ``<pool>``
slug pick another pool the key may use. Every response names its run (``X-Conductor-Run`` header,
``conductor`` field) so a developer can open its live graph.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.api.models import ApiKey
from apps.api.v1 import auth, bridge, follow, live_stream, shaping, targets
from apps.api.v1.chat_request import parse_chat_request
from apps.api.v1.errors import ApiError, error_response, method_not_allowed
from apps.core.executor_db import off_loop
from apps.runs.models import Run

# --- answers -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    id: str
    created: int
    model: str
    conductor: dict[str, Any]


def _usage(run: Run) -> dict[str, Any]:
    """The run's totals in the standard fields (the bill); the tokens spent beyond the answer
    (planning and intermediate steps) as ``completion_tokens_details.reasoning_tokens``, as
    OpenAI reports a reasoning model's hidden work, so ``completion_tokens - reasoning_tokens``
    is the answer's own; and the ``conductor`` breakdown (docs/api.md, "Usage")."""
    used = shaping.usage(run)
    breakdown = shaping.usage_breakdown(run)
    return {
        "prompt_tokens": used.input_tokens,
        "completion_tokens": used.output_tokens,
        "total_tokens": used.total_tokens,
        "completion_tokens_details": {"reasoning_tokens": breakdown["orchestration"]["output_tokens"]},
        "conductor": breakdown,
    }


def completion_body(env: Envelope, run: Run, answer: shaping.FinalAnswer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
        message["content"] = answer.text or None
    return {
        "id": env.id,
        "object": "chat.completion",
        "created": env.created,
        "model": env.model,
        "system_fingerprint": None,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": answer.finish_reason}
        ],
        "usage": _usage(run),
        "conductor": env.conductor,
    }


def _chunk(env: Envelope, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": env.id,
        "object": "chat.completion.chunk",
        "created": env.created,
        "model": env.model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    body.update(extra)
    return body


TOOL_ARGUMENT_PIECE = 48  # characters of arguments per streamed tool-call delta


def tool_call_deltas(calls: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """Streamed tool calls as OpenAI sends them: the call's id and name first, then its
    arguments in pieces, each delta naming the call's ``index``."""
    for i, call in enumerate(calls):
        fn = call.get("function") or {}
        yield {
            "tool_calls": [
                {
                    "index": i,
                    "id": call.get("id"),
                    "type": "function",
                    "function": {"name": fn.get("name"), "arguments": ""},
                }
            ]
        }
        arguments = str(fn.get("arguments") or "")
        for start in range(0, len(arguments), TOOL_ARGUMENT_PIECE):
            piece = arguments[start : start + TOOL_ARGUMENT_PIECE]
            yield {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}


DONE = shaping.sse("[DONE]")


async def stream_run(
    request: HttpRequest, started: bridge.Started, env: Envelope, buffered: str | None = None
) -> AsyncGenerator[bytes, None]:
    # The first chunk says at once whether the answer streams or is held for checks (issue 45).
    first = {**env.conductor, "answer": shaping.answer_mode(buffered)}
    yield shaping.sse(_chunk(env, {"role": "assistant", "content": ""}, conductor=first))
    final: Any = None
    streamed = shaping.Streamed()
    async for update in follow.follow_run(started.run):
        if update.kind == "event":
            assert update.event is not None
            piece = streamed.piece(update.event, buffered)
            if piece is not None:
                if piece:
                    yield shaping.sse(_chunk(env, {"content": piece}))
                continue
            info = shaping.progress(update.event)
            if info is not None:
                yield shaping.sse(_chunk(env, {}, conductor=info))
        elif update.kind == "keepalive":
            yield shaping.SSE_KEEPALIVE
        else:
            final = update.run
    async for ending in _stream_ending(request, started, env, final, streamed):
        yield ending


async def _stream_ending(
    request: HttpRequest, started: bridge.Started, env: Envelope, final: Run, streamed: shaping.Streamed
) -> AsyncGenerator[bytes, None]:
    """A stream's last events once its run ended: the error, or the rest of the answer, its
    finish reason and usage; then ``[DONE]``."""
    await auth.count_tokens(started.key, final)
    conductor = shaping.conductor_info(request, final, started.target)
    error = await off_loop(shaping.run_outcome_error, final, conductor)
    if error is not None:
        yield shaping.sse(error.body())
        yield DONE
        return
    usage = _usage(final)
    answer = await off_loop(shaping.final_answer, final)
    shaping.mark_incomplete(conductor, answer)
    if answer.held:
        held = await off_loop(shaping.held_info, final.id)
        yield shaping.sse(_chunk(env, {}, "content_filter", conductor={**conductor, "held": held}))
    elif (superseded := streamed.superseded(answer.text, final, conductor)) is not None:
        yield shaping.sse(superseded.body())  # issue 44: what was streamed is not the answer
        yield DONE
        return
    else:
        rest = streamed.rest(answer.text)
        if rest:
            yield shaping.sse(_chunk(env, {"content": rest}))
        for delta in tool_call_deltas(answer.tool_calls):
            yield shaping.sse(_chunk(env, delta))
        yield shaping.sse(_chunk(env, {}, answer.finish_reason, conductor={**conductor, "usage": usage}))
    if started.req.extra.get("include_usage"):
        yield shaping.sse(
            {
                "id": env.id,
                "object": "chat.completion.chunk",
                "created": env.created,
                "model": env.model,
                "system_fingerprint": None,
                "choices": [],
                "usage": usage,
            }
        )
    yield DONE


class ChatLive:
    """Chat Completions on the fast pass-through (``live_stream``): the same first chunk and
    ending as ``stream_run``; each piece one chunk from a frame rendered once."""

    keepalive = shaping.SSE_KEEPALIVE

    def __init__(self, request: HttpRequest, started: bridge.Started, env: Envelope) -> None:
        self.request, self.started, self.env = request, started, env
        self.piece = live_stream.Frame(lambda text: shaping.sse(_chunk(env, {"content": text})))

    def opening(self) -> Iterable[bytes]:
        first = {**self.env.conductor, "answer": shaping.answer_mode(None)}
        yield shaping.sse(_chunk(self.env, {"role": "assistant", "content": ""}, conductor=first))

    def open_content(self) -> Iterable[bytes]:
        return ()

    def ending(self, final: Run, streamed: shaping.Streamed) -> AsyncIterator[bytes]:
        return _stream_ending(self.request, self.started, self.env, final, streamed)


# --- views --------------------------------------------------------------------------------------------


@csrf_exempt
async def models_view(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return method_not_allowed("GET")
    try:
        key = await off_loop(auth.authenticate, request)
        payload = await off_loop(targets.models_payload, key)
    except ApiError as err:
        return error_response(err)
    return JsonResponse(payload)


@csrf_exempt
async def model_detail_view(request: HttpRequest, model: str) -> HttpResponse:
    if request.method != "GET":
        return method_not_allowed("GET")
    try:
        key = await off_loop(auth.authenticate, request)
        payload = await off_loop(targets.models_payload, key)
    except ApiError as err:
        return error_response(err)
    for entry in payload["data"]:
        if entry["id"] == model:
            return JsonResponse(entry)
    return error_response(await off_loop(targets.unknown_model, key, model))


def _outcome(
    key: ApiKey, final: Run, conductor: dict[str, Any]
) -> tuple[ApiError | None, shaping.FinalAnswer | None]:
    """Everything a plain answer reads once its run ended, in one trip to a sync thread."""
    auth.count_tokens_sync(key, final)
    error = shaping.run_outcome_error(final, conductor)
    if final.answer_held:
        conductor["held"] = shaping.held_info(final.id)
    answer = shaping.final_answer(final) if error is None else None
    shaping.mark_incomplete(conductor, answer)
    return error, answer


@csrf_exempt
async def chat_completions_view(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return method_not_allowed("POST")
    try:
        # A streamed pass-through may execute in this process, its answer taken as it is released.
        started, running, buffered = await live_stream.accept(request, parse_chat_request)
    except ApiError as err:
        return error_response(err)
    run, target = started.run, started.target
    env = Envelope(
        id=f"chatcmpl-{run.id.hex}",
        created=int(run.created_at.timestamp()),
        model=target.model,
        conductor=shaping.conductor_info(request, run, target),
    )
    headers = auth.run_headers(run, env.conductor["url"])
    response: HttpResponseBase
    if started.req.stream:
        body = live_stream.body_for(
            headers,
            started,
            running,
            buffered,
            live=lambda: ChatLive(request, started, env),
            events=lambda: stream_run(request, started, env, buffered),
        )

        # The run id travels in the headers and the first chunk, which go out before the run's
        # first event is read: a client that loses this server still knows which run it started.
        def on_failure(exc: BaseException) -> list[bytes]:
            return [shaping.sse(shaping.follow_failure_error(request, run, target, exc).body()), DONE]

        response = live_stream.event_stream(body, is_end=lambda piece: piece == DONE, on_failure=on_failure)
    else:
        # A plain response cannot send its headers early: its status depends on the outcome.
        # Whatever breaks while waiting, the answer still names the run (header and body).
        try:
            final = await follow.wait_for_run(run, started.ended)
            conductor = shaping.conductor_info(request, final, target)
            error, answer = await off_loop(_outcome, started.key, final, conductor)
            if error is not None:
                response = error_response(error)
            else:
                assert answer is not None  # _outcome reads the answer whenever there is no error
                response = JsonResponse(
                    completion_body(Envelope(env.id, env.created, env.model, conductor), final, answer)
                )
        except Exception as exc:
            response = error_response(shaping.follow_failure_error(request, run, target, exc))
    for name, value in headers.items():
        response[name] = value
    return response
