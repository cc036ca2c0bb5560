"""The Responses API as a drop-in (issue 22): the official ``openai`` SDK (``responses.create``,
``responses.stream``, ``previous_response_id``, ``responses.retrieve``) and the ``openai-agents``
SDK's default model class against a live daphne, on both runtimes. A response is a run: the fake
provider behind the pool records what each worker was sent."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import openai
import pytest

from apps.runs.models import Run
from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy
from tests.fakes.base import FakeReply
from tests.fixtures.api import CONDUCTOR_ANSWER, PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

CONDUCTOR, SOLVER, CRITIC = "fake-conductor-1", "fake-solver-1", "fake-critic-1"
LONG_STORY = " ".join(f"word{i}" for i in range(60))
SECRET = "AKIAIOSFODNN7EXAMPLE"  # an AWS key id the secrets guardrail detects
HOLD_POLICY = {
    "guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 10}}}
}
STREAM_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def script(server: Any, final: Any) -> None:
    """Conductor plans solver → critic; the critic's reply (text or callable) is the answer."""

    def respond(req: dict[str, Any]) -> Any:
        model = req.get("model")
        if model == CONDUCTOR:
            return PLAN_TEXT
        if model == CRITIC:
            return final(req) if callable(final) else final
        return "6 * 7 = 42"

    server.responder = respond


def sent_to(server: Any, model: str) -> list[dict[str, Any]]:
    return [r.json or {} for r in server.chat_requests() if (r.json or {}).get("model") == model]


def sent_text(server: Any, model: str) -> str:
    return json.dumps(sent_to(server, model)[-1]["messages"])


# --- create ------------------------------------------------------------------------------------------


def test_string_input_is_a_run_with_output_text_usage_and_run_link(
    conductor_fake: Any, sdk: openai.OpenAI
) -> None:
    raw = sdk.responses.with_raw_response.create(model="conductor-mini", input="What is six times seven?")
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == CONDUCTOR_ANSWER
    [item] = response.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    run = Run.objects.get(pk=raw.headers["x-conductor-run"])
    assert response.id == f"resp_{run.id.hex}" and run.status == "succeeded"
    assert run.request_id == raw.headers["x-request-id"]
    extra = response.model_extra or {}
    assert extra["conductor"]["run_id"] == str(run.id) and extra["conductor"]["url"].endswith(
        f"/runs/{run.id}/"
    )


def test_message_input_with_instructions_reaches_the_run(conductor_fake: Any, sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="conductor-mini",
        instructions="Answer like a pirate.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "What is six times seven?"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Forty-something."}]},
            {"role": "user", "content": "Exactly, please."},
        ],
        metadata={"ticket": "T-1"},
        temperature=0.3,
    )
    assert response.output_text == CONDUCTOR_ANSWER
    assert response.instructions == "Answer like a pirate." and response.metadata == {"ticket": "T-1"}
    plan = sent_text(conductor_fake.server, CONDUCTOR)
    for text in ("Answer like a pirate.", "What is six times seven?", "Forty-something.", "Exactly, please."):
        assert text in plan
    assert sent_to(conductor_fake.server, CRITIC)[-1]["temperature"] == 0.3


def test_max_output_tokens_makes_the_response_incomplete(fake_pool: Any, sdk: openai.OpenAI) -> None:
    script(fake_pool.server, LONG_STORY)
    response = sdk.responses.create(model="conductor-mini", input="Write a long story.", max_output_tokens=5)
    assert response.status == "incomplete"
    assert (
        response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    )
    assert len(response.output_text.split()) <= 5
    assert sent_to(fake_pool.server, CRITIC)[-1]["max_tokens"] == 5


