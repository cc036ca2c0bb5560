"""OpenAI and any OpenAI-compatible endpoint (vLLM, Ollama, Gemini's OpenAI endpoint,
OpenRouter) through the official `openai` SDK.

The SDK's own retries are off (`max_retries=0`): `call_with_retries` owns retrying so that
Retry-After, the step deadline and our typed errors are handled in one place for every provider.
A streamed call is only retried before its first delta — afterwards a retry would repeat text
the user has already seen.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import openai

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
    ProviderTimeout,
    call_with_retries,
    invalid_json_error,
    redact,
    stream_cut_error,
    timeout_error,
    transport_failure,
)
from apps.engine.providers.gate import OutboundGate, require_gate
from apps.engine.providers.pricing import price_call
from apps.engine.types import EmbeddingResult, Message, Usage, WorkerInfo, WorkerResult

logger = logging.getLogger(__name__)

OPENAI_HOSTS = ("api.openai.com",)


class OpenAIWorker(SdkWorker):
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
        structured_outputs: bool | None = None,
        client: openai.OpenAI | None = None,
    ) -> None:
        self.gate = require_gate(gate)
        self.info = info
        self.base_url = base_url
        self.max_retries = max_retries
        host = urlsplit(base_url).hostname if base_url else "api.openai.com"
        self._host = host or "the endpoint"
        is_openai = info.provider == "openai" and (base_url is None or self._host in OPENAI_HOSTS)
        # Structured outputs are an OpenAI feature; compatible servers vary, so it is opt-in there.
        self.structured_outputs = is_openai if structured_outputs is None else structured_outputs
        # OpenAI's newer models reject `max_tokens`; most compatible servers only know it.
        self._tokens_param = "max_completion_tokens" if is_openai else "max_tokens"
        self._secret = api_key
        if client is not None:
            self._client: openai.OpenAI | None = client
            self._client_error: str | None = None
        else:
            try:
                # Local compatible servers (Ollama, vLLM) need no key, but the SDK insists on one.
                sdk_key = api_key or ("not-needed" if info.provider == "openai_compatible" else None)
                self._client = shared_sdk_client(
                    openai.OpenAI,
                    api_key=sdk_key,
                    base_url=base_url,
                    timeout=info.timeout_s,
                    default_headers=default_headers,
                    egress_policy=egress,
                )
                self._client_error = None
            except openai.OpenAIError:
                self._client = None
                self._client_error = "No API key is configured for this OpenAI worker."

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIWorker(key={self.info.key!r}, model={self.info.model!r}, host={self._host!r})"

    # ------------------------------------------------------------------ errors

    @property
    def _provider(self) -> str:
        return "OpenAI" if self.info.provider == "openai" else "OpenAI-compatible"

    def _map(
        self, exc: Exception, *, timeout: float | None = None, received: int | None = None
    ) -> ProviderError:
        """A typed error naming what happened: no connection, a timeout after N s, a stream cut
        after N bytes, an unreadable body, or the provider's HTTP status. Never the key."""
        provider = self._provider
        if isinstance(exc, openai.APIStatusError):
            return map_status_error(
                provider=provider,
                status=exc.status_code,
                body=exc.body,
                headers=exc.response.headers,
                model=self.info.model,
                secrets=(self._secret,),
            )
        if isinstance(exc, ValueError) and hasattr(exc, "doc"):  # json.JSONDecodeError of a 2xx body
            return invalid_json_error(provider, self._host, exc.doc, (self._secret,))
        kind, reported = transport_failure(exc)
        if isinstance(exc, openai.APITimeoutError) or kind == "timeout":
            return timeout_error(provider, self._host, timeout, received)
        if kind == "cut":
            return stream_cut_error(provider, self._host, received if received is not None else reported)
        if isinstance(exc, openai.APIConnectionError):
            return connection_error(exc, provider=provider, host=self._host)
        return ProviderError(
            f"The {provider} call failed ({type(exc).__name__}): {redact(str(exc), (self._secret,))}",
            provider=provider,
        )

    # ------------------------------------------------------------------ calls

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
            raise ProviderAuthError(self._client_error or "The OpenAI client is not configured.")
        # Nothing below reads the caller's values: only what the gate admitted is sent.
        admitted = self.gate.admit(messages, json_schema=json_schema, options=options)
        messages, json_schema, options = admitted.messages, admitted.json_schema, admitted.options
        t0 = time.perf_counter()
        timeout = timeout if timeout is not None else self.info.timeout_s
        deadline = time.monotonic() + timeout
        params: dict[str, Any] = {
            "model": self.info.model,
            "messages": [_wire_message(m) for m in messages],
            self._tokens_param: max_tokens or self.info.max_output_tokens,
        }
        if json_schema is not None and self.structured_outputs:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": json_schema, "strict": False},
            }
        if options is not None:
            params.update(openai_options(options))

        return self._call(params, admitted=admitted, t0=t0, deadline=deadline, on_delta=on_delta)

    def embed(
        self, inputs: list[str], *, dimensions: int | None = None, timeout: float | None = None
    ) -> EmbeddingResult:
        """One ``/v1/embeddings`` call with the texts the gate admitted (each input its own
        field: the policy may have masked parts of it). Retried like a completion."""
        if self._client is None:
            raise ProviderAuthError(self._client_error or "The OpenAI client is not configured.")
        admitted = self.gate.admit((), inputs=inputs)
        texts = admitted.inputs
        t0 = time.perf_counter()
        timeout = timeout if timeout is not None else self.info.timeout_s
        deadline = time.monotonic() + timeout
        params: dict[str, Any] = {"model": self.info.model, "input": texts, "encoding_format": "float"}
        if dimensions is not None:
            params["dimensions"] = dimensions

        def once() -> tuple[list[list[float]], Usage, str]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProviderTimeout("The provider did not answer in time.")
            with admitted.on_wire():
                return self._embed_once(params, left, len(texts))

        vectors, usage, model = call_with_retries(once, max_retries=self.max_retries, deadline=deadline)
        cost, priced = price_call(self.info, usage, model=self.info.model, base_url=self.base_url)
        return EmbeddingResult(
            tuple(tuple(v) for v in vectors),
            usage,
            (time.perf_counter() - t0) * 1000,
            model,
            cost,
            priced,
            outbound=admitted.checks,
        )

    def _embed_once(
        self, params: dict[str, Any], timeout: float, count: int
    ) -> tuple[list[list[float]], Usage, str]:
        assert self._client is not None
        try:
            resp = self._client.embeddings.create(**params, timeout=timeout)
        except (openai.OpenAIError, ValueError) as exc:
            raise self._map(exc, timeout=timeout) from None
        data = getattr(resp, "data", None)
        if isinstance(resp, str) or not isinstance(data, list):
            raise ProviderBadResponse(
                f"Invalid embeddings response from the {self._provider} provider at {self._host}: "
                "the JSON has no 'data' list.",
                provider=self._provider,
            )
        by_index = sorted(data, key=lambda item: int(getattr(item, "index", 0) or 0))
        vectors = [list(getattr(item, "embedding", None) or []) for item in by_index]
        if len(vectors) != count or not all(
            v and all(isinstance(x, (int, float)) for x in v) for v in vectors
        ):
            raise ProviderBadResponse(
                f"Invalid embeddings response from the {self._provider} provider at {self._host}: "
                f"expected {count} vectors of numbers, got {len(vectors)}.",
                provider=self._provider,
            )
        usage_in = getattr(resp.usage, "prompt_tokens", None) if resp.usage is not None else None
        # Some compatible servers omit usage; ~4 characters per token keeps totals meaningful.
        tokens = int(usage_in) if usage_in is not None else max(1, sum(len(t) for t in params["input"]) // 4)
        return vectors, Usage(tokens, 0), resp.model or self.info.model

    def _plain(self, params: dict[str, Any], timeout: float) -> CallOutput:
        assert self._client is not None
        try:
            resp = self._client.chat.completions.create(**params, timeout=timeout)
        except (openai.OpenAIError, ValueError) as exc:
            raise self._map(exc, timeout=timeout) from None
        if isinstance(resp, str):  # the SDK hands back a non-JSON body as text
            raise invalid_json_error(self._provider, self._host, resp, (self._secret,), what="response")
        if not isinstance(resp.choices, list):
            raise ProviderBadResponse(
                f"Invalid chat completion from the {self._provider} provider at {self._host}: "
                "the JSON has no 'choices'.",
                provider=self._provider,
            )
        choice = resp.choices[0] if resp.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments or ""},
            }
            for call in ((choice.message.tool_calls or []) if choice is not None else [])
            if getattr(call, "function", None) is not None
        ]
        usage = (
            Usage(resp.usage.prompt_tokens, resp.usage.completion_tokens)
            if resp.usage
            else _estimate(params, text)
        )
        ending = {
            "finish_reason": _finish(choice.finish_reason if choice else None, calls),
            "tool_calls": calls,
        }
        return text, usage, resp.model or self.info.model, ending

    def _stream(self, params: dict[str, Any], timeout: float, on_delta: Callable[[str], None]) -> CallOutput:
        """The provider's server-sent events read as they are (issue 45): the SDK builds and sends
        the request (its headers, the shared egress-checked client, a status error mapped as a
        plain call's), but each event is one ``json.loads``, not a pydantic chunk object: at a
        token per event that object was the largest per-token cost of a streamed pass-through."""
        assert self._client is not None
        parts: list[str] = []
        usage: Usage | None = None
        model = self.info.model
        response: Any = None
        finished = False  # a finish_reason arrived: the provider ended the answer itself
        finish_reason: str | None = None
        calls: dict[int, dict[str, Any]] = {}  # streamed tool calls by index
        try:
            with self._client.chat.completions.with_streaming_response.create(
                **params, stream=True, stream_options={"include_usage": True}, timeout=timeout
            ) as response:
                for chunk in _sse_data(response.http_response.iter_lines()):
                    if chunk is _DONE:
                        break
                    if not isinstance(chunk, dict):
                        raise ProviderBadResponse(
                            f"Invalid stream event from the {self._provider} provider at {self._host}.",
                            provider=self._provider,
                        )
                    if chunk.get("error") is not None:
                        # What the SDK raises for an error event: mapped as any other failure.
                        error = chunk["error"]
                        message = error.get("message") if isinstance(error, dict) else None
                        raise openai.APIError(
                            str(message or "An error occurred during streaming"),
                            response.http_response.request,
                            body=error,
                        )
                    if chunk.get("model"):
                        model = str(chunk["model"])
                    used = chunk.get("usage")
                    if isinstance(used, dict):
                        usage = Usage(
                            int(used.get("prompt_tokens") or 0), int(used.get("completion_tokens") or 0)
                        )
                    for choice in chunk.get("choices") or ():
                        reason = choice.get("finish_reason")
                        finished = finished or bool(reason)
                        finish_reason = reason or finish_reason
                        delta = choice.get("delta") or {}
                        for delta_call in delta.get("tool_calls") or ():
                            _add_call_delta(calls, delta_call)
                        piece = delta.get("content")
                        if piece:
                            parts.append(piece)
                            on_delta(piece)
            if not finished:
                # A close-delimited stream that ends early looks like a normal end to the SDK.
                raise stream_cut_error(self._provider, self._host, _received(response))
        except ProviderError as typed:
            if parts:
                typed.retryable = False  # text already reached the user; a retry would repeat it
            raise
        except Exception as exc:
            # The SDK's errors, an unreadable event, or the transport failing mid-body (the raw
            # lines come straight from the HTTP client); anything else is not ours to name.
            if not isinstance(exc, openai.OpenAIError | ValueError) and transport_failure(exc)[0] is None:
                raise
            err = self._map(exc, timeout=timeout, received=_received(response))
            if parts:
                err.retryable = False  # text already reached the user; a retry would repeat it
            raise err from None
        text = "".join(parts)
        tool_calls = [calls[i] for i in sorted(calls)]
        ending = {"finish_reason": _finish(finish_reason, tool_calls), "tool_calls": tool_calls}
        return text, usage if usage is not None else _estimate(params, text), model, ending


