"""Every `/v1` client gets its run id and a truthful ending, whatever Redis or the server does.

A daphne subprocess of our own talks to Redis through a `TcpProxy` the test controls (the shared
Redis is never stopped). In the embedded mode that daphne runs the runs in its own threads with a
Redis channel layer; in the distributed mode the session's Celery worker runs them and publishes
to Redis directly, so only the web process loses Redis.

The solver's reply is held back until the test has injected the fault, so the clients are
certainly waiting when it happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings

from apps.runs.models import Run
from tests.faults.proxy import TcpProxy
from tests.fixtures.api import CONDUCTOR_ANSWER, PLAN_TEXT
from tests.fixtures.core import (
    LiveServer,
    _stop,
    start_daphne,
    subprocess_env,
)
from tests.runtime import MODE

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PROMPT = [{"role": "user", "content": "What is six times seven?"}]
# The Redis the distributed mode uses; the embedded mode's subprocess borrows the same server.
DEFAULT_REDIS = "redis://127.0.0.1:6379/1"
CLIENT_TIMEOUT_S = 120


def redis_target() -> tuple[str, int, str]:
    """(host, port, path) of the real Redis behind the proxy."""
    parts = urlsplit(settings.REDIS_URL or DEFAULT_REDIS)
    return parts.hostname or "127.0.0.1", parts.port or 6379, parts.path or "/0"


def require_redis() -> None:
    host, port, _ = redis_target()
    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError as exc:
        if MODE == "distributed":
            raise
        pytest.skip(f"no Redis at {host}:{port} to put behind the proxy ({exc})")


class FreezableProxy(TcpProxy):
    """A `TcpProxy` that can also swallow traffic without closing anything (a hung Redis: every
    client call then runs into its timeout instead of a connection error)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.frozen = threading.Event()
        super().__init__(*args, **kwargs)

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self.frozen.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()


class ProxiedServer(LiveServer):
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path, proxy: FreezableProxy) -> None:
        super().__init__(url, proc, log)
        self.proxy = proxy

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, text: str) -> None:
        stop = threading.Event()
        for _ in range(CLIENT_TIMEOUT_S * 10):
            if text in self.log_text():
                return
            stop.wait(0.1)
        raise AssertionError(f"{text!r} never appeared in the server log:\n{self.log_text()[-3000:]}")


def start_proxied_daphne(log: Path, proxy: TcpProxy, **env: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A daphne process like `tests.fixtures.core.daphne_server`, with Redis behind `proxy`."""
    _, _, path = redis_target()
    env = subprocess_env(REDIS_URL=f"redis://127.0.0.1:{proxy.listen_port}{path}", **env)
    server = start_daphne(log, env)
    return server.url, server.proc


@pytest.fixture
def proxied_server(
    django_db_setup: Any, django_db_blocker: Any, tmp_path: Path, runtime_workers: Any
) -> Iterator[ProxiedServer]:
    require_redis()
    host, port, _ = redis_target()
    proxy = FreezableProxy(0, host, port)
    log = tmp_path / "daphne.log"
    url, proc = start_proxied_daphne(log, proxy)
    try:
        yield ProxiedServer(url, proc, log, proxy)
    finally:
        _stop(proc)
        proxy.close()


class HeldSolver:
    """The fake provider's responder: plans two steps; the solver answers only once released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = threading.Semaphore(0)  # one release per solver call that is being held

    def __call__(self, request: dict[str, Any]) -> str:
        model = request.get("model")
        if model == "fake-conductor-1":
            return PLAN_TEXT
        if model == "fake-critic-1":
            return CONDUCTOR_ANSWER
        self.held.release()
        self.release.wait(timeout=CLIENT_TIMEOUT_S)
        return "6 * 7 = 42"

    def wait_held(self, count: int) -> None:
        """Until ``count`` solver calls are being held (their runs are mid-execution)."""
        for _ in range(count):
            assert self.held.acquire(timeout=CLIENT_TIMEOUT_S), "a run never reached its solver step"


@pytest.fixture
def held(conductor_fake: Any) -> Iterator[HeldSolver]:
    """The fake provider plays a HeldSolver; released at teardown so no call outlives the test."""
    solver = HeldSolver()
    conductor_fake.server.responder = solver
    yield solver
    solver.release.set()


class PlainClient(threading.Thread):
    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.response = httpx.post(
                f"{self.url}/v1/chat/completions",
                json={"model": "conductor-mini", "messages": PROMPT},
                headers={"Authorization": f"Bearer {self.key}"},
                timeout=CLIENT_TIMEOUT_S,
            )
        except BaseException as exc:  # reported by the test
            self.error = exc


class StreamClient(threading.Thread):
    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.headers: dict[str, str] = {}
        self.lines: list[str] = []
        self.first_chunk = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST",
                f"{self.url}/v1/chat/completions",
                json={"model": "conductor-mini", "messages": PROMPT, "stream": True},
                headers={"Authorization": f"Bearer {self.key}"},
                timeout=CLIENT_TIMEOUT_S,
            ) as response:
                self.headers = dict(response.headers)
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.lines.append(line)
                        self.first_chunk.set()
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.first_chunk.set()

    def events(self) -> list[Any]:
        return [json.loads(line[6:]) for line in self.lines if line != "data: [DONE]"]