def test_text_format_json_schema_gives_json(fake_pool: Any, sdk: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    script(fake_pool.server, '{"answer": 42}')
    response = sdk.responses.create(
        model="conductor-mini",
        input="What is six times seven?",
        text={"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}},
    )
    assert json.loads(response.output_text) == {"answer": 42}
    sent = sent_to(fake_pool.server, CRITIC)[-1]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"] == schema
    assert response.text is not None and response.text.format.type == "json_schema"


def test_function_tools_on_a_pool_model_return_function_calls(fake_pool: Any, sdk: openai.OpenAI) -> None:
    server = fake_pool.server
    server.script(
        FakeReply(tool_calls=[{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]),
        "It is sunny in Paris.",
    )
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    first = sdk.responses.create(model="fake", input="Weather in Paris?", tools=[tool])  # type: ignore[list-item]
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.call_id == "call_1" and call.name == "get_weather"
    assert sent_to(server, SOLVER)[-1]["tools"][0]["function"]["name"] == "get_weather"
    second = sdk.responses.create(
        model="fake",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "sunny, 24 C"}],
        tools=[tool],  # type: ignore[list-item]
    )
    assert second.output_text == "It is sunny in Paris."
    messages = sent_to(server, SOLVER)[-1]["messages"]
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"}
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "get_weather"


# --- streaming ---------------------------------------------------------------------------------------


def test_stream_sends_openai_events_in_order_and_deltas_join_to_the_final(
    conductor_fake: Any, sdk: openai.OpenAI
) -> None:
    with sdk.responses.stream(model="conductor-mini", input="What is six times seven?") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    # The answer streams as the output gate releases it: one or more deltas in a row (issue 45).
    assert [
        k for i, k in enumerate(kinds) if not (k == "response.output_text.delta" and kinds[i - 1] == k)
    ] == STREAM_EVENTS
    assert kinds.count("response.output_text.delta") >= 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == CONDUCTOR_ANSWER == final.output_text
    assert final.status == "completed" and final.usage is not None and final.usage.total_tokens > 0
    assert events[0].response.id == final.id


def test_a_failed_run_streams_response_failed_naming_the_run(
    api_server: Any, fake_pool: Any, api_key: Any
) -> None:
    publish_policy(
        fake_pool.pool.team, {"guardrails": {"input": {"secrets": {"enabled": True, "action": "block"}}}}
    )
    with httpx.stream(
        "POST",
        f"{api_server.url}/v1/responses",
        json={"model": "conductor-mini", "input": f"my key {SECRET}", "stream": True},
        headers={"Authorization": f"Bearer {api_key[1]}"},
        timeout=90,
    ) as response:
        run_id = response.headers["x-conductor-run"]
        raw = b"".join(response.iter_bytes()).decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "content_policy_violation"
    assert failed["conductor"]["run_id"] == run_id and "secrets" in failed["error"]["message"]
    assert SECRET not in raw


# --- chaining and retrieval --------------------------------------------------------------------------


def test_previous_response_id_sends_the_earlier_turn_and_retrieve_returns_it(
    fake_pool: Any, sdk: openai.OpenAI, alpha: Any, beta: Any, outsider: Any, api_server: Any
) -> None:
    script(
        fake_pool.server, lambda req: "First answer." if "Second" not in json.dumps(req) else "Second answer."
    )
    first = sdk.responses.create(model="conductor-mini", input="First question?", instructions="Be brief.")
    assert first.output_text == "First answer."
    second = sdk.responses.create(
        model="conductor-mini", input="Second question?", previous_response_id=first.id
    )
    assert second.output_text == "Second answer."
    assert second.previous_response_id == first.id
    plan = sent_text(fake_pool.server, CONDUCTOR)
    assert "First question?" in plan and "First answer." in plan and "Second question?" in plan
    assert "Be brief." not in plan  # instructions do not carry over (as OpenAI does it)

    fetched = sdk.responses.retrieve(first.id)
    assert fetched.id == first.id and fetched.output_text == "First answer." and fetched.status == "completed"

    # Unknown ids are 404 in OpenAI's shape with param; another team's key cannot see or chain.
    with pytest.raises(openai.NotFoundError) as exc:
        sdk.responses.create(
            model="conductor-mini", input="x", previous_response_id=f"resp_{uuid.uuid4().hex}"
        )
    assert exc.value.body["param"] == "previous_response_id"
    outsider_key = make_api_key(beta, principal=outsider).plaintext
    other = openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=outsider_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve("resp_nothex")


def test_store_false_keeps_the_run_but_not_the_response(conductor_fake: Any, sdk: openai.OpenAI) -> None:
    raw = sdk.responses.with_raw_response.create(model="conductor-mini", input="Hi?", store=False)
    response = raw.parse()
    assert response.store is False and Run.objects.filter(pk=raw.headers["x-conductor-run"]).exists()
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)


