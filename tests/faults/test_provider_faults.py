"""A provider fault is reported as what it was, never as "could not connect", a JSON traceback
or an internal error, and never with the provider key in it.

Two levels: the engine workers against a raw socket server that misbehaves on purpose (both
SDKs), and whole runs through `/v1` on a live server (both runtimes) whose solver step hits each
fault, so the step's error, the run's error and the `/v1` error message all name it.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from apps.engine.providers.base import (
    ProviderBadResponse,
    ProviderError,
    ProviderStreamCut,
    ProviderTimeout,
    ProviderUnavailable,
)
from apps.engine.providers.factory import build_worker
from apps.engine.providers.gate import gate_without_policy
from apps.engine.types import WorkerInfo
from tests.fakes.base import FAKE_HOST
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fixtures.api import CONDUCTOR_ANSWER, PLAN_TEXT
from tests.fixtures.workers import FAKE_PROVIDER_KEY

MSGS = [{"role": "user", "content": "Hello"}]
KEY = "sk-fault-SECRET-key-42xZ"

# --- a provider that misbehaves on purpose ------------------------------------------------------

Behaviour = Callable[[socket.socket], None]


class RawServer:
    """HTTP on a loopback socket where each request gets whatever bytes ``behaviour`` writes."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.release = threading.Event()  # lets a hanging behaviour end at teardown
        self.requests = 0
        self._sock = socket.socket()
        self._sock.bind((FAKE_HOST, 0))
        self._sock.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://{FAKE_HOST}:{self._sock.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            with contextlib.suppress(OSError):
                self.behaviour(conn)

    def close(self) -> None:
        self.release.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() that holds the socket open
        self._sock.close()


def _openai_event(content: str, finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _anthropic_events() -> bytes:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_x",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 1},
        },
    }
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello "}}
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in (start, block, delta))


