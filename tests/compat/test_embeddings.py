"""``POST /v1/embeddings`` (issue 45): the official ``openai`` SDK (sync and async, float and its
default base64) against the live server, embedding through a fake OpenAI-compatible provider on a
real socket. The team's input policy is asserted on the bytes the provider received; refusals name
the field, scope, limit or rule; the audit row holds digests, never text."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest

from apps.audit.models import AuditEvent
from apps.workers.models import Pool
from apps.workers.services import pool_create, worker_create
from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy
from tests.factories.runs import RunFactory
from tests.fakes.openai_server import embedding_of
from tests.fixtures.workers import EMBED_MODEL

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

CARD = "4111 1111 1111 1111"


def sent_inputs(fake_pool: Any) -> list[list[str]]:
    return [r.json["input"] for r in fake_pool.server.embedding_requests()]


def test_sync_sdk_embeds_float_and_base64_with_usage_and_an_audit_row_of_digests(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI
) -> None:
    texts = ["the quick brown fox", "jumps over the lazy dog"]
    raw = sdk.embeddings.with_raw_response.create(model="embed", input=texts, encoding_format="float")
    result = raw.parse()
    assert result.model == "embed" and result.object == "list"
    assert [d.index for d in result.data] == [0, 1]
    assert [d.embedding for d in result.data] == [embedding_of(t) for t in texts]
    assert result.usage.prompt_tokens == 9 and result.usage.total_tokens == 9  # 4 + 5 words
    request_id = raw.headers["x-request-id"]
    # The SDK's default asks for base64 and decodes it: the same vectors.
    default = sdk.embeddings.create(model="embed", input="the quick brown fox")
    assert default.data[0].embedding == pytest.approx(embedding_of("the quick brown fox"))
    [first, second] = fake_pool.server.embedding_requests()
    assert first.json == {"model": EMBED_MODEL, "input": texts, "encoding_format": "float"}
    assert second.json["input"] == ["the quick brown fox"]
    row = AuditEvent.objects.get(event_type="embedding.created", payload__request_id=request_id)
    assert row.payload["input_sha256"] == [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    assert row.payload["pool"] == "embed" and row.payload["worker"] == "fake-embedder"
    assert row.payload["prompt_tokens"] == 9 and row.payload["vectors"] == 2
    stored = json.dumps(row.payload)
    assert "quick brown" not in stored and str(embedding_of(texts[0])[0]) not in stored


async def test_async_sdk_embeds_with_dimensions(
    fake_pool: Any, embed_pool: Pool, async_sdk: openai.AsyncOpenAI
) -> None:
    result = await async_sdk.embeddings.create(model="embed", input=["hello there"], dimensions=4)
    assert result.data[0].embedding == pytest.approx(embedding_of("hello there", 4))
    [sent] = fake_pool.server.embedding_requests()
    assert sent.json["dimensions"] == 4


def test_redact_masks_what_the_provider_receives(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI, alpha: Any
) -> None:
    publish_policy(
        alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact", "types": ["card"]}}}}
    )
    result = sdk.embeddings.create(model="embed", input=["clean text", f"pay with {CARD} today"])
    assert len(result.data) == 2
    received = fake_pool.server.received()
    assert b"4111" not in received and b"clean text" in received and b"pay with" in received
    row = AuditEvent.objects.filter(event_type="embedding.created").latest("created_at")
    assert any("input[1]" in c["detail"] and c["action"] == "redact" for c in row.payload["checks"])
    assert CARD not in json.dumps(row.payload)


def test_a_blocked_term_refuses_naming_the_input_and_the_rule(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI, alpha: Any
) -> None:
    terms = {"enabled": True, "action": "block", "terms": [{"pattern": "insider trading", "message": "No."}]}
    publish_policy(alpha, {"guardrails": {"input": {"blocked_terms": terms}}})
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="embed", input=["fine", "a memo on insider trading"])
    body = err.value.body
    assert body["code"] == "content_policy_violation" and body["param"] == "input[1]"
    assert "guardrails.input.blocked_terms" in body["message"]
    assert fake_pool.server.embedding_requests() == []  # nothing reached the provider
    refused = AuditEvent.objects.get(event_type="embedding.refused")
    assert refused.payload["refusal"] == {"field": "input[1]", "rule": "guardrails.input.blocked_terms"}
    assert "insider" not in json.dumps(refused.payload)


def test_the_length_limit_applies_to_each_input(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI, alpha: Any
) -> None:
    publish_policy(
        alpha, {"guardrails": {"input": {"length": {"enabled": True, "action": "block", "max_chars": 10}}}}
    )
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="embed", input=["short", "this one is too long"])
    assert err.value.body["param"] == "input[1]" and "guardrails.input.length" in err.value.body["message"]
    assert fake_pool.server.embedding_requests() == []


@pytest.mark.parametrize("tokens", [[1, 2, 3], [[1, 2], [3, 4]]])
def test_token_arrays_are_refused_naming_input(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI, tokens: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="embed", input=tokens)
    assert err.value.body["param"] == "input" and err.value.body["code"] == "unsupported_input"
    assert "policy" in err.value.body["message"]
    assert fake_pool.server.embedding_requests() == []


def test_bad_parameters_are_refused_by_name(
    api_server: Any, fake_pool: Any, embed_pool: Pool, api_key: Any
) -> None:
    url = f"{api_server.url}/v1/embeddings"
    headers = {"Authorization": f"Bearer {api_key[1]}"}
    for body, param in (
        ({"model": "embed", "input": []}, "input"),
        ({"model": "embed", "input": ["ok", ""]}, "input[1]"),
        ({"model": "embed", "input": ["ok", 3]}, "input[1]"),
        ({"model": "embed", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "embed", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "embed", "input": "x", "stream": True}, "stream"),
        ({"input": "x"}, "model"),
    ):
        response = httpx.post(url, json=body, headers=headers, timeout=30)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"] == param, body
    assert httpx.get(url, headers=headers, timeout=30).status_code == 405


def test_a_pool_without_an_embeddings_api_is_refused_naming_model(
    fake_pool: Any, sdk: openai.OpenAI, alpha: Any
) -> None:
    from tests.factories.workers import ProviderFactory

    provider = ProviderFactory(
        kind="anthropic", base_url="", team=alpha, slug="anth", api_key="sk-ant-test-0000"
    )
    worker = worker_create(
        actor=None, provider=provider, slug="claude", display_name="Claude", model_name="claude-x"
    )
    pool_create(
        actor=None, team=alpha, slug="claude-pool", name="Claude", workers=[worker], default_worker=worker
    )
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="claude-pool", input="hi")
    assert err.value.body["param"] == "model" and "anthropic" in err.value.body["message"]


def test_scope_budget_and_token_limits_refuse_before_the_provider(
    api_server: Any, fake_pool: Any, embed_pool: Pool, alpha: Any, team_admin: Any
) -> None:
    reader = make_api_key(alpha, name="reader", role="read", principal=team_admin).plaintext
    client = openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=reader, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.embeddings.create(model="embed", input="hi")
    assert "runs:write" in denied.value.body["message"]

    runner = make_api_key(alpha, name="runner", principal=team_admin, tokens_per_minute=5).plaintext
    client = openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=runner, max_retries=0)
    client.embeddings.create(model="embed", input="one two three four five six")  # 6 tokens charged
    with pytest.raises(openai.RateLimitError) as limited:
        client.embeddings.create(model="embed", input="again")
    assert "tokens per minute" in limited.value.body["message"]

    publish_policy(alpha, {"budgets": {"daily": {"hard_usd": "1.00"}}})
    RunFactory(team=alpha, pool=fake_pool.pool, cost_usd=Decimal("1.20"), status="succeeded")
    key = make_api_key(alpha, name="budgeted", principal=team_admin).plaintext
    client = openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as spent:
        client.embeddings.create(model="embed", input="hi")
    assert spent.value.body["code"] == "budget_exhausted" and "daily budget" in spent.value.body["message"]
    assert len(fake_pool.server.embedding_requests()) == 1  # only the first runner call


def test_embedding_spend_counts_against_the_team_budget(
    fake_pool: Any, sdk: openai.OpenAI, alpha: Any, owner: Any
) -> None:
    from apps.runs.services import RunRefused, run_create

    # $0.50 per input token: one call of 3 tokens spends a $1 daily budget.
    worker = worker_create(
        actor=None, provider=fake_pool.provider, slug="dear-embedder", display_name="Dear", model_name=EMBED_MODEL,
        input_price_per_mtok="500000", output_price_per_mtok="500000",
    )  # fmt: skip
    pool_create(actor=None, team=alpha, slug="dear", name="Dear", workers=[worker], default_worker=worker)
    publish_policy(alpha, {"budgets": {"daily": {"hard_usd": "1.00"}}})
    sdk.embeddings.create(model="dear", input="one two three")
    with pytest.raises(openai.RateLimitError) as spent:
        sdk.embeddings.create(model="dear", input="again")
    assert (
        spent.value.body["code"] == "budget_exhausted"
        and "daily budget ($1.00)" in spent.value.body["message"]
    )
    with pytest.raises(RunRefused) as refused:  # runs share the budget the embeddings spent
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="hello", source="playground")
    assert refused.value.code == "budget_exhausted"
    assert len(fake_pool.server.embedding_requests()) == 1


def test_a_provider_failure_is_a_named_5xx_in_openai_shape_without_the_key(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI
) -> None:
    from tests.fakes.openai_server import openai_error

    fake_pool.server.script(
        openai_error("server_error"), openai_error("server_error"), openai_error("server_error")
    )
    with pytest.raises(openai.InternalServerError) as err:
        sdk.embeddings.create(model="embed", input="hi")
    assert err.value.status_code == 502 and err.value.body["code"] == "provider_unavailable"
    assert fake_pool.api_key not in json.dumps(err.value.body)


# --- unknown models: suggestions the key may use, on every /v1 surface ------------------------------


def test_unknown_model_404s_suggest_close_names_the_key_may_use(
    api_server: Any, fake_pool: Any, embed_pool: Pool, api_key: Any, beta: Any
) -> None:
    from tests.factories.workers import ProviderFactory, WorkerFactory

    provider = ProviderFactory(team=beta, slug="beta-fake", base_url=fake_pool.base_url)
    worker = WorkerFactory(provider=provider, slug="beta-worker")
    pool_create(
        actor=None, team=beta, slug="fakes-beta", name="Beta", workers=[worker], default_worker=worker
    )
    headers = {
        "Authorization": f"Bearer {api_key[1]}",
        "x-api-key": api_key[1],
        "anthropic-version": "2023-06-01",
    }
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for path, body in (
        ("/v1/chat/completions", chat),
        ("/v1/responses", {"input": "hi"}),
        ("/v1/messages", {**chat, "max_tokens": 5}),
        ("/v1/embeddings", {"input": "hi"}),
    ):
        response = httpx.post(
            f"{api_server.url}{path}", json={**body, "model": "fakes"}, headers=headers, timeout=30
        )
        assert response.status_code == 404, (path, response.text)
        error = response.json()["error"]
        assert "Did you mean 'fake'" in error["message"], path
        assert "fakes-beta" not in error["message"], path  # another team's pool is never named
    detail = httpx.get(f"{api_server.url}/v1/models/conductor-mni", headers=headers, timeout=30)
    assert detail.status_code == 404 and "'conductor-mini'" in detail.json()["error"]["message"]
    far = httpx.post(
        f"{api_server.url}/v1/embeddings",
        json={"model": "zzzzzz", "input": "hi"},
        headers=headers,
        timeout=30,
    )
    assert far.status_code == 404 and "Did you mean" not in far.json()["error"]["message"]


# --- the local model embeds -------------------------------------------------------------------------


def test_local_pool_refuses_dimensions_by_name(local_pool: Any, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk.embeddings.create(model="local", input="hi", dimensions=8)
    assert err.value.body["param"] == "dimensions" and "local" in err.value.body["message"]


@pytest.mark.slow
def test_local_model_embeds_through_the_policy(local_pool: Any, sdk: openai.OpenAI, alpha: Any) -> None:
    publish_policy(
        alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact", "types": ["card"]}}}}
    )
    texts = ["Paris is the capital of France.", f"card {CARD}", "card 5555 5555 5555 4444"]
    result = sdk.embeddings.create(model="local", input=texts, encoding_format="float")
    vectors = [d.embedding for d in result.data]
    assert len(vectors) == 3 and len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 8
    assert all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in vectors)  # unit length, as OpenAI's
    assert result.usage.prompt_tokens > 0 and result.usage.total_tokens == result.usage.prompt_tokens
    # Both cards were masked before the model read them: the two texts embed the same.
    assert vectors[1] == pytest.approx(vectors[2])
    row = AuditEvent.objects.get(event_type="embedding.created")
    assert row.payload["provider_kind"] == "local" and row.payload["cost_usd"] == "0"
