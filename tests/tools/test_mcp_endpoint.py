"""The governed /mcp endpoint (issue 43 item 3): the official SDK's client lists and calls the
team's tools on a live daphne under an API key's ``tools:call`` scope, through the same gate and
audit as a run's calls, and is refused outside the scope with the rule named."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from apps.audit.models import AuditEvent
from apps.tools.models import ToolCall
from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.runtime]


async def _session(url: str, key: str, fn: Any) -> Any:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client,
    ):
        return await fn(client)


def _run(url: str, key: str, fn: Any) -> Any:
    return asyncio.run(_session(url, key, fn))


def test_an_mcp_client_lists_and_calls_the_teams_tools_under_its_scope(
    alpha: Any, policy_admin: Any, crm: Any, mcp_http: Any, daphne_server: Any
) -> None:
    publish_policy(alpha, {"tools": {"denied_tools": ["crm.wire_money"]}})
    key = make_api_key(alpha, scopes=["tools:call"], principal=policy_admin).plaintext
    url = f"{daphne_server.url}/mcp"

    async def both(client: Any) -> Any:
        listed = await client.list_tools()
        added = await client.call_tool("crm.add", {"a": 20, "b": 22})
        denied = await client.call_tool("crm.wire_money", {"account": "x", "amount": 5})
        evil = await client.call_tool("crm.lookup", {"customer_id": "evil"})
        return listed, added, denied, evil

    listed, added, denied, evil = _run(url, key, both)
    names = sorted(t.name for t in listed.tools)
    assert names == ["crm.add", "crm.lookup"]  # the denied tool is not offered
    assert not added.is_error and added.content[0].text == "42"
    assert denied.is_error and "tools.denied_tools" in denied.content[0].text
    assert evil.is_error and "tools.output.injection" in evil.content[0].text
    assert "IGNORE" not in evil.content[0].text
    assert [c["tool"] for c in mcp_http.calls()] == ["add", "lookup"]
    calls = {c.qualified_name: c for c in ToolCall.objects.all()}
    assert calls["crm.add"].source == "mcp" and calls["crm.add"].api_key_id is not None
    assert AuditEvent.objects.filter(event_type="tool.called").count() == 3


def test_a_key_without_the_tools_scope_is_refused_naming_it(
    alpha: Any, policy_admin: Any, crm: Any, mcp_http: Any, daphne_server: Any
) -> None:
    key = make_api_key(alpha, scopes=["runs:write"], principal=policy_admin).plaintext
    resp = httpx2.post(
        f"{daphne_server.url}/mcp",
        headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    )
    assert resp.status_code == 403
    assert (
        resp.json()["error"]["data"]["rule"] == "apikey.scope"
        and "tools:call" in resp.json()["error"]["message"]
    )
    anonymous = httpx2.post(
        f"{daphne_server.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    )
    assert anonymous.status_code == 401
    with pytest.raises(BaseException):  # noqa: B017 - the SDK raises its own error group
        _run(f"{daphne_server.url}/mcp", key, lambda c: c.list_tools())
    assert mcp_http.calls() == []


def test_another_teams_key_sees_none_of_alphas_tools(
    beta: Any, outsider: Any, crm: Any, mcp_http: Any, daphne_server: Any
) -> None:
    key = make_api_key(beta, scopes=["tools:call"], principal=outsider).plaintext
    url = f"{daphne_server.url}/mcp"

    async def go(client: Any) -> Any:
        return await client.list_tools(), await client.call_tool("crm.add", {"a": 1, "b": 1})

    listed, called = _run(url, key, go)
    assert listed.tools == []
    assert called.is_error and "tools.unknown_tool" in called.content[0].text
    assert mcp_http.calls() == []


SECURITY_HEADERS = (
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
    "cross-origin-opener-policy",
    "content-security-policy",
)


def test_mcp_answers_carry_the_security_headers_of_v1(
    alpha: Any, policy_admin: Any, crm: Any, daphne_server: Any
) -> None:
    key = make_api_key(alpha, scopes=["tools:call", "runs:write"], principal=policy_admin).plaintext
    v1 = httpx2.get(f"{daphne_server.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert v1.status_code == 200
    expected = {name: v1.headers.get(name) for name in SECURITY_HEADERS}
    assert expected["x-frame-options"] and expected["x-content-type-options"] == "nosniff"
    ok = httpx2.post(
        f"{daphne_server.url}/mcp",
        headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    )
    refused = httpx2.post(
        f"{daphne_server.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    )
    assert refused.status_code == 401
    for resp in (ok, refused):
        assert {name: resp.headers.get(name) for name in SECURITY_HEADERS} == expected, resp.status_code
        assert resp.headers["x-request-id"].startswith("req_")


def _post(app: Any, key: str, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    from tests.api.test_v1_asgi_chain import call

    headers = (
        (b"authorization", f"Bearer {key}".encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
    )
    return asyncio.run(call(app, "POST", "/mcp", body=json.dumps(payload).encode(), headers=headers))


def test_mcp_errors_never_leak_internals(
    alpha: Any, policy_admin: Any, crm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.api import mcp_endpoint
    from conductor_web.handlers import with_api_headers

    app = with_api_headers(mcp_endpoint.app)
    key = make_api_key(alpha, scopes=["tools:call"], principal=policy_admin).plaintext
    secret = "password=hunter2 at db.internal:5432"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(secret)

    monkeypatch.setattr(mcp_endpoint, "tool_call", broken)
    monkeypatch.setattr(mcp_endpoint, "_listable", broken)
    call = {"name": "crm.add", "arguments": {"a": 1, "b": 2}}
    for method, params in (("tools/call", call), ("tools/list", {})):
        status, headers, body = _post(
            app, key, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        )
        assert status == 200 and b"hunter2" not in body and b"RuntimeError" not in body, body
        assert b"Internal error" in body or b"internal_error" in body, body
        assert headers["x-content-type-options"] == "nosniff"
    # An error before the SDK (the key lookup failing): a JSON-RPC error naming the request id.
    monkeypatch.setattr(mcp_endpoint, "_authenticate", broken)
    status, headers, body = _post(app, key, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert status == 500 and b"hunter2" not in body
    error = json.loads(body)["error"]
    assert error["data"] == {"rule": "internal_error", "request_id": headers["x-request-id"]}
    assert headers["x-frame-options"]
