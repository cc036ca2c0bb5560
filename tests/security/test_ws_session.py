"""An open run websocket follows its session and its viewer's access (issue 39, item 6).

Against a live daphne over real sockets (the ``websockets`` client, cookies of real sessions, the
run executed by the mode's runtime on the fake OpenAI server). Each run's first worker waits on a
gate, so a viewer is connected and has seen the plan before anything changes; then the session
ends or the access is taken away, the gate opens, and the run produces the rest of its events.
Before issue 39 the socket streamed all of them (``run.finished`` included); now it closes with
the documented code and reason and shows nothing after the change.

The Origin cases: a server on ``http://127.0.0.1:<port>`` refused every Origin that differs in
scheme, host or port from its own (``AllowedHostsOriginValidator`` compared hosts only), and
accepts its own.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from apps.core.ws_origin import CLOSE_ORIGIN_REFUSED
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.ws_access import CLOSE_ACCESS_LOST, CLOSE_SESSION_ENDED, CLOSE_WITHHELD
from tests.factories.policies import publish_policy
from tests.factories.runs import RunFactory
from tests.fixtures.api import PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

TIMEOUT = 90
# Any final answer longer than this is held for review (test_held.py's policy).
HOLD_POLICY = {
    "guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 10}}}
}


@pytest.fixture
def marker() -> str:
    return f"WSMARK{uuid.uuid4().hex[:10]}"


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def scripted(fake_pool: Any, gate: threading.Event, marker: str) -> Any:
    """Two steps: the solver waits on ``gate``; both answers carry ``marker``."""

    def respond(request: dict[str, Any]) -> str:
        model = request.get("model")
        if model == "fake-conductor-1":
            return PLAN_TEXT
        if model == "fake-critic-1":
            return f"Final: {marker} is the answer"
        gate.wait(TIMEOUT)
        return f"Draft: {marker} so far"

    fake_pool.server.responder = respond
    return fake_pool


class Browser:
    """One signed-in browser: its session cookie on HTTP and on the run websocket."""

    def __init__(self, server: Any, user: Any) -> None:
        client = Client()
        client.force_login(user)
        self.server = server
        self.cookies = {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}
        self.http = httpx.Client(base_url=server.url, cookies=self.cookies, timeout=TIMEOUT)

    def post(self, path: str, data: dict[str, Any] | None = None, *, page: str) -> httpx.Response:
        self.http.get(page)  # sets the CSRF cookie
        token = self.http.cookies.get(settings.CSRF_COOKIE_NAME) or ""
        return self.http.post(
            path, data=data or {}, headers={"X-CSRFToken": token, "Referer": self.server.url + page}
        )

    def start_run(self, pool: Any) -> str:
        response = self.post(
            "/playground/",
            {"prompt": "What is six times seven?", "strategy": "conductor-mini", "pool": str(pool.pk)},
            page="/playground/",
        )
        assert response.status_code == 302, response.text[:2000]
        return response.headers["location"].split("run=")[1].split("&")[0]

    def ws(self, run_id: str, *, origin: str | None = "own") -> ClientConnection:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        if origin is not None:
            headers["Origin"] = self.server.url if origin == "own" else origin
        return connect(
            f"{self.server.ws_url}/ws/runs/{run_id}/", additional_headers=headers, open_timeout=TIMEOUT
        )


def _recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=TIMEOUT))  # type: ignore[no-any-return]


def _until_step_waits(ws: ClientConnection) -> list[dict[str, Any]]:
    """The snapshot and every event up to the gated solver's ``step.started``."""
    got = [_recv(ws)]
    assert got[0]["type"] == "snapshot", got
    # The snapshot's steps may be newer than its ``last_seq`` (it reads ``last_seq`` first so that
    # nothing is skipped): events up to the step's start then follow it as a catch-up, already on
    # the wire before the test changes anything. Drain them by seq, not by time.
    started = (
        RunEvent.objects.filter(run_id=got[0]["run"]["id"], type="step.started", data__index=0)
        .values_list("seq", flat=True)
        .first()
    )
    if started is not None and got[0].get("last_seq", 0) >= started:
        return got  # it already waits, and the snapshot covers the event
    while not (got[-1].get("type") == "step.started" and got[-1]["data"].get("index") == 0):
        got.append(_recv(ws))
    return got


def _rest_of(ws: ClientConnection) -> tuple[list[dict[str, Any]], Any]:
    """What the socket delivers after the change: messages until ``run.finished`` or the close
    (then its close frame; None while still open after the run finished)."""
    got: list[dict[str, Any]] = []
    try:
        while True:
            message = _recv(ws)
            got.append(message)
            if message.get("type") == "run.finished":
                return got, None
    except ConnectionClosed as closed:
        return got, closed.rcvd


def _wait_finished(run_id: str) -> Run:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status not in ("queued", "running"):
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish")


def test_logging_out_closes_the_sessions_open_socket_at_once(
    daphne_server: Any, runtime_workers: Any, scripted: Any, gate: threading.Event, owner: Any, marker: str
) -> None:
    browser = Browser(daphne_server, owner)
    run_id = browser.start_run(scripted.pool)
    with browser.ws(run_id) as ws:
        _until_step_waits(ws)
        # Log out in the same browser: REST refuses the session at once...
        logout = browser.post("/accounts/logout/", page="/playground/")
        assert logout.status_code in (200, 302), logout.status_code
        assert browser.http.get(f"/api/runs/{run_id}/").status_code in (401, 403)
        # ...and so does the socket: closed before the run goes on, nothing more streamed.
        gate.set()
        after, close = _rest_of(ws)
    assert after == [], f"{len(after)} more events after logout: {[m.get('type') for m in after]}"
    assert close is not None and close.code == CLOSE_SESSION_ENDED, close
    assert "session ended" in close.reason
    assert _wait_finished(run_id).status == "succeeded"  # the run itself goes on


