"""Anthropic Messages (``POST /v1/messages``) on the run bridge.

The Anthropic SDK and the tools built on it drop in: ``x-api-key`` (or bearer) auth, the
``anthropic-version`` header accepted, Anthropic's request and response shapes, its streaming
event sequence (``message_start`` … ``message_stop``) and its error shape, plain and as an
``error`` event. A message is a run like any other: same policy, budget, audit, review hold and
live graph (``conductor`` field, ``X-Conductor-Run`` header). A held answer has no text and
``stop_reason: "refusal"`` with the held rules under ``conductor.held``.

Tools (``tools``, ``tool_choice``, ``tool_use`` / ``tool_result`` blocks) are refused with a 400
naming them: use ``/v1/chat/completions`` or ``/v1/responses`` for tool calling.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.api.v1 import auth, bridge, follow, live_stream, run_request, shaping
from apps.api.v1.chat_request import parse_response_format
from apps.api.v1.errors import (
    ApiError,
    BodyRules,
    bad_param,
    error_body,
    error_response,
    json_body,
    method_not_allowed,
)
from apps.core.executor_db import off_loop
from apps.engine.generation import GenerationOptions, ResponseFormat
from apps.runs.models import Run

SHAPE = "anthropic"
KNOWN_PARAMS = {
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "metadata",
    "stream",
    "output_config",  # its JSON-schema ``format`` only
}
REFUSED = {
    "tools": "tool calling is not available on /v1/messages; use /v1/chat/completions or /v1/responses",
    "tool_choice": "tool calling is not available on /v1/messages; use /v1/chat/completions or /v1/responses",
    "top_k": "not every worker provider supports it",
    "thinking": "extended thinking is set by the conductor preset (conductor-mini / conductor-ultra)",
    "container": "code execution containers are not available",
    "mcp_servers": "MCP servers are not available",
    "service_tier": "there is one tier here",
}
# Neutral values of refused parameters: sent by some clients and harmless.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "tool_choice": (None,),
    "top_k": (None,),
    "thinking": (None, {"type": "disabled"}),
    "container": (None,),
    "mcp_servers": (None, []),
    "service_tier": (None, "auto", "standard_only"),
}
MAX_STOP_SEQUENCES = 8


# Anthropic's own wording (`field: reason`).
BODY_RULES = BodyRules(
    ("model", "messages", "max_tokens"),
    frozenset(KNOWN_PARAMS),
    NEUTRAL,
    REFUSED,
    missing="{name}: Field required",
    unsupported="{name}: not supported: {reason}.",
    unknown="{name}: Extra inputs are not permitted",
)


def _text(content: Any, param: str) -> str:
    """A string, or a list of ``text`` blocks; anything else (image, document, tool blocks) is
    refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_param("Content must be a string or a list of content blocks.", param, "invalid_type")
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise bad_param(
                f"Content blocks of type {kind!r} are not supported here: only 'text' blocks.",
                f"{param}.{j}.type",
                "unsupported_parameter",
            )
        if not isinstance(block.get("text"), str):
            raise bad_param("A text block needs a string 'text'.", f"{param}.{j}.text")
        parts.append(block["text"])
    return "\n".join(parts)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise bad_param("messages: at least one message is required.", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise bad_param(f"messages.{i}.role: expected 'user' or 'assistant'.", f"messages.{i}.role")
        out.append(
            {"role": message["role"], "content": _text(message.get("content"), f"messages.{i}.content")}
        )
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise bad_param("messages: at least one user message with text is required.", "messages")
    return out


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high
    ):
        raise bad_param(f"{name}: must be a number between {low:g} and {high:g}.", name)
    return float(value) if value is not None else None


