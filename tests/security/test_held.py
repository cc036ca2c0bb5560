"""Held means held (issue #13, item 3): while a ``require_review`` guardrail holds a run's answer,
the requester finds no part of it on any surface; a reviewer sees it; after approval the requester
does too.

Everything goes through a live daphne over real sockets (HTTP, websockets, the ``/v1`` stream) and
the runtime of the mode (daphne's thread pool / a Celery worker). The fake provider answers with
unique markers: ``STEP_MARK`` in the first step's output (which the second step reads), ``MARK``
in the final answer; the test searches every response for them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client
from websockets.sync.client import ClientConnection, connect

from apps.audit.models import AuditEvent
from apps.policies.spec import parse_spec
from apps.runs.models import Run, RunEvent, Step
from apps.runs.selectors import policy_hold_rules, withhold_event_data, withhold_step
from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy
from tests.fixtures.api import PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

# Any final answer longer than this is flagged: the output guardrail holds it for review.
HOLD_POLICY = {
    "guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 10}}}
}
TIMEOUT = 90


class Markers:
    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.answer = f"HELDANSWER{tag}"
        self.step = f"HELDSTEP{tag}"

    def found_in(self, blob: str | bytes) -> list[str]:
        text = blob.decode() if isinstance(blob, bytes) else blob
        return [m for m in (self.answer, self.step) if m in text]


@pytest.fixture
def marks() -> Markers:
    return Markers()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """The first worker waits for it, so viewers can connect before any output exists."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def critic_gate() -> Iterator[threading.Event]:
    """The second (last) worker waits for it; open unless a test closes it."""
    event = threading.Event()
    event.set()
    yield event
    event.set()


@pytest.fixture
def scripted(fake_pool: Any, marks: Markers, gate: threading.Event, critic_gate: threading.Event) -> Any:
    def respond(request: dict[str, Any]) -> str:
        model = request.get("model")
        if model == "fake-conductor-1":
            return PLAN_TEXT  # solver (step 0), then critic (step 1, reads step 0)
        if model == "fake-critic-1":
            critic_gate.wait(TIMEOUT)
            return f"Final: {marks.answer} is the answer"
        gate.wait(TIMEOUT)
        return f"Draft: {marks.step} so far"

    fake_pool.server.responder = respond
    return fake_pool


def _session(user: Any) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}


class Viewer:
    """One logged-in browser-like user against the live server."""

    def __init__(self, server: Any, user: Any) -> None:
        self.server = server
        self.cookies = _session(user)
        self.http = httpx.Client(base_url=server.url, cookies=self.cookies, timeout=TIMEOUT)

    def ws(self, run_id: str, query: str = "") -> ClientConnection:
        cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        return connect(
            f"{self.server.ws_url}/ws/runs/{run_id}/{query}",
            additional_headers={"Cookie": cookie, "Origin": self.server.url},
            open_timeout=TIMEOUT,
        )

    def post(self, path: str, data: dict[str, Any] | None = None, *, page: str) -> httpx.Response:
        self.http.get(page)  # sets the CSRF cookie
        token = self.http.cookies.get(settings.CSRF_COOKIE_NAME) or ""
        return self.http.post(
            path, data=data or {}, headers={"X-CSRFToken": token, "Referer": self.server.url + page}
        )


def _until(ws: ClientConnection, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while True:
        message = json.loads(ws.recv(timeout=TIMEOUT))
        got.append(message)
        if done(message):
            return got


def _finished(message: dict[str, Any]) -> bool:
    return message.get("type") == "run.finished"


def _dump(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages)


class V1Stream(threading.Thread):
    """A streamed /v1 chat completion as the requester; exposes the run id and the raw bytes."""

    def __init__(self, server: Any, key: str) -> None:
        super().__init__(daemon=True)
        self.server, self.key = server, key
        self.run_id: str | None = None
        self.started = threading.Event()
        self.raw = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST",
                f"{self.server.url}/v1/chat/completions",
                json={
                    "model": "conductor-mini",
                    "messages": [{"role": "user", "content": "six times seven?"}],
                    "stream": True,
                },
                headers={"Authorization": f"Bearer {self.key}"},
                timeout=TIMEOUT,
            ) as response:
                self.run_id = response.headers.get("x-conductor-run")
                self.started.set()
                self.raw = b"".join(response.iter_bytes())
        except BaseException as exc:
            self.error = exc
        finally:
            self.started.set()


