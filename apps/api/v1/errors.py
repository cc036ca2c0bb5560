"""The error every ``/v1`` adapter raises, and its renderings.

Adapters raise ``ApiError`` (status, message, type, param, code, headers); the adapter that
answers picks the shape: ``error_response(err)`` is OpenAI's ``{"error": {"message", "type",
"param", "code"}}``, ``error_response(err, shape="anthropic")`` is Anthropic's ``{"type":
"error", "error": {"type", "message"}}``. Another adapter registers its own shape with
``register_error_shape``. The ``conductor`` field (run id and URL) travels in every shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.http import JsonResponse

from apps.core.input_limits import safe_json_loads  # size/depth/NUL limits (issue 14)


class ApiError(Exception):
    """An error answered to a ``/v1`` client, in the shape of the protocol the adapter speaks
    (OpenAI's unless it says otherwise: Anthropic's for /v1/messages)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        conductor: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.conductor = conductor

    def body(self) -> dict[str, Any]:
        """OpenAI's error body."""
        return openai_error_body(self)


def openai_error_body(err: ApiError) -> dict[str, Any]:
    out: dict[str, Any] = {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }
    if err.conductor is not None:
        out["conductor"] = err.conductor
    return out


# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    410: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_body(err: ApiError) -> dict[str, Any]:
    type_ = ANTHROPIC_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    out: dict[str, Any] = {"type": "error", "error": {"type": type_, "message": err.message}}
    if err.code:
        out["error"]["code"] = err.code  # extra field: clients ignore it, people read it
    if err.param:
        out["error"]["param"] = err.param
    if err.conductor is not None:
        out["conductor"] = err.conductor
    return out


ErrorShape = Callable[[ApiError], dict[str, Any]]
_SHAPES: dict[str, ErrorShape] = {"openai": openai_error_body, "anthropic": anthropic_error_body}


def register_error_shape(name: str, render: ErrorShape) -> None:
    """Let another adapter render ``ApiError`` in its own protocol's shape."""
    _SHAPES[name] = render


def error_body(err: ApiError, shape: str = "openai") -> dict[str, Any]:
    return _SHAPES[shape](err)


def error_response(err: ApiError, shape: str = "openai") -> JsonResponse:
    """The JSON response for ``err`` in ``shape`` with its headers (Retry-After, x-should-retry)."""
    response = JsonResponse(error_body(err, shape), status=err.status)
    for name, value in err.headers.items():
        response[name] = value
    return response


def no_retry() -> dict[str, str]:
    """Headers for a deterministic refusal. The OpenAI and Anthropic SDKs honour
    ``x-should-retry``: a retry would only start another run or meet the same refusal."""
    return {"x-should-retry": "false"}


def method_not_allowed(allowed: str, shape: str = "openai") -> JsonResponse:
    response = error_response(
        ApiError(405, f"Use {allowed} on this endpoint.", code="method_not_allowed"), shape
    )
    response["Allow"] = allowed
    return response


# The endpoints this server implements, named in the answer to any other /v1 path. Adapters are
# listed where they are routed (apps/api/urls.py: ``V1_ENDPOINTS``).
def endpoints_text(endpoints: list[str]) -> str:
    return ", ".join(endpoints)


def unknown_url_error(method: str, path: str, endpoints: list[str]) -> ApiError:
    return ApiError(
        404,
        f"Unknown request URL: {method} {path}. This server implements {endpoints_text(endpoints)}.",
        code="unknown_url",
    )


def bad_param(message: str, param: str, code: str = "invalid_value") -> ApiError:
    """A 400 naming the request parameter that caused it."""
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class BodyRules:
    """The top-level checks every /v1 adapter makes on its JSON body; the wording is the
    protocol's own (OpenAI's sentences, or Anthropic's `field: reason`)."""

    required: tuple[str, ...]
    known: frozenset[str]
    neutral: Mapping[str, tuple[Any, ...]]  # accepted only at these values (refused otherwise)
    reasons: Mapping[str, str]  # why each `neutral` parameter is refused
    missing: str = "'{name}' is required."
    unsupported: str = "'{name}' is not supported: {reason}."
    unknown: str = "Unrecognized request argument supplied: {name}."


def json_body(raw: bytes, rules: BodyRules) -> dict[str, Any]:
    """Parse a /v1 body within the input limits (size, depth, NUL) and apply `rules`: required
    parameters, parameters refused unless neutral, and unknown ones — each a 400 naming it."""
    try:
        body = safe_json_loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    for name in rules.required:
        if name not in body:
            raise bad_param(rules.missing.format(name=name), name, "missing_required_parameter")
    for name, neutral in rules.neutral.items():
        if name in body and body[name] not in neutral:
            message = rules.unsupported.format(name=name, reason=rules.reasons[name])
            raise bad_param(message, name, "unsupported_parameter")
    unknown = sorted(set(body) - rules.known - set(rules.neutral))
    if unknown:
        raise bad_param(rules.unknown.format(name=unknown[0]), unknown[0], "unknown_parameter")
    return body