def _output_format(value: Any) -> ResponseFormat | None:
    """``output_config.format`` (structured outputs): a JSON schema the answer must match."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_param("output_config: must be an object.", "output_config", "invalid_type")
    other = sorted(set(value) - {"format"})
    if other:
        raise bad_param(
            f"output_config.{other[0]}: not supported (only 'format' is).",
            f"output_config.{other[0]}",
            "unsupported_parameter",
        )
    fmt = value.get("format")
    if fmt is None:
        return None
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise bad_param(
            "output_config.format: must be {'type': 'json_schema', 'schema': {...}}.", "output_config.format"
        )
    return parse_response_format(
        {"type": "json_schema", "json_schema": {"schema": fmt["schema"], "strict": True}},
        "output_config.format",
    )


def parse_messages_request(raw: bytes) -> run_request.RunRequest:
    """Validate a Messages body into the bridge's ``RunRequest``. Raises ApiError."""
    body = json_body(raw, BODY_RULES)
    max_tokens = body["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad_param("max_tokens: must be a positive integer.", "max_tokens")
    stop = body.get("stop_sequences") or []
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise bad_param(
            f"stop_sequences: must be a list of up to {MAX_STOP_SEQUENCES} non-empty strings.",
            "stop_sequences",
        )
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise bad_param("stream: must be a boolean.", "stream", "invalid_type")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_param("metadata: must be an object.", "metadata", "invalid_type")
    user_id = (metadata or {}).get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise bad_param("metadata.user_id: must be a string.", "metadata.user_id", "invalid_type")
    unknown_meta = sorted(set(metadata or {}) - {"user_id"})
    if unknown_meta:
        raise bad_param(
            f"metadata.{unknown_meta[0]}: Extra inputs are not permitted", f"metadata.{unknown_meta[0]}"
        )
    system = body.get("system")
    system_text = _text(system, "system") if system is not None else ""
    turns = _messages(body["messages"])
    messages = ([{"role": "system", "content": system_text}] if system_text else []) + turns
    options = GenerationOptions(
        max_tokens=max_tokens,
        stop=tuple(stop),
        temperature=_number(body, "temperature", 0, 1),
        top_p=_number(body, "top_p", 0, 1),
        response_format=_output_format(body.get("output_config")),
    )
    return run_request.RunRequest(
        model=body["model"],
        question=run_request.question_from_turns(messages),
        messages=messages,
        options=options,
        stream=bool(body.get("stream")),
        metadata={"user_id": user_id[:256]} if user_id else {},
        extra={"stop_sequences": tuple(stop)},
        keep={"api": "messages"},
    )


# --- answers -----------------------------------------------------------------------------------------


def _msg_id(run: Run) -> str:
    return f"msg_{run.id.hex}"


def shape_answer(answer: shaping.FinalAnswer, stops: tuple[str, ...]) -> tuple[str, str, str | None]:
    """(text, stop_reason, stop_sequence). A worker whose provider ignored a stop sequence is cut
    here, so the client sees Anthropic's semantics whichever provider wrote the answer."""
    if answer.held:
        return "", "refusal", None
    text = answer.text or ""
    hits = [(text.find(s), s) for s in stops if s in text]
    if hits:
        at, seq = min(hits)
        return text[:at], "stop_sequence", seq
    return text, ("max_tokens" if answer.finish_reason == "length" else "end_turn"), None


def message_body(
    run: Run,
    model: str,
    text: str,
    stop_reason: str | None,
    stop_sequence: str | None,
    conductor: dict[str, Any],
) -> dict[str, Any]:
    used = shaping.usage(run)
    return {
        "id": _msg_id(run),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": used.input_tokens,
            "output_tokens": used.output_tokens,
            "conductor": shaping.usage_breakdown(run),  # answer vs run (docs/api.md, "Usage")
        },
        "conductor": conductor,
    }


async def outcome(
    request: HttpRequest, started: bridge.Started, final: Run
) -> tuple[dict[str, Any], str, str | None, str | None, ApiError | None]:
    """(conductor, text, stop_reason, stop_sequence, error) for the run as it ended."""
    await auth.count_tokens(started.key, final)
    conductor = shaping.conductor_info(request, final, started.target)
    error = await off_loop(shaping.run_outcome_error, final, conductor)
    if final.answer_held:
        conductor["held"] = await off_loop(shaping.held_info, final.id)
    if error is not None:
        if error.param == "response_format":
            error.param = "output_config.format"  # this protocol's name for it
        return conductor, "", None, None, error
    answer = await off_loop(shaping.final_answer, final)
    shaping.mark_incomplete(conductor, answer)
    text, reason, seq = shape_answer(answer, started.req.extra.get("stop_sequences") or ())
    return conductor, text, reason, seq, None


def _event(kind: str, **fields: Any) -> bytes:
    return shaping.sse({"type": kind, **fields}, event=kind)


PING = _event("ping")
MESSAGE_STOP = _event("message_stop")


def stream_buffered(started: bridge.Started) -> str | None:
    """Why this Messages stream's answer is not streamed as written (see bridge.answer_buffered);
    stop sequences are cut from the whole answer here (``shape_answer``), so they buffer too."""
    if started.req.extra.get("stop_sequences"):
        return "stop sequences are applied to the whole answer"
    return bridge.answer_buffered(started)


def _opening(request: HttpRequest, started: bridge.Started, buffered: str | None) -> list[bytes]:
    """``message_start`` (whether the answer streams or is held for checks, said at once: issue
    45) and a first ``ping``."""
    run, model = started.run, started.target.model
    conductor = shaping.conductor_info(request, run, started.target)
    start = message_body(run, model, "", None, None, {**conductor, "answer": shaping.answer_mode(buffered)})
    start["usage"] = {"input_tokens": 0, "output_tokens": 0}
    return [_event("message_start", message=start), PING]


