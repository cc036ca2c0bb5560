"""The official ``openai`` client against a live daphne server: plain, streaming and every error
class mapped to the SDK's exception types. Runs in both modes (thread pool / Celery)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from django.test import Client

from apps.audit.models import AuditEvent
from apps.runs.models import Run, RunEvent, Step
from tests.factories.api import make_api_key
from tests.fixtures.api import CONDUCTOR_ANSWER

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PROMPT = [{"role": "user", "content": "What is six times seven?"}]


@pytest.fixture
def client_for(api_server: Any, runtime_workers: Any) -> Any:
    def make(key: str | None) -> openai.OpenAI:
        # max_retries=0: a retried 429 would hide the status this test asserts.
        return openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=key or "", max_retries=0, timeout=90)

    return make


def test_plain_completion_runs_the_conductor_and_links_to_the_graph(
    conductor_fake: Any, api_key: tuple[Any, str], client_for: Any, owner: Any
) -> None:
    key, plaintext = api_key
    raw = client_for(plaintext).chat.completions.with_raw_response.create(
        model="conductor-mini", messages=PROMPT
    )
    completion = raw.parse()
    run_id = raw.headers["x-conductor-run"]

    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == CONDUCTOR_ANSWER
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    conductor = completion.model_extra["conductor"]
    assert conductor["run_id"] == run_id
    assert conductor["url"].endswith(f"/runs/{run_id}/")

    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded"
    assert run.source == "openai_api" and run.api_key_id == key.pk and run.pool.slug == "fake"
    assert run.input_tokens == completion.usage.prompt_tokens
    steps = list(Step.objects.filter(run=run).order_by("index"))
    assert [s.worker_key for s in steps] == ["fake-solver", "fake-critic"]
    # The critic (step 1, access [0]) saw the solver's output in its exact messages.
    assert "6 * 7 = 42" in str(steps[1].messages)
    # Audit rows written during the API request carry the key id.
    created = AuditEvent.objects.get(event_type="run.created", run_id=run.pk)
    assert created.api_key_id == key.pk

    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/runs/{run_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "fake-solver" in html or "Fake solver" in html


def test_streaming_sends_progress_then_the_answer_and_done(
    conductor_fake: Any, api_key: tuple[Any, str], client_for: Any
) -> None:
    _key, plaintext = api_key
    stream = client_for(plaintext).chat.completions.create(
        model="conductor-mini", messages=PROMPT, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == CONDUCTOR_ANSWER
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    progress = [
        c.model_extra.get("conductor") for c in chunks if c.choices and c.model_extra.get("conductor")
    ]
    started = [p["index"] for p in progress if p.get("event") == "step.started"]
    assert started == [0, 1]
    run_id = chunks[0].model_extra["conductor"]["run_id"]
    assert Run.objects.get(pk=run_id).status == "succeeded"
    seqs = [p["seq"] for p in progress if "seq" in p]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))


def test_a_plain_request_calls_its_models_plainly_and_a_streamed_one_streams(
    conductor_fake: Any, api_key: tuple[Any, str], client_for: Any
) -> None:
    """V1_UPSTREAM_STREAM=client (the default): a plain request's client waits for the whole
    answer, so its run asks the providers for whole answers too (no per-chunk parsing, no delta
    events); a streamed request's run streams from the providers token by token."""
    client = client_for(api_key[1])
    server = conductor_fake.server
    raw = client.chat.completions.with_raw_response.create(model="conductor-mini", messages=PROMPT)
    assert raw.parse().choices[0].message.content == CONDUCTOR_ANSWER
    plain_calls = server.chat_requests()
    assert len(plain_calls) >= 3  # the plan and two steps
    assert not any((call.json or {}).get("stream") for call in plain_calls)
    kinds = set(RunEvent.objects.filter(run_id=raw.headers["x-conductor-run"]).values_list("type", flat=True))
    assert "step.finished" in kinds and not kinds & {"step.delta", "plan.delta"}

    chunks = list(client.chat.completions.create(model="conductor-mini", messages=PROMPT, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CONDUCTOR_ANSWER
    streamed_calls = server.chat_requests()[len(plain_calls) :]
    assert len(streamed_calls) >= 3 and all((call.json or {}).get("stream") for call in streamed_calls)
    run_id = chunks[0].model_extra["conductor"]["run_id"]
    assert RunEvent.objects.filter(run_id=run_id, type="step.delta").exists()


def test_raw_stream_ends_with_done(
    conductor_fake: Any, api_key: tuple[Any, str], api_server: Any, runtime_workers: Any
) -> None:
    import httpx

    _key, plaintext = api_key
    with httpx.stream(
        "POST",
        f"{api_server.url}/v1/chat/completions",
        json={"model": "conductor-mini", "messages": PROMPT, "stream": True},
        headers={"Authorization": f"Bearer {plaintext}"},
        timeout=90,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-conductor-run"]
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_models_lists_presets_and_usable_pools(
    fake_pool: Any, api_key: tuple[Any, str], client_for: Any
) -> None:
    _key, plaintext = api_key
    ids = [m.id for m in client_for(plaintext).models.list()]
    assert ids[:2] == ["conductor-mini", "conductor-ultra"]
    assert "fake" in ids


def test_bad_or_missing_key_is_authentication_error(fake_pool: Any, client_for: Any, api_server: Any) -> None:
    import httpx

    for key in ("cw_0000000000_" + "x" * 43, "sk-not-ours"):
        with pytest.raises(openai.AuthenticationError) as exc:
            client_for(key).chat.completions.create(model="conductor-mini", messages=PROMPT)
        assert exc.value.status_code == 401
        assert exc.value.body["code"] == "invalid_api_key"
    # The SDK refuses to send no key at all; a raw client can.
    response = httpx.post(
        f"{api_server.url}/v1/chat/completions", json={"model": "conductor-mini", "messages": PROMPT}
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"
    assert not Run.objects.exists()


def test_revoked_key_is_authentication_error(
    fake_pool: Any, alpha: Any, team_admin: Any, client_for: Any
) -> None:
    from apps.api.services import apikey_revoke

    created = make_api_key(alpha, principal=team_admin)
    apikey_revoke(actor=team_admin, api_key=created.api_key)
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        client_for(created.plaintext).models.list()


def test_pool_not_allowed_is_permission_denied(
    fake_pool: Any, alpha: Any, team_admin: Any, client_for: Any
) -> None:
    from tests.factories.workers import PoolFactory

    other = PoolFactory(team=alpha, slug="other", workers=fake_pool.workers)
    created = make_api_key(alpha, principal=team_admin, allowed_pools=[other])
    with pytest.raises(openai.PermissionDeniedError) as exc:
        client_for(created.plaintext).chat.completions.create(model="conductor-mini", messages=PROMPT)
    assert exc.value.body["code"] == "pool_not_allowed"
    with pytest.raises(openai.PermissionDeniedError):
        client_for(created.plaintext).chat.completions.create(model="conductor-ultra:fake", messages=PROMPT)
    denied = AuditEvent.objects.filter(event_type="apikey.denied", object_id=str(created.api_key.pk))
    assert denied.exists() and denied.first().payload["reason"] == "pool_not_allowed"
    assert not Run.objects.exists()


def test_read_only_key_cannot_run(fake_pool: Any, alpha: Any, team_admin: Any, client_for: Any) -> None:
    created = make_api_key(alpha, principal=team_admin, role="read")
    with pytest.raises(openai.PermissionDeniedError):
        client_for(created.plaintext).chat.completions.create(model="conductor-mini", messages=PROMPT)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": PROMPT, "n": 2}, "n"),
        ({"messages": PROMPT, "temperature": 7}, "temperature"),
        ({"messages": [{"role": "system", "content": "be brief"}]}, "messages"),
    ],
)
def test_invalid_request_is_bad_request_naming_the_field(
    fake_pool: Any, api_key: tuple[Any, str], client_for: Any, kwargs: dict[str, Any], param: str
) -> None:
    _key, plaintext = api_key
    with pytest.raises(openai.BadRequestError) as exc:
        client_for(plaintext).chat.completions.create(model="conductor-mini", **kwargs)
    assert exc.value.body["param"] == param
    assert exc.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("model", ["gpt-4o", "conductor-mini:no-such-pool", "conductor-max"])
def test_unknown_model_is_not_found(
    fake_pool: Any, api_key: tuple[Any, str], client_for: Any, model: str
) -> None:
    _key, plaintext = api_key
    with pytest.raises(openai.NotFoundError) as exc:
        client_for(plaintext).chat.completions.create(model=model, messages=PROMPT)
    assert exc.value.body["code"] == "model_not_found"
    assert exc.value.body["param"] == "model"


def test_other_teams_pool_is_not_found_not_forbidden(
    fake_pool: Any, beta: Any, outsider: Any, alpha: Any, team_admin: Any, client_for: Any
) -> None:
    from tests.factories.workers import PoolFactory

    PoolFactory(team=beta, slug="beta-pool")
    created = make_api_key(alpha, principal=team_admin)
    with pytest.raises(openai.NotFoundError):
        client_for(created.plaintext).chat.completions.create(model="beta-pool", messages=PROMPT)


def test_request_rate_limit_is_rate_limit_error_with_retry_after(
    fake_pool: Any, alpha: Any, team_admin: Any, client_for: Any
) -> None:
    created = make_api_key(alpha, principal=team_admin, requests_per_minute=1)
    client = client_for(created.plaintext)
    client.models.list()
    with pytest.raises(openai.RateLimitError) as exc:
        client.models.list()
    assert exc.value.body["code"] == "rate_limit_exceeded"
    assert 1 <= int(exc.value.response.headers["retry-after"]) <= 60


def test_exhausted_budget_is_rate_limit_error_and_calls_no_model(
    conductor_fake: Any, api_key: tuple[Any, str], client_for: Any, alpha: Any
) -> None:
    from tests.factories.policies import publish_policy

    publish_policy(alpha, {"budgets": {"daily": {"hard_usd": "0"}}})
    _key, plaintext = api_key
    with pytest.raises(openai.RateLimitError) as exc:
        client_for(plaintext).chat.completions.create(model="conductor-mini", messages=PROMPT)
    assert exc.value.body["code"] == "budget_exhausted"
    assert exc.value.body["type"] == "insufficient_quota"
    assert int(exc.value.response.headers["retry-after"]) > 0
    # A refusal is final: the SDKs must not retry it into more refusals.
    assert exc.value.response.headers["x-should-retry"] == "false"
    assert conductor_fake.server.chat_requests() == []
    assert not Run.objects.exists()


SECRET = "AKIAIOSFODNN7EXAMPLE"


def test_guardrail_block_names_the_rule_never_the_secret(
    conductor_fake: Any, api_key: tuple[Any, str], client_for: Any, alpha: Any
) -> None:
    from tests.factories.policies import publish_policy

    publish_policy(alpha, {"guardrails": {"input": {"secrets": {"enabled": True, "action": "block"}}}})
    _key, plaintext = api_key
    with pytest.raises(openai.BadRequestError) as exc:
        client_for(plaintext).chat.completions.create(
            model="conductor-mini", messages=[{"role": "user", "content": f"Remember my key {SECRET} please"}]
        )
    body = exc.value.response.json()
    assert body["error"]["code"] == "content_policy_violation"
    assert "secrets" in body["error"]["message"]
    assert SECRET not in exc.value.response.text
    run = Run.objects.get(pk=body["conductor"]["run_id"])
    assert run.status == "blocked"
    assert conductor_fake.server.chat_requests() == []


def test_guardrail_block_while_streaming_is_an_error_event(
    conductor_fake: Any, api_key: tuple[Any, str], client_for: Any, alpha: Any
) -> None:
    from tests.factories.policies import publish_policy

    publish_policy(alpha, {"guardrails": {"input": {"secrets": {"enabled": True, "action": "block"}}}})
    _key, plaintext = api_key
    stream = client_for(plaintext).chat.completions.create(
        model="conductor-mini", messages=[{"role": "user", "content": f"key {SECRET}"}], stream=True
    )
    with pytest.raises(openai.APIError) as exc:
        list(stream)
    assert "secrets" in str(exc.value)
    assert SECRET not in str(exc.value)