_DONE = object()


def _sse_data(lines: Iterable[str]) -> Iterator[Any]:
    """The parsed ``data`` of each server-sent event (``_DONE`` for ``[DONE]``): data lines
    joined until the blank line that ends the event, as the SDK's decoder does."""
    data: list[str] = []
    for line in lines:
        if line:
            if line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
            continue  # event:, id:, retry: and comments carry nothing for a chat stream
        if data:
            payload = "\n".join(data)
            data = []
            yield _DONE if payload.startswith("[DONE]") else json.loads(payload)
    if data:
        payload = "\n".join(data)
        yield _DONE if payload.startswith("[DONE]") else json.loads(payload)


def openai_options(options: GenerationOptions) -> dict[str, Any]:
    """A client's generation options as Chat Completions parameters (max_tokens is the call's own)."""
    params: dict[str, Any] = {}
    if options.stop:
        params["stop"] = list(options.stop)
    for name in ("temperature", "top_p", "seed"):
        value = getattr(options, name)
        if value is not None:
            params[name] = value
    if options.response_format is not None:
        params["response_format"] = options.response_format.openai()
    if options.tools:
        params["tools"] = [dict(t) for t in options.tools]
        if options.tool_choice is not None:
            params["tool_choice"] = options.tool_choice
        if options.parallel_tool_calls is not None:
            params["parallel_tool_calls"] = options.parallel_tool_calls
    return params


