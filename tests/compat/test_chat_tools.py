"""Tools through Chat Completions (issue 22), against the fake OpenAI server returning tool calls
on a real socket: a pool model passes tools, tool calls and tool results through (plain and
streamed); a conductor model's answering worker receives the tools; a provider without tool
support is refused naming ``tools``; arguments pass the guardrails; held stays held."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from apps.audit.models import AuditEvent
from apps.runs.models import Run, Step
from tests.factories.policies import publish_policy
from tests.fakes.base import FakeReply
from tests.fixtures.api import PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = FakeReply(tool_calls=[{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}])
SOLVER, CRITIC, CONDUCTOR = "fake-solver-1", "fake-critic-1", "fake-conductor-1"


def sent_to(server: Any, model: str) -> list[dict[str, Any]]:
    return [r.json or {} for r in server.chat_requests() if (r.json or {}).get("model") == model]


def test_pool_model_returns_tool_calls_then_answers_with_the_result(
    fake_pool: Any, sdk: openai.OpenAI
) -> None:
    server = fake_pool.server
    server.script(CALL, "It is sunny in Paris.")
    first = sdk.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER_TOOL], tool_choice="auto")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.id == "call_1" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # One step on the pool's default worker, which got the tools and the chat as it is.
    sent = sent_to(server, SOLVER)[-1]
    assert sent["tools"] == [WEATHER_TOOL] and sent["tool_choice"] == "auto"
    assert sent["messages"] == ASK
    assert not sent_to(server, CONDUCTOR)

    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    ]
    second = sdk.chat.completions.create(model="fake", messages=history, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    sent = sent_to(server, SOLVER)[-1]
    assert sent["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"}
    # Each request is a run, audited: the step and the tool-call check are on record.
    run = Run.objects.get(pk=first.model_extra["conductor"]["run_id"])
    assert run.strategy == "single" and Step.objects.filter(run=run).count() == 1
    assert AuditEvent.objects.filter(run_id=run.pk, event_type="run.step_finished").exists()
    assert AuditEvent.objects.filter(run_id=run.pk, event_type="run.output_checked").exists()


def test_streamed_tool_calls_arrive_as_deltas(fake_pool: Any, sdk: openai.OpenAI) -> None:
    fake_pool.server.script(CALL)
    stream = sdk.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER_TOOL], stream=True)
    chunks = list(stream)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) > 1  # the head (id, name) and the arguments in pieces
    assert deltas[0].id == "call_1" and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(arguments) == {"city": "Paris"}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_conductor_model_gives_the_tools_to_the_answering_worker(fake_pool: Any, sdk: openai.OpenAI) -> None:
    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR:
            return PLAN_TEXT
        if req.get("model") == CRITIC:
            return CALL
        return "Paris is a city in France."

    fake_pool.server.responder = respond
    completion = sdk.chat.completions.create(model="conductor-mini", messages=ASK, tools=[WEATHER_TOOL])
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert sent_to(fake_pool.server, CRITIC)[-1]["tools"] == [WEATHER_TOOL]
    assert "tools" not in sent_to(fake_pool.server, SOLVER)[-1]
    assert "tools" not in sent_to(fake_pool.server, CONDUCTOR)[0]


def test_provider_without_tool_support_is_refused_naming_tools(
    local_pool: Any, sdk: openai.OpenAI, alpha: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model="local", messages=ASK, tools=[WEATHER_TOOL])
    assert exc.value.body["param"] == "tools"
    assert exc.value.body["code"] == "unsupported_parameter"
    assert "local" in exc.value.body["message"]
    assert not Run.objects.exists()


def test_tool_call_arguments_pass_the_output_guardrails(
    fake_pool: Any, sdk: openai.OpenAI, alpha: Any
) -> None:
    publish_policy(
        alpha,
        {
            "guardrails": {
                "output": {
                    "blocked_terms": {
                        "enabled": True,
                        "action": "block",
                        "terms": [{"pattern": "Paris", "kind": "keyword", "message": "no cities"}],
                    }
                }
            }
        },
    )
    fake_pool.server.script(CALL)
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER_TOOL])
    assert exc.value.body["code"] == "content_policy_violation"
    assert "get_weather" in exc.value.body["message"]


def test_held_tool_calls_stay_held(fake_pool: Any, sdk: openai.OpenAI, alpha: Any) -> None:
    publish_policy(
        alpha,
        {"guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 5}}}},
    )
    fake_pool.server.script(CALL)
    completion = sdk.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER_TOOL])
    choice = completion.choices[0]
    assert choice.finish_reason == "content_filter"
    assert not choice.message.tool_calls and choice.message.content is None
    fake_pool.server.script(CALL)
    chunks = list(sdk.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER_TOOL], stream=True))
    assert not [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert "Paris" not in "".join(c.model_dump_json() for c in chunks)


def test_langchain_bind_tools_against_a_pool(
    fake_pool: Any, api_server: Any, api_key: tuple[Any, str]
) -> None:
    from langchain_openai import ChatOpenAI

    fake_pool.server.script(CALL)
    llm = ChatOpenAI(
        model="fake", base_url=f"{api_server.url}/v1", api_key=api_key[1], max_retries=0, timeout=90
    )
    message = llm.bind_tools([WEATHER_TOOL]).invoke("What is the weather in Paris?")
    assert message.tool_calls == [
        {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    ]
    assert sent_to(fake_pool.server, SOLVER)[-1]["tools"][0]["function"]["name"] == "get_weather"