def start_waiting_clients(server: LiveServer, key: str, held: HeldSolver) -> tuple[PlainClient, StreamClient]:
    plain, stream = PlainClient(server.url, key), StreamClient(server.url, key)
    stream.start()
    assert stream.first_chunk.wait(CLIENT_TIMEOUT_S), "the stream sent nothing"
    assert stream.error is None, stream.error
    plain.start()
    held.wait_held(2)  # both runs are executing their solver step: both clients are waiting
    assert Run.objects.count() == 2
    return plain, stream


def assert_truthful_success(plain: PlainClient, stream: StreamClient) -> None:
    plain.join(CLIENT_TIMEOUT_S)
    stream.join(CLIENT_TIMEOUT_S)
    assert not plain.is_alive() and not stream.is_alive(), "a client never got an ending"
    assert plain.error is None and stream.error is None, (plain.error, stream.error)

    assert plain.response is not None
    body = plain.response.json()
    assert plain.response.status_code == 200, body
    run_id = plain.response.headers["x-conductor-run"]
    assert body["conductor"]["run_id"] == run_id
    assert body["choices"][0]["message"]["content"] == CONDUCTOR_ANSWER

    assert stream.lines[-1] == "data: [DONE]"
    events = stream.events()
    stream_run = stream.headers["x-conductor-run"]
    assert events[0]["conductor"]["run_id"] == stream_run
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")) == (
        CONDUCTOR_ANSWER
    )
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1] == "stop"
    assert {str(r.pk): r.status for r in Run.objects.all()} == {run_id: "succeeded", stream_run: "succeeded"}


def test_redis_going_down_while_clients_wait_still_gives_both_their_answer(
    proxied_server: ProxiedServer, held: HeldSolver, api_key: tuple[Any, str]
) -> None:
    _key, plaintext = api_key
    plain, stream = start_waiting_clients(proxied_server, plaintext, held)

    proxied_server.proxy.stop_accepting()  # Redis is gone: open connections reset, new ones refused
    proxied_server.proxy.cut_all()
    # The runs go on only once the waiting clients have hit the dead channel layer.
    proxied_server.wait_for_log("channel layer failed on receive")
    held.release.set()

    assert_truthful_success(plain, stream)
    log = proxied_server.log_text()
    # One warning per transition, not one per client or call.
    assert log.count("/v1 clients follow runs by polling the database") == 1
    assert log.count("rate limiter: Redis unreachable (ConnectionError)") == 1


@pytest.mark.distributed
def test_redis_hanging_while_clients_wait_still_gives_both_their_answer(
    proxied_server: ProxiedServer, held: HeldSolver, api_key: tuple[Any, str]
) -> None:
    # Distributed only: in the embedded mode the run's own event publishing would wait on the
    # hung Redis too (that is the sink's timeout, not the client's ending under test).
    _key, plaintext = api_key
    plain, stream = start_waiting_clients(proxied_server, plaintext, held)

    proxied_server.proxy.frozen.set()  # Redis stops answering; nothing is closed
    held.release.set()

    assert_truthful_success(plain, stream)
    assert "rate limiter: Redis unreachable (TimeoutError)" in proxied_server.log_text()


def test_run_deleted_while_clients_wait_ends_both_with_an_error_naming_the_run(
    proxied_server: ProxiedServer, held: HeldSolver, api_key: tuple[Any, str]
) -> None:
    _key, plaintext = api_key
    plain, stream = start_waiting_clients(proxied_server, plaintext, held)

    Run.objects.all().delete()  # the one failure of the wait itself a test can cause for real
    held.release.set()
    plain.join(CLIENT_TIMEOUT_S)
    stream.join(CLIENT_TIMEOUT_S)
    assert not plain.is_alive() and not stream.is_alive(), "a client never got an ending"
    assert plain.error is None and stream.error is None, (plain.error, stream.error)

    assert plain.response is not None
    run_id = plain.response.headers["x-conductor-run"]
    body = plain.response.json()
    assert plain.response.status_code == 410, body
    assert body["error"]["code"] == "run_deleted" and run_id in body["error"]["message"]
    assert body["conductor"]["run_id"] == run_id
    assert plain.response.headers["x-should-retry"] == "false"

    assert stream.lines[-1] == "data: [DONE]"
    stream_run = stream.headers["x-conductor-run"]
    error = stream.events()[-1]
    assert error["error"]["code"] == "run_deleted" and stream_run in error["error"]["message"]
    assert error["conductor"]["run_id"] == stream_run


@pytest.mark.distributed
def test_streaming_client_knows_its_run_before_the_server_dies(
    proxied_server: ProxiedServer, held: HeldSolver, api_key: tuple[Any, str]
) -> None:
    # Distributed: the run lives on in Celery after its web process is SIGKILLed.
    _key, plaintext = api_key
    stream = StreamClient(proxied_server.url, plaintext)
    stream.start()
    assert stream.first_chunk.wait(CLIENT_TIMEOUT_S)
    held.wait_held(1)  # the run is executing now

    os.kill(proxied_server.proc.pid, signal.SIGKILL)
    proxied_server.proc.wait(timeout=30)
    held.release.set()
    stream.join(CLIENT_TIMEOUT_S)

    run_id = stream.headers["x-conductor-run"]
    assert stream.events()[0]["conductor"]["run_id"] == run_id
    assert "data: [DONE]" not in stream.lines  # the stream really died mid-run
    from apps.runs.services import run_wait

    run = run_wait(run_id, CLIENT_TIMEOUT_S)
    assert run.status == "succeeded" and run.answer == CONDUCTOR_ANSWER
