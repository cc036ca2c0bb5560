"""An accepted run is never lost (issue 14): leases, re-queue, outbox.

Real processes: each test starts its own daphne / Celery worker subprocesses on the test
database (the session fixtures are left alone), SIGKILLs them while a run is in flight (the fake
provider answers slowly), starts a new one and checks that every accepted run still succeeds,
with each step billed once. The broker outage goes through a TCP proxy of the test's own; the
shared RabbitMQ is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.runs.execution import executor_id, reap_runs
from apps.runs.models import Run, RunCall, RunDispatch, RunEvent, RunStatus
from tests.factories.policies import publish_policy
from tests.factories.runs import RunFactory, StepFactory
from tests.fakes.base import FakeReply
from tests.faults.proxy import TcpProxy
from tests.fixtures.core import (
    LiveServer,
    _stop,
    start_celery_worker,
    start_daphne,
    subprocess_env,
)
from tests.fixtures.runs import CONDUCTOR_MODEL, THREE_STEP_PLAN, scripted_plan, worker_answer
from tests.runtime import MODE

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

# A lease long enough that only the "is gone" check re-queues a killed executor's run: with a
# short one, another live server of the test session (the session daphne, on the same database)
# could take it over by expiry first, and its reaper tells a dead pid only on its own node.
LEASE_ENV = {"RUN_LEASE_S": "60", "RUN_REAP_INTERVAL_S": "0.5"}
STEP_DELAY_S = 1.5  # each worker reply: long enough to kill the executor mid-step


# -- process helpers --------------------------------------------------------------------------------


class Procs:
    """The subprocesses a test started; whatever is still alive is stopped at teardown."""

    def __init__(self, tmp: Path, queue: str) -> None:
        self.tmp = tmp
        self.queue = queue
        # A node of their own: the session's other live servers and workers (same host, same
        # database) must not re-queue or re-dispatch these processes' runs the moment one is
        # killed, before the test has looked (seen: the queued run claimed by the session daphne).
        self.node = f"survival-{uuid.uuid4().hex[:8]}"
        self.started: list[subprocess.Popen[bytes]] = []

    def env(self, **extra: str) -> dict[str, str]:
        return subprocess_env(
            **LEASE_ENV,
            CELERY_RUN_QUEUE=self.queue,
            RUN_THREAD_WORKERS="1",
            RUN_EXECUTOR_NODE=self.node,
            **extra,
        )

    def daphne(self, **extra: str) -> LiveServer:
        server = start_daphne(self.tmp / f"daphne-{len(self.started)}.log", self.env(**extra))
        self.started.append(server.proc)
        return server

    def worker(self, **extra: str) -> subprocess.Popen[bytes]:
        proc = start_celery_worker(
            self.tmp / f"celery-{len(self.started)}.log",
            self.env(**extra),
            queue=self.queue,
            name=f"survival-{uuid.uuid4().hex[:6]}",
            concurrency=2,
            extra_args=("--without-heartbeat",),
        )
        self.started.append(proc)
        return proc

    def logs(self) -> str:
        """What the subprocesses said about claims and re-queues (for failure messages)."""
        lines = []
        for log in sorted(self.tmp.glob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if any(w in line for w in ("claimed by", "re-queued", "lease", "Traceback", "Error")):
                    lines.append(f"{log.name}: {line[:300]}")
        return "\n".join(lines[-60:])

    def stop_all(self) -> None:
        for proc in self.started:
            _stop(proc)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path, queue=f"survival-{uuid.uuid4().hex[:8]}")
    try:
        yield p
    finally:
        p.stop_all()


def sigkill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def poll_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for: {what}")
        threading.Event().wait(0.1)


def submit(server: LiveServer, key: str, question: str) -> str:
    response = httpx.post(
        f"{server.url}/api/runs/",
        json={"question": question, "pool": "fake", "strategy": "conductor", "preset": "mini"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def step_finished(run_id: str, index: int) -> bool:
    return RunEvent.objects.filter(run_id=run_id, type="step.finished", data__index=index).exists()


def terminal(*run_ids: str) -> bool:
    return Run.objects.filter(
        pk__in=run_ids, status__in=["succeeded", "failed", "blocked", "cancelled", "timed_out"]
    ).count() == len(run_ids)


def assert_billed_once(run_id: str) -> None:
    """The run's totals are exactly its final attempt's: the steps and planning calls recorded
    after the last run.started, each step once — not the lost attempt's, nor twice."""
    run = Run.objects.get(pk=run_id)
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)) and run.last_seq == seqs[-1]  # one log, no gaps
    last_start = max(i for i, e in enumerate(events) if e.type == "run.started")
    final = events[last_start:]
    usage_events = [e for e in final if e.type in ("plan.proposed", "step.finished")]
    assert run.input_tokens == sum(int(e.data["usage"]["input_tokens"]) for e in usage_events)
    assert run.output_tokens == sum(int(e.data["usage"]["output_tokens"]) for e in usage_events)
    finished = [e.data["index"] for e in final if e.type == "step.finished"]
    assert sorted(finished) == sorted(set(finished)) == [0, 1, 2]
    steps = run.steps.all()
    assert sorted(s.index for s in steps) == [0, 1, 2] and run.step_count == 3
    assert all(s.status == "succeeded" for s in steps)
    step_sum = steps.aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"))
    plan_in = sum(int(e.data["usage"]["input_tokens"]) for e in final if e.type == "plan.proposed")
    assert run.input_tokens == step_sum["i"] + plan_in
    costs = [Decimal(e.data["cost_usd"]) for e in usage_events if e.data.get("cost_usd") is not None]
    if run.cost_usd is not None:
        assert run.cost_usd == sum(costs, Decimal(0))


