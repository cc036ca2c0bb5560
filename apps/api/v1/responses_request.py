"""The Responses request (``POST /v1/responses``): a body validated into the bridge's ``RunRequest``.

Input items (``message`` with ``input_text`` / ``output_text`` parts, ``function_call``,
``function_call_output``) become the bridge's chat messages; function tools become its tools;
``previous_response_id`` adds the earlier response's conversation (``with_history``) once the key
is known. Every other parameter is honoured or refused by name (400 with ``param``). A response's
id is its run's (``resp_<run hex>``).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from apps.api import selectors as api_sel
from apps.api.models import ApiKey
from apps.api.v1 import run_request, shaping
from apps.api.v1.chat_request import number, parse_response_format, positive_int, request_metadata
from apps.api.v1.errors import ApiError, BodyRules, bad_param, json_body
from apps.engine.generation import GenerationOptions, ResponseFormat
from apps.runs.models import Run

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


def msg_id(run_id: Any) -> str:
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


def parse_text(value: Any) -> ResponseFormat | None:
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
        max_tokens=positive_int(body, "max_output_tokens"),
        temperature=number(body, "temperature", 0, 2),
        top_p=number(body, "top_p", 0, 1),
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
            metadata=request_metadata(body),
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


def stored_run(key: ApiKey, resp_id: str, param: str | None = None) -> Run:
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
    if (
        run is None
        or not isinstance(protocol, dict)
        or protocol.get("api") != "responses"
        or not protocol.get("store")
    ):
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
    protocol = (run.api_request or {})["protocol"]  # stored_run checked it is there
    history = [dict(m) for m in protocol.get("messages") or [] if isinstance(m, dict)]
    answer = shaping.final_answer(run)
    assistant: dict[str, Any] = {"role": "assistant", "content": answer.text or ""}
    if answer.tool_calls:
        assistant["tool_calls"] = answer.tool_calls
    return _assemble(req, [*history, assistant])
