"""The Chat Completions request: a body validated into the bridge's ``RunRequest``.

Every parameter is honoured or refused by name (400 with ``param``), never silently ignored:
``KNOWN_PARAMS`` are honoured (or change nothing a client can observe), ``NEUTRAL_VALUES`` are
refused unless neutral. The Responses and Messages adapters reuse the shared pieces (numbers,
``metadata``, ``response_format``).
"""

from __future__ import annotations

from typing import Any

from apps.api.v1 import run_request
from apps.api.v1.errors import BodyRules, bad_param, json_body
from apps.engine.generation import GenerationOptions, ResponseFormat

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


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise bad_param(f"'{name}' must be a positive integer.", name)
    return value


def number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
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


def request_metadata(body: dict[str, Any]) -> dict[str, str]:
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
    max_tokens = positive_int(body, "max_tokens")
    max_completion = positive_int(body, "max_completion_tokens")
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
        temperature=number(body, "temperature", 0, 2),
        top_p=number(body, "top_p", 0, 1),
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
        metadata=request_metadata(body),
        extra={"include_usage": bool((stream_options or {}).get("include_usage", False))},
    )
