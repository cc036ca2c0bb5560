"""Talking to MCP tool servers (issue 43): list and call tools over streamable HTTP or stdio.

Pure Python, no Django: the tools app builds a ``ToolServerSpec`` from a registered server (its
credential decrypted there) and hands it here with the operator's ``EgressPolicy``.

* Streamable HTTP goes through an httpx2 client whose network backend resolves once, checks every
  address with ``apps.engine.egress.resolve_checked`` and connects to exactly those addresses, the
  same rule the provider clients follow (``_egress_http``); proxies from the environment are
  ignored and the SDK follows no redirect off the endpoint's origin.
* Stdio starts the registered command with only the SDK's safe environment plus the server's
  credential (never the server's own secrets); who may register a command is decided above.

The SDK is async; callers here are sync (Celery tasks, the executor's threads, services), so each
call runs its own event loop on a short-lived thread: safe even when the caller is inside a loop.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from apps.engine.egress import EgressDenied, EgressPolicy, resolve_checked

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

TRANSPORTS = ("http", "stdio")
# Tool output beyond this many characters is cut before anything (gate, model, audit) reads it.
MAX_OUTPUT_CHARS = 64_000


class ToolServerError(Exception):
    """The server could not be reached or answered with a protocol error. ``str`` is safe to show."""


class ToolChanged(ToolServerError):
    """The server now announces the tool differently from the accepted version: not called."""

    def __init__(self, tool: DiscoveredTool | None) -> None:
        self.tool = tool
        super().__init__(
            "The tool is no longer offered by its server."
            if tool is None
            else "The tool's description or input schema changed since it was accepted; an administrator must accept the new version."
        )


@dataclass(frozen=True, slots=True)
class ToolServerSpec:
    transport: str  # "http" | "stdio"
    url: str = ""
    command: tuple[str, ...] = ()
    # Sent with every HTTP request (the credential lives here); for stdio, the child's extra env.
    headers: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class DiscoveredTool:
    name: str
    description: str
    input_schema: dict[str, Any]

    @property
    def digest(self) -> str:
        """What an admin accepts: the name, description and schema exactly as the server sent them.
        Any change (a poisoned description, a widened schema) is a new digest, so a new version."""
        return tool_digest(self.name, self.description, self.input_schema)


def tool_digest(name: str, description: str, input_schema: Mapping[str, Any]) -> str:
    canonical = json.dumps(
        {"name": name, "description": description, "input_schema": input_schema},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str
    is_error: bool
    latency_ms: float
    truncated: bool = False


# --- egress-checked async HTTP ----------------------------------------------------------------------


def _http_client(policy: EgressPolicy, headers: Mapping[str, str], timeout_s: float) -> Any:
    # Lazy: httpx2/httpcore2/mcp load only when a tool server is used.
    import anyio
    import httpcore2
    import httpx2

    class _Backend(httpcore2.AsyncNetworkBackend):
        def __init__(self) -> None:
            self._inner = httpcore2.AnyIOBackend()

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Iterable[Any] | None = None,
        ) -> Any:
            try:
                infos = await anyio.to_thread.run_sync(resolve_checked, host, port, policy)
            except EgressDenied as denied:
                raise httpcore2.ConnectError(str(denied)) from denied
            except (OSError, UnicodeError) as err:
                raise httpcore2.ConnectError(f"Could not resolve {host}.") from err
            last: Exception | None = None
            for *_ignored, sockaddr in infos:
                try:
                    return await self._inner.connect_tcp(
                        str(sockaddr[0]), port, timeout, local_address, socket_options
                    )
                except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as err:
                    last = err
            raise last or httpcore2.ConnectError(f"No address for {host}.")

        async def sleep(self, seconds: float) -> None:
            await self._inner.sleep(seconds)

    class _Transport(httpx2.AsyncHTTPTransport):
        def __init__(self) -> None:
            self._pool = httpcore2.AsyncConnectionPool(
                ssl_context=httpx2.create_ssl_context(verify=True, trust_env=True),
                network_backend=_Backend(),
            )

    return httpx2.AsyncClient(
        transport=_Transport(),
        headers=dict(headers),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx2.Timeout(timeout_s, read=timeout_s),
    )


def _find(exc: BaseException, kind: type[E]) -> E | None:
    """The first ``kind`` in an exception's causes and groups (anyio wraps errors in groups)."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kind):
            return e
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                stack.append(nxt)
    return None


