"""Plain ``/v1`` runs executed on the request's own thread (``V1_INLINE_RUNS``, issue #15).

A plain request waits for its run's ending anyway, so handing the run to the thread pool (or
Celery) and then polling for the ending only adds statements, thread hops and a wake-up. Inline, the
run is accepted already claimed (``running`` under this process's lease, no outbox row) and
executed before the response is written. These tests pin that, and that nothing accepted is lost
on the way: a full process, a failed inline attempt, or a process that died after accepting.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from apps.audit.models import AuditEvent
from apps.runs import execution
from apps.runs.execution import executor_id, inline_slot, reap_runs
from apps.runs.models import Run, RunDispatch, RunEvent, RunStatus
from apps.runs.services import run_create, run_wait
from tests.fakes.base import FakeReply
from tests.fixtures.queries import Queries
from tests.fixtures.workers import solo_pool_of
from tests.runtime import MODE

pytestmark = [
    pytest.mark.runtime,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(MODE != "embedded", reason="the embedded runtime executes runs in this process"),
]

OUTBOX = r'^INSERT INTO "runs_rundispatch"'
STEP = r'^INSERT INTO "runs_step"'


@pytest.fixture
def solo(fake_pool: Any, alpha: Any) -> Any:
    fake_pool.server.responder = lambda req: FakeReply("42")
    return solo_pool_of(fake_pool, alpha)


@pytest.fixture
def inline(settings: Any) -> Iterator[Any]:
    settings.V1_INLINE_RUNS = "passthrough"
    settings.V1_INLINE_SLOTS = 4
    settings.V1_INLINE_WAIT_S = 5.0
    yield settings


def _ask(key: str, *, model: str = "solo", stream: bool = False) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "What is 6*7?"}], "stream": stream}
    resp = Client().post(
        "/v1/chat/completions",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert resp.status_code == 200, resp.content
    return resp


async def _drain(resp: Any) -> str:
    return b"".join([piece async for piece in resp.streaming_content]).decode()


def _answer(resp: Any) -> tuple[str, Run]:
    body = resp.json()
    return body["choices"][0]["message"]["content"], Run.objects.get(pk=body["conductor"]["run_id"])


def test_a_plain_pass_through_runs_on_the_request_thread_with_no_hand_off(
    solo: Any, api_key: tuple[Any, str], inline: Any, queries: Queries
) -> None:
    text, run = _answer(_ask(api_key[1]))
    assert text == "42"
    assert (run.status, run.attempts, run.step_count) == (RunStatus.SUCCEEDED, 1, 1)
    # Accepted already claimed: no outbox row, no dispatch, no claim, no status poll.
    assert queries.count(OUTBOX) == 0, queries.common()
    assert queries.count(r'^UPDATE "runs_rundispatch"') == 0, queries.common()
    assert queries.count(r'^SELECT "runs_run"."status" FROM "runs_run"') == 0, queries.common()
    # The step was written by the thread that served the request, not by the run pool ("run_N").
    senders = queries.senders(STEP)
    assert senders and not any(name.startswith("run_") for name in senders), senders
    # The claim is recorded as any other: this process's lease, and the creation audited.
    assert run.lease_owner == executor_id()
    assert AuditEvent.objects.filter(run_id=run.id, event_type="run.created").count() == 1
    # The run's audit rows name the request, as on a pool thread, and not the client's address
    # (the run executes in an empty context, as there).
    finished = AuditEvent.objects.get(run_id=run.id, event_type="run.finished")
    assert finished.payload.get("request_id") == run.request_id != ""
    assert finished.ip is None


def test_with_inline_runs_off_the_run_is_queued_and_handed_to_the_pool(
    solo: Any, api_key: tuple[Any, str], inline: Any, queries: Queries
) -> None:
    inline.V1_INLINE_RUNS = "off"
    text, run = _answer(_ask(api_key[1]))
    assert (text, run.status) == ("42", RunStatus.SUCCEEDED)
    assert queries.count(OUTBOX) == 1, queries.common()
    assert all(name.startswith("run_") for name in queries.senders(STEP)), queries.senders(STEP)


def test_a_streamed_request_is_never_run_inline(
    solo: Any, api_key: tuple[Any, str], inline: Any, queries: Queries
) -> None:
    inline.V1_INLINE_RUNS = "all"
    resp = _ask(api_key[1], stream=True)
    text = async_to_sync(_drain)(resp)
    assert '"42"' in text and text.rstrip().endswith("data: [DONE]")
    # The stream follows the run's events while it runs: the run went through the outbox.
    assert queries.count(OUTBOX) == 1, queries.common()


def test_conductor_runs_are_inline_only_when_all_are(
    solo: Any, api_key: tuple[Any, str], inline: Any, queries: Queries
) -> None:
    _, queued = _answer(_ask(api_key[1], model="conductor-mini"))
    assert queries.count(OUTBOX) == 1, "passthrough mode queues a conductor run"
    queries.clear()
    inline.V1_INLINE_RUNS = "all"
    _, run = _answer(_ask(api_key[1], model="conductor-mini"))
    assert run.status == queued.status == RunStatus.SUCCEEDED
    assert queries.count(OUTBOX) == 0, queries.common()


def test_a_full_process_queues_the_run_instead_and_still_answers(
    solo: Any, api_key: tuple[Any, str], inline: Any, queries: Queries
) -> None:
    inline.V1_INLINE_SLOTS = 1
    inline.V1_INLINE_WAIT_S = 0.0
    with inline_slot(True) as taken:  # another request holds the process's only slot
        assert taken
        text, run = _answer(_ask(api_key[1]))
    assert (text, run.status) == ("42", RunStatus.SUCCEEDED)
    assert queries.count(OUTBOX) == 1, queries.common()
    with inline_slot(True) as taken:  # and the slot is free again afterwards
        assert taken


def test_a_failed_inline_attempt_is_requeued_and_the_client_still_gets_its_answer(
    solo: Any, api_key: tuple[Any, str], inline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def broken(run: Any) -> Any:
        calls.append(threading.current_thread().name)
        raise RuntimeError("database went away mid-run")

    monkeypatch.setattr(execution, "execute_here", broken)
    text, run = _answer(_ask(api_key[1]))
    assert calls, "the inline path was taken"
    # The accepted run was given back to the queue at once (not left to its lease) and answered.
    assert (text, run.status, run.attempts) == ("42", RunStatus.SUCCEEDED, 2)
    requeued = AuditEvent.objects.get(run_id=run.id, event_type="run.requeued")
    assert "inline" in requeued.payload["reason"]


def test_an_accepted_inline_run_outlives_the_process_that_accepted_it(
    solo: Any, team_admin: Any, alpha: Any, inline: Any
) -> None:
    # Accepted (committed, claimed by this process) and then the process died before executing.
    run = run_create(
        actor=team_admin, team=alpha, pool=solo, question="What is 6*7?", strategy="single", execute_here=True
    )
    assert not RunDispatch.objects.filter(run_id=run.id).exists()
    assert Run.objects.get(pk=run.id).status == RunStatus.RUNNING
    dead = f"{executor_id().rsplit(':', 2)[0]}:999999999:deadbeef"  # this host, no such pid
    Run.objects.filter(pk=run.id).update(lease_owner=dead)
    reap_runs()  # the reaper of any live server finds the dead owner's run
    ended = run_wait(run.id, timeout_s=20)
    assert (ended.status, ended.attempts) == (RunStatus.SUCCEEDED, 2)
    assert ended.answer.strip() == "42"


# Columns an inline run's in-memory ending may differ in from its row: the lease keeper renews
# the lease while the run executes, and nothing a /v1 answer says comes from it.
NOT_ANSWERED_FROM = {"lease_expires_at"}


def _as_read(run: Run) -> dict[str, Any]:
    return {
        f.attname: getattr(run, f.attname)
        for f in Run._meta.concrete_fields
        if f.attname not in NOT_ANSWERED_FROM
    }


def test_an_inline_runs_ending_is_its_row_as_stored_without_a_read_back(
    solo: Any, team_admin: Any, alpha: Any, inline: Any, queries: Queries
) -> None:
    """The sink stored the verdict under the run's lease: the ending a /v1 caller is answered from
    is built from it, with no read of the run afterwards (issue #15), and equals the row."""
    run = run_create(
        actor=team_admin, team=alpha, pool=solo, question="What is 6*7?", strategy="single", execute_here=True
    )
    queries.clear()
    ended = execution.execute_here(run)
    assert ended is not None and ended.status == RunStatus.SUCCEEDED
    assert queries.count(r'^SELECT "runs_run"."id", ') == 0, queries.common()  # no full-row read back
    assert _as_read(ended) == _as_read(Run.objects.get(pk=run.id))
    assert str(ended.cost_usd) == str(Run.objects.get(pk=run.id).cost_usd)  # as the column gives it
    assert ended.finished_data is not None and ended.finished_data["status"] == "succeeded"
    assert ended is not run and run.status == RunStatus.RUNNING  # the accepted row is left as it was


def test_a_run_end_that_asks_for_a_review_is_read_back(
    solo: Any, team_admin: Any, alpha: Any, inline: Any, queries: Queries
) -> None:
    """A warn guardrail puts the run in the review queue at its end, which changes the row beyond
    the verdict: the ending is read, so it shows the review state."""
    from tests.factories.policies import publish_policy

    publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "warn"}}}})
    run = run_create(
        actor=team_admin,
        team=alpha,
        pool=solo,
        question="Mail ada@example.com: what is 6*7?",
        strategy="single",
        execute_here=True,
    )
    ended = execution.execute_here(run)
    assert ended is not None and ended.status == RunStatus.SUCCEEDED
    stored = Run.objects.get(pk=run.id)
    assert stored.review_status != ""
    assert _as_read(ended) == _as_read(stored)


