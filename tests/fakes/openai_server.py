"""A fake OpenAI API speaking the real wire format on a loopback socket.

    server = FakeOpenAIServer(lambda req: "hello").start()
    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test")
    ...
    server.stop()

Endpoints: POST /v1/chat/completions (JSON, or SSE `data:` chunks ending `data: [DONE]` when
`stream: true`, with a usage chunk when `stream_options.include_usage`), POST /v1/embeddings
(deterministic vectors from each text's SHA-256: `embedding_of(text, dims)`; `float` or `base64`;
`dimensions` honoured; a scripted `FakeError` answers instead), GET /v1/models.
Errors use OpenAI's real bodies: see `openai_error`.
Usable standalone as an `openai_compatible` provider: `python -m tests.fakes.openai_server`.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import struct
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fakes.base import (
    FakeError,
    FakeReply,
    FakeServerBase,
    before_reply,
    count_prompt_tokens,
    pause_point,
    simulate_latency,
    split_chunks,
)

_ids = itertools.count(1)


def openai_error(
    kind: str, *, model: str = "gpt-4o-mini", retry_after: float | None = None, key: str = "sk-wrong-key-0000"
) -> FakeError:
    """Real OpenAI error bodies: auth, model_not_found, context_length, bad_request,
    rate_limited, quota, server_error (500), unavailable (503)."""

    def body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
        return {"error": {"message": message, "type": type_, "param": param, "code": code}}

    if kind == "auth":
        # The real API echoes part of the presented key; the fake echoes all of it (worse case).
        return FakeError(
            401,
            body(
                f"Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            ),
        )
    if kind == "model_not_found":
        return FakeError(
            404,
            body(
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
            ),
        )
    if kind == "context_length":
        return FakeError(
            400,
            body(
                "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. "
                "Please reduce the length of the messages.",
                "invalid_request_error",
                "context_length_exceeded",
                "messages",
            ),
        )
    if kind == "bad_request":
        return FakeError(
            400,
            body("Invalid value for 'temperature'.", "invalid_request_error", "invalid_value", "temperature"),
        )
    if kind == "rate_limited":
        headers = {"retry-after": str(retry_after if retry_after is not None else 0)}
        return FakeError(
            429,
            body(
                f"Rate limit reached for {model} on requests per min (RPM): Limit 3, Used 3, Requested 1.",
                "requests",
                "rate_limit_exceeded",
            ),
            headers,
        )
    if kind == "quota":
        return FakeError(
            429,
            body(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
            ),
        )
    if kind == "server_error":
        return FakeError(
            500,
            body(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                None,
            ),
        )
    if kind == "unavailable":
        return FakeError(
            503, body("The engine is currently overloaded, please try again later.", "server_error", None)
        )
    raise ValueError(f"unknown error kind {kind!r}")


EMBEDDING_DIMS = 8


def embedding_of(text: str, dims: int = EMBEDDING_DIMS) -> list[float]:
    """The fake's vector for ``text``: deterministic, so a test can tell which text was embedded
    (values exact in float32, so ``base64`` and ``float`` answers compare equal)."""
    seed = hashlib.sha256(text.encode()).digest()
    return [(seed[i % len(seed)] - 128) / 128 for i in range(dims)]


class FakeOpenAIServer(FakeServerBase):
    default_model = "gpt-4o-mini"

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def chat_requests(self) -> list[Any]:
        return self.posts("/chat/completions")

    def handle(
        self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> None:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            presented = headers.get("authorization", "").removeprefix("Bearer ")
            self.send_error_reply(handler, openai_error("auth", key=presented or "(none)"))
            return
        if method == "GET" and path == "/v1/models":
            models = self.models or [self.default_model]
            self.send_json(
                handler,
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "created": 1700000000, "owned_by": "fake"}
                        for m in models
                    ],
                },
            )
            return
        if method == "POST" and path == "/v1/chat/completions":
            self._chat(handler, body or {})
            return
        if method == "POST" and path == "/v1/embeddings":
            self._embeddings(handler, body or {})
            return
        self.send_json(
            handler,
            404,
            {
                "error": {
                    "message": f"Unknown request URL: {method} {path}",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "unknown_url",
                }
            },
        )

    def embedding_requests(self) -> list[Any]:
        return self.posts("/embeddings")

    def _embeddings(self, handler: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        model = str(req.get("model", "text-embedding-3-small"))
        if self.models is not None and model not in self.models:
            self.send_error_reply(handler, openai_error("model_not_found", model=model))
            return
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if isinstance(scripted, FakeError):
            self.send_error_reply(handler, scripted)
            return
        texts = req.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        dims = int(req.get("dimensions") or EMBEDDING_DIMS)
        data = []
        for i, text in enumerate(texts):
            vector = embedding_of(str(text), dims)
            encoded: Any = vector
            if req.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(len(str(t).split()) for t in texts) or 1
        self.send_json(
            handler,
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _chat(self, handler: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        model = str(req.get("model", self.default_model))
        if self.models is not None and model not in self.models:
            self.send_error_reply(handler, openai_error("model_not_found", model=model))
            return
        reply = self.next_reply(req)
        if isinstance(reply, FakeError):
            self.send_error_reply(handler, reply)
            return
        if isinstance(reply, str):
            reply = FakeReply(reply)
        before_reply(reply)
        model = reply.model or model
        chunks = reply.chunks if reply.chunks is not None else split_chunks(reply.text)
        text = "".join(chunks) if reply.chunks is not None else reply.text
        finish = "stop"
        # Like the real API: max_tokens cuts the answer (one chunk ~ one token) with "length".
        limit = req.get("max_tokens") or req.get("max_completion_tokens")
        if isinstance(limit, int) and len(chunks) > limit:
            chunks = chunks[:limit]
            text = "".join(chunks)
            finish = "length"
        calls = [
            {
                "id": call.get("id") or f"call_fake{next(_ids)}",
                "type": "function",
                "function": {"name": call["name"], "arguments": call.get("arguments", "{}")},
            }
            for call in reply.tool_calls or []
        ]
        if calls:
            finish = "tool_calls"
        prompt = (
            reply.input_tokens
            if reply.input_tokens is not None
            else count_prompt_tokens(req.get("messages", []))
        )
        completion = (
            reply.output_tokens if reply.output_tokens is not None else max(len(chunks), 1 if text else 0)
        )
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        cid = f"chatcmpl-fake{next(_ids)}"
        created = int(time.time())
        if not req.get("stream"):
            payload: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text or (None if calls else ""),
                            "refusal": None,
                            **({"tool_calls": calls} if calls else {}),
                        },
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                "system_fingerprint": "fp_fake",
            }
            if reply.include_usage:
                payload["usage"] = usage
            self.send_json(handler, 200, payload, reply.headers)
            return

        def chunk(delta: dict[str, Any], finish: str | None) -> str:
            return json.dumps(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "system_fingerprint": "fp_fake",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                }
            )

        self.start_sse(handler, reply.headers)
        self.write_sse(handler, chunk({"role": "assistant", "content": "", "refusal": None}, None))
        for sent, piece in enumerate(chunks):
            pause_point(reply, sent)
            simulate_latency(reply.chunk_delay)
            self.write_sse(handler, chunk({"content": piece}, None))
        for i, call in enumerate(calls):
            head = {**call, "index": i, "function": {"name": call["function"]["name"], "arguments": ""}}
            self.write_sse(handler, chunk({"tool_calls": [head]}, None))
            arguments = call["function"]["arguments"]
            for start in range(0, len(arguments), 8):
                part = {"index": i, "function": {"arguments": arguments[start : start + 8]}}
                self.write_sse(handler, chunk({"tool_calls": [part]}, None))
        self.write_sse(handler, chunk({}, finish))
        include = bool((req.get("stream_options") or {}).get("include_usage")) and reply.include_usage
        if include:
            self.write_sse(
                handler,
                json.dumps(
                    {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                ),
            )
        self.write_sse(handler, "[DONE]")


if __name__ == "__main__":  # pragma: no cover — manual use as an openai_compatible provider
    import signal
    import sys

    srv = FakeOpenAIServer(lambda req: "This is the fake OpenAI server.").start()
    print(srv.base_url, flush=True)
    try:
        signal.pause()  # serve until interrupted
    except KeyboardInterrupt:
        srv.stop()
        sys.exit(0)
