"""Anthropic Messages API through the official `anthropic` SDK.

System messages map to the top-level `system` parameter and consecutive same-role turns are
merged (the API wants alternating user/assistant turns starting with user). A `json_schema`
becomes a forced tool call whose `input_schema` is the schema; the tool input is returned as
JSON text. Retries are ours (`max_retries=0` on the SDK), see `openai_provider` for why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import anthropic

from apps.engine.egress import EgressPolicy
from apps.engine.generation import GenerationOptions
from apps.engine.providers._http import (
    CallOutput,
    SdkWorker,
    connection_error,
    map_status_error,
    shared_sdk_client,
)
from apps.engine.providers.base import (
    ProviderAuthError,
    ProviderBadResponse,
    ProviderError,
    invalid_json_error,
    redact,
    stream_cut_error,
    timeout_error,
    transport_failure,
)
from apps.engine.providers.gate import OutboundGate, require_gate
from apps.engine.types import Message, Usage, WorkerInfo, WorkerResult

TOOL_NAME = "respond"
JSON_INSTRUCTION = "Reply with one valid JSON object and nothing else: no prose, no code fence."


def to_anthropic(messages: list[Message]) -> tuple[str | None, list[dict[str, str]]]:
    """(system, turns) in the shape the Messages API accepts."""
    system_parts: list[str] = []
    turns: list[dict[str, str]] = []
    for m in messages:
        role, content = m.get("role", "user"), m.get("content", "")
        if role == "system":
            system_parts.append(content)
            continue
        role = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n\n" + content
        else:
            turns.append({"role": role, "content": content})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": "Continue."})
    return ("\n\n".join(system_parts) or None), turns


class AnthropicWorker(SdkWorker):
    timeout_message = "The Anthropic provider did not answer in time."

    def __init__(
        self,
        info: WorkerInfo,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        default_headers: dict[str, str] | None = None,
        gate: OutboundGate,
        egress: EgressPolicy | None = None,
        client: anthropic.Anthropic | None = None,
    ) -> None:
        self.gate = require_gate(gate)
        self.info = info
        self.base_url = base_url
        self.max_retries = max_retries
        self._secret = api_key
        self._host = (urlsplit(base_url).hostname if base_url else "api.anthropic.com") or "the endpoint"
        self._client_error: str | None = None
        if client is not None:
            self._client: anthropic.Anthropic | None = client
        else:
            try:
                self._client = shared_sdk_client(
                    anthropic.Anthropic,
                    api_key=api_key,
                    base_url=base_url,
                    timeout=info.timeout_s,
                    default_headers=default_headers,
                    egress_policy=egress,
                )
            except anthropic.AnthropicError:
                self._client = None
                self._client_error = "No API key is configured for this Anthropic worker."

    def __repr__(self) -> str:  # never shows the key
        return f"AnthropicWorker(key={self.info.key!r}, model={self.info.model!r}, host={self._host!r})"

    def _map(
        self, exc: Exception, *, timeout: float | None = None, received: int | None = None
    ) -> ProviderError:
        """See ``OpenAIWorker._map``: what happened, in words, never the key."""
        if isinstance(exc, anthropic.APIStatusError):
            return map_status_error(
                provider="Anthropic",
                status=exc.status_code,
                body=exc.body,
                headers=exc.response.headers,
                model=self.info.model,
                secrets=(self._secret,),
            )
        if isinstance(exc, ValueError) and hasattr(exc, "doc"):  # json.JSONDecodeError of a 2xx body
            return invalid_json_error("Anthropic", self._host, exc.doc, (self._secret,))
        kind, reported = transport_failure(exc)
        if isinstance(exc, anthropic.APITimeoutError) or kind == "timeout":
            return timeout_error("Anthropic", self._host, timeout, received)
        if kind == "cut":
            return stream_cut_error("Anthropic", self._host, received if received is not None else reported)
        if isinstance(exc, anthropic.APIConnectionError) or kind == "connect":
            return connection_error(exc, provider="Anthropic", host=self._host)
        text = redact(str(exc), (self._secret,))
        if "api_key" in text or "auth" in text.lower():
            return ProviderAuthError(
                "No usable API key is configured for this Anthropic worker.", provider="Anthropic"
            )
        return ProviderError(
            f"The Anthropic call failed ({type(exc).__name__}): {text}", provider="Anthropic"
        )

    def complete(
        self,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        on_delta: Callable[[str], None] | None = None,
        json_schema: dict | None = None,
        options: GenerationOptions | None = None,
    ) -> WorkerResult:
        if self._client is None:
            raise ProviderAuthError(self._client_error or "The Anthropic client is not configured.")
        # Nothing below reads the caller's values: only what the gate admitted is sent.
        admitted = self.gate.admit(messages, json_schema=json_schema, options=options)
        messages, json_schema, options = admitted.messages, admitted.json_schema, admitted.options
        t0 = time.perf_counter()
        timeout = timeout if timeout is not None else self.info.timeout_s
        deadline = time.monotonic() + timeout
        system, turns = to_anthropic(messages)
        params: dict[str, Any] = {
            "model": self.info.model,
            "messages": turns,
            "max_tokens": max_tokens or self.info.max_output_tokens,
        }
        fmt = options.response_format if options is not None else None
        if fmt is not None and fmt.type == "json_schema" and fmt.schema is not None and json_schema is None:
            json_schema = fmt.schema  # native structured output: a forced tool with the schema
        elif fmt is not None:
            system = f"{system}\n\n{JSON_INSTRUCTION}" if system else JSON_INSTRUCTION
        if options is not None:
            if options.stop:
                params["stop_sequences"] = list(options.stop)
            # The Messages API has no seed; temperature and top_p map one to one.
            for name in ("temperature", "top_p"):
                value = getattr(options, name)
                if value is not None:
                    params[name] = min(value, 1.0) if name == "temperature" else value
        if system:
            params["system"] = system
        if json_schema is not None:
            params["tools"] = [
                {
                    "name": TOOL_NAME,
                    "description": "Return the response as structured data.",
                    "input_schema": json_schema,
                }
            ]
            params["tool_choice"] = {"type": "tool", "name": TOOL_NAME}

        return self._call(params, admitted=admitted, t0=t0, deadline=deadline, on_delta=on_delta)

    def _plain(self, params: dict[str, Any], timeout: float) -> CallOutput:
        assert self._client is not None
        try:
            resp = self._client.messages.create(**params, timeout=timeout)
        except (anthropic.AnthropicError, ValueError) as exc:
            raise self._map(exc, timeout=timeout) from None
        if isinstance(resp, str):  # the SDK hands back a non-JSON body as text
            raise invalid_json_error("Anthropic", self._host, resp, (self._secret,), what="response")
        if not isinstance(resp.content, list) or resp.usage is None:
            raise ProviderBadResponse(
                f"Invalid message from the Anthropic provider at {self._host}: the JSON has no "
                "'content' or 'usage'.",
                provider="Anthropic",
            )
        parts: list[str] = []
        ending = {"finish_reason": "length" if resp.stop_reason == "max_tokens" else "stop"}
        for block in resp.content:
            if block.type == "tool_use" and block.name == TOOL_NAME:
                return (
                    json.dumps(block.input),
                    Usage(resp.usage.input_tokens, resp.usage.output_tokens),
                    resp.model,
                    ending,
                )
            if block.type == "text":
                parts.append(block.text)
        return "".join(parts), Usage(resp.usage.input_tokens, resp.usage.output_tokens), resp.model, ending

    def _stream(self, params: dict[str, Any], timeout: float, on_delta: Callable[[str], None]) -> CallOutput:
        assert self._client is not None
        parts: list[str] = []
        tool_json: list[str] = []
        input_tokens = output_tokens = 0
        model = self.info.model
        stream: Any = None
        stopped = False  # message_stop arrived: the provider ended the message itself
        stop_reason: str | None = None
        try:
            stream = self._client.messages.create(**params, stream=True, timeout=timeout)
            with stream:
                for event in stream:
                    if event.type == "message_stop":
                        stopped = True
                    elif event.type == "message_start":
                        model = event.message.model or model
                        input_tokens = event.message.usage.input_tokens or 0
                        output_tokens = event.message.usage.output_tokens or 0
                    elif event.type == "content_block_delta":
                        delta = event.delta
                        if delta.type == "text_delta" and delta.text:
                            parts.append(delta.text)
                            on_delta(delta.text)
                        elif delta.type == "input_json_delta":
                            tool_json.append(delta.partial_json)  # structured output: not user text
                    elif event.type == "message_delta" and event.usage is not None:
                        stop_reason = getattr(event.delta, "stop_reason", None) or stop_reason
                        output_tokens = event.usage.output_tokens or output_tokens
                        if getattr(event.usage, "input_tokens", None):
                            input_tokens = event.usage.input_tokens
            if not stopped:
                raise stream_cut_error("Anthropic", self._host, _received(stream))
        except ProviderError as typed:
            if parts:
                typed.retryable = False  # text already reached the user; a retry would repeat it
            raise
        except Exception as exc:  # the SDK lets transport errors of a stream through unwrapped
            err = self._map(exc, timeout=timeout, received=_received(stream))
            if parts:
                err.retryable = False
            raise err from None
        text = "".join(tool_json) if tool_json else "".join(parts)
        ending = {"finish_reason": "length" if stop_reason == "max_tokens" else "stop"}
        return text, Usage(input_tokens, output_tokens), model, ending


def _received(stream: Any) -> int | None:
    """Body bytes read so far on a streamed response (None before it started)."""
    response = getattr(stream, "response", None)
    count = getattr(response, "num_bytes_downloaded", None)
    return count if isinstance(count, int) else None