@pytest.mark.parametrize("mode", ["client", "always"])
def test_a_plain_pass_through_streams_from_the_provider_only_when_told_to(
    solo: Any, fake_pool: Any, api_key: tuple[Any, str], inline: Any, mode: str
) -> None:
    """V1_UPSTREAM_STREAM: ``client`` (the default) calls the provider plainly for a plain
    request; ``always`` streams it, so the run's graph fills token by token for its viewers."""
    inline.V1_UPSTREAM_STREAM = mode
    text, run = _answer(_ask(api_key[1]))
    assert (text, run.status) == ("42", RunStatus.SUCCEEDED)
    (call,) = fake_pool.server.chat_requests()
    streamed = mode == "always"
    assert bool((call.json or {}).get("stream")) is streamed
    assert run.events.filter(type="step.delta").exists() is streamed


def _events(run_id: Any) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True))


def test_a_one_step_run_stores_its_start_with_its_answer_in_one_transaction(
    solo: Any, api_key: tuple[Any, str], inline: Any, queries: Queries
) -> None:
    """Issue 45: the client of a plain pass-through waits on this thread, so nothing is stored
    between the run's acceptance and the provider call: its start (run.started, the input check,
    step.started) goes with its answer, one write transaction after the call."""
    text, run = _answer(_ask(api_key[1]))
    assert text == "42"
    assert queries.count(r"^BEGIN") == 2, queries.common()  # the acceptance, then everything the run did
    assert queries.count(r'"runs_runcall"') == 0, queries.common()  # no journal row to forget
    types = _events(run.id)
    assert types[0] == "run.started" and types[-1] == "run.finished", types
    assert "step.started" in types and "step.finished" in types, types
    assert Run.objects.get(pk=run.id).last_seq == len(types)