def provider_calls(server: Any, question: str, instruction: str | None = None) -> list[Any]:
    """What the fake provider was asked for the run of `question`: the conductor's planning
    calls, or the worker calls whose own subtask (the last message) is `instruction`."""
    calls = [c for c in server.chat_requests() if any(question in str(m.get("content")) for m in c.messages)]
    if instruction is None:
        return [c for c in calls if (c.json or {}).get("model") == CONDUCTOR_MODEL]
    return [c for c in calls if c.messages[-1].get("content") == instruction]


def assert_resumed(run_id: str, server: Any, *, done_before: list[int]) -> None:
    """The re-queued attempt resumed: planning and every step finished before the loss were
    answered from the journal (each asked of the provider exactly once across both attempts),
    the final attempt's events mark them replayed, and the journal is gone once the run ended."""
    question = Run.objects.get(pk=run_id).question
    assert len(provider_calls(server, question)) == 1, "the conductor was asked to plan again"
    subtasks = THREE_STEP_PLAN["subtasks"]
    for index in done_before:
        assert len(provider_calls(server, question, subtasks[index])) == 1, f"step {index} called again"
    for index in range(len(subtasks)):
        assert len(provider_calls(server, question, subtasks[index])) in (1, 2)  # in flight: twice
    events = list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))
    last_start = max(i for i, e in enumerate(events) if e.type == "run.started")
    final = events[last_start:]
    replayed = {e.data["index"] for e in final if e.type == "step.finished" and e.data.get("replayed")}
    assert set(done_before) <= replayed
    # Viewers were told the run went back to the queue (issue 44), before the next attempt began.
    requeued = [e for e in events[:last_start] if e.type == "run.requeued"]
    assert requeued and requeued[-1].data["restart"] == "resume"
    assert any(e.type == "plan.proposed" and e.data.get("replayed") for e in final)
    assert not RunCall.objects.filter(run_id=run_id).exists()


def requeues(run_id: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(run_id=run_id, event_type="run.requeued").order_by("seq"))


# -- embedded: the server process is the executor ---------------------------------------------------


