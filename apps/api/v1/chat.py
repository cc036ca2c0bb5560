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

import asyncio
import json
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from apps.api.v1 import auth, bridge, run_request, shaping, targets
from apps.api.v1.errors import (
    ApiError,
    BodyRules,
    bad_param,
    error_response,
    json_body,
    method_not_allowed,
)
from apps.core.executor_db import off_loop, on_server_loop
from apps.engine.generation import GenerationOptions, ResponseFormat
from apps.runs import live
from apps.runs.models import Run

MESSAGE_ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOP_SEQUENCES = 4
# Accepted and honoured, or accepted because they change nothing a client can observe.
KNOWN_PARAMS = {
    "model",
    "messages",
    "stream",
    "stream_options",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",  # recorded in the run's metadata
    "metadata",  # recorded in the run's metadata
    "store",  # runs are always stored (audit); accepted either way
    "service_tier",  # one tier here; "auto" / "default" accepted
}
# Parameters a run cannot honour: refused by name unless they hold their neutral value.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "functions": (None, []),
    "function_call": (None,),
}
REFUSAL_REASONS = {
    "logprobs": "token log-probabilities are not available from a multi-model run",
    "top_logprobs": "token log-probabilities are not available from a multi-model run",
    "frequency_penalty": "not every worker provider supports it",
    "presence_penalty": "not every worker provider supports it",
    "logit_bias": "token ids differ between the pool's models",
    "modalities": "only text output is supported",
    "audio": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "reasoning effort is set by the conductor preset (conductor-mini / conductor-ultra)",
    "web_search_options": "web search is not available",
    "functions": "use 'tools' (the legacy 'functions' parameter is not supported)",
    "function_call": "use 'tool_choice' (the legacy 'function_call' parameter is not supported)",
}


BODY_RULES = BodyRules(("model", "messages"), frozenset(KNOWN_PARAMS), NEUTRAL_VALUES, REFUSAL_REASONS)


# --- request validation ----------------------------------------------------------------------------


def _text_content(content: Any, index: int, role: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "refusal"):
                raise bad_param(
                    "Only text content parts ({'type': 'text', 'text': …}) are supported.",
                    f"messages[{index}].content[{j}]",
                )
            key = "text" if part.get("type") == "text" else "refusal"
            if not isinstance(part.get(key), str):
                raise bad_param(
                    f"A {part.get('type')} part needs a string '{key}'.", f"messages[{index}].content[{j}]"
                )
            parts.append(part[key])
        return "\n".join(parts)
    raise bad_param(
        "Message content must be a string or a list of text parts.",
        f"messages[{index}].content",
        "invalid_type",
    )


def _tool_calls(value: Any, index: int) -> list[dict[str, Any]]:
    param = f"messages[{index}].tool_calls"
    if not isinstance(value, list):
        raise bad_param("'tool_calls' must be an array.", param, "invalid_type")
    calls = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("id"), str)
            or call.get("type", "function") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments", ""), str)
        ):
            raise bad_param(
                "Each tool call needs 'id', 'type': 'function' and 'function': {'name', 'arguments'}.",
                f"{param}[{j}]",
            )
        calls.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": fn["name"], "arguments": fn.get("arguments") or ""},
            }
        )
    return calls


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """Chat messages, validated and normalised (text content; tool calls and results kept)."""
    if not isinstance(messages, list) or not messages:
        raise bad_param("'messages' must be a non-empty array.", "messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_param("Each message must be an object.", f"messages[{i}]", "invalid_type")
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise bad_param(
                f"Invalid role {role!r}; expected one of {', '.join(sorted(MESSAGE_ROLES))}.",
                f"messages[{i}].role",
            )
        normal: dict[str, Any] = {"role": role, "content": _text_content(message.get("content"), i, role)}
        if message.get("tool_calls") is not None:
            if role != "assistant":
                raise bad_param("Only assistant messages carry 'tool_calls'.", f"messages[{i}].tool_calls")
            normal["tool_calls"] = _tool_calls(message["tool_calls"], i)
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str) or not message["tool_call_id"]:
                raise bad_param(
                    "A tool message needs the 'tool_call_id' it answers.",
                    f"messages[{i}].tool_call_id",
                    "missing_required_parameter",
                )
            normal["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str) and message["name"]:
            normal["name"] = message["name"]
        out.append(normal)
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise bad_param("At least one user message with text is required.", "messages")
    return out


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise bad_param(f"'{name}' must be a positive integer.", name)
    return value


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high
    ):
        raise bad_param(f"'{name}' must be a number between {low:g} and {high:g}.", name)
    return float(value) if value is not None else None


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or len(value) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in value)
    ):
        raise bad_param(
            f"'stop' must be a non-empty string or an array of up to {MAX_STOP_SEQUENCES} of them.", "stop"
        )
    return tuple(value)


