"""``/v1`` under an ASGI server goes through ``conductor_web.handlers.ApiASGIHandler`` (issue 15).

Django's chain (settings.MIDDLEWARE) is built for the pages: its synchronous middleware gave each
``/v1`` request a thread of its own and crossings to it and back. The ``/v1`` chain is the same
list without the browser-session middleware, every hook inline on the event loop. These tests
drive the application as ``conductor_web.asgi`` composes it, with real ASGI messages, and check
that nothing the pages chain gave a ``/v1`` answer went missing: headers, input limits, the audit
request context.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.core.asgi import get_asgi_application
from django.utils.module_loading import import_string

from apps.audit.models import AuditEvent
from apps.core.middleware import InlineHooks
from apps.runs.models import Run
from conductor_web import handlers
from conductor_web.handlers import ApiASGIHandler, api_middleware, http_application
from tests.fakes.base import FakeReply
from tests.fixtures.workers import solo_pool_of

pytestmark = [pytest.mark.django_db(transaction=True)]

CHAT = json.dumps({"model": "solo", "messages": [{"role": "user", "content": "What is 6*7?"}]}).encode()


@pytest.fixture(scope="module")
def pages_app() -> Any:
    return get_asgi_application()


@pytest.fixture(scope="module")
def app(pages_app: Any) -> Any:
    """What conductor_web.asgi serves over HTTP (without its background threads)."""
    return http_application(pages_app, ApiASGIHandler())


@pytest.fixture
def solo(fake_pool: Any, alpha: Any) -> Any:
    fake_pool.server.responder = lambda req: FakeReply("42")
    return solo_pool_of(fake_pool, alpha)


async def call(
    app: Any,
    method: str,
    path: str,
    *,
    body: bytes = b"",
    headers: tuple[tuple[bytes, bytes], ...] = (),
    query: bytes = b"",
    client: tuple[str, int] = ("127.0.0.1", 50123),
    root_path: str = "",
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request as daphne hands it to the application: status, headers, body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": root_path,
        "query_string": query,
        "headers": [(b"host", b"testserver"), *headers],
        "client": client,
        "server": ("testserver", 80),
    }
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await communicator.receive_output(30)
    assert start["type"] == "http.response.start", start
    content = b""
    while True:
        message = await communicator.receive_output(30)
        content += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(5)
    found = {name.decode().lower(): value.decode() for name, value in start["headers"]}
    return start["status"], found, content


def _auth(key: str, *extra: tuple[bytes, bytes]) -> tuple[tuple[bytes, bytes], ...]:
    return ((b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json"), *extra)


def test_the_api_chain_is_the_pages_chain_without_the_browser_middleware() -> None:
    chain = api_middleware(list(settings.MIDDLEWARE))
    assert not set(chain) & handlers.BROWSER_ONLY
    assert "apps.api.v1.middleware.V1Middleware" in chain
    assert "apps.core.input_limits.InputLimitsMiddleware" in chain
    assert "apps.core.middleware.RequestContextMiddleware" in chain
    # Every header middleware of the pages chain is there, inline.
    for original, inline in handlers.INLINE.items():
        assert (original in settings.MIDDLEWARE) == (inline in chain), original
    # A middleware an operator adds applies to /v1 too, in its place.
    assert api_middleware([*settings.MIDDLEWARE, "example.Audit"])[-1] == "example.Audit"
    # Nothing left in it would cross to a thread: each is async-capable, and a MiddlewareMixin
    # (whose async hooks Django runs in threads) only with its hooks inline. A new middleware in
    # MIDDLEWARE fails here until it is made inline or listed as browser-only.
    for path in chain:
        middleware = import_string(path)
        assert getattr(middleware, "async_capable", False), path
        if hasattr(middleware, "process_request") or hasattr(middleware, "process_response"):
            assert issubclass(middleware, InlineHooks), path


def test_paths_under_v1_go_to_the_api_handler_below_the_mount_point() -> None:
    seen: list[tuple[str, str]] = []

    def recorder(name: str) -> Any:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            seen.append((name, scope["path"]))

        return app

    app = http_application(recorder("pages"), recorder("api"))
    for path, root in [
        ("/v1/chat/completions", ""),
        ("/conductor/v1/models", "/conductor"),
        ("/v1", ""),  # no trailing slash: Django's 404, as before
        ("/api/runs/", ""),
        ("/runs/v1/", ""),
    ]:
        asyncio.run(app({"type": "http", "path": path, "root_path": root}, None, None))
    assert [name for name, _ in seen] == ["api", "api", "pages", "pages", "pages"], seen


def test_a_v1_answer_carries_the_headers_the_pages_chain_gave_it(
    app: Any, pages_app: Any, api_key: tuple[Any, str]
) -> None:
    status, api, _ = asyncio.run(call(app, "GET", "/v1/models", headers=_auth(api_key[1])))
    assert status == 200
    status, pages, _ = asyncio.run(call(pages_app, "GET", "/v1/models", headers=_auth(api_key[1])))
    assert status == 200
    assert set(api) == set(pages), set(api) ^ set(pages)
    # No "Vary: Cookie" on either (the login check read the session of every request before it
    # looked at the path): no cookie decides a /v1 answer.
    assert "vary" not in api, api
    for name in (
        "x-frame-options",
        "x-content-type-options",
        "referrer-policy",
        "cross-origin-opener-policy",
        "x-request-id",
        "x-conductor-overhead-ms",
    ):
        assert name in api, (name, api)
    assert api["x-frame-options"] == pages["x-frame-options"]
    assert "set-cookie" not in api  # no session, no CSRF cookie


def test_input_limits_answer_on_the_async_chain(app: Any, api_key: tuple[Any, str]) -> None:
    deep = b"[" * 200 + b"]" * 200
    status, found, body = asyncio.run(
        call(app, "POST", "/v1/chat/completions", body=deep, headers=_auth(api_key[1]))
    )
    assert status == 400, body
    assert "JSON_MAX_DEPTH" in json.loads(body)["error"]["message"]
    assert found["x-request-id"].startswith("req_")  # the refusal went back through V1Middleware

    huge = settings.JSON_MAX_BYTES + 1
    status, _, body = asyncio.run(
        call(
            app,
            "POST",
            "/v1/chat/completions",
            body=b" " * huge,
            headers=(*_auth(api_key[1]), (b"content-length", str(huge).encode())),
        )
    )
    assert status == 413, body
    assert "JSON_MAX_BYTES" in json.loads(body)["error"]["message"]

    status, _, body = asyncio.run(call(app, "GET", "/v1/models", query=b"q=%00", headers=_auth(api_key[1])))
    assert status == 400, body


def test_a_run_keeps_its_request_id_and_client_in_the_audit_trail(
    app: Any, solo: Any, api_key: tuple[Any, str]
) -> None:
    status, found, body = asyncio.run(
        call(
            app,
            "POST",
            "/v1/chat/completions",
            body=CHAT,
            headers=_auth(api_key[1], (b"user-agent", b"audit-probe/1.0")),
            client=("10.9.8.7", 4242),
        )
    )
    assert status == 200, body
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] == "42"
    run = Run.objects.get(pk=answer["conductor"]["run_id"])
    assert run.request_id == found["x-request-id"]
    rows = AuditEvent.objects.filter(run_id=run.pk, ip="10.9.8.7")
    assert rows.exists(), list(AuditEvent.objects.filter(run_id=run.pk).values("event_type", "ip"))
    assert {row.user_agent for row in rows} == {"audit-probe/1.0"}
    assert {row.api_key_id for row in rows} == {api_key[0].pk}


def test_a_warm_v1_request_runs_its_middleware_on_the_loop_and_starts_no_thread(
    app: Any, solo: Any, api_key: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks: list[str] = []
    original = InlineHooks.__acall__

    async def spy(self: Any, request: Any) -> Any:
        hooks.append(threading.current_thread().name)
        return await original(self, request)

    monkeypatch.setattr(InlineHooks, "__acall__", spy)
    started: list[tuple[str, str]] = []
    start = threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        started.append((threading.current_thread().name, thread.name))
        start(thread)

    async def ask(times: int) -> None:
        for _ in range(times):
            status, _, body = await call(
                app, "POST", "/v1/chat/completions", body=CHAT, headers=_auth(api_key[1])
            )
            assert status == 200, body

    asyncio.run(ask(1))  # the first request of the process starts the kept threads it needs
    monkeypatch.setattr(threading.Thread, "start", recording_start)
    loop_thread = threading.current_thread().name  # asyncio.run runs the loop on this thread
    asyncio.run(ask(4))
    # Every middleware hook ran on the event loop's thread (Django's chain ran them on a thread).
    assert hooks and set(hooks) == {loop_thread}, hooks
    # No request got a thread of its own: what the loop started, if anything, is a kept
    # v1-request thread (the executor adds one when all are busy), never a per-request one.
    from_loop = [name for starter, name in started if starter == loop_thread]
    assert all(name.startswith("v1-request_") for name in from_loop), from_loop