# --- sessions -----------------------------------------------------------------------------------------


async def _with_client(spec: ToolServerSpec, policy: EgressPolicy, body: Callable[[Any], Awaitable[T]]) -> T:
    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    if spec.transport == "http":
        http = _http_client(policy, spec.headers, spec.timeout_s)
        async with http:
            transport = streamable_http_client(spec.url, http_client=http)
            with anyio.fail_after(spec.timeout_s):
                async with Client(transport, mode="legacy", cache=None) as client:
                    return await body(client)
    if spec.transport == "stdio":
        if not spec.command:
            raise ToolServerError("The stdio server has no command.")
        params = StdioServerParameters(
            command=spec.command[0], args=list(spec.command[1:]), env=dict(spec.env)
        )
        with anyio.fail_after(spec.timeout_s):
            async with Client(params, mode="legacy", cache=None) as client:
                return await body(client)
    raise ToolServerError(f"Unknown transport {spec.transport!r}.")


def _run(spec: ToolServerSpec, policy: EgressPolicy, body: Callable[[Any], Awaitable[T]]) -> T:
    import asyncio

    def target() -> T:
        return asyncio.run(_with_client(spec, policy, body))

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp") as pool:
        try:
            return pool.submit(target).result()
        except Exception as exc:
            own = _find(exc, ToolServerError)
            if own is not None:
                raise own from None
            if _find(exc, TimeoutError) is not None:
                raise ToolServerError(
                    f"The tool server did not answer within {spec.timeout_s:g} s."
                ) from None
            denied = _find(exc, EgressDenied)
            if denied is not None:
                raise ToolServerError(f"Egress refused: {denied}") from None
            # The SDK's messages can carry the URL; the header (credential) never reaches them.
            raise ToolServerError(f"The tool server failed: {type(exc).__name__}") from None


def list_tools(spec: ToolServerSpec, policy: EgressPolicy) -> list[DiscoveredTool]:
    async def body(client: Any) -> list[DiscoveredTool]:
        result = await client.list_tools()
        return [
            DiscoveredTool(
                name=t.name,
                description=t.description or "",
                input_schema=dict(t.input_schema or {}),
            )
            for t in result.tools
        ]

    return _run(spec, policy, body)


def _content_text(result: Any) -> str:
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:
            # Images, audio, resources: named, not inlined (a model reads text only here).
            parts.append(f"[{getattr(block, 'type', 'content')} omitted]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, sort_keys=True))
    return "\n".join(parts)


def call_tool(
    spec: ToolServerSpec,
    policy: EgressPolicy,
    name: str,
    arguments: Mapping[str, Any],
    *,
    expect_digest: str | None = None,
) -> ToolResult:
    """Call one tool. With ``expect_digest``, the tool is first listed in the same session and the
    call is made only if the server still announces exactly the accepted version (a server that
    changed the tool between discoveries raises ``ToolChanged`` and runs nothing)."""
    started = time.perf_counter()

    async def body(client: Any) -> Any:
        if expect_digest is not None:
            listed = await client.list_tools()
            now = next(
                (
                    DiscoveredTool(t.name, t.description or "", dict(t.input_schema or {}))
                    for t in listed.tools
                    if t.name == name
                ),
                None,
            )
            if now is None or now.digest != expect_digest:
                raise ToolChanged(now)
        return await client.call_tool(name, dict(arguments))

    result = _run(spec, policy, body)
    text = _content_text(result)
    truncated = len(text) > MAX_OUTPUT_CHARS
    return ToolResult(
        text=text[:MAX_OUTPUT_CHARS],
        is_error=bool(getattr(result, "is_error", False)),
        latency_ms=(time.perf_counter() - started) * 1000,
        truncated=truncated,
    )
