"""Tool calls are journaled like provider calls (issue 43, apps.runs.journal): an executor killed
right after a tool answered is not made to call it again when its run resumes — exactly one call
reaches the MCP server — as tests/faults/test_run_survival.py proves for provider calls. Real
processes: a daphne (embedded) or Celery worker (distributed) of the test's own, SIGKILLed."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

import pytest

from apps.runs.models import Run, RunCall, RunEvent, RunStatus
from apps.tools.models import ToolCall
from tests.fakes.base import FakeReply
from tests.faults.test_run_survival import Procs, poll_until, procs, sigkill, submit, terminal  # noqa: F401
from tests.fixtures.runs import CONDUCTOR_MODEL
from tests.runtime import MODE

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PLAN = {
    "model_id": [1, 2],
    "subtasks": ["Add 40 and 2 with the tool.", "Give the final answer."],
    "access_list": [[], "all"],
    "tool_access": [["crm.add"], []],
}


def test_a_kill_after_a_tool_answered_does_not_repeat_the_call_on_resume(
    procs: Procs,  # noqa: F811
    fake_pool: Any,
    crm: Any,
    mcp_http: Any,
    api_key: Any,
) -> None:
    executor: list[subprocess.Popen[bytes]] = []
    killed = threading.Event()
    question = "Add, then get killed."

    def respond(req: dict[str, Any]) -> FakeReply:
        if req.get("model") == CONDUCTOR_MODEL:
            return FakeReply(json.dumps(PLAN))
        messages = req.get("messages") or []
        tool_results = [m.get("content") for m in messages if m.get("role") == "tool"]
        if req.get("model") == "fake-solver-1" and not tool_results:
            return FakeReply(tool_calls=[{"id": "c1", "name": "crm__add", "arguments": '{"a": 40, "b": 2}'}])
        if req.get("model") == "fake-solver-1":
            # The tool answered and its result is on its way back to the model: kill now.
            if not killed.is_set():
                killed.set()
                sigkill(executor[0])
            return FakeReply(f"the sum is {tool_results[-1]}")
        return FakeReply("final: " + str(messages[-1].get("content", ""))[:200])

    fake_pool.server.responder = respond
    server = procs.daphne()
    executor.append(server.proc if MODE == "embedded" else procs.worker())
    run_id = submit(server, api_key[1], question)
    poll_until(killed.is_set, 90, "the executor killed right after the tool answered")
    assert mcp_http.calls() == [{"tool": "add", "arguments": {"a": 40, "b": 2}}]
    assert RunCall.objects.filter(run_id=run_id, worker_key="tool:crm.add").count() == 1  # journaled
    if MODE == "embedded":
        procs.daphne()  # the restarted server re-queues and resumes the run
    else:
        procs.worker()
    poll_until(lambda: terminal(run_id), 150, "the run terminal after the restart")

    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error, procs.logs())
    assert run.attempts == 2
    # Exactly one call reached the MCP server, and one ToolCall row (and audit row) records it.
    assert mcp_http.calls() == [{"tool": "add", "arguments": {"a": 40, "b": 2}}]
    assert ToolCall.objects.filter(run_id=run_id).count() == 1
    assert run.steps.get(index=0).output == "the sum is 42"
    # The model's round that asked for the call was journaled before the call: asked once.
    first_rounds = [
        r
        for r in fake_pool.server.chat_requests()
        if r.json.get("model") == "fake-solver-1" and not any(m.get("role") == "tool" for m in r.messages)
    ]
    assert len(first_rounds) == 1
    events = list(RunEvent.objects.filter(run_id=run_id, type="tool.called").order_by("seq"))
    assert events and events[-1].data["status"] == "succeeded"
    assert not RunCall.objects.filter(run_id=run_id).exists()