def cut_stream(events: bytes) -> Behaviour:
    """A chunked SSE response that dies in the middle of its next chunk."""

    def behave(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        conn.sendall(b"%x\r\n" % len(events) + events + b"\r\n")
        conn.sendall(b'200\r\ndata: {"partial')

    return behave


def ended_early(events: bytes) -> Behaviour:
    """A close-delimited SSE response that just stops: no finish, no [DONE] / message_stop."""

    def behave(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + events)

    return behave


def raw_response(status: str, content_type: str, body: bytes) -> Behaviour:
    def behave(conn: socket.socket) -> None:
        conn.sendall(
            f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n".encode()
            + body
        )

    return behave


GARBAGE = f'{{"id": "chatcmpl-x", "choices": [ <html> upstream echoed Bearer {KEY}'.encode()
BAD_GATEWAY = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>"


@pytest.fixture
def raw_server() -> Iterator[Callable[[Behaviour], RawServer]]:
    servers: list[RawServer] = []

    def make(behaviour: Behaviour) -> RawServer:
        server = RawServer(behaviour)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def worker_for(server: RawServer, kind: str) -> Any:
    from apps.workers.egress import egress_policy

    info = WorkerInfo("w", "W", "m" if kind != "anthropic" else "claude-x", kind)
    return build_worker(
        info,
        base_url=server.base_url.removesuffix("/v1") if kind == "anthropic" else server.base_url,
        api_key=KEY,
        max_retries=0,
        egress=egress_policy(),
        gate=gate_without_policy(),
    )


def hang(server_ref: list[RawServer]) -> Behaviour:
    def behave(conn: socket.socket) -> None:
        server_ref[0].release.wait(60)

    return behave


def _no_key(err: BaseException) -> None:
    assert KEY not in str(err) and KEY not in repr(err)
    assert err.__cause__ is None  # the SDK exception (which may echo request details) is not chained


# --- the engine workers ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_stream_cut_mid_body_names_the_bytes_received(raw_server: Any, kind: str) -> None:
    events = _openai_event("Hello ") if kind != "anthropic" else _anthropic_events()
    server = raw_server(cut_stream(events))
    deltas: list[str] = []
    with pytest.raises(ProviderStreamCut) as info:
        worker_for(server, kind).complete(MSGS, on_delta=deltas.append, timeout=10)
    received = int(re.search(r"Stream cut after (\d+) bytes", str(info.value)).group(1))  # type: ignore[union-attr]
    assert received >= len(events)
    assert deltas == ["Hello "]
    assert info.value.retryable is False  # text already went out: a retry would repeat it
    _no_key(info.value)


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_stream_that_just_stops_is_a_cut_not_an_answer(raw_server: Any, kind: str) -> None:
    events = _openai_event("Hello ") if kind != "anthropic" else _anthropic_events()
    server = raw_server(ended_early(events))
    with pytest.raises(ProviderStreamCut, match=rf"Stream cut after {len(events)} bytes"):
        worker_for(server, kind).complete(MSGS, on_delta=lambda text: None, timeout=10)


def test_response_cut_before_its_content_length_is_a_cut(raw_server: Any) -> None:
    def behave(conn: socket.socket) -> None:
        conn.sendall(
            b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"id": 1'
        )

    server = raw_server(behave)
    with pytest.raises(ProviderStreamCut, match=r"Stream cut after 8 bytes"):
        worker_for(server, "openai_compatible").complete(MSGS, timeout=10)


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_garbage_json_shows_its_first_bytes_with_the_key_redacted(raw_server: Any, kind: str) -> None:
    server = raw_server(raw_response("200 OK", "application/json", GARBAGE))
    with pytest.raises(ProviderBadResponse) as info:
        worker_for(server, kind).complete(MSGS, timeout=10)
    message = str(info.value)
    assert message.startswith("Invalid JSON from the")
    assert 'first bytes: \'{"id": "chatcmpl-x", "choices": [ <html>' in message
    assert "[redacted]" in message and "secrets redacted" in message
    _no_key(info.value)


def test_garbage_in_a_stream_is_invalid_json(raw_server: Any) -> None:
    server = raw_server(ended_early(b'data: {"choices": nope ' + KEY.encode() + b"\n\n"))
    with pytest.raises(
        ProviderBadResponse, match=r"Invalid JSON .*first bytes: '\{\"choices\": nope \[redacted\]'"
    ):
        worker_for(server, "openai_compatible").complete(MSGS, on_delta=lambda text: None, timeout=10)


def test_html_instead_of_json_is_an_invalid_response(raw_server: Any) -> None:
    server = raw_server(raw_response("200 OK", "text/html", b"<html>captive portal</html>"))
    with pytest.raises(
        ProviderBadResponse, match=r"Invalid response .*first bytes: '<html>captive portal</html>'"
    ):
        worker_for(server, "openai_compatible").complete(MSGS, timeout=10)


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_http_502_names_the_status(raw_server: Any, kind: str) -> None:
    server = raw_server(raw_response("502 Bad Gateway", "text/html", BAD_GATEWAY))
    with pytest.raises(ProviderUnavailable, match=r"\(HTTP 502\)") as info:
        worker_for(server, kind).complete(MSGS, timeout=10)
    assert info.value.status == 502
    _no_key(info.value)


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_hang_names_the_time_waited(raw_server: Any, kind: str) -> None:
    ref: list[RawServer] = []
    server = raw_server(hang(ref))
    ref.append(server)
    with pytest.raises(ProviderTimeout, match=r"timed out after 0\.5 s"):
        worker_for(server, kind).complete(MSGS, timeout=0.5)


def test_nothing_listening_is_still_could_not_connect() -> None:
    from apps.workers.egress import egress_policy

    with socket.socket() as probe:  # a port on the fakes' address that nothing listens on
        probe.bind((FAKE_HOST, 0))
        url = f"http://{FAKE_HOST}:{probe.getsockname()[1]}/v1"
    info = WorkerInfo("w", "W", "m", "openai_compatible")
    worker = build_worker(
        info, base_url=url, api_key=KEY, max_retries=0, egress=egress_policy(), gate=gate_without_policy()
    )
    with pytest.raises(ProviderError, match="Could not connect"):
        worker.complete(MSGS, timeout=5)


# --- whole runs through /v1 --------------------------------------------------------------------


class FaultyOpenAIServer(FakeOpenAIServer):
    """The fake OpenAI server, but the solver model gets ``fault`` instead of an answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fault = ""
        self.release = threading.Event()  # ends a held "hang" reply

    def _chat(self, handler: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        if req.get("model") != "fake-solver-1" or not self.fault:
            super()._chat(handler, req)
            return
        handler.close_connection = True
        out = handler.wfile
        plain = not req.get("stream")  # as a real server: a plain request gets a JSON body
        if self.fault == "cut" and plain:
            head = b'{"id": "chatcmpl-x", "object": "chat.completion", "choices": ['
            out.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n" + head
            )
        elif self.fault == "garbage" and plain:
            body = b'{"id": "chatcmpl-x", "choices": [ oops ' + FAKE_PROVIDER_KEY.encode()
            raw_response("200 OK", "application/json", body)(handler.connection)
        elif self.fault == "cut":
            events = _openai_event("6 * 7 ")
            out.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            out.write(b"%x\r\n" % len(events) + events + b"\r\n" + b'200\r\ndata: {"partial')
        elif self.fault == "garbage":
            body = b'data: {"id": "chatcmpl-x", "choices": [ oops ' + FAKE_PROVIDER_KEY.encode() + b"\n\n"
            out.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + body)
        elif self.fault == "502":
            raw_response("502 Bad Gateway", "text/html", BAD_GATEWAY)(handler.connection)
        elif self.fault == "hang":
            self.release.wait(60)
        out.flush()


@pytest.fixture
def fake_pool_server() -> Iterator[FaultyOpenAIServer]:
    """Overrides the fixture behind ``fake_pool``: same key, same wire format, plus faults."""
    server = FaultyOpenAIServer(api_key=FAKE_PROVIDER_KEY)
    server.start()
    try:
        yield server
    finally:
        server.release.set()
        server.stop()


def _respond(request: dict[str, Any]) -> str:
    model = request.get("model")
    if model == "fake-conductor-1":
        return PLAN_TEXT
    if model == "fake-critic-1":
        return CONDUCTOR_ANSWER
    return "6 * 7 = 42"


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fault", "status", "expected"),
    [
        ("cut", "failed", r"Stream cut after \d+ bytes: the OpenAI-compatible provider at 127\.0\.13\.1"),
        (
            "garbage",
            "failed",
            r"Invalid JSON from the OpenAI-compatible provider at 127\.0\.13\.1 \(first bytes: ",
        ),
        ("502", "failed", r"The OpenAI-compatible provider is unavailable \(HTTP 502\)"),
        ("hang", "timed_out", r"(timed out after|did not answer within) 2\.\d s"),
    ],
)
def test_each_fault_is_named_in_the_step_the_run_and_the_v1_error(
    fault: str,
    status: str,
    expected: str,
    fake_pool: Any,
    api_key: tuple[Any, str],
    daphne_server: Any,
    runtime_workers: Any,
) -> None:
    from apps.runs.models import Run, Step
    from apps.workers.models import Worker

    server: FaultyOpenAIServer = fake_pool.server
    server.responder = _respond
    server.fault = fault
    # A short timeout for the hang; retries of the retryable faults stay quick too.
    Worker.objects.filter(slug="fake-solver").update(timeout_s=2)
    _key, plaintext = api_key

    response = httpx.post(
        f"{daphne_server.url}/v1/chat/completions",
        json={"model": "conductor-mini", "messages": MSGS},
        headers={"Authorization": f"Bearer {plaintext}"},
        timeout=120,
    )
    body = response.json()
    run = Run.objects.get(pk=response.headers["x-conductor-run"])
    step = Step.objects.get(run=run, index=0)

    assert step.status == status, step.error
    assert re.search(expected, step.error or ""), step.error
    assert run.status == "failed"
    assert re.search(expected, run.error), run.error
    assert response.status_code == 502, body
    assert body["error"]["code"] == "run_failed"
    assert re.search(expected, body["error"]["message"]), body
    assert body["conductor"]["run_id"] == str(run.pk)
    for text in (response.text, run.error, step.error or ""):
        assert FAKE_PROVIDER_KEY not in text
        assert "JSONDecodeError" not in text and "Could not connect" not in text
        assert "internal_error" not in text and "unexpectedly" not in text
    if fault == "garbage":
        assert "[redacted]" in run.error


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("cut", r"Stream cut after \d+ bytes: the OpenAI-compatible provider at 127\.0\.13\.1"),
        ("garbage", r"Invalid JSON from the OpenAI-compatible provider at 127\.0\.13\.1 \(first bytes: "),
    ],
)
def test_a_fault_mid_stream_is_named_in_the_step_the_run_and_the_stream(
    fault: str,
    expected: str,
    fake_pool: Any,
    api_key: tuple[Any, str],
    daphne_server: Any,
    runtime_workers: Any,
) -> None:
    """A streamed request's run streams from its providers (V1_UPSTREAM_STREAM=client): a stream
    cut or garbled mid-response is named as such, in the step, the run and the client's stream."""
    from apps.runs.models import Run, Step

    server: FaultyOpenAIServer = fake_pool.server
    server.responder = _respond
    server.fault = fault
    with httpx.stream(
        "POST",
        f"{daphne_server.url}/v1/chat/completions",
        json={"model": "conductor-mini", "messages": MSGS, "stream": True},
        headers={"Authorization": f"Bearer {api_key[1]}"},
        timeout=120,
    ) as response:
        assert response.status_code == 200
        run_id = response.headers["x-conductor-run"]
        text = response.read().decode()
    solver_calls = [c for c in server.chat_requests() if (c.json or {}).get("model") == "fake-solver-1"]
    assert solver_calls and all(c.json.get("stream") for c in solver_calls)
    run = Run.objects.get(pk=run_id)
    step = Step.objects.get(run=run, index=0)
    assert (run.status, step.status) == ("failed", "failed"), (run.error, step.error)
    for said in (step.error or "", run.error, text):
        assert re.search(expected, said), said
        assert FAKE_PROVIDER_KEY not in said