def test_a_slow_calls_start_is_stored_while_the_provider_works(
    fake_pool: Any, solo: Any, api_key: tuple[Any, str], inline: Any
) -> None:
    """Deferring the start does not hide a slow call: still running ``DEFERRED_START_FLUSH_S``
    after it began, the run's start is stored (the live graph shows the step) before the answer."""
    release = threading.Event()
    fake_pool.server.responder = lambda req: FakeReply("42", hold=release)
    answered: list[Any] = []
    asking = threading.Thread(target=lambda: answered.append(_ask(api_key[1])))
    asking.start()
    try:
        deadline = time.monotonic() + 10
        run_id = None
        while time.monotonic() < deadline:
            run_id = Run.objects.order_by("-created_at").values_list("id", flat=True).first()
            if run_id is not None and "step.started" in _events(run_id):
                break
            time.sleep(0.05)
        assert run_id is not None
        stored = _events(run_id)
        assert not answered and not release.is_set()  # the provider has not answered yet
        assert stored[-1] == "step.started" and "run.finished" not in stored, stored
    finally:
        release.set()
        asking.join(timeout=30)
    text, run = _answer(answered[0])
    assert (text, run.id, run.status) == ("42", run_id, RunStatus.SUCCEEDED)
    types = _events(run.id)
    assert types.count("step.started") == 1 and types[-1] == "run.finished", types
    assert Run.objects.get(pk=run.id).last_seq == len(types)
