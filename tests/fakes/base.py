"""Shared machinery for the fake provider servers: a real HTTP server on a loopback socket
(ThreadingHTTPServer on a daemon thread, port 0), a scripted responder, and request recording.

A responder is a callable `(request_json) -> reply` where a reply is a `str` (assistant text),
a `FakeReply` (text, usage, delays, tool input...) or a `FakeError` (status, body, headers).
`server.script(*replies)` queues replies that are used, in order, before the responder.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Fakes listen on their own loopback address, which the test settings' EGRESS_ALLOW opens
# (conductor_web/settings/test.py FAKE_PROVIDER_HOST): 127.0.0.1 and ::1 stay refused, so the
# egress tests' listeners there prove nothing reaches them. Linux routes all of 127/8 to lo.
FAKE_HOST = "127.0.13.1"


@dataclass
class FakeReply:
    text: str = ""
    input_tokens: int | None = None  # None: counted from the request (words + 4 per message)
    output_tokens: int | None = None  # None: one per streamed chunk / word
    # Simulated latency, for tests where the pace is the point (a timeout that must fire, a run
    # slow enough to watch mid-way). A test that only needs "slow until I say so" uses `hold`.
    delay: float = 0.0  # seconds before the response starts
    chunk_delay: float = 0.0  # seconds between streamed chunks
    hold: threading.Event | None = None  # the response starts only once the test sets it
    chunks: list[str] | None = None  # explicit stream chunks; default: split text into words
    include_usage: bool = True  # OpenAI: send usage (JSON) / the usage chunk (stream)
    tool_input: dict[str, Any] | None = None  # Anthropic forced tool call input
    # OpenAI: tool calls to answer with ([{"id", "name", "arguments"}]); finish_reason tool_calls.
    tool_calls: list[dict[str, Any]] | None = None
    model: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Streams: after this many content chunks the provider waits for ``resume`` (set by the test)
    # before the rest: "mid-stream until I say so" (a client must have its first chunk by then).
    pause_after: int | None = None
    resume: threading.Event | None = None
    pause_expired: bool = False  # the pause ended by its safety limit, not by ``resume``


def pause_point(reply: FakeReply, sent: int) -> None:
    """Wait for the test's ``resume`` once ``sent`` chunks of a paused stream went out."""
    if reply.pause_after is not None and reply.resume is not None and sent == reply.pause_after:
        # A test that resumes only after its client got content asserts this stayed False.
        reply.pause_expired = not reply.resume.wait(60)


@dataclass
class FakeError:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # simulated latency before the error (see FakeReply.delay)
    hold: threading.Event | None = None  # the error is sent only once the test sets it


Reply = str | FakeReply | FakeError
Responder = Callable[[dict[str, Any]], Reply]


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    json: dict[str, Any] | None
    raw: bytes = b""  # the body exactly as it arrived on the socket (security tests search it)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list((self.json or {}).get("messages", []))


def split_chunks(text: str) -> list[str]:
    """Word-ish chunks that re-join to exactly `text`."""
    if not text:
        return []
    out: list[str] = []
    current = ""
    for ch in text:
        current += ch
        if ch == " ":
            out.append(current)
            current = ""
    if current:
        out.append(current)
    return out


def simulate_latency(seconds: float) -> None:
    """The fakes' one deliberate sleep: a reply's declared `delay` / `chunk_delay` (pacing that
    the test asked for by name; nothing waits on it to learn a state)."""
    if seconds > 0:
        time.sleep(seconds)


def before_reply(reply: FakeReply | FakeError) -> None:
    """Hold the reply until the test releases it (`hold`), then its declared `delay`."""
    if reply.hold is not None:
        reply.hold.wait()
    simulate_latency(reply.delay)


def count_prompt_tokens(messages: Iterable[dict[str, Any]], system: object = None) -> int:
    total = 0
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        total += len(str(content).split()) + 4
    if isinstance(system, str):
        total += len(system.split()) + 4
    return max(total, 1)


class FakeServerBase:
    """Subclasses implement `handle(handler, method, path, body)`."""

    default_model = "fake-model"

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        api_key: str | None = None,
        models: Iterable[str] | None = None,
        host: str = FAKE_HOST,
    ) -> None:
        self.responder: Responder = responder or (lambda req: "ok")
        self.api_key = api_key  # when set, requests must present exactly this key
        self.models = list(models) if models is not None else None  # None: any model exists
        self.requests: list[RecordedRequest] = []
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # notified as each request is recorded
        self._host = host
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeServerBase:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection; streaming ends at close

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                return

            def _dispatch(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server._arrived:
                    server.requests.append(RecordedRequest(method, self.path, headers, body, raw))
                    server._arrived.notify_all()
                # The client may give up mid-reply (timeout tests): that is not a server error.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    server.handle(self, method, self.path.split("?", 1)[0], body, headers)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

        self._httpd = ThreadingHTTPServer((self._host, 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=type(self).__name__,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeServerBase:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def origin(self) -> str:
        return f"http://{self._host}:{self.port}"

    # ------------------------------------------------------------------ scripting

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._script.clear()

    def next_reply(self, request_json: dict[str, Any]) -> Reply:
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        return scripted if scripted is not None else self.responder(request_json)

    def wait_requests(
        self, check: Callable[[list[RecordedRequest]], bool], timeout: float = 30
    ) -> list[RecordedRequest]:
        """The recorded requests once ``check(requests)`` holds: each arriving request wakes the
        wait (a test learns "the provider was called" without polling)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: check(list(self.requests)), timeout):
                raise AssertionError(f"{type(self).__name__}: requests never matched in {timeout}s")
            return list(self.requests)

    def received(self) -> bytes:
        """Every request body this server received, as the bytes that arrived, one per line."""
        with self._lock:
            return b"\n".join(r.raw for r in self.requests)

    def posts(self, path_suffix: str = "") -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path.endswith(path_suffix)]

    # ------------------------------------------------------------------ writing

    @staticmethod
    def send_json(
        handler: BaseHTTPRequestHandler,
        status: int,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def start_sse(handler: BaseHTTPRequestHandler, headers: dict[str, str] | None = None) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.end_headers()

    @staticmethod
    def write_sse(handler: BaseHTTPRequestHandler, data: str, event: str | None = None) -> None:
        out = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
        handler.wfile.write(out.encode())
        handler.wfile.flush()

    def send_error_reply(self, handler: BaseHTTPRequestHandler, err: FakeError) -> None:
        before_reply(err)
        self.send_json(handler, err.status, err.body, err.headers)

    def handle(
        self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> None:
        raise NotImplementedError
