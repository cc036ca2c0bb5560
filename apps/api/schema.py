"""OpenAPI extensions: how the schema describes API key authentication, and the ``/v1`` protocol
endpoints (plain async Django views, which drf-spectacular cannot introspect) added by a
post-processing hook with their request and response schemas."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "apps.api.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "cw_<prefix>_<secret>",
            "description": "A team API key (Teams → API keys). It acts for its creator, limited to the key's "
            "team, role (read/run/admin) and allowed pools.",
        }


# --- /v1 ------------------------------------------------------------------------------------------

V1_TAG = "v1 (OpenAI / Anthropic compatible)"
MODEL_HELP = "conductor-mini, conductor-ultra, or the slug of a pool the key may use (GET /v1/models)."


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = required
    return out


_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_USAGE_OPENAI = _obj(
    {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
    ["prompt_tokens", "completion_tokens", "total_tokens"],
)
_TOOL_CALL = _obj(
    {
        "id": _STR,
        "type": {"type": "string", "enum": ["function"]},
        "function": _obj({"name": _STR, "arguments": {**_STR, "description": "JSON text"}}),
    }
)

V1_COMPONENTS: dict[str, Any] = {
    "V1Error": _obj(
        {
            "error": _obj(
                {
                    "message": _STR,
                    "type": _STR,
                    "param": {"type": "string", "nullable": True},
                    "code": {"type": "string", "nullable": True},
                },
                ["message", "type"],
            )
        },
        ["error"],
        description="OpenAI's error shape (every /v1 error except /v1/messages).",
    ),
    "V1AnthropicError": _obj(
        {
            "type": {"type": "string", "enum": ["error"]},
            "error": _obj({"type": _STR, "message": _STR}, ["type", "message"]),
        },
        ["type", "error"],
        description="Anthropic's error shape (/v1/messages).",
    ),
    "V1Model": _obj(
        {"id": _STR, "object": {"type": "string", "enum": ["model"]}, "created": _INT, "owned_by": _STR},
        ["id", "object", "created", "owned_by"],
    ),
    "V1ModelList": _obj(
        {"object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": _ref("V1Model")}},
        ["object", "data"],
    ),
    "V1ChatMessage": _obj(
        {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {
                "oneOf": [_STR, {"type": "array", "items": {"type": "object"}}],
                "nullable": True,
                "description": "Text, or content parts (text parts are used).",
            },
            "name": _STR,
            "tool_calls": {"type": "array", "items": _TOOL_CALL},
            "tool_call_id": _STR,
        },
        ["role"],
    ),
    "V1ChatCompletionRequest": _obj(
        {
            "model": {**_STR, "description": MODEL_HELP},
            "messages": {"type": "array", "items": _ref("V1ChatMessage"), "minItems": 1},
            "stream": {
                **_BOOL,
                "default": False,
                "description": "Server-sent events (chat.completion.chunk).",
            },
            "stream_options": _obj({"include_usage": _BOOL}),
            "max_tokens": _INT,
            "max_completion_tokens": _INT,
            "temperature": _NUM,
            "top_p": _NUM,
            "stop": {"oneOf": [_STR, {"type": "array", "items": _STR}]},
            "n": {**_INT, "description": "Only 1 is supported."},
            "seed": _INT,
            "user": _STR,
            "metadata": {"type": "object", "additionalProperties": _STR},
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"oneOf": [_STR, {"type": "object"}]},
            "parallel_tool_calls": _BOOL,
            "response_format": {"type": "object", "description": "text, json_object or json_schema"},
        },
        ["model", "messages"],
    ),
    "V1ChatCompletion": _obj(
        {
            "id": _STR,
            "object": {"type": "string", "enum": ["chat.completion"]},
            "created": _INT,
            "model": _STR,
            "system_fingerprint": {"type": "string", "nullable": True},
            "choices": {
                "type": "array",
                "items": _obj(
                    {
                        "index": _INT,
                        "message": _obj(
                            {
                                "role": {"type": "string", "enum": ["assistant"]},
                                "content": {"type": "string", "nullable": True},
                                "tool_calls": {"type": "array", "items": _TOOL_CALL},
                            },
                            ["role"],
                        ),
                        "finish_reason": _STR,
                        "logprobs": {"type": "object", "nullable": True},
                    },
                    ["index", "message", "finish_reason"],
                ),
            },
            "usage": _USAGE_OPENAI,
        },
        ["id", "object", "created", "model", "choices"],
    ),
    "V1ResponsesRequest": _obj(
        {
            "model": {**_STR, "description": MODEL_HELP},
            "input": {
                "oneOf": [_STR, {"type": "array", "items": {"type": "object"}}],
                "description": "Text, or a list of input items (messages, function call outputs).",
            },
            "instructions": _STR,
            "previous_response_id": _STR,
            "stream": _BOOL,
            "store": _BOOL,
            "max_output_tokens": _INT,
            "temperature": _NUM,
            "top_p": _NUM,
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"oneOf": [_STR, {"type": "object"}]},
            "text": _obj({"format": {"type": "object"}}),
            "metadata": {"type": "object", "additionalProperties": _STR},
        },
        ["model", "input"],
    ),
    "V1Response": _obj(
        {
            "id": _STR,
            "object": {"type": "string", "enum": ["response"]},
            "created_at": _INT,
            "status": {
                "type": "string",
                "enum": ["queued", "in_progress", "completed", "incomplete", "failed"],
            },
            "model": _STR,
            "output": {"type": "array", "items": {"type": "object"}},
            "error": {"type": "object", "nullable": True},
            "incomplete_details": {"type": "object", "nullable": True},
            "usage": _obj({"input_tokens": _INT, "output_tokens": _INT, "total_tokens": _INT}, nullable=True),
        },
        ["id", "object", "created_at", "status", "output"],
    ),
    "V1MessagesRequest": _obj(
        {
            "model": {**_STR, "description": MODEL_HELP},
            "max_tokens": _INT,
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": _obj(
                    {
                        "role": {"type": "string", "enum": ["user", "assistant"]},
                        "content": {"oneOf": [_STR, {"type": "array", "items": {"type": "object"}}]},
                    },
                    ["role", "content"],
                ),
            },
            "system": {"oneOf": [_STR, {"type": "array", "items": {"type": "object"}}]},
            "stream": _BOOL,
            "temperature": _NUM,
            "top_p": _NUM,
            "top_k": _INT,
            "stop_sequences": {"type": "array", "items": _STR},
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"type": "object"},
            "metadata": {"type": "object"},
        },
        ["model", "max_tokens", "messages"],
    ),
    "V1Message": _obj(
        {
            "id": _STR,
            "type": {"type": "string", "enum": ["message"]},
            "role": {"type": "string", "enum": ["assistant"]},
            "model": _STR,
            "content": {
                "type": "array",
                "items": _obj({"type": {"type": "string", "enum": ["text", "tool_use"]}, "text": _STR}),
            },
            "stop_reason": {"type": "string", "nullable": True},
            "stop_sequence": {"type": "string", "nullable": True},
            "usage": _obj({"input_tokens": _INT, "output_tokens": _INT}),
        },
        ["id", "type", "role", "model", "content"],
    ),
    "V1EmbeddingRequest": _obj(
        {
            "model": {**_STR, "description": "A pool (its default worker embeds), as on /v1/models."},
            "input": {
                "oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 2048}],
                "description": "Text or texts; token arrays are refused (the input policy reads text).",
            },
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {**_INT, "minimum": 1, "description": "OpenAI and OpenAI-compatible workers only."},
            "user": _STR,
        },
        ["model", "input"],
    ),
    "V1EmbeddingList": _obj(
        {
            "object": {"type": "string", "enum": ["list"]},
            "data": {
                "type": "array",
                "items": _obj(
                    {
                        "object": {"type": "string", "enum": ["embedding"]},
                        "index": _INT,
                        "embedding": {"oneOf": [{"type": "array", "items": _NUM}, _STR]},
                    },
                    ["object", "index", "embedding"],
                ),
            },
            "model": _STR,
            "usage": _obj({"prompt_tokens": _INT, "total_tokens": _INT}),
        },
        ["object", "data", "model", "usage"],
    ),
    "V1FeedbackRequest": _obj(
        {
            "run_id": {**_STR, "format": "uuid", "description": "A run of the key's team."},
            "metric": {**_STR, "description": "A metric of the team, e.g. 'helpful'."},
            "value": {
                "oneOf": [_BOOL, _NUM],
                "description": "Boolean metrics: true/false/1/0; float metrics: a finite number.",
            },
            "comment": {**_STR, "maxLength": 1000},
            "step_index": {**_INT, "description": "Required for step-level metrics only."},
        },
        ["run_id", "metric", "value"],
    ),
    "V1Feedback": _obj(
        {
            "id": _INT,
            "object": {"type": "string", "enum": ["feedback"]},
            "run_id": _STR,
            "metric": _STR,
            "value": _NUM,
            "step_index": {"type": "integer", "nullable": True},
            "source": _STR,
            "created_at": _INT,
        },
        ["id", "object", "run_id", "metric", "value", "source", "created_at"],
    ),
}


def _errors(shape: str, *statuses: int) -> dict[str, Any]:
    text = {
        400: "Invalid request (names the parameter)",
        401: "Missing or invalid API key",
        403: "The key's scope, role or pool does not allow this (names which)",
        404: "No such model or response",
        429: "Rate limited (Retry-After)",
        504: "The run timed out",
    }
    return {
        str(s): {"description": text[s], "content": {"application/json": {"schema": _ref(shape)}}}
        for s in statuses
    }


def _operation(
    op_id: str,
    summary: str,
    response: str,
    *,
    request: str | None = None,
    error: str = "V1Error",
    stream: bool = False,
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": _ref(response)}}
    if stream:
        ok["text/event-stream"] = {"schema": {"type": "string", "description": "Server-sent events"}}
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "tags": [V1_TAG],
        "security": [{"apiKey": []}],
        "responses": {
            "200": {"description": "OK", "content": ok},
            **_errors(error, 400, 401, 403, 404, 429, *((504,) if request else ())),
        },
    }
    if request:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request)}},
        }
    if parameters:
        op["parameters"] = parameters
    return op


def _path_param(name: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": _STR}]


def v1_paths() -> dict[str, Any]:
    return {
        "/v1/models": {
            "get": _operation("v1_models_list", "Models (presets and usable pools)", "V1ModelList")
        },
        "/v1/models/{model}": {
            "get": _operation("v1_models_retrieve", "One model", "V1Model", parameters=_path_param("model"))
        },
        "/v1/chat/completions": {
            "post": _operation(
                "v1_chat_completions_create",
                "OpenAI Chat Completions: one conductor run",
                "V1ChatCompletion",
                request="V1ChatCompletionRequest",
                stream=True,
            )
        },
        "/v1/responses": {
            "post": _operation(
                "v1_responses_create",
                "OpenAI Responses: one conductor run",
                "V1Response",
                request="V1ResponsesRequest",
                stream=True,
            )
        },
        "/v1/responses/{response_id}": {
            "get": _operation(
                "v1_responses_retrieve",
                "A stored response",
                "V1Response",
                parameters=_path_param("response_id"),
            )
        },
        "/v1/messages": {
            "post": _operation(
                "v1_messages_create",
                "Anthropic Messages: one conductor run (x-api-key or bearer)",
                "V1Message",
                request="V1MessagesRequest",
                error="V1AnthropicError",
                stream=True,
            )
        },
        "/v1/embeddings": {
            "post": _operation(
                "v1_embeddings_create",
                "OpenAI Embeddings: the pool's default worker, through the team's input policy",
                "V1EmbeddingList",
                request="V1EmbeddingRequest",
            )
        },
        "/v1/feedback": {"post": _feedback_operation()},
    }


def _feedback_operation() -> dict[str, Any]:
    """``POST /v1/feedback`` answers 201 (a feedback item was created), not 200."""
    op = _operation("v1_feedback_create", "Score a run of the key's team (issue 19)", "V1Feedback")
    op["responses"]["201"] = {**op["responses"].pop("200"), "description": "Created"}
    op["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": _ref("V1FeedbackRequest")}},
    }
    return op


def add_v1_paths(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOKS entry: the /v1 paths and their component schemas."""
    result.setdefault("paths", {}).update(v1_paths())
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update(V1_COMPONENTS)
    tags = result.setdefault("tags", [])
    if not any(t.get("name") == V1_TAG for t in tags):
        tags.append(
            {
                "name": V1_TAG,
                "description": "Drop-in endpoints for the OpenAI and Anthropic SDKs; each call is one "
                "conductor run on the key's team. Errors use the protocol's own error shape.",
            }
        )
    return result
