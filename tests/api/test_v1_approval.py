"""/v1 and plans held for an approver (issue 17): the official openai client gets a clear
409 ``plan_awaiting_approval`` naming the policy field at once (``constraints.approval.api_wait_s``
0), or waits up to that many seconds and gets the answer when an approver lets the plan run."""

from __future__ import annotations

import threading
from typing import Any

import openai
import pytest

from apps.runs.models import Run
from tests.fixtures.waits import status_is, wait_run

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PROMPT = [{"role": "user", "content": "What is six times seven?"}]


def _policy(wait: float) -> dict[str, Any]:
    return {
        "constraints": {
            "forecast": {"enabled": True, "max_tokens": 50, "action": "require_approval"},
            "approval": {"api_wait_s": wait},
        }
    }


@pytest.fixture
def client(api_server: Any, runtime_workers: Any, api_key: tuple[Any, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=api_key[1], max_retries=0, timeout=90)


def test_a_held_plan_is_a_409_naming_the_policy_field(
    conductor_fake: Any, client: openai.OpenAI, alpha: Any
) -> None:
    from tests.factories.policies import publish_policy

    publish_policy(alpha, _policy(0))
    with pytest.raises(openai.ConflictError) as exc:
        client.chat.completions.create(model="conductor-mini", messages=PROMPT)
    body = exc.value.response.json()
    assert body["error"]["code"] == "plan_awaiting_approval"
    assert body["error"]["type"] == "approval_required"
    assert "constraints.forecast.max_tokens" in body["error"]["message"]
    assert "constraints.forecast.action" in body["error"]["message"]
    run = Run.objects.get(pk=body["conductor"]["run_id"])
    assert run.status == "awaiting_approval"
    # Only the conductor was asked; no worker saw the request.
    assert len(conductor_fake.server.chat_requests()) == 1


def test_the_caller_waits_for_the_approver_and_gets_the_answer(
    conductor_fake: Any, client: openai.OpenAI, api_server: Any, alpha: Any, reviewer: Any
) -> None:
    from apps.runs.approvals import plan_approve
    from tests.factories.policies import publish_policy
    from tests.fixtures.api import CONDUCTOR_ANSWER

    publish_policy(alpha, _policy(60))
    out: dict[str, Any] = {}

    def call() -> None:
        try:
            out["completion"] = client.chat.completions.create(model="conductor-mini", messages=PROMPT)
        except Exception as exc:  # reported by the assertion below
            out["error"] = exc

    caller = threading.Thread(target=call)
    caller.start()
    # The conductor was asked: the run exists. The server executes it (embedded mode: in its own
    # process), so its websocket says when it pauses.
    conductor_fake.server.wait_requests(lambda requests: len(requests) > 0, 30)
    run = wait_run(Run.objects.get().pk, status_is("awaiting_approval"), timeout=30, server=api_server)
    assert run.status == "awaiting_approval", (run.status, out)
    assert caller.is_alive()  # still waiting for the decision
    plan_approve(actor=reviewer, run=run, note="ok")
    caller.join(60)
    assert "error" not in out, out.get("error")
    assert out["completion"].choices[0].message.content == CONDUCTOR_ANSWER
    run.refresh_from_db()
    assert run.status == "succeeded"
    models = [r.json.get("model") for r in conductor_fake.server.chat_requests()]
    assert models.count(models[0]) == 1  # the planning call was replayed, not asked again


def test_a_streaming_caller_gets_the_approval_error_event(
    conductor_fake: Any, client: openai.OpenAI, alpha: Any
) -> None:
    from tests.factories.policies import publish_policy

    publish_policy(alpha, _policy(0))
    stream = client.chat.completions.create(model="conductor-mini", messages=PROMPT, stream=True)
    with pytest.raises(openai.APIError) as exc:
        list(stream)
    assert "constraints.forecast.action" in str(exc.value) and "approver" in str(exc.value)
    assert Run.objects.get().status == "awaiting_approval"


def test_a_decision_taken_between_the_waiters_two_reads_is_not_answered_as_still_held(
    alpha: Any, fake_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter reads the run (held), then the pending approval's wait. An approver deciding in
    between (the decision and the run's new status commit together) left no pending approval:
    that used to read as "the wait is over" and the caller got a 409 for a run already approved.
    Now the run is read again and the caller waits for it."""
    import copy

    from asgiref.sync import async_to_sync

    from apps.api.v1 import follow
    from tests.factories.runs import RunFactory

    # No pending approval: it was decided.
    held = RunFactory(team=alpha, pool=fake_pool.pool, status="awaiting_approval")
    reads: list[str] = []

    def load_ended(run_id: Any) -> tuple[Any, float | None]:
        reads.append("run")
        if len(reads) == 1:
            return held, None  # read just before the approver decided
        ended = copy.copy(held)
        ended.status = "succeeded"
        return ended, None

    monkeypatch.setattr(follow, "_load_ended", load_ended)
    assert follow.approval_wait_left(held.pk) is None  # nothing pending: decided
    final = async_to_sync(follow.wait_for_run)(held)
    assert final.status == "succeeded" and len(reads) == 2
