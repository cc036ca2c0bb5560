"""One OpenTelemetry trace per run, in the GenAI semantic conventions, received by a real OTLP/HTTP
receiver that decodes the protobuf; on the runtime of the mode (thread / Celery worker)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.runs.models import RunStatus
from apps.runs.services import run_create, run_wait
from tests.factories.policies import publish_policy
from tests.fixtures.core import free_port
from tests.fixtures.runs import CONDUCTOR_MODEL, scripted_plan

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

CARD = "4242 4242 4242 4242"


def _by_id(spans: list[Any]) -> dict[str, Any]:
    return {s.span_id: s for s in spans}


def test_a_run_is_one_trace_with_genai_spans(
    traced_runtime: Any, otlp: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    scripted_plan(fake_pool.server)
    traced_runtime(otlp.url, capture=True)
    run = run_wait(
        run_create(actor=owner, pool=fake_pool.pool, question="What is 6*7?", strategy="conductor").id, 60
    )
    assert run.status == RunStatus.SUCCEEDED, run.error

    spans = otlp.wait_for_trace(run.id.hex, "invoke_workflow")
    ids = _by_id(spans)
    (root,) = [s for s in spans if not s.parent_span_id]
    assert root.name == "invoke_workflow conductor" and root.service_name == "conductor-test"
    assert root.attributes["conductor.run_id"] == str(run.id)
    assert root.attributes["conductor.team"] == "alpha"
    assert root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert all(s.start_ns >= root.start_ns and s.end_ns <= root.end_ns for s in spans)

    planning = [s for s in spans if s.attributes.get("conductor.phase") == "planning"]
    assert len(planning) == 1 and planning[0].parent_span_id == root.span_id
    assert planning[0].name == f"chat {CONDUCTOR_MODEL}"
    assert planning[0].attributes["gen_ai.request.model"] == CONDUCTOR_MODEL
    assert planning[0].attributes["gen_ai.usage.input_tokens"] > 0

    agents = sorted(
        (s for s in spans if s.name.startswith("invoke_agent ")),
        key=lambda s: s.attributes["conductor.step.index"],
    )
    assert [a.name for a in agents] == [
        "invoke_agent fake-planner",
        "invoke_agent fake-solver",
        "invoke_agent fake-critic",
    ]
    assert all(a.parent_span_id == root.span_id for a in agents)
    assert [a.attributes["conductor.access_list"] for a in agents] == [[], [0], [0, 1]]
    steps = {s.index: s for s in run.steps.all()}
    for agent in agents:
        (chat,) = [s for s in spans if s.parent_span_id == agent.span_id]
        step = steps[agent.attributes["conductor.step.index"]]
        assert chat.name == f"chat {chat.attributes['gen_ai.request.model']}"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.response.model"] == chat.attributes["gen_ai.request.model"]
        assert chat.attributes["gen_ai.usage.input_tokens"] == step.input_tokens
        assert chat.attributes["gen_ai.usage.output_tokens"] == step.output_tokens
        assert chat.attributes["gen_ai.response.finish_reasons"] == ["stop"]
        # Capture is on and nothing held or redacted: the exact messages the worker saw.
        assert json.loads(chat.attributes["gen_ai.input.messages"]) == step.messages
        assert ids[chat.parent_span_id] is agent


def test_redacted_content_is_never_exported_and_guardrails_are_spans(
    traced_runtime: Any, otlp: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}})
    traced_runtime(otlp.url, capture=True)
    run = run_wait(
        run_create(
            actor=owner, team=alpha, pool=fake_pool.pool, question=f"Refund card {CARD}", source="playground"
        ).id,
        60,
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    spans = otlp.wait_for_trace(run.id.hex, "invoke_workflow")
    (root,) = [s for s in spans if not s.parent_span_id]
    assert root.attributes["conductor.policy_version"] == run.policy_version_id
    guardrails = [s for s in spans if s.name.startswith("apply_guardrail ")]
    pii = [g for g in guardrails if g.attributes["conductor.guardrail.name"] == "pii"]
    assert pii and pii[0].attributes["conductor.guardrail.outcome"] == "redact"
    assert pii[0].attributes["gen_ai.operation.name"] == "apply_guardrail"
    # A guardrail changed the content: no message content at all, and never the card number.
    assert not any(
        "gen_ai.input.messages" in s.attributes or "gen_ai.output.messages" in s.attributes for s in spans
    )
    assert "4242" not in json.dumps([s.attributes for s in spans])


def test_a_dead_collector_costs_a_run_nothing(
    traced_runtime: Any, otlp: Any, fake_pool: Any, owner: Any
) -> None:
    scripted_plan(fake_pool.server)
    traced_runtime(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    first = run_wait(run_create(actor=owner, pool=fake_pool.pool, question="one", strategy="single").id, 60)
    second = run_wait(run_create(actor=owner, pool=fake_pool.pool, question="two", strategy="single").id, 60)
    assert first.status == second.status == RunStatus.SUCCEEDED
    assert otlp.spans == []