def _sse_chunks(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: ") :]))
    return out


def test_a_held_answer_is_on_no_surface_for_the_requester_until_a_reviewer_releases_it(
    daphne_server: Any,
    runtime_workers: Any,
    scripted: Any,
    gate: threading.Event,
    marks: Markers,
    alpha: Any,
    owner: Any,
    reviewer: Any,
) -> None:
    publish_policy(alpha, HOLD_POLICY)
    owner_key = make_api_key(alpha, name="owner key", principal=owner).plaintext
    requester, checker = Viewer(daphne_server, owner), Viewer(daphne_server, reviewer)

    # The requester starts a streamed /v1 run; viewers connect while the first worker waits.
    stream = V1Stream(daphne_server, owner_key)
    stream.start()
    assert stream.started.wait(TIMEOUT) and stream.error is None and stream.run_id, stream.error
    run_id = stream.run_id
    sockets = contextlib.ExitStack()
    live_owner = sockets.enter_context(requester.ws(run_id))
    live_reviewer = sockets.enter_context(checker.ws(run_id))
    first_owner, first_reviewer = (
        json.loads(live_owner.recv(timeout=TIMEOUT)),
        json.loads(live_reviewer.recv(timeout=TIMEOUT)),
    )
    assert first_owner["type"] == first_reviewer["type"] == "snapshot"
    gate.set()

    owner_live = [first_owner, *_until(live_owner, _finished)]
    reviewer_live = [first_reviewer, *_until(live_reviewer, _finished)]
    stream.join(TIMEOUT)
    assert not stream.is_alive() and stream.error is None

    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded" and run.answer_held and marks.answer in run.answer
    # There was something to leak: the markers were streamed as deltas and stored as outputs.
    deltas = "".join(
        e.data.get("text") or "" for e in RunEvent.objects.filter(run=run, type="step.delta").order_by("seq")
    )
    assert marks.answer in deltas and marks.step in deltas
    assert marks.step in str(Step.objects.get(run=run, index=1).messages)

    # Websocket, live (snapshot, events before the verdict, run.finished): nothing for the requester.
    assert marks.found_in(_dump(owner_live)) == []
    finished = owner_live[-1]["data"]
    assert finished["answer_held"] is True and finished["answer"] is None
    assert any(m.get("type") == "step.finished" and m["data"].get("withheld") for m in owner_live)
    assert not any(m.get("type") == "step.delta" for m in owner_live)
    # ...while the reviewer watched the whole thing.
    assert sorted(marks.found_in(_dump(reviewer_live))) == sorted([marks.answer, marks.step])

    # /v1 stream, raw bytes: no delta of the answer, ends content_filter naming the rule.
    assert marks.found_in(stream.raw) == []
    assert stream.raw.rstrip().endswith(b"data: [DONE]")
    chunks = _sse_chunks(stream.raw)
    assert all(not c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices"))
    last = [c for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in last] == ["content_filter"]
    held = last[0]["conductor"]["held"]
    assert held["rules"] == ["output:length"] and "output:length" in held["reason"]
    assert "require_review" in held["reason"]

    # /v1 plain: the same run's answer is not in the body either.
    plain = httpx.post(
        f"{daphne_server.url}/v1/chat/completions",
        json={"model": "conductor-mini", "messages": [{"role": "user", "content": "again?"}]},
        headers={"Authorization": f"Bearer {owner_key}"},
        timeout=TIMEOUT,
    )
    assert plain.status_code == 200 and marks.found_in(plain.content) == []
    assert plain.json()["choices"][0]["finish_reason"] == "content_filter"
    assert plain.json()["choices"][0]["message"]["content"] is None
    assert plain.json()["conductor"]["held"]["rules"] == ["output:length"]

    def requester_surfaces() -> dict[str, str]:
        out = {}
        for path in (
            f"/api/runs/{run_id}/",
            f"/api/runs/{run_id}/steps/",
            f"/api/runs/{run_id}/events/",
            f"/api/runs/{run_id}/events/?after=0&limit=500",
            f"/runs/{run_id}/",
            f"/playground/?run={run_id}",
            "/audit/export.jsonl",
            "/audit/export.csv",
            "/api/audit/export/?format=jsonl",
        ):
            response = requester.http.get(path)
            assert response.status_code < 500, (path, response.status_code)
            out[path] = response.text
        with requester.ws(run_id) as ws:  # a fresh snapshot
            out["ws snapshot"] = ws.recv(timeout=TIMEOUT)  # type: ignore[assignment]
        with requester.ws(run_id, "?after=0") as ws:  # a reconnect that replays every event
            out["ws after=0"] = _dump(_until(ws, _finished))
        return out

    # REST, run page, playground, exports, websocket snapshot and reconnect: nothing.
    surfaces = requester_surfaces()
    assert {name: marks.found_in(text) for name, text in surfaces.items() if marks.found_in(text)} == {}
    detail = requester.http.get(f"/api/runs/{run_id}/").json()
    assert (detail["answer"], detail["answer_held"], detail["content_withheld"]) == (None, True, True)
    steps = requester.http.get(f"/api/runs/{run_id}/steps/").json()["results"]
    assert [(s["output"], s["messages"], s["withheld"]) for s in steps] == [("", [], True)] * 2
    assert "held for review" in surfaces[f"/runs/{run_id}/"]
    assert "output:length" in surfaces[f"/runs/{run_id}/"]
    snapshot = json.loads(surfaces["ws snapshot"])
    assert snapshot["run"]["answer_held"] and snapshot["run"]["held_rules"] == ["output:length"]

    # Replay of the step that read the held output: refused, naming the rule; nothing started.
    runs_before = Run.objects.count()
    replay = requester.post(f"/runs/{run_id}/steps/1/replay/", page=f"/runs/{run_id}/")
    assert replay.status_code == 403 and "require_review" in replay.text
    assert marks.found_in(replay.text) == [] and Run.objects.count() == runs_before

    # The reviewer sees the held content on REST to decide.
    reviewed = checker.http.get(f"/api/runs/{run_id}/").json()
    assert marks.answer in reviewed["answer"] and reviewed["content_withheld"] is False
    assert marks.step in checker.http.get(f"/api/runs/{run_id}/steps/").text

    # A decline (flag) is audited and keeps the answer held; the open page is told, and still
    # shows nothing.
    flag = checker.post(
        f"/api/runs/{run_id}/review/",
        {"status": "flagged", "reason": "needs a human"},
        page=f"/runs/{run_id}/",
    )
    assert flag.status_code == 201, flag.text
    after_flag = json.loads(live_owner.recv(timeout=TIMEOUT))
    assert after_flag["type"] == "snapshot" and after_flag["run"]["answer_held"] is True
    assert marks.found_in(_dump([after_flag])) == []
    assert marks.found_in(requester.http.get(f"/api/runs/{run_id}/steps/").text) == []

    # Approval releases it (audited) and the open page gets it live.
    approve = checker.post(f"/api/runs/{run_id}/review/", {"status": "approved"}, page=f"/runs/{run_id}/")
    assert approve.status_code == 201 and approve.json()["released_answer"] is True, approve.text
    released = json.loads(live_owner.recv(timeout=TIMEOUT))
    sockets.close()
    assert released["type"] == "snapshot" and released["run"]["answer_held"] is False
    assert marks.answer in released["run"]["answer"]
    assert marks.step in _dump(released["steps"])
    types = list(AuditEvent.objects.filter(run_id=run.pk).values_list("event_type", flat=True))
    assert types.count("run.reviewed") == 2 and types.count("run.released") == 1

    assert marks.answer in requester.http.get(f"/api/runs/{run_id}/").json()["answer"]
    assert marks.step in requester.http.get(f"/api/runs/{run_id}/steps/").text
    assert marks.answer in requester.http.get(f"/api/runs/{run_id}/events/").text
    with requester.ws(run_id, "?after=0") as ws:
        assert marks.answer in _dump(_until(ws, _finished))


def test_without_a_require_review_guardrail_the_requester_watches_output_live(
    daphne_server: Any,
    runtime_workers: Any,
    scripted: Any,
    gate: threading.Event,
    marks: Markers,
    alpha: Any,
    owner: Any,
) -> None:
    # The same run under a warn-only policy: nothing is held, so nothing is withheld.
    publish_policy(
        alpha, {"guardrails": {"output": {"length": {"enabled": True, "action": "warn", "max_chars": 10}}}}
    )
    stream = V1Stream(daphne_server, make_api_key(alpha, name="owner key", principal=owner).plaintext)
    stream.start()
    assert stream.started.wait(TIMEOUT) and stream.run_id, stream.error
    requester = Viewer(daphne_server, owner)
    with requester.ws(stream.run_id) as ws:
        assert json.loads(ws.recv(timeout=TIMEOUT))["type"] == "snapshot"
        gate.set()
        live = _until(ws, _finished)
    stream.join(TIMEOUT)
    assert any(m["type"] == "step.delta" and marks.step in m["data"]["text"] for m in live)
    assert marks.answer in live[-1]["data"]["answer"] and live[-1]["data"]["answer_held"] is False
    assert marks.answer in stream.raw.decode()


def test_a_holdable_run_that_never_reached_its_verdict_stays_withheld(
    daphne_server: Any,
    runtime_workers: Any,
    scripted: Any,
    gate: threading.Event,
    critic_gate: threading.Event,
    marks: Markers,
    alpha: Any,
    owner: Any,
    reviewer: Any,
) -> None:
    # Cancelling after outputs exist but before the output guardrail must not release them.
    publish_policy(alpha, HOLD_POLICY)
    critic_gate.clear()
    stream = V1Stream(daphne_server, make_api_key(alpha, name="owner key", principal=owner).plaintext)
    stream.start()
    assert stream.started.wait(TIMEOUT) and stream.run_id, stream.error
    run_id = stream.run_id
    requester = Viewer(daphne_server, owner)
    with requester.ws(run_id) as ws:
        assert json.loads(ws.recv(timeout=TIMEOUT))["type"] == "snapshot"
        gate.set()
        # The solver answered (its output is stored) and the critic is waiting: cancel now.
        early = _until(ws, lambda m: m.get("type") == "step.started" and m["data"]["index"] == 1)
        cancel = requester.post(f"/runs/{run_id}/cancel/", page=f"/runs/{run_id}/")
        assert cancel.status_code == 302, cancel.status_code
        live = early + _until(ws, _finished)
    stream.join(TIMEOUT)
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and not run.answer_held
    assert marks.step in Step.objects.get(run=run, index=0).output
    assert marks.found_in(_dump(live)) == []
    assert marks.found_in(requester.http.get(f"/api/runs/{run_id}/steps/").text) == []
    assert marks.found_in(requester.http.get(f"/api/runs/{run_id}/events/").text) == []
    assert requester.http.get(f"/api/runs/{run_id}/").json()["content_withheld"] is True
    assert marks.found_in(stream.raw) == []
    # The reviewer can still read what was produced.
    assert marks.step in Viewer(daphne_server, reviewer).http.get(f"/api/runs/{run_id}/steps/").text


def test_hold_rules_and_withholding_are_pure() -> None:
    spec = parse_spec(
        {
            "guardrails": {
                "input": {"pii": {"enabled": True, "action": "require_review"}},
                "output": {"length": {"enabled": False, "action": "require_review", "max_chars": 5}},
                "step_output": {"secrets": {"enabled": True, "action": "block"}},
            }
        }
    )
    assert policy_hold_rules(spec) == ["input:pii"]
    step = {"index": 2, "round": 2, "instruction": "use X", "output": "X", "messages": [{"role": "user"}]}
    assert withhold_step(step) == {
        "index": 2,
        "round": 2,
        "instruction": "",
        "output": "",
        "messages": [],
        "withheld": True,
    }
    judged = withhold_event_data(
        "guardrail.checked",
        {
            "checks": [
                {"name": "model_judge", "detail": "failed: it says X"},
                {"name": "pii", "detail": "e-mail"},
            ]
        },
    )
    assert "X" not in json.dumps(judged) and judged["checks"][1]["detail"] == "e-mail"
    assert withhold_event_data("plan.proposed", {"round": 1, "raw": "X", "plan": {}})["raw"] == ""
