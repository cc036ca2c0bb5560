"""Who is acting and from where, for the audit trail, without threading a request everywhere.

Middleware (and the API key authenticator) set it per request; services read it when they write an
audit event. Context variables follow asgiref's sync/async hops, so this works under daphne.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RequestMeta:
    ip: str | None = None
    user_agent: str = ""
    api_key_id: int | None = None
    request_id: str = ""  # /v1 requests: the x-request-id answered (apps.api.v1.middleware)


# RequestMeta is frozen, so sharing one default instance is safe.
_current: contextvars.ContextVar[RequestMeta] = contextvars.ContextVar(
    "conductor_request_meta",
    default=RequestMeta(),  # noqa: B039
)


def current_request_meta() -> RequestMeta:
    return _current.get()


def set_request_meta(meta: RequestMeta) -> contextvars.Token[RequestMeta]:
    return _current.set(meta)


def set_request_id(request_id: str) -> None:
    _current.set(replace(_current.get(), request_id=request_id))


def set_api_key_id(api_key_id: int | None) -> None:
    _current.set(replace(_current.get(), api_key_id=api_key_id))


@contextmanager
def request_meta(meta: RequestMeta) -> Iterator[None]:
    token = _current.set(meta)
    try:
        yield
    finally:
        _current.reset(token)