@pytest.mark.skipif(MODE != "embedded", reason="embedded runtime: daphne executes runs itself")
def test_killed_embedded_server_loses_no_run(procs: Procs, run_pool: Any, api_key: Any) -> None:
    scripted_plan(run_pool.server, delay=STEP_DELAY_S)
    first = procs.daphne()
    in_flight = submit(first, api_key[1], "Survive a crash, please.")
    waiting = submit(first, api_key[1], "And me, queued behind it.")  # one run thread: queued
    poll_until(lambda: step_finished(in_flight, 0), 60, "step 0 of the first run finished")
    sigkill(first.proc)

    lost = Run.objects.get(pk=in_flight)
    assert lost.status == RunStatus.RUNNING and lost.lease_owner.split(":")[-2] == str(first.proc.pid)
    assert Run.objects.get(pk=waiting).status == RunStatus.QUEUED
    billed_before = lost.input_tokens
    assert billed_before > 0  # the lost attempt had spent something

    procs.daphne()  # the restarted server
    poll_until(lambda: terminal(in_flight, waiting), 120, "both runs terminal after the restart")

    for run_id in (in_flight, waiting):
        run = Run.objects.get(pk=run_id)
        assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
        assert run.answer.startswith("fake-critic-1 says")
        assert_billed_once(run_id)
    (requeued,) = requeues(in_flight)
    assert "is gone" in requeued.payload["reason"] and str(first.proc.pid) in requeued.payload["reason"]
    assert requeued.payload["discarded"]["steps"] >= 1
    assert requeued.payload["restart"] == "resume" and requeued.payload["journaled_calls"] >= 2
    assert_resumed(in_flight, run_pool.server, done_before=[0])
    assert requeued.payload["discarded"]["input_tokens"] >= billed_before
    assert Run.objects.get(pk=in_flight).attempts == 2
    assert not RunDispatch.objects.filter(run_id__in=[in_flight, waiting]).exists()


# -- distributed: Celery workers execute, the broker may be down -------------------------------------


@pytest.mark.skipif(MODE != "distributed", reason="Celery workers run only in the distributed mode")
def test_killed_celery_worker_loses_no_run(procs: Procs, run_pool: Any, api_key: Any) -> None:
    scripted_plan(run_pool.server, delay=STEP_DELAY_S)
    server = procs.daphne()
    first = procs.worker()
    run_id = submit(server, api_key[1], "Survive a dead worker, please.")
    poll_until(lambda: step_finished(run_id, 0), 60, "step 0 finished on the first worker")
    sigkill(first)
    # Still running, or already re-queued by the server's keeper (the owner's pid is gone).
    assert Run.objects.get(pk=run_id).status in (RunStatus.RUNNING, RunStatus.QUEUED)

    procs.worker()  # another worker: its keeper re-queues the dead worker's run at once
    poll_until(lambda: terminal(run_id), 120, "the run terminal on the second worker")

    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    assert_billed_once(run_id)
    found = requeues(run_id)
    assert len(found) == 1, ([(e.payload["reason"], e.payload["attempt"]) for e in found], procs.logs())
    assert str(first.pid) in found[0].payload["reason"]
    assert run.attempts == 2
    assert found[0].payload["restart"] == "resume"
    assert_resumed(run_id, run_pool.server, done_before=[0])


@pytest.mark.skipif(MODE != "distributed", reason="a broker exists only in the distributed mode")
def test_run_accepted_while_broker_down_completes_after_it_returns(
    procs: Procs, run_pool: Any, api_key: Any
) -> None:
    broker = urlparse(os.environ["CELERY_BROKER_URL"])
    proxy = TcpProxy(0, broker.hostname or "127.0.0.1", broker.port or 5672)
    try:
        via_proxy = broker._replace(netloc=f"{broker.netloc.rsplit('@', 1)[0]}@127.0.0.1:{proxy.listen_port}")
        server = procs.daphne(CELERY_BROKER_URL=via_proxy.geturl())
        procs.worker()  # on the real broker
        warm = submit(server, api_key[1], "Broker is up.")
        poll_until(lambda: terminal(warm), 60, "a run while the broker is up")
        connected = proxy.accepted
        assert connected >= 1  # the server really publishes through the proxy

        proxy.stop_accepting()
        proxy.cut_all()
        run_id = submit(server, api_key[1], "Accepted while the broker is down.")  # 201, not 500
        outbox = RunDispatch.objects.get(run_id=run_id)
        assert outbox.dispatched_at is None and outbox.last_error  # kept, with why
        assert Run.objects.get(pk=run_id).status == RunStatus.QUEUED

        # /v1 while the broker is down: the client learns its run id at once and gets the answer
        # once the broker is back, never a 500.
        with httpx.stream(
            "POST",
            f"{server.url}/v1/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": "Down?"}], "stream": True},
            headers={"Authorization": f"Bearer {api_key[1]}"},
            timeout=120,
        ) as stream:
            assert stream.status_code == 200
            v1_run = stream.headers["X-Conductor-Run"]
            assert Run.objects.get(pk=v1_run).status == RunStatus.QUEUED  # accepted, not yet handed off
            proxy.resume()
            body = b"".join(stream.iter_bytes())
        assert b'"finish_reason":"stop"' in body and body.rstrip().endswith(b"data: [DONE]"), body[-500:]
        assert Run.objects.get(pk=v1_run).status == RunStatus.SUCCEEDED
        poll_until(lambda: terminal(run_id), 90, "the run terminal after the broker came back")
        run = Run.objects.get(pk=run_id)
        assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
        assert_billed_once(run_id)
        assert not RunDispatch.objects.filter(run_id=run_id).exists()
        assert AuditEvent.objects.filter(run_id=run_id, event_type="run.created").count() == 1
    finally:
        proxy.close()


