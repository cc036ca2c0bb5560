"""Tools in the plan (issue 43 item 5): a conductor run whose plan grants a step a tool; the
step's worker calls it through the tool gate (a real MCP server), each call a node of the run's
live graph (a ``tool.called`` event) and an audited decision."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.runs.models import RunEvent, RunStatus
from apps.runs.services import run_create, run_wait
from tests.fakes.base import FakeReply
from tests.fixtures.runs import CONDUCTOR_MODEL

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PLAN = {
    "model_id": [1, 2],
    "subtasks": ["Use the tools to work it out.", "Give the final answer."],
    "access_list": [[], "all"],
}


def _script(server: Any, grant: list[str], call: dict[str, Any]) -> None:
    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            return FakeReply(json.dumps({**PLAN, "tool_access": [grant, []]}))
        messages = req.get("messages") or []
        if req.get("model") == "fake-solver-1" and not any(m.get("role") == "tool" for m in messages):
            return FakeReply(
                tool_calls=[{"id": "call-1", "name": call["name"], "arguments": json.dumps(call["args"])}]
            )
        if req.get("model") == "fake-solver-1":
            return FakeReply(f"solver read: {messages[-1].get('content')}")
        return FakeReply("final: " + str(messages[-1].get("content", ""))[:200])

    server.responder = respond


def _tool_events(run: Any) -> list[dict[str, Any]]:
    return [e.data for e in RunEvent.objects.filter(run=run, type="tool.called").order_by("seq")]


def test_a_conductor_run_whose_step_uses_a_granted_tool(
    runtime_workers: Any, fake_pool: Any, crm: Any, mcp_http: Any, owner: Any
) -> None:
    _script(fake_pool.server, ["crm.add"], {"name": "crm__add", "args": {"a": 2, "b": 3}})
    run = run_wait(run_create(actor=owner, pool=fake_pool.pool, question="2+3?", strategy="conductor").id, 90)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    assert mcp_http.calls() == [{"tool": "add", "arguments": {"a": 2, "b": 3}}]
    (event,) = _tool_events(run)
    assert event["tool"] == "crm.add" and event["status"] == "succeeded" and event["index"] == 0
    assert event["arguments"] == {"a": 2, "b": 3} and event["output"] == "5" and event["latency_ms"] > 0
    steps = list(run.steps.order_by("index"))
    assert steps[0].output == "solver read: 5"
    # The conductor was told which tools exist; the critic's step was granted none.
    conductor = next(r for r in fake_pool.server.chat_requests() if r.json.get("model") == CONDUCTOR_MODEL)
    assert "crm.add - Add two integers." in json.dumps(conductor.json["messages"])
    critic = [r.json for r in fake_pool.server.chat_requests() if r.json.get("model") == "fake-critic-1"]
    assert critic and all("tools" not in r for r in critic)
    audit_flush()
    assert AuditEvent.objects.filter(run_id=run.id, event_type="run.tool_called").count() == 1


def test_a_step_that_tries_an_ungranted_tool_is_refused_with_the_rule_named(
    runtime_workers: Any, fake_pool: Any, crm: Any, mcp_http: Any, owner: Any
) -> None:
    _script(
        fake_pool.server, ["crm.lookup"], {"name": "crm__wire_money", "args": {"account": "x", "amount": 9}}
    )
    run = run_wait(run_create(actor=owner, pool=fake_pool.pool, question="pay", strategy="conductor").id, 90)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    (event,) = _tool_events(run)
    assert (event["tool"], event["status"], event["rule"]) == (
        "crm.wire_money",
        "refused",
        "plan.tool_access",
    )
    assert mcp_http.calls() == []
    assert "plan.tool_access" in run.steps.get(index=0).output


def test_a_tool_output_carrying_an_injection_is_caught_before_the_next_model_call(
    runtime_workers: Any, fake_pool: Any, crm: Any, mcp_http: Any, owner: Any
) -> None:
    _script(fake_pool.server, ["crm.lookup"], {"name": "crm__lookup", "args": {"customer_id": "evil"}})
    run = run_wait(
        run_create(actor=owner, pool=fake_pool.pool, question="note?", strategy="conductor").id, 90
    )
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    (event,) = _tool_events(run)
    assert (event["status"], event["rule"]) == ("blocked", "tools.output.injection")
    assert "IGNORE ALL PREVIOUS" not in event["output"]
    assert b"IGNORE ALL PREVIOUS" not in fake_pool.server.received()
    assert not RunEvent.objects.filter(run=run, data__icontains="IGNORE ALL PREVIOUS").exists()
