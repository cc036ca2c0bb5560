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

import dataclasses
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from apps.api import selectors as api_sel
from apps.api.models import ApiKey, ApiScope
from apps.api.v1 import auth, bridge, run_request, shaping, targets
from apps.api.v1.chat import _metadata, _number, _positive_int, parse_response_format
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
from apps.engine.generation import GenerationOptions

KNOWN_PARAMS = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "text",
    "metadata",
    "store",
    "stream",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "previous_response_id",
    "user",  # recorded in the run's metadata
    "service_tier",  # one tier here
    "prompt_cache_key",  # a caching hint: nothing to observe
    "safety_identifier",  # recorded nowhere; changes nothing a client can observe
}
# Refused by name unless they hold their neutral value.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "include": (None, []),
    "truncation": (None, "disabled", "auto"),
    "reasoning": (None, {}),
    "top_logprobs": (None, 0),
    "background": (None, False),
    "conversation": (None,),
    "prompt": (None,),
    "max_tool_calls": (None,),
    "stream_options": (None, {}),
    "prompt_cache_retention": (None,),
    "context_management": (None,),
}
REFUSAL_REASONS = {
    "include": "extra output data (logprobs, reasoning, tool results) is not available from a run",
    "truncation": "only 'disabled' or 'auto' truncation",
    "reasoning": "reasoning effort is set by the conductor preset (conductor-mini / conductor-ultra)",
    "top_logprobs": "token log-probabilities are not available from a multi-model run",
    "background": "background responses are not supported; stream or wait",
    "conversation": "conversations are not supported; chain with 'previous_response_id'",
    "prompt": "stored prompt templates are not supported",
    "max_tool_calls": "built-in tools are not supported",
    "stream_options": "no stream options are supported",
    "prompt_cache_retention": "prompt caching is not configurable here",
    "context_management": "context management is not supported",
}
INPUT_ROLES = {"user", "assistant", "system", "developer"}


BODY_RULES = BodyRules(("model", "input"), frozenset(KNOWN_PARAMS), NEUTRAL_VALUES, REFUSAL_REASONS)


# --- ids ---------------------------------------------------------------------------------------------


def response_id(run_id: Any) -> str:
    return f"resp_{uuid.UUID(str(run_id)).hex}"


def run_id_of(resp_id: str) -> uuid.UUID | None:
    if not isinstance(resp_id, str) or not resp_id.startswith("resp_"):
        return None
    try:
        return uuid.UUID(hex=resp_id[len("resp_") :])
    except ValueError:
        return None


def _msg_id(run_id: Any) -> str:
    return f"msg_{uuid.UUID(str(run_id)).hex}"


# --- request -----------------------------------------------------------------------------------------


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_param("'content' must be a string or a list of text parts.", param, "invalid_type")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            if not isinstance(part.get("text"), str):
                raise bad_param(f"An {kind} part needs a string 'text'.", f"{param}[{j}].text")
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        else:
            raise bad_param(
                f"Only text content parts (input_text, output_text) are supported, not {kind!r}.",
                f"{param}[{j}]",
            )
    return "\n".join(parts)


def parse_input(value: Any) -> list[dict[str, Any]]:
    """Responses ``input`` as the bridge's chat messages (function calls → assistant tool calls,
    function call outputs → tool messages)."""
    if isinstance(value, str):
        if not value.strip():
            raise bad_param("'input' must not be empty.", "input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_param("'input' must be a string or a non-empty array of input items.", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_param("Each input item must be an object.", param, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise bad_param(
                    f"Invalid role {role!r}; expected one of {', '.join(sorted(INPUT_ROLES))}.",
                    f"{param}.role",
                )
            out.append({"role": role, "content": _content_text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name")):
                raise bad_param("A function_call item needs 'call_id', 'name' and 'arguments'.", param)
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": str(item.get("arguments") or "")},
            }
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise bad_param(
                    "A function_call_output item needs the 'call_id' it answers.", f"{param}.call_id"
                )
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{param}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise bad_param(
                f"Input items of type {kind!r} are not supported: use message, function_call or "
                "function_call_output items.",
                f"{param}.type",
            )
    return out


def parse_tools(value: Any) -> tuple[dict[str, Any], ...]:
    """Responses function tools (flat: ``name``, ``parameters`` …) as the bridge's chat tools."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_param("'tools' must be an array.", "tools", "invalid_type")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_param(f"Only function tools are supported, not {kind!r}.", f"tools[{i}]")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_param("A function tool needs a 'name'.", f"tools[{i}].name")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise bad_param("'parameters' must be a JSON schema object.", f"tools[{i}].parameters")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        tools.append({"type": "function", "function": fn})
    return tuple(tools)


def parse_tool_choice(value: Any, tools: tuple[dict[str, Any], ...]) -> Any:
    if value is None:
        return None
    if value in ("none", "auto", "required"):
        if value != "none" and not tools:
            raise bad_param(f"tool_choice '{value}' needs 'tools'.", "tool_choice")
        return value
    names = {t["function"]["name"] for t in tools}
    if isinstance(value, dict) and value.get("type") == "function" and value.get("name") in names:
        return {"type": "function", "function": {"name": value["name"]}}
    raise bad_param(
        "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'name': <a tool>}.",
        "tool_choice",
    )


def parse_text(value: Any) -> Any:
    """``text.format`` → the bridge's response format (Responses puts the schema fields flat)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_param("'text' must be an object.", "text", "invalid_type")
    unknown = sorted(set(value) - {"format", "verbosity"})
    if unknown:
        raise bad_param(f"Unrecognized field 'text.{unknown[0]}'.", f"text.{unknown[0]}", "unknown_parameter")
    if value.get("verbosity") not in (None, "medium"):
        raise bad_param(
            "'text.verbosity' is not supported: length is set by 'max_output_tokens'.", "text.verbosity"
        )
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_param("'text.format' must be an object.", "text.format", "invalid_type")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt.get(k) for k in ("name", "schema", "strict") if k in fmt}
        return parse_response_format({"type": "json_schema", "json_schema": spec}, "text.format")
    return parse_response_format(fmt, "text.format")


