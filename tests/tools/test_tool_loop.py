"""The worker's tool-calling loop (issue 43 item 5, the engine module and its Django port): a
real OpenAI-compatible fake model asks for tools, the calls go through the tool gate to a real MCP
server, and what comes back is what the next model call reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.engine.providers import build_worker
from apps.engine.providers.gate import gate_without_policy
from apps.engine.tools_loop import run_tool_loop
from apps.engine.types import WorkerInfo
from apps.tools.loop import step_tool_runner, tools_for_step
from apps.tools.models import ToolCall
from tests.fakes.base import FakeReply

pytestmark = pytest.mark.django_db(transaction=True)


def _worker(fake: Any) -> Any:
    info = WorkerInfo(key="oa", name="OA", model="gpt-4o-mini", provider="openai_compatible", timeout_s=10.0)
    return build_worker(
        info,
        kind="openai_compatible",
        base_url=fake.base_url,
        api_key="sk-test-123456",
        gate=gate_without_policy(),
    )


def _call(name: str, args: dict[str, Any], call_id: str = "c1") -> FakeReply:
    return FakeReply(tool_calls=[{"id": call_id, "name": name, "arguments": json.dumps(args)}])


def _loop(alpha: Any, fake: Any, granted: list[str], *replies: Any) -> Any:
    fake.script(*replies)
    return run_tool_loop(
        _worker(fake),
        [{"role": "user", "content": "Help the customer."}],
        tools_for_step(alpha, granted),
        step_tool_runner(team=alpha, granted=granted, step_index=0),
        max_rounds=3,
    )


def test_a_step_uses_a_granted_tool_and_answers_with_its_result(
    alpha: Any, crm: Any, mcp_http: Any, openai_fake: Any
) -> None:
    out = _loop(alpha, openai_fake, ["crm.add"], _call("crm__add", {"a": 2, "b": 3}), "The sum is 5.")
    assert out.result.text == "The sum is 5." and out.rounds == 2
    assert [(c.name, c.status) for c in out.calls] == [("crm.add", "succeeded")]
    first, second = (r.json for r in openai_fake.posts())
    assert [t["function"]["name"] for t in first["tools"]] == ["crm__add"]  # only the granted tool
    assert first["tools"][0]["function"]["description"] == "Add two integers."
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    assert mcp_http.calls() == [{"tool": "add", "arguments": {"a": 2, "b": 3}}]


def test_an_ungranted_tool_is_refused_naming_the_rule(
    alpha: Any, crm: Any, mcp_http: Any, openai_fake: Any
) -> None:
    out = _loop(
        alpha,
        openai_fake,
        ["crm.lookup"],
        _call("crm__wire_money", {"account": "x", "amount": 9}),
        "I could not.",
    )
    assert [(c.name, c.status, c.rule) for c in out.calls] == [
        ("crm.wire_money", "refused", "plan.tool_access")
    ]
    assert "plan.tool_access" in openai_fake.posts()[1].json["messages"][-1]["content"]
    assert mcp_http.calls() == []
    assert ToolCall.objects.get().rule == "plan.tool_access"


def test_an_injected_tool_output_is_caught_before_the_next_model_call(
    alpha: Any, crm: Any, mcp_http: Any, openai_fake: Any
) -> None:
    out = _loop(alpha, openai_fake, ["crm.lookup"], _call("crm__lookup", {"customer_id": "evil"}), "Done.")
    assert [(c.status, c.rule) for c in out.calls] == [("blocked", "tools.output.injection")]
    assert mcp_http.calls() == [{"tool": "lookup", "arguments": {"customer_id": "evil"}}]  # it ran...
    assert b"IGNORE ALL PREVIOUS" not in openai_fake.received()  # ...and no model read its output


def test_the_loop_is_bounded(alpha: Any, crm: Any, mcp_http: Any, openai_fake: Any) -> None:
    calls = [_call("crm__add", {"a": i, "b": 1}, f"c{i}") for i in range(3)]
    out = _loop(alpha, openai_fake, ["crm.add"], *calls)
    assert out.rounds == 3 and len(out.calls) == 2  # the last round offers no tool choice
    assert openai_fake.posts()[2].json["tool_choice"] == "none"


def test_a_held_call_inside_a_run_stops_the_loop_and_pauses_the_run(
    alpha: Any, crm: Any, mcp_http: Any, openai_fake: Any, owner: Any
) -> None:
    """In a run (a run id), a call waiting for an approver raises ToolApprovalHeld: nothing after
    it in the round runs and the executor turns it into the run's pause (RunHeld)."""
    import uuid

    from apps.engine.tools_loop import ToolApprovalHeld
    from tests.factories.policies import publish_policy

    publish_policy(alpha, {"tools": {"rules": [{"tool": "crm.wire_money", "action": "require_approval"}]}})
    granted = ["crm.wire_money", "crm.add"]
    openai_fake.script(
        FakeReply(
            tool_calls=[
                {"id": "c1", "name": "crm__wire_money", "arguments": '{"account": "DE-1", "amount": 5}'},
                {"id": "c2", "name": "crm__add", "arguments": '{"a": 1, "b": 1}'},
            ]
        )
    )
    run_id = uuid.uuid4()
    with pytest.raises(ToolApprovalHeld) as held:
        run_tool_loop(
            _worker(openai_fake),
            [{"role": "user", "content": "Pay."}],
            tools_for_step(alpha, granted),
            step_tool_runner(team=alpha, granted=granted, run_id=run_id, step_index=0, actor=owner),
            max_rounds=3,
        )
    assert held.value.tool == "crm.wire_money" and held.value.rule == "tools.rules[0].action"
    paused = held.value.run_held(round=1)
    assert paused.status.value == "awaiting_approval" and paused.hold["kind"] == "tool"
    assert paused.hold["tool_approval"] == ToolCall.objects.get(run_id=run_id).approval.pk
    assert mcp_http.calls() == []  # neither the held call nor the one after it ran