def test_removal_from_the_team_closes_the_open_socket(
    daphne_server: Any,
    runtime_workers: Any,
    scripted: Any,
    gate: threading.Event,
    alpha: Any,
    owner: Any,
    teammate: Any,
    team_admin: Any,
    marker: str,
) -> None:
    run_id = Browser(daphne_server, owner).start_run(scripted.pool)
    watcher, admin = Browser(daphne_server, teammate), Browser(daphne_server, team_admin)
    with watcher.ws(run_id) as ws:
        _until_step_waits(ws)
        removed = admin.post(
            f"/teams/{alpha.slug}/members/{teammate.pk}/remove/", page=f"/teams/{alpha.slug}/"
        )
        assert removed.status_code == 302 and not alpha.memberships.filter(user=teammate).exists()
        assert watcher.http.get(f"/api/runs/{run_id}/").status_code == 404  # REST: gone at once
        gate.set()
        after, close = _rest_of(ws)
    # The first batch after the removal carries the new access version: nothing of it is shown.
    assert after == [], f"{len(after)} more events after removal: {[m.get('type') for m in after]}"
    assert close is not None and close.code == CLOSE_ACCESS_LOST, close
    assert "access lost" in close.reason
    assert marker not in json.dumps(after)
    # And a new handshake is refused outright.
    with pytest.raises((InvalidStatus, ConnectionClosed)), watcher.ws(run_id) as again:
        _recv(again)
    _wait_finished(run_id)


def test_losing_the_review_role_on_a_held_run_closes_the_socket_that_showed_its_content(
    daphne_server: Any,
    runtime_workers: Any,
    scripted: Any,
    gate: threading.Event,
    alpha: Any,
    owner: Any,
    reviewer: Any,
    team_admin: Any,
    marker: str,
) -> None:
    publish_policy(alpha, HOLD_POLICY)
    run_id = Browser(daphne_server, owner).start_run(scripted.pool)
    checker, admin = Browser(daphne_server, reviewer), Browser(daphne_server, team_admin)
    with checker.ws(run_id) as ws:
        seen = _until_step_waits(ws)
        assert not seen[0]["run"].get("content_withheld")  # a reviewer sees a holdable run's content
        changed = admin.post(
            f"/teams/{alpha.slug}/members/{reviewer.pk}/role/",
            {"role": "member"},
            page=f"/teams/{alpha.slug}/",
        )
        assert changed.status_code == 302
        gate.set()
        after, close = _rest_of(ws)
    assert marker not in json.dumps(after), "held content streamed to a viewer who may no longer see it"
    assert close is not None and close.code == CLOSE_WITHHELD, close
    assert "withheld" in close.reason
    run = _wait_finished(run_id)
    assert run.answer_held and marker in run.answer
    # Reconnecting gives the withheld view (now a member), still live, without the content.
    with checker.ws(run_id) as ws:
        snapshot = _recv(ws)
    assert snapshot["type"] == "snapshot" and snapshot["run"]["content_withheld"] is True
    assert marker not in json.dumps(snapshot)


def _refusal(browser: Browser, run_id: str, origin: str | None) -> Any:
    """The close frame a handshake with ``origin`` gets (failing if the socket streams instead)."""
    try:
        with browser.ws(run_id, origin=origin) as ws:
            message = _recv(ws)
    except ConnectionClosed as closed:
        return closed.rcvd
    except InvalidStatus as refused:  # the handshake itself refused (how Channels refused no Origin)
        raise AssertionError(f"refused with HTTP {refused.response.status_code}, no close code") from None
    raise AssertionError(f"Origin {origin!r} accepted: got {message.get('type')}")


def test_origin_must_match_scheme_host_and_port(
    daphne_server: Any, fake_pool: Any, alpha: Any, owner: Any
) -> None:
    browser = Browser(daphne_server, owner)
    run_id = str(RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.SUCCEEDED).pk)
    port = daphne_server.url.rsplit(":", 1)[1]
    refused = {
        "https://127.0.0.1": "scheme and port (the issue's reproduction)",
        "http://localhost:9": "host and port (the issue's reproduction)",
        f"https://127.0.0.1:{port}": "scheme",
        "http://127.0.0.1:9": "port",
        "http://127.0.0.1": "port (the scheme's default)",
        f"http://localhost:{port}": "host (also in ALLOWED_HOSTS)",
        f"http://evil.example:{port}": "host",
        "null": "an opaque origin",
        f"http://127.0.0.1:{port}/ws": "not an origin",
    }
    for origin, differs in refused.items():
        close = _refusal(browser, run_id, origin)
        assert (close.code, close.reason) == (
            CLOSE_ORIGIN_REFUSED,
            "origin not allowed (WEBSOCKET_ALLOWED_ORIGINS)",
        ), (
            origin,
            differs,
        )
    close = _refusal(browser, run_id, None)
    assert close.code == CLOSE_ORIGIN_REFUSED
    # Logged with the origin it refused.
    log = daphne_server.log.read_text(errors="replace")
    assert "'http://localhost:9' is neither this server's own origin" in log
    # The server's own origin works.
    with browser.ws(run_id) as ws:
        snapshot = _recv(ws)
    assert snapshot["type"] == "snapshot" and snapshot["run"]["id"] == run_id
