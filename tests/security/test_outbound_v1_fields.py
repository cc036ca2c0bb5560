"""Fields no guardrail read (issue 39, item 2): on ``/v1`` a secret or card that the policy stops in
``content`` must not reach the provider in any other field either.

Against the live daphne (runs executed by its thread pool, or a Celery worker in distributed mode)
with the official OpenAI client, and the fake OpenAI provider on a real socket recording the exact
bytes it receives. The team's input policy blocks secrets and redacts personal data. For each field
(a message's ``name``, a tool's description, ``stop``, the ``response_format`` schema's
description, an assistant tool call's id and function name, ``tool_call_id``, and the Responses
API's ``function_call.call_id``): a secret there ends the request with a 400 naming the field and
the rule, and the provider's bytes never hold it; a card there reaches the provider masked.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from apps.audit.models import AuditEvent
from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy
from tests.fixtures.workers import solo_pool_of
from tests.security.outbound_helpers import CARD, card_leaked, fresh_secret, leaked

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

POLICY = {
    "guardrails": {
        "input": {
            "secrets": {"enabled": True, "action": "block"},
            "pii": {"enabled": True, "action": "redact", "types": ["card", "email"]},
        }
    }
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = {"role": "user", "content": "What is the weather in Paris?"}


def _history(call_id: str, name: str) -> list[dict[str, Any]]:
    return [
        ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
    ]


# field -> a Chat Completions body carrying ``value`` in that field (and nowhere else)
CHAT_FIELDS: dict[str, Callable[[str], dict[str, Any]]] = {
    "messages[0].name": lambda v: {"messages": [{**ASK, "name": v}]},
    "tools[0].function.description": lambda v: {
        "messages": [ASK],
        "tools": [{"type": "function", "function": {**TOOL["function"], "description": f"Weather. {v}"}}],
    },
    "stop[0]": lambda v: {"messages": [ASK], "stop": [f"END {v}"]},
    "response_format.schema": lambda v: {
        "messages": [ASK],
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "weather",
                "schema": {"type": "object", "description": f"Report. {v}", "properties": {}},
            },
        },
    },
    "messages[1].tool_calls[0].id": lambda v: {
        "messages": _history(f"call {v}", "get_weather"),
        "tools": [TOOL],
    },
    "messages[1].tool_calls[0].function.name": lambda v: {
        "messages": [
            *_history("call_1", f"get {v}")[:2],
            {"role": "tool", "tool_call_id": "call_1", "content": "x"},
        ],
        "tools": [TOOL],
    },
    "messages[2].tool_call_id": lambda v: {
        "messages": [
            *_history("call_1", "get_weather")[:2],
            {"role": "tool", "tool_call_id": f"call {v}", "content": "sunny"},
        ],
        "tools": [TOOL],
    },
}


# Fields that are also part of the one question a run is asked (apps.api.v1.run_request
# .question_from_turns): the input stage reads them too. The others only the outbound gate reads.
# (A tool call's id is echoed by the tool message that answers it: "[result of <id>]".)
INPUT_FIELDS = {
    "messages[1].tool_calls[0].id",
    "messages[1].tool_calls[0].function.name",
    "messages[2].tool_call_id",
}


@pytest.fixture
def v1(daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any) -> Any:
    """Model ``solo``: a one-worker pool, so the chat passes through to the provider as it is."""
    solo_pool_of(fake_pool, alpha)
    publish_policy(alpha, POLICY)
    key = make_api_key(alpha, name="outbound", principal=team_admin).plaintext
    return daphne_server, key


def _post(v1: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    server, key = v1
    return httpx.post(
        f"{server.url}/v1/{path}",
        json={"model": "solo", **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=90,
    )


@pytest.mark.parametrize("field", sorted(CHAT_FIELDS))
def test_a_secret_in_any_chat_field_is_refused_and_never_reaches_the_provider(
    v1: Any, fake_pool: Any, field: str
) -> None:
    secret = fresh_secret()
    resp = _post(v1, "chat/completions", CHAT_FIELDS[field](secret))
    received = fake_pool.server.received()
    assert not leaked(received, secret), f"the provider received the secret from {field}"
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "content_policy_violation"
    assert secret not in resp.text  # the refusal names the rule (and field), not the value
    rows = AuditEvent.objects.filter(event_type__in=("run.outbound_checked", "run.input_checked"))
    assert all(secret not in json.dumps(r.payload) for r in rows)
    if field in INPUT_FIELDS:
        # Already part of the question the input stage reads: blocked there, before any plan.
        assert "input:secrets" in error["message"]
        return
    # Only the outbound gate reads this field: it names the field and the rule, and audits both.
    assert field in error["message"] and "guardrails.input.secrets" in error["message"]
    outbound = [r for r in rows if r.event_type == "run.outbound_checked"]
    assert any(field in json.dumps(r.payload) and r.payload.get("blocked") for r in outbound)


@pytest.mark.parametrize("field", sorted(CHAT_FIELDS))
def test_a_card_in_any_chat_field_reaches_the_provider_masked(v1: Any, fake_pool: Any, field: str) -> None:
    fake_pool.server.responder = lambda req: "{}"  # a JSON object: valid for the response_format case
    resp = _post(v1, "chat/completions", CHAT_FIELDS[field](CARD))
    assert resp.status_code == 200, resp.text
    received = fake_pool.server.received()
    assert received, "the provider was called"
    assert not card_leaked(received), f"the provider received the card from {field}"
    assert b"[REDACTED:card]" in received


def test_a_secret_in_a_responses_call_id_is_refused(v1: Any, fake_pool: Any) -> None:
    secret = fresh_secret()
    call_id = f"call {secret}"
    body = {
        "input": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}],
    }
    resp = _post(v1, "responses", body)
    assert not leaked(fake_pool.server.received(), secret)
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert "input:secrets" in message or "guardrails.input.secrets" in message
    assert secret not in resp.text


def test_a_card_in_a_responses_call_id_reaches_the_provider_masked(v1: Any, fake_pool: Any) -> None:
    call_id = f"call {CARD}"
    body = {
        "input": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}],
    }
    resp = _post(v1, "responses", body)
    assert resp.status_code == 200, resp.text
    received = fake_pool.server.received()
    assert not card_leaked(received)
    assert b"call [REDACTED:card]" in received


def test_an_unreadable_field_is_refused_with_a_400_naming_it(v1: Any, fake_pool: Any) -> None:
    """A tool function with a key the gate does not know: refused before any run, by name."""
    server, key = v1
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=90)
    tool = {"type": "function", "function": {**TOOL["function"], "x-extra": {"note": "anything"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="solo", messages=[ASK], tools=[tool])  # type: ignore[list-item]
    body = caught.value.body
    assert isinstance(body, dict)
    error = body.get("error", body)
    assert error.get("param") == "tools[0].function.x-extra", error
    assert fake_pool.server.posts() == []