def parse_responses_request(raw: bytes) -> run_request.RunRequest:
    """Validate a Responses body into the bridge's ``RunRequest`` (the history of a
    ``previous_response_id`` is added by ``with_history`` once the key is known)."""
    body = json_body(raw, BODY_RULES)
    for name in ("stream", "store", "parallel_tool_calls"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise bad_param(f"'{name}' must be a boolean.", name, "invalid_type")
    if body.get("service_tier") not in (None, "auto", "default"):
        raise bad_param("'service_tier' must be 'auto' or 'default': there is one tier here.", "service_tier")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_param("'instructions' must be a string.", "instructions", "invalid_type")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise bad_param("'previous_response_id' must be a string.", "previous_response_id", "invalid_type")
    tools = parse_tools(body.get("tools"))
    options = GenerationOptions(
        max_tokens=_positive_int(body, "max_output_tokens"),
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1),
        response_format=parse_text(body.get("text")),
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=body.get("parallel_tool_calls") if tools else None,
    )
    if options.tools and options.response_format is not None:
        raise bad_param("Use either 'tools' or a JSON 'text.format', not both.", "text.format")
    turns = parse_input(body["input"])
    store = body.get("store") is not False
    return _assemble(
        run_request.RunRequest(
            model=body.get("model"),
            question="",
            options=options,
            stream=bool(body.get("stream")),
            metadata=_metadata(body),
            extra={"previous_response_id": previous, "instructions": instructions, "turns": turns},
            keep={
                "api": "responses",
                "store": store,
                "model": body.get("model"),
                "previous_response_id": previous,
            },
        ),
        history=[],
    )


def _assemble(req: run_request.RunRequest, history: list[dict[str, Any]]) -> run_request.RunRequest:
    """The run's chat: instructions (this request's only, as OpenAI does), history, new input."""
    turns = history + list(req.extra["turns"])
    instructions = req.extra.get("instructions")
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + turns
    if not any(m["role"] in ("user", "tool") and str(m.get("content") or "").strip() for m in turns):
        raise bad_param("'input' needs at least one user message with text.", "input")
    keep = {**req.keep, "messages": turns, "instructions": instructions or ""}
    return dataclasses.replace(
        req, question=run_request.question_from_turns(messages), messages=messages, keep=keep
    )


def _not_found(resp_id: str, param: str | None) -> ApiError:
    return ApiError(404, f"Response with id '{resp_id}' not found.", param=param, code="not_found")


def stored_run(key: ApiKey, resp_id: str, param: str | None = None) -> Any:
    """The run behind a stored response this key's team may read (404 otherwise: no probing)."""

    run_id = run_id_of(resp_id)
    if run_id is None:
        raise _not_found(resp_id, param)
    run = (
        api_sel.runs_for(key.created_by, key)
        .select_related("pool")
        .filter(pk=run_id, team_id=key.team_id)
        .first()
    )
    protocol = (run.api_request or {}).get("protocol") if run is not None else None
    if not isinstance(protocol, dict) or protocol.get("api") != "responses" or not protocol.get("store"):
        raise _not_found(resp_id, param)
    return run