# -- a kill right after a provider answered (both modes, issue 44) --------------------------------

# A step-output judge on the fake pool: its request reaches the fake server after the executor
# received step 0's answer and before it reported the step, which is the window where an answer
# held only in memory was lost (and its call repeated) by a kill.
STEP_JUDGE = {
    "enabled": True,
    "action": "block",
    "judges": [{"name": "tone", "worker": "fake-critic", "prompt": "Be kind."}],
}


def test_kill_right_after_an_answer_does_not_repeat_the_call(
    procs: Procs, run_pool: Any, api_key: Any, alpha: Any
) -> None:
    publish_policy(alpha, {"guardrails": {"step_output": {"model_judge": STEP_JUDGE}}})
    executor: list[subprocess.Popen[bytes]] = []
    killed = threading.Event()

    def respond(req: dict[str, Any]) -> FakeReply:
        messages = req.get("messages") or []
        if req.get("model") == CONDUCTOR_MODEL:
            return FakeReply(json.dumps(THREE_STEP_PLAN))
        if messages and "strict compliance judge" in str(messages[0].get("content")):
            if not killed.is_set():  # the first judge call: step 0's output, answered just now
                killed.set()
                sigkill(executor[0])
            return FakeReply(json.dumps({"verdict": "pass", "reason": "fine"}))
        return FakeReply(worker_answer(str(req.get("model")), messages))

    run_pool.server.responder = respond
    # Not inline: the run goes to the executor (this daphne's run thread, or a Celery worker).
    server = procs.daphne(V1_INLINE_RUNS="off")
    executor.append(server.proc if MODE == "embedded" else procs.worker())
    question = "Answered, then killed."
    replies: list[httpx.Response] = []

    def ask() -> None:
        # A plain (non-streamed) /v1 request: its calls stream nothing, so no step.delta is
        # buffered when the answer arrives (one would have been stored with the journal).
        with contextlib.suppress(httpx.HTTPError):
            replies.append(
                httpx.post(
                    f"{server.url}/v1/chat/completions",
                    json={"model": "fake", "messages": [{"role": "user", "content": question}]},
                    headers={"Authorization": f"Bearer {api_key[1]}"},
                    timeout=150,
                )
            )

    client = threading.Thread(target=ask, daemon=True)
    client.start()
    poll_until(killed.is_set, 60, "the executor killed right after step 0's answer")
    run_id = str(Run.objects.get(question=question).pk)
    assert not step_finished(run_id, 0)  # the kill came before the step was reported
    if MODE == "embedded":
        procs.daphne()  # the restarted server re-queues and resumes the run
    else:
        procs.worker()
    poll_until(lambda: terminal(run_id), 120, "the run terminal after the restart")
    client.join(30)
    if MODE == "distributed":  # the client's server lived: it answers once the run ends
        (reply,) = replies
        assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "stop"

    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error, procs.logs())
    assert run.attempts == 2
    assert len(provider_calls(run_pool.server, question)) == 1, "the conductor was asked to plan again"
    for index, subtask in enumerate(THREE_STEP_PLAN["subtasks"]):
        calls = provider_calls(run_pool.server, question, subtask)
        assert len(calls) == 1, f"step {index} asked {len(calls)} times"
    assert_billed_once(run_id)
    events = list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))
    last_start = max(i for i, e in enumerate(events) if e.type == "run.started")
    replayed = {
        e.data["index"] for e in events[last_start:] if e.type == "step.finished" and e.data.get("replayed")
    }
    assert replayed == {0}


