"""Issue 44, items 4-5: a step waiting for a busy worker's slot is waiting, not running; its call
timeout starts with its call; the run's deadline still bounds the wait; an abandoned call is
cancelled (the HTTP request closed), so the step behind it gets the slot.

The worker is an OpenAI-compatible one on a loopback fake server, with ``concurrency=1`` (the
local model's shape: one call at a time)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from apps.engine import calls, slots
from apps.engine.events import EventType, ListSink, RunStatus
from apps.engine.plan import Plan, PlanStep
from apps.engine.pool import WorkerPool
from apps.engine.providers import build_worker
from apps.engine.providers.base import ProviderCancelled
from apps.engine.providers.gate import gate_without_policy
from apps.engine.runner import run_request
from apps.engine.types import Limits, WorkerInfo
from tests.engine.test_executor import PlanStrategy
from tests.fakes.base import FakeReply
from tests.fakes.openai_server import FakeOpenAIServer

# A safety net for waits on other threads, never a pace.
LIMIT_S = 30.0


def one_slot_worker(server: FakeOpenAIServer, key: str, *, timeout_s: float = 60.0) -> Any:
    info = WorkerInfo(
        key=key,
        name="Serial",
        model="gpt-4o-mini",
        provider="openai_compatible",
        timeout_s=timeout_s,
        concurrency=1,
    )
    return build_worker(info, base_url=server.base_url, api_key="sk-test", gate=gate_without_policy())


def parallel(n: int) -> Plan:
    # n independent steps on worker 0, and an answer step reading them all.
    steps = [PlanStep(i, 0, f"part {i}", ()) for i in range(n)]
    steps.append(PlanStep(n, 0, "combine", tuple(range(n))))
    return Plan(tuple(steps))


def events_of(sink: ListSink, index: int) -> list[str]:
    return [
        e.type.value for e in sink.events if e.type.value.startswith("step.") and e.data.get("index") == index
    ]


def wait_until(check: Any) -> bool:
    end = time.monotonic() + LIMIT_S
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_parallel_steps_on_a_one_slot_worker_each_get_their_own_call_timeout() -> None:
    """Each call (1.0 s) is shorter than the call timeout (1.6 s), the two together are longer:
    before issue 44 the second step's timeout ran while it queued for the slot and it timed out."""
    with FakeOpenAIServer() as server:
        assert isinstance(server, FakeOpenAIServer)
        server.responder = lambda req: FakeReply("done", delay=1.0)
        worker = one_slot_worker(server, "serial-a")
        sink = ListSink()
        result = run_request(
            run_id="slots-1",
            question="Two parts, one model.",
            pool=WorkerPool([worker]),
            strategy=PlanStrategy(parallel(2)),
            sink=sink,
            limits=Limits(step_timeout_s=1.6, run_timeout_s=60, stream=False),
        )
    assert result.status == RunStatus.SUCCEEDED, result.error
    ended = {e.data["index"]: e.data for e in sink.of_type(EventType.STEP_FINISHED)}
    assert [ended[i]["status"] for i in range(3)] == ["succeeded"] * 3
    # One of the two parallel steps got the slot; the other waited, then ran.
    shapes = sorted(events_of(sink, i) for i in (0, 1))
    assert shapes == [
        ["step.started", "step.finished"],
        ["step.started", "step.waiting", "step.running", "step.finished"],
    ]
    waited = next(e.data for e in sink.of_type(EventType.STEP_WAITING))
    assert waited["capacity"] == 1 and "one call at a time" in waited["reason"]
    ran = next(e.data for e in sink.of_type(EventType.STEP_RUNNING))
    assert ran["index"] == waited["index"] and ran["waited_ms"] > 0