def with_history(req: run_request.RunRequest, key: ApiKey) -> run_request.RunRequest:
    """``previous_response_id``: the earlier response's input and output become the history."""
    previous = req.extra.get("previous_response_id")
    if not previous:
        return req
    run = stored_run(key, previous, "previous_response_id")
    if not run.is_terminal or run.status != "succeeded":
        raise bad_param(
            f"The response '{previous}' has no answer to continue from (its run is {run.status}).",
            "previous_response_id",
        )
    if run.answer_held:
        # Its answer is held for review: a follow-up run would carry it into a visible question.
        raise bad_param(
            f"The response '{previous}' is held for review; continue once a reviewer releases it.",
            "previous_response_id",
            "response_held",
        )
    protocol = run.api_request["protocol"]
    history = [dict(m) for m in protocol.get("messages") or [] if isinstance(m, dict)]
    answer = shaping.final_answer(run)
    assistant: dict[str, Any] = {"role": "assistant", "content": answer.text or ""}
    if answer.tool_calls:
        assistant["tool_calls"] = answer.tool_calls
    return _assemble(req, [*history, assistant])


# --- response objects --------------------------------------------------------------------------------


def output_items(run: Any, answer: shaping.FinalAnswer | None) -> list[dict[str, Any]]:
    if answer is None or answer.held:
        return []
    items: list[dict[str, Any]] = []
    if answer.text or not answer.tool_calls:
        items.append(message_item(run, answer.text or "", "completed"))
    for call in answer.tool_calls:
        fn = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call.get('id')}",
                "call_id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments") or "",
                "status": "completed",
            }
        )
    return items