def parse_response_format(value: Any, param: str = "response_format") -> ResponseFormat | None:
    """OpenAI's ``response_format``: text (None), json_object, or json_schema with a schema."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_param("'response_format' must be an object.", param, "invalid_type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise bad_param(
                "'response_format.json_schema.schema' must be a JSON schema object.", f"{param}.json_schema"
            )
        try:
            import jsonschema

            jsonschema.Draft202012Validator.check_schema(spec["schema"])
        except jsonschema.SchemaError as err:
            raise bad_param(
                f"The JSON schema is invalid: {err.message[:200]}", f"{param}.json_schema.schema"
            ) from None
        name = spec.get("name") or "response"
        if not isinstance(name, str):
            raise bad_param(
                "'response_format.json_schema.name' must be a string.", f"{param}.json_schema.name"
            )
        return ResponseFormat("json_schema", spec["schema"], name, bool(spec.get("strict")))
    raise bad_param("'response_format.type' must be 'text', 'json_object' or 'json_schema'.", f"{param}.type")


def parse_tools(value: Any, param: str = "tools") -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_param("'tools' must be an array.", param, "invalid_type")
    tools = []
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise bad_param(
                "Only function tools ({'type': 'function', 'function': {...}}) are supported.",
                f"{param}[{i}]",
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_param("A function tool needs a 'name'.", f"{param}[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_param("'parameters' must be a JSON schema object.", f"{param}[{i}].function.parameters")
        tools.append({"type": "function", "function": dict(fn)})
    return tuple(tools)


def parse_tool_choice(value: Any, tools: tuple[dict[str, Any], ...]) -> Any:
    if value is None:
        return None
    names = {t["function"]["name"] for t in tools}
    if value in ("none", "auto", "required"):
        if value != "none" and not tools:
            raise bad_param(f"tool_choice '{value}' needs 'tools'.", "tool_choice")
        return value
    fn = value.get("function") if isinstance(value, dict) else None
    if not isinstance(fn, dict) or value.get("type") != "function" or fn.get("name") not in names:
        raise bad_param(
            "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
            "{'name': <one of the tools>}}.",
            "tool_choice",
        )
    return {"type": "function", "function": {"name": fn["name"]}}


def _metadata(body: dict[str, Any]) -> dict[str, str]:
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        )
    ):
        raise bad_param("'metadata' must be an object of up to 16 string values.", "metadata")
    out = dict(metadata or {})
    user = body.get("user")
    if user is not None:
        if not isinstance(user, str):
            raise bad_param("'user' must be a string.", "user", "invalid_type")
        out["user"] = user[:256]
    return out


def parse_chat_request(raw: bytes) -> run_request.RunRequest:
    """Validate a Chat Completions body into the bridge's ``RunRequest``. Raises ApiError."""
    body = json_body(raw, BODY_RULES)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad_param("'stream' must be a boolean.", "stream", "invalid_type")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_param("Only n=1 is supported: the conductor returns one answer per run.", "n")
    tier = body.get("service_tier")
    if tier not in (None, "auto", "default"):
        raise bad_param("'service_tier' must be 'auto' or 'default': there is one tier here.", "service_tier")
    max_tokens = _positive_int(body, "max_tokens")
    max_completion = _positive_int(body, "max_completion_tokens")
    caps = [v for v in (max_tokens, max_completion) if v is not None]
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_param("'seed' must be an integer.", "seed")
    tools = parse_tools(body.get("tools"))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_param("'parallel_tool_calls' must be a boolean.", "parallel_tool_calls", "invalid_type")
    options = GenerationOptions(
        max_tokens=min(caps) if caps else None,
        stop=_stop(body.get("stop")),
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1),
        seed=seed,
        response_format=parse_response_format(body.get("response_format")),
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=parallel if tools else None,
    )
    if options.tools and options.response_format is not None:
        raise bad_param("Use either 'tools' or a JSON 'response_format', not both.", "response_format")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise bad_param("'stream_options' must be an object.", "stream_options", "invalid_type")
    messages = parse_messages(body.get("messages"))
    return run_request.RunRequest(
        model=body.get("model"),
        question=run_request.question_from_turns(messages),
        messages=messages,
        options=options,
        stream=bool(stream),
        metadata=_metadata(body),
        extra={"include_usage": bool((stream_options or {}).get("include_usage", False))},
    )


# --- responses ---------------------------------------------------------------------------------------


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
# How a stream's answer reached it: "direct" (the fast pass-through: executed in this process, the
# released text handed over as it comes) or "events" (read from the run's stored events).
STREAM_HEADER = "X-Conductor-Stream"


async def stream_run(
    request: HttpRequest, started: bridge.Started, env: Envelope, buffered: str | None = None
) -> AsyncGenerator[bytes, None]:
    # The first chunk says at once whether the answer streams or is held for checks (issue 45).
    first = {**env.conductor, "answer": shaping.answer_mode(buffered)}
    yield shaping.sse(_chunk(env, {"role": "assistant", "content": ""}, conductor=first))
    final: Any = None
    streamed = shaping.Streamed()
    async for update in bridge.follow_run(started.run):
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
    request: HttpRequest, started: bridge.Started, env: Envelope, final: Any, streamed: shaping.Streamed
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