BLOCK_START = _event("content_block_start", index=0, content_block={"type": "text", "text": ""})


async def stream_message(
    request: HttpRequest, started: bridge.Started, buffered: str | None = None
) -> AsyncGenerator[bytes, None]:
    """A streamed message from the run's stored events."""
    for head in _opening(request, started, buffered):
        yield head
    final: Any = None
    streamed = shaping.Streamed()
    async for update in follow.follow_run(started.run):
        if update.kind == "keepalive":
            yield PING
        elif update.kind == "event":
            assert update.event is not None
            opened = bool(streamed.parts)  # the text block was started (its first text came)
            piece = streamed.piece(update.event, buffered)
            if not piece:
                continue
            if not opened:
                yield BLOCK_START
            yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
        elif update.kind == "final":
            final = update.run
    async for tail in _ending(request, started, final, streamed):
        yield tail


async def _ending(
    request: HttpRequest, started: bridge.Started, final: Run, streamed: shaping.Streamed
) -> AsyncGenerator[bytes, None]:
    """A stream's last events once its run ended, on either path: an ``error`` event (blocked,
    failed, superseded …), or the rest of the text, ``message_delta`` (stop reason, usage) and
    ``message_stop``."""
    opened = bool(streamed.parts)
    conductor, text, reason, seq, error = await outcome(request, started, final)
    if error is not None:
        yield _event("error", **{k: v for k, v in error_body(error, SHAPE).items() if k != "type"})
        return
    superseded = streamed.superseded(text, final, conductor)
    if superseded is not None:  # issue 44: what was streamed is not the answer
        yield _event("error", **{k: v for k, v in error_body(superseded, SHAPE).items() if k != "type"})
        return
    rest = streamed.rest(text)
    if rest and not opened:
        opened = True
        yield BLOCK_START
    if rest:
        yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": rest})
    if opened:
        yield _event("content_block_stop", index=0)
    used = shaping.usage(final)
    yield _event(
        "message_delta",
        delta={"stop_reason": reason, "stop_sequence": seq},
        usage={
            "input_tokens": used.input_tokens,
            "output_tokens": used.output_tokens,
            "conductor": shaping.usage_breakdown(final),
        },
        conductor=conductor,
    )
    yield MESSAGE_STOP


class MessagesLive:
    """Anthropic Messages on the fast pass-through (``live_stream``): ``stream_message``'s
    opening and ending; each ``text_delta`` one event from a frame rendered once."""

    keepalive = PING

    def __init__(self, request: HttpRequest, started: bridge.Started) -> None:
        self.request, self.started = request, started
        self.piece = live_stream.Frame(
            lambda text: _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
        )

    def opening(self) -> Iterable[bytes]:
        return _opening(self.request, self.started, None)

    def open_content(self) -> Iterable[bytes]:
        return (BLOCK_START,)

    def ending(self, final: Run, streamed: shaping.Streamed) -> AsyncIterator[bytes]:
        return _ending(self.request, self.started, final, streamed)


def _ends(piece: bytes) -> bool:
    return piece == MESSAGE_STOP or piece.startswith(b"event: error\n")


@csrf_exempt
async def messages_view(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return method_not_allowed("POST", shape=SHAPE)
    try:
        # A streamed pass-through may execute in this process (see live_stream.accept).
        started, running, buffered = await live_stream.accept(
            request, parse_messages_request, buffered=stream_buffered
        )
    except ApiError as err:
        return error_response(err, shape=SHAPE)
    run, target = started.run, started.target
    headers = auth.run_headers(run, shaping.run_url(request, run.id))
    response: HttpResponseBase
    if started.req.stream:
        stream = live_stream.body_for(
            headers,
            started,
            running,
            buffered,
            live=lambda: MessagesLive(request, started),
            events=lambda: stream_message(request, started, buffered),
        )

        def on_failure(exc: BaseException) -> list[bytes]:
            body = error_body(shaping.follow_failure_error(request, run, target, exc), SHAPE)
            return [_event("error", **{k: v for k, v in body.items() if k != "type"})]

        response = live_stream.event_stream(stream, is_end=_ends, on_failure=on_failure)
    else:
        try:
            final = await follow.wait_for_run(run, started.ended)
            conductor, text, reason, seq, error = await outcome(request, started, final)
            if error is not None:
                response = error_response(error, shape=SHAPE)
            else:
                response = JsonResponse(message_body(final, target.model, text, reason, seq, conductor))
        except Exception as exc:
            response = error_response(shaping.follow_failure_error(request, run, target, exc), shape=SHAPE)
    for name, value in headers.items():
        response[name] = value
    return response