def test_the_run_deadline_ends_a_run_stuck_waiting_and_the_abandoned_call_is_closed() -> None:
    """The first call never answers (held); the step behind it waits. The run's deadline ends the
    run; the waiting step made no call, and the abandoned call's request is closed, so the slot
    is free again while the provider still holds its answer."""
    hold = threading.Event()
    with FakeOpenAIServer() as server:
        assert isinstance(server, FakeOpenAIServer)
        server.responder = lambda req: FakeReply("late", hold=hold)
        worker = one_slot_worker(server, "serial-b")
        slot = slots.worker_slot(worker)
        assert slot is not None
        sink = ListSink()
        try:
            result = run_request(
                run_id="slots-2",
                question="Stuck.",
                pool=WorkerPool([worker]),
                strategy=PlanStrategy(parallel(2)),
                sink=sink,
                limits=Limits(step_timeout_s=60, run_timeout_s=1.0, stream=False),
            )
            assert result.status == RunStatus.TIMED_OUT
            ended = {e.data["index"]: e.data for e in sink.of_type(EventType.STEP_FINISHED)}
            waited = next(e.data["index"] for e in sink.of_type(EventType.STEP_WAITING))
            assert ended[waited]["status"] == "timed_out"
            assert "waited for its worker (no call started)" in ended[waited]["error"]
            assert ended[waited]["priced"] is True and ended[waited]["cost_usd"] == "0"  # no call, no bill
            assert not sink.of_type(EventType.STEP_RUNNING)
            assert len(server.chat_requests()) == 1  # the waiting step never called
            # The abandoned call was cancelled: its request closed, the slot freed, all while the
            # provider is still holding its answer.
            assert wait_until(lambda: slot.in_use == 0)
            assert not hold.is_set()
        finally:
            hold.set()


def test_a_cancelled_http_call_returns_at_once_and_says_so() -> None:
    hold = threading.Event()
    with FakeOpenAIServer() as server:
        assert isinstance(server, FakeOpenAIServer)
        server.responder = lambda req: FakeReply("late", hold=hold)
        worker = one_slot_worker(server, "serial-c")
        scope = calls.CallScope()
        outcome: list[BaseException] = []

        def call() -> None:
            with calls.scope(scope):
                try:
                    worker.complete([{"role": "user", "content": "hi"}], timeout=60)
                except BaseException as err:  # handed to the test thread
                    outcome.append(err)

        thread = threading.Thread(target=call, daemon=True)
        try:
            thread.start()
            assert wait_until(lambda: len(server.chat_requests()) == 1)
            scope.cancel("the test gave up")
            thread.join(LIMIT_S)
            assert not thread.is_alive() and not hold.is_set()
            assert len(outcome) == 1 and isinstance(outcome[0], ProviderCancelled), outcome
            assert outcome[0].retryable is False
            assert len(server.chat_requests()) == 1  # not retried
        finally:
            hold.set()


@pytest.mark.parametrize("capacity", [1, 2])
def test_slot_counts_its_holders_and_waiters(capacity: int) -> None:
    slot = slots.Slot("test", capacity)
    assert all(slot.try_acquire() for _ in range(capacity))
    assert not slot.try_acquire()
    gave_up = slot.acquire(give_up=lambda: True)
    assert gave_up is False and slot.waiting == 0
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(slot.acquire(timeout=LIMIT_S)), daemon=True)
    waiter.start()
    assert wait_until(lambda: slot.waiting == 1)
    slot.release()
    waiter.join(LIMIT_S)
    assert got == [True] and slot.in_use == capacity


def test_a_wrapped_worker_shares_the_slot_of_the_worker_it_wraps() -> None:
    """Two workers of one local model file share its one slot; a wrapper (the resume journal's,
    a replay's) takes the slot of what it wraps, not one of its own."""
    from apps.engine.providers.local import LocalWorker

    def local(key: str) -> LocalWorker:
        info = WorkerInfo(key=key, name=key, model="m", provider="local")
        return LocalWorker(info, gate=gate_without_policy(), model_path=__file__)

    class Wrapper:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.info = inner.info

    planner, solver = local("planner"), local("solver")
    shared = slots.worker_slot(planner)
    assert shared is not None and shared is slots.worker_slot(solver)
    assert slots.worker_slot(Wrapper(solver)) is shared
    assert slots.worker_slot(Wrapper(Wrapper(planner))) is shared
