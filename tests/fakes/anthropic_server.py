"""A fake Anthropic Messages API speaking the real wire format on a loopback socket.

    server = FakeAnthropicServer(lambda req: "hello").start()
    client = anthropic.Anthropic(base_url=server.base_url, api_key="sk-ant-test")

Endpoints: POST /v1/messages (JSON, or the SSE event stream message_start,
content_block_start/delta/stop, message_delta with usage, message_stop when `stream: true`;
forced tool calls when the request names `tool_choice`), GET /v1/models.
Errors use Anthropic's real bodies: see `anthropic_error`.
"""

from __future__ import annotations

import itertools
import json
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


def anthropic_error(
    kind: str, *, model: str = "claude-haiku-4-5", retry_after: float | None = None
) -> FakeError:
    """Real Anthropic error bodies: auth, permission, model_not_found, context_length,
    bad_request, rate_limited, server_error (500), overloaded (529), unavailable (503)."""

    def body(type_: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": type_, "message": message}, "request_id": "req_fake"}

    if kind == "auth":
        return FakeError(401, body("authentication_error", "invalid x-api-key"))
    if kind == "permission":
        return FakeError(
            403,
            body("permission_error", "Your API key does not have permission to use the specified resource."),
        )
    if kind == "model_not_found":
        return FakeError(404, body("not_found_error", f"model: {model}"))
    if kind == "context_length":
        return FakeError(
            400, body("invalid_request_error", "prompt is too long: 210432 tokens > 200000 maximum")
        )
    if kind == "bad_request":
        return FakeError(400, body("invalid_request_error", "max_tokens: Field required"))
    if kind == "rate_limited":
        return FakeError(
            429,
            body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit."),
            {"retry-after": str(retry_after if retry_after is not None else 0)},
        )
    if kind == "server_error":
        return FakeError(500, body("api_error", "Internal server error"))
    if kind == "overloaded":
        return FakeError(529, body("overloaded_error", "Overloaded"))
    if kind == "unavailable":
        return FakeError(503, body("api_error", "Service unavailable"))
    raise ValueError(f"unknown error kind {kind!r}")


class FakeAnthropicServer(FakeServerBase):
    default_model = "claude-haiku-4-5"

    @property
    def base_url(self) -> str:
        return self.origin  # the SDK appends /v1/messages

    def message_requests(self) -> list[Any]:
        return self.posts("/v1/messages")

    def handle(
        self, handler: BaseHTTPRequestHandler, method: str, path: str, body: Any, headers: dict[str, str]
    ) -> None:
        # Older SDKs send x-api-key, newer ones a bearer token; the real API accepts both.
        presented = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and presented != self.api_key:
            self.send_error_reply(handler, anthropic_error("auth"))
            return
        if method == "GET" and path == "/v1/models":
            models = self.models or [self.default_model]
            self.send_json(
                handler,
                200,
                {
                    "data": [
                        {"type": "model", "id": m, "display_name": m, "created_at": "2025-09-29T00:00:00Z"}
                        for m in models
                    ],
                    "has_more": False,
                    "first_id": models[0],
                    "last_id": models[-1],
                },
            )
            return
        if method == "POST" and path == "/v1/messages":
            self._messages(handler, body or {})
            return
        self.send_json(
            handler, 404, {"type": "error", "error": {"type": "not_found_error", "message": "Not found"}}
        )

    def _messages(self, handler: BaseHTTPRequestHandler, req: dict[str, Any]) -> None:
        model = str(req.get("model", self.default_model))
        if self.models is not None and model not in self.models:
            self.send_error_reply(handler, anthropic_error("model_not_found", model=model))
            return
        if "max_tokens" not in req:
            self.send_error_reply(handler, anthropic_error("bad_request"))
            return
        reply = self.next_reply(req)
        if isinstance(reply, FakeError):
            self.send_error_reply(handler, reply)
            return
        if isinstance(reply, str):
            reply = FakeReply(reply)
        before_reply(reply)
        model = reply.model or model
        forced = req.get("tool_choice", {}).get("name") if isinstance(req.get("tool_choice"), dict) else None
        tool_input = reply.tool_input
        if forced and tool_input is None:
            try:
                parsed = json.loads(reply.text)
                tool_input = parsed if isinstance(parsed, dict) else {"value": parsed}
            except ValueError:
                tool_input = {"text": reply.text}
        chunks = reply.chunks if reply.chunks is not None else split_chunks(reply.text)
        text = "".join(chunks) if reply.chunks is not None else reply.text
        input_tokens = (
            reply.input_tokens
            if reply.input_tokens is not None
            else count_prompt_tokens(req.get("messages", []), req.get("system"))
        )
        output_tokens = reply.output_tokens if reply.output_tokens is not None else max(len(chunks), 1)
        mid = f"msg_fake{next(_ids)}"
        if forced:
            content: list[dict[str, Any]] = [
                {"type": "tool_use", "id": f"toolu_fake{next(_ids)}", "name": forced, "input": tool_input}
            ]
            stop_reason = "tool_use"
        else:
            content = [{"type": "text", "text": text}]
            stop_reason = "end_turn"
        if not req.get("stream"):
            self.send_json(
                handler,
                200,
                {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
                },
                reply.headers,
            )
            return

        def send(event: str, data: dict[str, Any]) -> None:
            self.write_sse(handler, json.dumps({"type": event, **data}), event=event)

        self.start_sse(handler, reply.headers)
        send(
            "message_start",
            {
                "message": {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 1},
                }
            },
        )
        if forced:
            send("content_block_start", {"index": 0, "content_block": {**content[0], "input": {}}})
            raw = json.dumps(tool_input)
            for i in range(0, len(raw), 16):
                send(
                    "content_block_delta",
                    {"index": 0, "delta": {"type": "input_json_delta", "partial_json": raw[i : i + 16]}},
                )
        else:
            send("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            self.write_sse(handler, json.dumps({"type": "ping"}), event="ping")
            for sent, piece in enumerate(chunks):
                pause_point(reply, sent)
                simulate_latency(reply.chunk_delay)
                send("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
        send("content_block_stop", {"index": 0})
        send(
            "message_delta",
            {
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        )
        send("message_stop", {})