# -- the reaper's decisions, in-process (both modes) ------------------------------------------------


def _dead_owner() -> str:
    """An owner id of this host whose process has certainly exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    node = executor_id().rsplit(":", 2)[0]
    return f"{node}:{proc.pid}:deadbeef"


def test_expired_lease_is_requeued_with_a_clean_restart(
    runtime_workers: Any, run_pool: Any, owner: Any, alpha: Any
) -> None:
    run = RunFactory(
        team=alpha,
        pool=run_pool.pool,
        created_by=owner,
        status=RunStatus.RUNNING,
        lease_owner="elsewhere:1:abc",  # another host: only its expired lease tells
        lease_expires_at=timezone.now() - timedelta(seconds=1),
        attempts=1,
        input_tokens=40,
        output_tokens=7,
        step_count=1,
    )
    StepFactory(run=run, index=0, input_tokens=40, output_tokens=7)
    reap_runs()
    (requeued,) = requeues(str(run.id))
    assert "expired" in requeued.payload["reason"] and requeued.payload["previous_owner"] == "elsewhere:1:abc"
    assert requeued.payload["discarded"] == {
        "steps": 1,
        "input_tokens": 40,
        "output_tokens": 7,
        "cost_usd": None,
    }
    poll_until(lambda: terminal(str(run.id)), 60, "the re-queued run terminal")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    assert_billed_once(str(run.id))
    assert reap_runs()["requeued"] == 0  # done once


def test_live_lease_is_left_alone(run_pool: Any, owner: Any, alpha: Any) -> None:
    run = RunFactory(
        team=alpha,
        pool=run_pool.pool,
        created_by=owner,
        status=RunStatus.RUNNING,
        lease_owner="elsewhere:1:abc",
        lease_expires_at=timezone.now() + timedelta(seconds=60),
        attempts=1,
    )
    assert reap_runs()["requeued"] == 0
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.lease_owner == "elsewhere:1:abc"
    assert not requeues(str(run.id))


def test_run_fails_truthfully_after_max_attempts(run_pool: Any, owner: Any, alpha: Any) -> None:
    dead = _dead_owner()
    run = RunFactory(
        team=alpha,
        pool=run_pool.pool,
        created_by=owner,
        status=RunStatus.RUNNING,
        lease_owner=dead,
        lease_expires_at=timezone.now() + timedelta(seconds=60),  # not expired: dead pid decides
        attempts=settings.RUN_MAX_ATTEMPTS,
    )
    assert reap_runs()["ended"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.status_reason == "executor_lost"
    assert f"RUN_MAX_ATTEMPTS={settings.RUN_MAX_ATTEMPTS}" in run.error and "is gone" in run.error
    finished = AuditEvent.objects.get(run_id=run.id, event_type="run.finished")
    assert finished.payload["reason"] == "executor_lost"
    assert RunEvent.objects.get(run=run).type == "run.finished"
    assert not run_pool.server.chat_requests()  # not executed again
    assert json.dumps(run.error)  # plain text for users


def test_executor_identity_is_one_per_process_even_when_threads_race(monkeypatch: Any) -> None:
    """A run's thread and the lease keeper asked for the identity at once and got two nonces; the
    reaper then re-queued the process's own run as an 'earlier incarnation'."""
    from apps.runs.execution import leases as execution

    real = uuid.uuid4

    def slow_uuid4() -> uuid.UUID:
        threading.Event().wait(0.02)  # widen the window every racing thread would fall into
        return real()

    monkeypatch.setattr(execution, "_identity", None)
    monkeypatch.setattr(execution.uuid, "uuid4", slow_uuid4)
    barrier = threading.Barrier(8)
    seen: list[str] = []

    def ask() -> None:
        barrier.wait()
        seen.append(execution.executor_id())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == 8 and len(set(seen)) == 1, seen
    assert not execution._owner_is_dead(seen[0])