def message_item(run: Any, text: str, status: str) -> dict[str, Any]:
    content = [] if status == "in_progress" else [text_part(text)]
    return {
        "type": "message",
        "id": _msg_id(run.id),
        "status": status,
        "role": "assistant",
        "content": content,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_body(
    run: Any,
    req_record: dict[str, Any],
    conductor: dict[str, Any],
    *,
    status: str,
    answer: shaping.FinalAnswer | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """OpenAI's response object for ``run`` (``req_record`` is the run's ``api_request``)."""
    protocol = req_record.get("protocol") or {}
    options = GenerationOptions.from_dict(req_record.get("options"))
    incomplete = None
    if answer is not None and answer.held:
        status, incomplete = "incomplete", {"reason": "content_filter"}
    elif answer is not None and answer.incomplete is not None:
        # A partial answer (issue 44): the run's own reason, not a token limit that was not hit.
        status, incomplete = (
            "incomplete",
            {"reason": str(answer.incomplete.get("reason") or "run_incomplete")},
        )
    elif answer is not None and answer.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    used = shaping.usage(run)
    fmt = options.response_format
    text_format: dict[str, Any] = {"type": "text"}
    if fmt is not None and fmt.type == "json_schema":
        text_format = {"type": "json_schema", "name": fmt.name, "schema": fmt.schema, "strict": fmt.strict}
    elif fmt is not None:
        text_format = {"type": fmt.type}
    tools = [{"type": "function", **t.get("function", {})} for t in options.tools]
    finished = status in ("completed", "incomplete", "failed")
    return {
        "id": response_id(run.id),
        "object": "response",
        "created_at": int(run.created_at.timestamp()),
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": protocol.get("instructions") or None,
        "max_output_tokens": options.max_tokens,
        "model": protocol.get("model") or conductor.get("preset"),
        "output": output_items(run, answer) if finished else [],
        "parallel_tool_calls": options.parallel_tool_calls is not False,
        "previous_response_id": protocol.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": bool(protocol.get("store", True)),
        "temperature": options.temperature,
        "text": {"format": text_format},
        "tool_choice": options.tool_choice or "auto",
        "tools": tools,
        "top_p": options.top_p,
        "truncation": "disabled",
        "usage": (
            {
                "input_tokens": used.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": used.output_tokens,
                # The run's work beyond the answer, as a reasoning model's (docs/api.md, "Usage").
                "output_tokens_details": {
                    "reasoning_tokens": shaping.usage_breakdown(run)["orchestration"]["output_tokens"]
                },
                "total_tokens": used.total_tokens,
                "conductor": shaping.usage_breakdown(run),
            }
            if finished
            else None
        ),
        "metadata": dict(req_record.get("metadata") or {}),
        "conductor": conductor,
    }


def _failed_error(err: ApiError) -> dict[str, Any]:
    return {"code": err.code or "server_error", "message": err.message}


async def finished_response(
    request: HttpRequest, run: Any, target: targets.Target
) -> tuple[dict[str, Any], ApiError | None]:
    """The response object of a run that ended (or stopped being waited for), and the error that
    a plain request answers instead (None: the body is the answer)."""
    conductor = shaping.conductor_info(request, run, target)
    error = await off_loop(shaping.run_outcome_error, run, conductor)
    if run.answer_held:
        conductor["held"] = await off_loop(shaping.held_info, run.id)
    record = run.api_request if isinstance(run.api_request, dict) else {}
    if error is not None:
        if error.param == "response_format":
            error.param = "text.format"  # this protocol's name for it
        body = response_body(run, record, conductor, status="failed", error=_failed_error(error))
        return body, error
    answer = await off_loop(shaping.final_answer, run)
    shaping.mark_incomplete(conductor, answer)
    return response_body(run, record, conductor, status="completed", answer=answer), None


# --- streaming ---------------------------------------------------------------------------------------


class _Events:
    """Responses SSE events, each with its ``sequence_number``."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return shaping.sse(payload, event=kind)


async def stream_response(
    request: HttpRequest, started: bridge.Started, events: _Events, buffered: str | None = None
) -> AsyncGenerator[bytes, None]:
    run, target = started.run, started.target
    record = bridge.api_request_record(started.req, target)
    conductor = shaping.conductor_info(request, run, target)
    # Whether the answer streams or is held for checks, said at once (issue 45).
    initial = response_body(
        run, record, {**conductor, "answer": shaping.answer_mode(buffered)}, status="in_progress"
    )
    yield events("response.created", response=initial)
    yield events("response.in_progress", response=initial)
    final: Any = None
    streamed = shaping.Streamed()
    opened = False  # the message item was announced (its first released text arrived)
    msg_id = _msg_id(run.id)
    async for update in bridge.follow_run(run):
        if update.kind == "keepalive":
            yield shaping.SSE_KEEPALIVE
        elif update.kind == "event":
            assert update.event is not None
            piece = streamed.piece(update.event, buffered)
            if not piece:
                continue
            if not opened:
                opened = True
                yield events(
                    "response.output_item.added", output_index=0, item=message_item(run, "", "in_progress")
                )
                yield events(
                    "response.content_part.added",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    part=text_part(""),
                )
            yield events(
                "response.output_text.delta",
                item_id=msg_id,
                output_index=0,
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        elif update.kind == "final":
            final = update.run
    await auth.count_tokens(started.key, final)
    body, error = await finished_response(request, final, target)
    if error is not None:
        yield events("response.failed", response=body)
        return
    items = body["output"]
    for index, item in enumerate(items):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            if not (opened and index == 0):
                yield events(
                    "response.output_item.added",
                    output_index=index,
                    item=message_item(final, "", "in_progress"),
                )
                yield events(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=text_part(""),
                )
                streamed = shaping.Streamed()
            rest = streamed.rest(text)
            if rest:
                yield events(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=rest,
                    logprobs=[],
                )
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


ENDINGS = (b"event: response.completed\n", b"event: response.incomplete\n", b"event: response.failed\n")


# --- views -------------------------------------------------------------------------------------------


@csrf_exempt
async def responses_view(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return method_not_allowed("POST")
    try:
        started = await off_loop(bridge.start_run, request, parse_responses_request, with_history)
    except ApiError as err:
        return error_response(err)
    run, target = started.run, started.target
    headers = auth.run_headers(run, shaping.run_url(request, run.id))
    response: HttpResponseBase
    if started.req.stream:
        events = _Events()
        buffered = await off_loop(bridge.answer_buffered, started)
        headers[shaping.ANSWER_HEADER] = "buffered" if buffered else "streamed"

        def on_failure(exc: BaseException) -> list[bytes]:
            err = shaping.follow_failure_error(request, run, target, exc)
            return [events("error", **error_body(err)["error"], conductor=err.conductor)]

        response = StreamingHttpResponse(
            shaping.guarded_stream(
                stream_response(request, started, events, buffered),
                is_end=lambda piece: piece.startswith(ENDINGS),
                on_failure=on_failure,
            ),
            content_type="text/event-stream",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        try:
            final = await bridge.wait_for_run(run, started.ended)
            await auth.count_tokens(started.key, final)
            body, error = await finished_response(request, final, target)
            response = error_response(error) if error is not None else JsonResponse(body)
        except Exception as exc:
            response = error_response(shaping.follow_failure_error(request, run, target, exc))
    for name, value in headers.items():
        response[name] = value
    return response


def _retrieve(request: HttpRequest, resp_id: str) -> tuple[Any, targets.Target]:
    key = auth.authenticate(request)
    refusal = api_sel.scope_refusal(key, ApiScope.RUNS_READ)
    if refusal is not None:
        raise auth.deny(key, 403, "insufficient_scope", refusal, detail=ApiScope.RUNS_READ)
    run = stored_run(key, resp_id)
    preset = run.preset or "mini"
    return run, targets.Target(
        preset=preset, pool=run.pool, model=str(run.api_request["protocol"].get("model"))
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
