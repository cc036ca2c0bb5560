"""Bad input gets a clear 4xx, never a 5xx (issue 14).

Two pieces:

- `safe_json_loads` — the one JSON loader for untrusted bodies: refuses a body larger than
  ``JSON_MAX_BYTES`` (413), nesting deeper than ``JSON_MAX_DEPTH`` (400; a 10,000-deep body made
  the stdlib raise ``RecursionError``) and strings holding NUL or an unpaired surrogate (400,
  naming the field: ``"\\u0000"`` and ``"\\ud800"`` escapes decode to characters PostgreSQL and
  UTF-8 cannot store). Syntax errors still raise ``ValueError`` as ``json.loads`` does.
- `InputLimitsMiddleware` — applies the loader to every JSON body under ``/v1/`` and ``/api/``
  before any view or parser sees it, answers Django's own ``DATA_UPLOAD_MAX_MEMORY_SIZE`` /
  ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` refusals there in JSON (413/400 instead of the HTML 400 page),
  and refuses NUL or unpaired surrogates in the query string and form fields of every path.

Errors on ``/v1/`` use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``; on
``/api/`` DRF's ``{"detail": ...}``; elsewhere a plain-text 400. Messages name the limit and the
setting, never echo the offending content.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from apps.core.middleware import InlineHooks
from apps.engine.text import BAD_CHARS, has_bad_chars

DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_BYTES = 2_621_440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE default (2.5 MiB)

# Only bodies with one of these can decode to a bad character; the rest skip the string walk.
_ESCAPE_BYTES = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")  # UTF-8-encoded surrogates (invalid UTF-8)
_ESCAPE_TEXT = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def max_depth() -> int:
    return int(getattr(settings, "JSON_MAX_DEPTH", DEFAULT_MAX_DEPTH))


def max_bytes() -> int:
    return int(getattr(settings, "JSON_MAX_BYTES", None) or _upload_limit() or DEFAULT_MAX_BYTES)


def _upload_limit() -> int | None:
    value = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", DEFAULT_MAX_BYTES)
    return None if value is None else int(value)


class InputRefused(ValueError):
    """Input refused before it reaches a view, a parser or the database.

    A ``ValueError`` so that callers which map ``ValueError`` to "invalid JSON" still answer 4xx."""

    status = 400
    code = "invalid_input"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class TooLarge(InputRefused):
    status = 413
    code = "request_too_large"


class TooDeep(InputRefused):
    code = "json_too_deep"


class BadCharacters(InputRefused):
    code = "invalid_characters"


class TooManyFields(InputRefused):
    code = "too_many_fields"


def _bad_chars_error(where: str) -> BadCharacters:
    return BadCharacters(
        f"{where} contains a NUL character or an unpaired surrogate (\\u0000, \\ud800-\\udfff), "
        "which cannot be stored; remove it.",
        param=where,
    )


def too_large_error(size: int | None, limit: int, setting: str) -> TooLarge:
    got = f" ({size} bytes)" if size is not None else ""
    return TooLarge(f"The request body{got} is larger than {limit} bytes, the limit set by {setting}.")


def _render_path(path: Any) -> str:
    parts: list[Any] = []
    while path is not None:
        path, key = path
        parts.append(key)
    out = ""
    for key in reversed(parts):
        if isinstance(key, int):
            out += f"[{key}]"
        else:
            key = BAD_CHARS.sub("?", str(key)[:100])  # never echo the offending character
            out += f".{key}" if out else key
    return out or "(root)"


def _has_problem(data: Any, limit: int, check_strings: bool) -> bool:
    """Fast pass: raise `TooDeep`, or return whether some key or string holds a bad character."""
    bad = BAD_CHARS.search
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise _too_deep(limit)
        if type(node) is dict:
            if check_strings and any(type(k) is str and bad(k) for k in node):
                return True
            node = node.values()
        for value in node:
            kind = type(value)
            if kind is dict or kind is list:
                stack.append((value, depth + 1))
            elif check_strings and kind is str and bad(value):
                return True
    return False


def _bad_path(data: Any) -> str:
    """Slow pass, only once a bad character is known to exist: the path of the first one."""
    stack: list[tuple[Any, Any]] = [(data, None)]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            here = (path, key)
            if isinstance(key, str) and has_bad_chars(key):
                return _render_path(here)
            if isinstance(value, dict | list):
                stack.append((value, here))
            elif isinstance(value, str) and has_bad_chars(value):
                return _render_path(here)
    return "(root)"


def check_json_value(data: Any, *, depth_limit: int | None = None, check_strings: bool = True) -> None:
    """Refuse nesting deeper than the limit and NUL/unpaired surrogates in any key or string.

    Iterative (a recursive walk is what the limit protects against)."""
    limit = depth_limit if depth_limit is not None else max_depth()
    if isinstance(data, str):
        if check_strings and has_bad_chars(data):
            raise _bad_chars_error("(root)")
        return
    if not isinstance(data, dict | list):
        return
    if _has_problem(data, limit, check_strings):
        raise _bad_chars_error(_bad_path(data))


def _too_deep(limit: int) -> TooDeep:
    return TooDeep(f"The JSON is nested more than {limit} levels deep, the limit set by JSON_MAX_DEPTH.")


def safe_json_loads(
    raw: bytes | str, *, limit_bytes: int | None = None, depth_limit: int | None = None
) -> Any:
    """`json.loads` for untrusted input, with the size, depth and character limits above."""
    size_limit = limit_bytes if limit_bytes is not None else max_bytes()
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > size_limit:
        raise too_large_error(size, size_limit, "JSON_MAX_BYTES")
    depth = depth_limit if depth_limit is not None else max_depth()
    try:
        data = json.loads(raw)
    except RecursionError:
        raise _too_deep(depth) from None
    if isinstance(raw, bytes):
        # A NUL or surrogate escape, or raw surrogate bytes (json decodes bytes with surrogatepass).
        # `in` first: a literal scan is far cheaper than a regex over megabytes.
        suspicious = bool(
            (b"\\u" in raw and _ESCAPE_BYTES.search(raw)) or (b"\xed" in raw and _SURROGATE_BYTES.search(raw))
        )
        brackets = raw.count(b"[") + raw.count(b"{")
    else:
        suspicious = bool(("\\u" in raw and _ESCAPE_TEXT.search(raw)) or has_bad_chars(raw))
        brackets = raw.count("[") + raw.count("{")
    if suspicious or brackets > depth:
        check_json_value(data, depth_limit=depth, check_strings=suspicious)
    return data


# ------------------------------------------------------------------------------------ responses


def _surface(path: str) -> str:
    if path.startswith("/v1/"):
        return "openai"
    if path.startswith("/api/"):
        return "api"
    return "html"


def refusal_response(path: str, err: InputRefused) -> HttpResponse:
    surface = _surface(path)
    if surface == "openai":
        body = {
            "error": {
                "message": err.message,
                "type": "invalid_request_error",
                "param": err.param,
                "code": err.code,
            }
        }
        return JsonResponse(body, status=err.status)
    if surface == "api":
        return JsonResponse({"detail": err.message}, status=err.status)
    return HttpResponse(err.message, status=err.status, content_type="text/plain; charset=utf-8")


def _is_json(content_type: str) -> bool:
    ctype = content_type.split(";", 1)[0].strip().lower()
    return ctype == "application/json" or ctype.endswith("+json")


def _check_query_and_form(request: HttpRequest, content_type: str) -> None:
    if has_bad_chars(request.path):
        raise _bad_chars_error("the URL path")
    for key, values in request.GET.lists():
        if has_bad_chars(key) or any(has_bad_chars(v) for v in values):
            raise _bad_chars_error(f"query parameter {BAD_CHARS.sub('?', key[:100])!r}")
    # /v1 reads only JSON bodies: parsing a multipart one here would consume the stream, and the
    # view's read of the body then failed as a 503; unparsed, the view answers it as not JSON.
    form = content_type.startswith(_FORM_TYPES) and not request.path.startswith("/v1/")
    if request.method in ("POST", "PUT", "PATCH") and form:
        for key, values in request.POST.lists():
            if has_bad_chars(key) or any(has_bad_chars(v) for v in values):
                raise _bad_chars_error(f"form field {BAD_CHARS.sub('?', key[:100])!r}")


def _check_api_body(request: HttpRequest, content_type: str) -> None:
    upload_limit = _upload_limit()
    length_header = request.META.get("CONTENT_LENGTH") or "0"
    try:
        length = int(length_header)
    except ValueError:
        raise InputRefused("The Content-Length header is not a number.") from None
    json_body = _is_json(content_type) or (
        request.path.startswith("/v1/") and length > 0 and not content_type.startswith(_FORM_TYPES)
    )
    if json_body and length > max_bytes():
        raise too_large_error(length, max_bytes(), "JSON_MAX_BYTES")
    if upload_limit is not None and length > upload_limit and not content_type.startswith("multipart/"):
        raise too_large_error(length, upload_limit, "DATA_UPLOAD_MAX_MEMORY_SIZE")
    if not json_body:
        return
    body = request.body  # cached on the request: views and parsers read the same bytes
    if not body:
        return
    try:
        safe_json_loads(body)
    except InputRefused:
        raise
    except (ValueError, UnicodeDecodeError):
        return  # a syntax error: the view answers it in its own words


class InputLimitsMiddleware(InlineHooks, MiddlewareMixin):
    """See the module docstring. Placed before sessions and CSRF so nothing is loaded or stored.
    Inline in an async chain: it reads the body ASGI has already received, and the database not."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        content_type = request.META.get("CONTENT_TYPE", "") or ""
        try:
            if request.path.startswith(("/v1/", "/api/")):
                _check_api_body(request, content_type)
            _check_query_and_form(request, content_type)
        except RequestDataTooBig:
            return refusal_response(
                request.path,
                too_large_error(None, _upload_limit() or 0, "DATA_UPLOAD_MAX_MEMORY_SIZE"),
            )
        except TooManyFieldsSent:
            return refusal_response(request.path, _too_many_fields())
        except InputRefused as err:
            return refusal_response(request.path, err)
        return None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        # Raised while a view (or DRF) reads the body: answer in the API's format, not HTML.
        if not request.path.startswith(("/v1/", "/api/")):
            return None
        if isinstance(exception, RequestDataTooBig):
            return refusal_response(
                request.path, too_large_error(None, _upload_limit() or 0, "DATA_UPLOAD_MAX_MEMORY_SIZE")
            )
        if isinstance(exception, TooManyFieldsSent):
            return refusal_response(request.path, _too_many_fields())
        return None


def _too_many_fields() -> TooManyFields:
    limit = getattr(settings, "DATA_UPLOAD_MAX_NUMBER_FIELDS", None)
    return TooManyFields(
        f"The request has more than {limit} fields, the limit set by DATA_UPLOAD_MAX_NUMBER_FIELDS."
    )


# ------------------------------------------------------------------------------------ DRF


class PayloadTooLarge(APIException):
    status_code = 413
    default_detail = "The request body is too large."
    default_code = "request_too_large"


class SafeJSONParser(JSONParser):
    """DRF's JSON parser on `safe_json_loads` (the middleware already checked ``/api/`` bodies;
    this covers any other mount of a DRF view)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            return safe_json_loads(raw)
        except TooLarge as err:
            raise PayloadTooLarge(err.message) from None
        except InputRefused as err:
            raise ParseError(err.message) from None
        except (ValueError, UnicodeDecodeError) as err:
            raise ParseError(f"JSON parse error - {str(err)[:200]}") from None
