"""Chat Completions as a drop-in (issue 22): the official ``openai`` SDK (sync, async, streaming,
``with_raw_response``) against a live daphne, on both runtimes. Parameters are honoured — asserted
at the fake provider, which records what the worker was sent — or refused by name."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from apps.audit.models import AuditEvent
from apps.runs.models import Run
from tests.compat.conftest import ALLOWED_ORIGIN
from tests.factories.api import make_api_key
from tests.fixtures.api import CONDUCTOR_ANSWER, PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PROMPT = [{"role": "user", "content": "What is six times seven?"}]
LONG_STORY = " ".join(f"word{i}" for i in range(60))
CONDUCTOR, SOLVER, CRITIC = "fake-conductor-1", "fake-solver-1", "fake-critic-1"


def script(server: Any, final: Any) -> None:
    """Conductor plans solver → critic (tests.fixtures.api.PLAN_TEXT); the critic's reply is
    ``final`` (text, FakeReply, or a callable of the request)."""

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


# --- clients and headers -------------------------------------------------------------------------


def test_sync_raw_response_has_request_id_processing_time_and_rate_limits(
    conductor_fake: Any, sdk: openai.OpenAI, api_key: tuple[Any, str]
) -> None:
    raw = sdk.chat.completions.with_raw_response.create(model="conductor-mini", messages=PROMPT)
    completion = raw.parse()
    assert completion.choices[0].message.content == CONDUCTOR_ANSWER
    assert completion.choices[0].finish_reason == "stop"
    headers = raw.headers
    request_id = headers["x-request-id"]
    assert request_id.startswith("req_") and raw.request_id == request_id
    assert int(headers["openai-processing-ms"]) >= 0
    key = api_key[0]
    assert headers["x-ratelimit-limit-requests"] == str(key.requests_per_minute)
    assert int(headers["x-ratelimit-remaining-requests"]) == key.requests_per_minute - 1
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert headers["x-ratelimit-limit-tokens"] == str(key.tokens_per_minute)
    assert int(headers["x-ratelimit-remaining-tokens"]) <= key.tokens_per_minute
    assert headers["x-ratelimit-reset-tokens"].endswith("s")
    # The request id is on the run and in the audit rows of the request and of the execution.
    run = Run.objects.get(pk=headers["x-conductor-run"])
    assert run.request_id == request_id
    created = AuditEvent.objects.get(event_type="run.created", run_id=run.pk)
    assert created.payload["request_id"] == request_id
    finished = AuditEvent.objects.get(event_type="run.finished", run_id=run.pk)
    assert finished.payload["request_id"] == request_id


async def test_async_client_and_async_stream(conductor_fake: Any, async_sdk: openai.AsyncOpenAI) -> None:
    completion = await async_sdk.chat.completions.create(model="conductor-mini", messages=PROMPT)
    assert completion.choices[0].message.content == CONDUCTOR_ANSWER
    stream = await async_sdk.chat.completions.create(
        model="conductor-mini", messages=PROMPT, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CONDUCTOR_ANSWER
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


def test_streamed_raw_response_has_headers_before_the_body(conductor_fake: Any, sdk: openai.OpenAI) -> None:
    with sdk.chat.completions.with_streaming_response.create(
        model="conductor-mini", messages=PROMPT, stream=True
    ) as response:
        assert response.headers["x-request-id"].startswith("req_")
        assert "x-ratelimit-remaining-requests" in response.headers
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text == CONDUCTOR_ANSWER


# --- parameters honoured ---------------------------------------------------------------------------


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_caps_the_answer_with_finish_reason_length(
    fake_pool: Any, sdk: openai.OpenAI, param: str
) -> None:
    script(fake_pool.server, LONG_STORY)
    completion = sdk.chat.completions.create(
        model="conductor-mini", messages=[{"role": "user", "content": "Write a long story."}], **{param: 5}
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert len((choice.message.content or "").split()) <= 5
    # The final step's generation was capped; the conductor's own plan was not.
    assert sent_to(fake_pool.server, CRITIC)[-1]["max_tokens"] == 5
    assert sent_to(fake_pool.server, CONDUCTOR)[0]["max_tokens"] > 5


def test_stop_temperature_top_p_and_seed_reach_the_answering_worker(
    conductor_fake: Any, sdk: openai.OpenAI
) -> None:
    sdk.chat.completions.create(
        model="conductor-mini", messages=PROMPT, stop=["\n\n", "END"], temperature=0.3, top_p=0.9, seed=7
    )
    critic = sent_to(conductor_fake.server, CRITIC)[-1]
    assert critic["stop"] == ["\n\n", "END"]
    assert critic["temperature"] == 0.3 and critic["top_p"] == 0.9 and critic["seed"] == 7
    # Only the worker that writes the answer: the solver step and the plan keep their settings.
    for model in (SOLVER, CONDUCTOR):
        assert not {"stop", "temperature", "seed"} & set(sent_to(conductor_fake.server, model)[-1])


def test_response_format_json_object_gives_json(fake_pool: Any, sdk: openai.OpenAI) -> None:
    script(fake_pool.server, '{"answer": 42}')
    completion = sdk.chat.completions.create(
        model="conductor-mini", messages=PROMPT, response_format={"type": "json_object"}
    )
    assert json.loads(completion.choices[0].message.content or "") == {"answer": 42}
    assert sent_to(fake_pool.server, CRITIC)[-1]["response_format"] == {"type": "json_object"}


def test_response_format_json_schema_is_repaired_once_then_valid(fake_pool: Any, sdk: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    replies = iter(["The answer is 42.", '{"answer": 42}'])
    script(fake_pool.server, lambda req: next(replies))
    completion = sdk.chat.completions.create(
        model="conductor-mini",
        messages=PROMPT,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    )
    assert json.loads(completion.choices[0].message.content or "") == {"answer": 42}
    first, repair = sent_to(fake_pool.server, CRITIC)
    assert first["response_format"]["json_schema"]["schema"] == schema
    assert "not valid JSON" in repair["messages"][-1]["content"]


def test_response_format_that_cannot_be_met_is_a_clear_error(fake_pool: Any, sdk: openai.OpenAI) -> None:
    script(fake_pool.server, "no JSON here")
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        sdk.chat.completions.create(
            model="conductor-mini", messages=PROMPT, response_format={"type": "json_object"}
        )
    assert exc.value.body["param"] == "response_format"
    assert exc.value.body["code"] == "response_format_invalid"
    assert "response_format" in exc.value.body["message"]


# --- parameters refused by name ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"top_p": 2}, "top_p"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"extra_body": {"frobnicate": True}}, "frobnicate"),
    ],
)
def test_parameters_that_cannot_be_honoured_are_refused_by_name(
    fake_pool: Any, sdk: openai.OpenAI, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model="conductor-mini", messages=PROMPT, **kwargs)
    assert exc.value.body["param"] == param
    assert exc.value.body["type"] == "invalid_request_error"
    assert not Run.objects.exists()


# --- every other /v1 path, wrong methods, CORS, 429 -----------------------------------------------


def test_unknown_endpoints_answer_in_openai_shape_naming_the_real_ones(
    fake_pool: Any, sdk: openai.OpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        sdk.completions.create(model="conductor-mini", prompt="hello")
    body = exc.value.body
    assert body["code"] == "unknown_url" and body["type"] == "invalid_request_error"
    assert "POST /v1/embeddings" in body["message"] and "POST /v1/chat/completions" in body["message"]
    assert exc.value.response.headers["x-request-id"].startswith("req_")


def test_wrong_method_is_405_in_openai_shape(api_server: Any, fake_pool: Any) -> None:
    for method, path in (("GET", "/v1/chat/completions"), ("DELETE", "/v1/models"), ("PUT", "/v1/models/x")):
        response = httpx.request(method, f"{api_server.url}{path}")
        assert response.status_code == 405, (method, path)
        error = response.json()["error"]
        assert error["code"] == "method_not_allowed" and error["type"] == "invalid_request_error"
        assert response.headers["allow"] and response.headers["x-request-id"]


def test_cors_preflight_for_an_allowed_origin_and_nothing_for_others(api_server: Any) -> None:
    asked = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    allowed = httpx.options(
        f"{api_server.url}/v1/chat/completions", headers={"Origin": ALLOWED_ORIGIN, **asked}
    )
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "authorization" in allowed.headers["access-control-allow-headers"]
    other = httpx.options(
        f"{api_server.url}/v1/chat/completions", headers={"Origin": "https://evil.example", **asked}
    )
    assert other.status_code == 403
    assert "access-control-allow-origin" not in other.headers
    # A real (non-preflight) response carries the origin and exposes the headers SDKs read.
    listed = httpx.get(f"{api_server.url}/v1/models", headers={"Origin": ALLOWED_ORIGIN})
    assert listed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "x-request-id" in listed.headers["access-control-expose-headers"]
    assert (
        "access-control-allow-origin"
        not in httpx.get(f"{api_server.url}/v1/models", headers={"Origin": "https://evil.example"}).headers
    )


def test_rate_limited_request_is_429_with_retry_after_and_zero_remaining(
    fake_pool: Any, alpha: Any, team_admin: Any, api_server: Any, runtime_workers: Any
) -> None:
    created = make_api_key(alpha, principal=team_admin, requests_per_minute=1)
    client = openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=created.plaintext, max_retries=0)
    client.models.list()
    with pytest.raises(openai.RateLimitError) as exc:
        client.models.list()
    headers = exc.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-requests"] == "1"