# --- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"background": True}, "background"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
    ],
)
def test_unsupported_parameters_are_refused_by_name(
    fake_pool: Any, sdk: openai.OpenAI, kwargs: dict[str, Any], param: str
) -> None:
    kwargs.setdefault("input", "hello")
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.responses.create(model="conductor-mini", **kwargs)
    assert exc.value.body["param"] == param
    assert not Run.objects.exists()


def test_http_discipline_method_key_model_json(api_server: Any, fake_pool: Any, api_key: Any) -> None:
    url = f"{api_server.url}/v1/responses"
    auth = {"Authorization": f"Bearer {api_key[1]}"}
    wrong = httpx.get(url, headers=auth)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert httpx.delete(f"{url}/resp_x", headers=auth).status_code == 405
    nokey = httpx.post(url, json={"model": "conductor-mini", "input": "hi"})
    assert nokey.status_code == 401 and nokey.json()["error"]["code"] == "missing_api_key"
    unknown = httpx.post(url, json={"model": "nope:x", "input": "hi"}, headers=auth)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    bad = httpx.post(url, content=b"{not json", headers={**auth, "content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert not Run.objects.exists()


# --- held --------------------------------------------------------------------------------------------


def test_a_held_response_has_no_text_plain_streamed_or_retrieved(
    fake_pool: Any, sdk: openai.OpenAI, api_server: Any, api_key: Any
) -> None:
    mark = f"HELD{uuid.uuid4().hex[:10]}"
    script(fake_pool.server, f"Final: {mark} is the answer")
    publish_policy(fake_pool.pool.team, HOLD_POLICY)
    raw = httpx.post(
        f"{api_server.url}/v1/responses",
        json={"model": "conductor-mini", "input": "six times seven?"},
        headers={"Authorization": f"Bearer {api_key[1]}"},
        timeout=90,
    )
    assert raw.status_code == 200 and mark not in raw.text
    body = raw.json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "content_filter"}
    assert body["output"] == [] and body["conductor"]["held"]["rules"] == ["output:length"]
    assert mark in Run.objects.get(pk=raw.headers["x-conductor-run"]).answer  # there was something to leak

    with httpx.stream(
        "POST",
        f"{api_server.url}/v1/responses",
        json={"model": "conductor-mini", "input": "six times seven?", "stream": True},
        headers={"Authorization": f"Bearer {api_key[1]}"},
        timeout=90,
    ) as response:
        streamed = b"".join(response.iter_bytes())
    assert mark.encode() not in streamed
    events = [json.loads(line[6:]) for line in streamed.decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.incomplete"]
    assert events[-1]["response"]["incomplete_details"] == {"reason": "content_filter"}
    assert events[-1]["response"]["conductor"]["held"]["rules"] == ["output:length"]

    fetched = httpx.get(
        f"{api_server.url}/v1/responses/{body['id']}", headers={"Authorization": f"Bearer {api_key[1]}"}
    )
    assert fetched.status_code == 200 and mark not in fetched.text
    assert fetched.json()["status"] == "incomplete"
    # Chaining would carry the held answer into a new, visible question: refused.
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.responses.create(model="conductor-mini", input="and?", previous_response_id=body["id"])
    assert exc.value.body["param"] == "previous_response_id"


# --- the OpenAI Agents SDK ---------------------------------------------------------------------------


def test_openai_agents_sdk_runs_an_agent_on_the_default_responses_model(
    conductor_fake: Any, api_server: Any, api_key: Any, runtime_workers: Any
) -> None:
    import agents

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(
        base_url=f"{api_server.url}/v1", api_key=api_key[1], max_retries=0, timeout=90
    )
    agents.set_default_openai_client(client, use_for_tracing=False)
    agents.set_default_openai_api("responses")
    agent = agents.Agent(name="Calculator", instructions="You compute.", model="conductor-mini")
    result = agents.Runner.run_sync(agent, "What is six times seven?")
    assert result.final_output == CONDUCTOR_ANSWER
    assert isinstance(result.raw_responses[0], agents.ModelResponse)
    assert "You compute." in sent_text(conductor_fake.server, CONDUCTOR)