def _wire_message(message: Message) -> dict[str, Any]:
    """A message as the API takes it: an assistant turn that only calls tools has null content."""
    if message.get("role") == "assistant" and message.get("tool_calls") and not message.get("content"):
        return {**message, "content": None}
    return message


def _finish(reason: str | None, calls: list[dict[str, Any]]) -> str:
    if calls:
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def _add_call_delta(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """Accumulate one streamed tool-call delta (id and name first, arguments in pieces)."""
    entry = calls.setdefault(
        int(delta.get("index") or 0),
        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
    )
    if delta.get("id"):
        entry["id"] = delta["id"]
    fn = delta.get("function")
    if isinstance(fn, dict):
        if fn.get("name"):
            entry["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            entry["function"]["arguments"] += fn["arguments"]


def _received(response: Any) -> int | None:
    """Body bytes read so far on a streamed response (None before it started)."""
    response = getattr(response, "http_response", None)
    count = getattr(response, "num_bytes_downloaded", None)
    return count if isinstance(count, int) else None


def _estimate(params: dict[str, Any], text: str) -> Usage:
    # Some compatible servers omit usage; ~4 characters per token keeps totals meaningful.
    logger.info("provider returned no usage for model %s; estimating", params.get("model"))
    chars_in = sum(len(m.get("content") or "") for m in params.get("messages", []))
    return Usage(max(1, chars_in // 4), max(0, len(text) // 4))