# Executions of live streams (a task is only weakly held by the loop): each runs to its end
# whether or not its client stays.
_live_runs: set[asyncio.Future[Any]] = set()


def execute_live(started: bridge.Started, tap: live.LiveTap | None) -> asyncio.Future[Any]:
    """Start executing a run ``start_run(live=True)`` accepted for this process, on a request
    thread; its released answer goes to ``tap`` as it comes. The future is the run as it ended
    (None: it is followed as any other run). A client that goes away does not stop it: the run
    ends as it would have (and its record says so)."""
    run_id = started.run.id

    async def execute() -> Any:
        try:
            return await off_loop(bridge.execute_live, started)
        finally:
            if tap is not None:
                tap.end()
                live.close_tap(run_id)

    task = asyncio.ensure_future(execute())
    _live_runs.add(task)
    task.add_done_callback(_live_runs.discard)
    return task


async def stream_live(
    request: HttpRequest, started: bridge.Started, env: Envelope, tap: live.LiveTap, execution: Any
) -> AsyncGenerator[bytes, None]:
    """The fast pass-through (issue 45): a streamed pass-through executing in this process, its
    released answer written as the engine emits it (``apps.runs.live``), with no database read
    per piece. Each piece is one chunk built from a prefix rendered once. What the client gets
    and how the stream ends are ``stream_run``'s: the same checks released the same text."""
    first = {**env.conductor, "answer": shaping.answer_mode(None)}
    yield shaping.sse(_chunk(env, {"role": "assistant", "content": ""}, conductor=first))
    head, tail = _content_frame(env)
    streamed = shaping.Streamed()
    while True:
        taken = await tap.take(bridge.KEEPALIVE_S)
        if taken is None:
            yield shaping.SSE_KEEPALIVE
            continue
        text, ended = taken
        if text:
            streamed.parts.append(text)
            yield head + json.dumps(text).encode() + tail
        if ended:
            break
    final = await execution
    if final is None or not final.is_terminal:
        # Given back to the queue or paused: follow it to its end as any other stream does (the
        # text it released here is already sent; its events are read only for the ending).
        async for update in bridge.follow_run(started.run):
            if update.kind == "keepalive":
                yield shaping.SSE_KEEPALIVE
            elif update.kind == "final":
                final = update.run
    async for piece in _stream_ending(request, started, env, final, streamed):
        yield piece


def _content_frame(env: Envelope) -> tuple[bytes, bytes]:
    """The bytes of a content chunk before and after its JSON string (``_chunk``'s shape)."""
    marker = "\u0000MARK\u0000"
    frame = shaping.sse(_chunk(env, {"content": marker}))
    head, _, tail = frame.partition(json.dumps(marker).encode())
    return head, tail


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
    key: Any, final: Any, conductor: dict[str, Any]
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
        # live: a streamed pass-through may execute here, its answer taken as it is released
        # (on a server's loop, which outlives this view: the stream is written after it returns).
        started = await off_loop(bridge.start_run, request, parse_chat_request, live=on_server_loop())
    except ApiError as err:
        return error_response(err)
    run, target = started.run, started.target
    tap: live.LiveTap | None = None
    execution: Any = None
    if started.live_slot is not None:
        # Accepted for this process: it executes now, whatever follows (the tap is registered
        # first: the run's sink looks for it once).
        tap = live.open_tap(run.id, asyncio.get_running_loop())
        execution = execute_live(started, tap)
    env = Envelope(
        id=f"chatcmpl-{run.id.hex}",
        created=int(run.created_at.timestamp()),
        model=target.model,
        conductor=shaping.conductor_info(request, run, target),
    )
    headers = auth.run_headers(run, env.conductor["url"])
    if started.req.stream:
        buffered = await off_loop(bridge.answer_buffered, started)
        headers[shaping.ANSWER_HEADER] = "buffered" if buffered else "streamed"
        body: AsyncGenerator[bytes, None]
        if tap is not None and buffered is None:
            # The fast path only when nothing needs the whole answer: a buffered answer comes
            # with the verdict, which the run's events carry (its tap receives nothing).
            body = stream_live(request, started, env, tap, execution)
            headers[STREAM_HEADER] = "direct"
        else:
            body = stream_run(request, started, env, buffered)
            headers[STREAM_HEADER] = "events"

        # The run id travels in the headers and the first chunk, which go out before the run's
        # first event is read: a client that loses this server still knows which run it started.
        def on_failure(exc: BaseException) -> list[bytes]:
            return [shaping.sse(shaping.follow_failure_error(request, run, target, exc).body()), DONE]

        response: HttpResponseBase = StreamingHttpResponse(
            shaping.guarded_stream(
                body,
                is_end=lambda piece: piece == DONE,
                on_failure=on_failure,
            ),
            content_type="text/event-stream",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    else:
        # A plain response cannot send its headers early: its status depends on the outcome.
        # Whatever breaks while waiting, the answer still names the run (header and body).
        try:
            final = await bridge.wait_for_run(run, started.ended)
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
