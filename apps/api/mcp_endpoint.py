"""``/mcp``: the team's allowed tools served as one MCP server (issue 43 item 3).

The official SDK's low-level ``Server`` behind its streamable-HTTP session manager (stateless, JSON
responses), mounted beside ``/v1`` (``conductor_web.handlers``). Before the SDK sees a request, the
API key is authenticated and must carry the ``tools:call`` scope (401 / 403 otherwise, the rule
named). The key's team is then the principal: ``tools/list`` shows only tools the team's policy
lets it call, and ``tools/call`` goes through ``apps.tools.calls.tool_call`` — the same gate,
approvals and audit as a worker's call in a run. A refusal is a tool error result naming the rule.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from apps.api.models import ApiKey, ApiScope
from apps.api.services import ApiKeyInvalid, apikey_authenticate
from apps.core.types import Viewer
from apps.policies.services import effective_policy
from apps.tools import selectors
from apps.tools.calls import tool_call

logger = logging.getLogger(__name__)

PATH = "/mcp"


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: int
    team: Any
    user: Viewer


_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("mcp_principal", default=None)


def _current() -> Principal:
    principal = _principal.get()
    if principal is None:  # the ASGI wrapper always sets it; a handler reached otherwise refuses
        raise PermissionError("no authenticated API key")
    return principal


def _listable(team: Any) -> list[types.Tool]:
    """Tools the team may call now: accepted, current, allowed and not blocked by the policy."""
    eff = effective_policy(team).spec.tools
    blocked = {r.tool for r in eff.rules if r.action == "block"}
    out: list[types.Tool] = []
    for server in selectors.servers_for_team(team):
        if not server.enabled:
            continue
        for tool in server.tools.all():
            name = tool.qualified_name
            if name in eff.denied_tools or name in blocked or eff.default_action == "block":
                continue
            if eff.allowed_tools is not None and name not in eff.allowed_tools:
                continue
            version = selectors.usable_version(tool)
            if version is None:
                continue
            out.append(
                types.Tool(
                    name=name,
                    description=version.description,
                    input_schema=version.input_schema or {"type": "object"},
                )
            )
    return out


INTERNAL = "Internal error; the server log has the details."


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    principal = _current()
    try:
        tools = await sync_to_async(_listable, thread_sensitive=False)(principal.team)
    except Exception:
        # Whatever the SDK would make of the exception, its text never reaches the client.
        logger.exception("/mcp tools/list failed")
        raise MCPError(code=INTERNAL_ERROR, message=INTERNAL) from None
    return types.ListToolsResult(tools=tools)


async def _call_tool(ctx: Any, params: Any) -> types.CallToolResult:
    principal = _current()
    try:
        outcome = await sync_to_async(tool_call, thread_sensitive=False)(
            team=principal.team,
            qualified=params.name,
            arguments=dict(params.arguments or {}),
            actor=principal.user,
            api_key_id=principal.key_id,
            source="mcp",
        )
    except Exception:
        logger.exception("/mcp tools/call %s failed", getattr(params, "name", "?"))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"failed: {INTERNAL} (rule: internal_error)")],
            is_error=True,
        )
    if outcome.ok:
        return types.CallToolResult(content=[types.TextContent(type="text", text=outcome.output)])
    text = f"{outcome.status}: {outcome.message} (rule: {outcome.rule})"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def build_server() -> Server[Any]:
    return Server("conductor-web", version="1", on_list_tools=_list_tools, on_call_tool=_call_tool)


class _Manager:
    """The SDK's session manager needs a task group for its lifetime; daphne offers no lifespan,
    so the first request starts it on the serving loop and it lives as long as that loop."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None

    async def get(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        if self.manager is None or self.loop is not loop:
            self.loop = loop
            self.manager = StreamableHTTPSessionManager(build_server(), json_response=True, stateless=True)
            self._ready = asyncio.Event()
            manager, ready = self.manager, self._ready

            async def run() -> None:
                async with manager.run():
                    ready.set()
                    await asyncio.Event().wait()

            # Kept on the instance: a task only referenced by the loop may be collected.
            self._task = loop.create_task(run())
        assert self._ready is not None
        await self._ready.wait()
        return self.manager


_manager = _Manager()


async def _reject(send: Any, status: int, code: str, message: str) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": message, "data": {"rule": code}}}
    )
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="conductor-web mcp"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


def _presented(scope: dict[str, Any]) -> str | None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    auth = headers.get("authorization", "")
    if auth:
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else None
    return headers.get("x-api-key", "").strip() or None


def _authenticate(raw: str) -> tuple[ApiKey, Any, Any]:
    key = apikey_authenticate(raw)
    return key, key.team, key.created_by


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """ASGI app for ``/mcp``: authenticate, check the scope, then the SDK's transport."""
    raw = _presented(scope)
    if raw is None:
        await _reject(
            send, 401, "auth.missing_api_key", "An API key is required (Authorization: Bearer <key>)."
        )
        return
    try:
        key, team, user = await sync_to_async(_authenticate, thread_sensitive=False)(raw)
    except ApiKeyInvalid as err:
        await _reject(send, 401, "auth.invalid_api_key", str(err))
        return
    if ApiScope.TOOLS_CALL.value not in (key.scopes or []):
        await _reject(
            send,
            403,
            "apikey.scope",
            f"This API key lacks the {ApiScope.TOOLS_CALL.value} scope needed for /mcp.",
        )
        return
    manager = await _manager.get()
    token = _principal.set(Principal(key_id=key.pk, team=team, user=user))
    try:
        await manager.handle_request(scope, receive, send)
    finally:
        _principal.reset(token)
