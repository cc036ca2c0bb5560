"""The Anthropic Messages API as a drop-in (issue 22): the official ``anthropic`` SDK (create and
stream) against a live daphne, on both runtimes; Anthropic's error shape for every refusal; a held
answer stays held, plain and streamed."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import httpx
import pytest

from apps.runs.models import Run
from tests.factories.policies import publish_policy
from tests.fixtures.api import CONDUCTOR_ANSWER, PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

CONDUCTOR, SOLVER, CRITIC = "fake-conductor-1", "fake-solver-1", "fake-critic-1"
ASK = [{"role": "user", "content": "What is six times seven?"}]
HOLD_POLICY = {
    "guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 10}}}
}
STREAM_EVENTS = [
    "message_start",
    "ping",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
]


@pytest.fixture
def claude(api_server: Any, runtime_workers: Any, api_key: tuple[Any, str]) -> anthropic.Anthropic:
    """The official Anthropic client on the live server (its own ``x-api-key`` header)."""
    return anthropic.Anthropic(base_url=api_server.url, api_key=api_key[1], max_retries=0, timeout=90)


def script(server: Any, final: str) -> None:
    def respond(req: dict[str, Any]) -> str:
        model = req.get("model")
        if model == CONDUCTOR:
            return PLAN_TEXT
        return final if model == CRITIC else "6 * 7 = 42"

    server.responder = respond


def sent_to(server: Any, model: str) -> list[dict[str, Any]]:
    return [r.json or {} for r in server.chat_requests() if (r.json or {}).get("model") == model]


def test_create_returns_an_anthropic_message_with_usage(
    conductor_fake: Any, claude: anthropic.Anthropic
) -> None:
    raw = claude.messages.with_raw_response.create(
        model="conductor-mini",
        max_tokens=200,
        system=[{"type": "text", "text": "Answer tersely."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is six times seven?"}]}],
        # The current SDK dropped these named arguments; older clients still send them.
        extra_body={"temperature": 0.2, "top_p": 0.9},
        metadata={"user_id": "u-1"},
    )
    message = raw.parse()
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "conductor-mini"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == CONDUCTOR_ANSWER  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    run = Run.objects.get(pk=raw.headers["x-conductor-run"])
    assert run.status == "succeeded" and run.request_id == raw.headers["x-request-id"]
    assert (message.model_extra or {})["conductor"]["run_id"] == str(run.id)
    assert "Answer tersely." in json.dumps(sent_to(conductor_fake.server, CONDUCTOR)[-1]["messages"])
    critic = sent_to(conductor_fake.server, CRITIC)[-1]
    assert critic["max_tokens"] == 200 and critic["temperature"] == 0.2 and critic["top_p"] == 0.9


def test_small_max_tokens_stops_with_max_tokens(fake_pool: Any, claude: anthropic.Anthropic) -> None:
    script(fake_pool.server, " ".join(f"word{i}" for i in range(60)))
    message = claude.messages.create(model="conductor-mini", max_tokens=5, messages=ASK)
    assert message.stop_reason == "max_tokens"
    assert len(message.content[0].text.split()) <= 5  # type: ignore[union-attr]
    assert sent_to(fake_pool.server, CRITIC)[-1]["max_tokens"] == 5


def test_stop_sequences_reach_the_worker_and_cut_the_answer(
    fake_pool: Any, claude: anthropic.Anthropic
) -> None:
    script(fake_pool.server, "The answer is 42.\nEND of story")
    message = claude.messages.create(
        model="conductor-mini", max_tokens=100, messages=ASK, stop_sequences=["END"]
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "END"
    assert message.content[0].text == "The answer is 42.\n"  # type: ignore[union-attr]
    assert sent_to(fake_pool.server, CRITIC)[-1]["stop"] == ["END"]


def test_output_config_json_schema_gives_json_or_names_the_parameter(
    fake_pool: Any, claude: anthropic.Anthropic
) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    script(fake_pool.server, '{"answer": 42}')
    message = claude.messages.create(
        model="conductor-mini",
        max_tokens=100,
        messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert json.loads(message.content[0].text) == {"answer": 42}  # type: ignore[union-attr]
    assert sent_to(fake_pool.server, CRITIC)[-1]["response_format"]["json_schema"]["schema"] == schema
    script(fake_pool.server, "no JSON here")
    with pytest.raises(anthropic.UnprocessableEntityError) as exc:
        claude.messages.create(
            model="conductor-mini",
            max_tokens=100,
            messages=ASK,
            output_config={"format": {"type": "json_schema", "schema": schema}},
        )
    assert exc.value.body["error"]["param"] == "output_config.format"  # type: ignore[index]


def test_stream_follows_anthropics_event_sequence(conductor_fake: Any, claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="conductor-mini", max_tokens=200, messages=ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == CONDUCTOR_ANSWER == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    with claude.messages.with_streaming_response.create(
        model="conductor-mini", max_tokens=200, messages=ASK, stream=True
    ) as response:
        raw = response.read().decode()
    kinds = [line[len("event: ") :] for line in raw.splitlines() if line.startswith("event: ")]
    # The answer streams as the output gate releases it: one or more deltas in a row (issue 45).
    assert [
        k for i, k in enumerate(kinds) if not (k == "content_block_delta" and kinds[i - 1] == k)
    ] == STREAM_EVENTS
    assert kinds.count("content_block_delta") >= 1


def test_errors_are_in_anthropics_shape(api_server: Any, fake_pool: Any, claude: anthropic.Anthropic) -> None:
    bad_key = anthropic.Anthropic(base_url=api_server.url, api_key="cw_nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        bad_key.messages.create(model="conductor-mini", max_tokens=10, messages=ASK)
    assert auth.value.body["type"] == "error"  # type: ignore[index]
    assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="nope:x", max_tokens=10, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as exc:
        claude.messages.create(
            model="conductor-mini", max_tokens=10, messages=[{"role": "user", "content": [image]}]
        )
    assert "image" in exc.value.message and exc.value.body["error"]["param"] == "messages.0.content.0.type"  # type: ignore[index]
    tool = {"name": "f", "input_schema": {"type": "object"}}
    with pytest.raises(anthropic.BadRequestError) as exc:
        claude.messages.create(model="conductor-mini", max_tokens=10, messages=ASK, tools=[tool])  # type: ignore[list-item]
    assert exc.value.body["error"]["param"] == "tools"  # type: ignore[index]
    url = f"{api_server.url}/v1/messages"
    no_max = httpx.post(
        url, json={"model": "conductor-mini", "messages": ASK}, headers={"x-api-key": claude.api_key}
    )
    assert no_max.status_code == 400 and no_max.json()["error"]["param"] == "max_tokens"
    wrong = httpx.get(url)
    assert wrong.status_code == 405 and wrong.json()["type"] == "error" and wrong.headers["allow"] == "POST"
    assert httpx.post(url, json={}).json()["error"]["type"] == "authentication_error"
    # Bearer auth works too, and anthropic-version is accepted.
    bearer = httpx.post(
        url,
        content=b"{nope",
        headers={"Authorization": f"Bearer {claude.api_key}", "anthropic-version": "2023-06-01"},
    )
    assert bearer.status_code == 400 and bearer.json()["error"]["type"] == "invalid_request_error"
    assert not Run.objects.exists()


def test_a_held_answer_has_no_text_plain_or_streamed(
    fake_pool: Any, claude: anthropic.Anthropic, api_server: Any
) -> None:
    mark = f"HELD{uuid.uuid4().hex[:10]}"
    script(fake_pool.server, f"Final: {mark} is the answer")
    publish_policy(fake_pool.pool.team, HOLD_POLICY)
    raw = claude.messages.with_raw_response.create(model="conductor-mini", max_tokens=100, messages=ASK)
    assert mark not in raw.http_response.text
    message = raw.parse()
    assert message.content == [] and message.stop_reason == "refusal"
    assert (message.model_extra or {})["conductor"]["held"]["rules"] == ["output:length"]
    assert mark in Run.objects.get(pk=raw.headers["x-conductor-run"]).answer  # there was something to leak

    with claude.messages.with_streaming_response.create(
        model="conductor-mini", max_tokens=100, messages=ASK, stream=True
    ) as response:
        streamed = response.read()
    assert mark.encode() not in streamed
    events = [json.loads(line[6:]) for line in streamed.decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["message_start", "ping", "message_delta", "message_stop"]
    assert events[2]["delta"]["stop_reason"] == "refusal"
    assert events[2]["conductor"]["held"]["rules"] == ["output:length"]
    with claude.messages.stream(model="conductor-mini", max_tokens=100, messages=ASK) as stream:
        assert "".join(stream.text_stream) == ""
        assert stream.get_final_message().stop_reason == "refusal"


def test_a_blocked_run_streams_an_error_event(fake_pool: Any, claude: anthropic.Anthropic) -> None:
    publish_policy(
        fake_pool.pool.team, {"guardrails": {"input": {"secrets": {"enabled": True, "action": "block"}}}}
    )
    with (
        pytest.raises(anthropic.APIStatusError) as exc,
        claude.messages.stream(
            model="conductor-mini",
            max_tokens=100,
            messages=[{"role": "user", "content": "key AKIAIOSFODNN7EXAMPLE"}],
        ) as stream,
    ):
        "".join(stream.text_stream)
    assert "secrets" in str(exc.value) and "AKIAIOSFODNN7EXAMPLE" not in str(exc.value)
