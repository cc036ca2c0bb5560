"""OpenAI and Anthropic providers through the official SDKs against real-socket fakes."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from decimal import Decimal

import pytest

from apps.engine.providers import build_worker
from apps.engine.providers.anthropic_provider import to_anthropic
from apps.engine.providers.base import (
    ProviderAuthError,
    ProviderBadRequest,
    ProviderContextTooLong,
    ProviderError,
    ProviderModelNotFound,
    ProviderRateLimited,
    ProviderTimeout,
    ProviderUnavailable,
    call_with_retries,
    parse_retry_after,
    redact,
)
from apps.engine.providers.gate import gate_without_policy
from apps.engine.providers.pricing import price_call
from apps.engine.types import Usage, WorkerInfo
from tests.fakes.anthropic_server import FakeAnthropicServer, anthropic_error
from tests.fakes.base import FakeReply
from tests.fakes.openai_server import FakeOpenAIServer, openai_error

from .workers import HOLD_LIMIT_S

KEY = "sk-proj-SuperSecretKey1234567890"
ANT_KEY = "sk-ant-api03-SuperSecretKey1234567890"
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The delays ``call_with_retries`` waits between attempts, recorded instead of slept: the
    retry tests check the delay chosen, not how long this machine took."""
    recorded: list[float] = []
    defaults = dict(call_with_retries.__kwdefaults__ or {})
    monkeypatch.setattr(call_with_retries, "__kwdefaults__", {**defaults, "sleep": recorded.append})
    return recorded


@contextlib.contextmanager
def held_reply() -> Iterator[threading.Event]:
    """An event holding a fake's reply until the test sets it. Released at the end, or after a
    safety net so a client that never gives up fails the test instead of hanging it (not a pace)."""
    hold = threading.Event()
    net = threading.Timer(HOLD_LIMIT_S, hold.set)
    net.start()
    try:
        yield hold
    finally:
        net.cancel()
        hold.set()


def oa_worker(
    server: FakeOpenAIServer, *, kind: str = "openai_compatible", model: str = "gpt-4o-mini", **kw: object
):
    info = WorkerInfo(key="oa", name="OA", model=model, provider=kind, timeout_s=5.0)
    return build_worker(
        info, kind=kind, base_url=server.base_url, api_key=KEY, **kw, gate=gate_without_policy()
    )  # type: ignore[arg-type]


def an_worker(server: FakeAnthropicServer, *, model: str = "claude-haiku-4-5", **kw: object):
    info = WorkerInfo(key="an", name="AN", model=model, provider="anthropic", timeout_s=5.0)
    return build_worker(info, base_url=server.base_url, api_key=ANT_KEY, **kw, gate=gate_without_policy())  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- OpenAI


def test_openai_plain(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = lambda req: FakeReply("Hi! How can I help?", input_tokens=12, output_tokens=6)
    w = oa_worker(openai_fake)
    r = w.complete(MSGS, max_tokens=50)
    assert r.text == "Hi! How can I help?"
    assert r.usage == Usage(12, 6)
    assert r.latency_ms > 0 and r.model == "gpt-4o-mini"
    req = openai_fake.chat_requests()[0]
    assert req.json["messages"] == MSGS
    assert req.json["max_tokens"] == 50  # compatible servers get max_tokens
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert "stream" not in req.json


def test_openai_streaming_with_usage(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = lambda req: FakeReply(
        "one two three", chunks=["one ", "two ", "three"], input_tokens=7, output_tokens=3
    )
    deltas: list[str] = []
    r = oa_worker(openai_fake).complete(MSGS, on_delta=deltas.append)
    assert deltas == ["one ", "two ", "three"] and r.text == "one two three"
    assert r.usage == Usage(7, 3)
    body = openai_fake.chat_requests()[0].json
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_openai_stream_reads_events_raw_no_sdk_object_per_chunk(
    openai_fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: a streamed call parses the provider's events itself. The SDK's model builder
    (a pydantic object per chunk: the per-token cost of a pass-through) is never reached, and
    text, tool calls, usage and the finish reason still come through."""
    import openai._models

    def no_objects(*args: object, **kwargs: object) -> None:
        raise AssertionError("an SDK object was built for a streamed chunk")

    monkeypatch.setattr(openai._models, "construct_type", no_objects)
    monkeypatch.setattr(openai._models.BaseModel, "construct", no_objects)
    openai_fake.responder = lambda req: FakeReply(
        "a b c", chunks=["a ", "b ", "c"], input_tokens=5, output_tokens=3
    )
    deltas: list[str] = []
    r = oa_worker(openai_fake).complete(MSGS, on_delta=deltas.append)
    assert deltas == ["a ", "b ", "c"] and r.text == "a b c" and r.usage == Usage(5, 3)
    assert r.finish_reason == "stop"
    openai_fake.responder = lambda req: FakeReply(
        "", tool_calls=[{"id": "call_1", "name": "lookup", "arguments": '{"q": "' + "x" * 80 + '"}'}]
    )
    r = oa_worker(openai_fake).complete(MSGS, on_delta=deltas.append)
    assert r.finish_reason == "tool_calls"
    assert r.tool_calls == (
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "' + "x" * 80 + '"}'},
        },
    )


def test_openai_stream_without_usage_is_estimated(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = lambda req: FakeReply("a b c d", include_usage=False)
    r = oa_worker(openai_fake).complete(MSGS, on_delta=lambda s: None)
    assert r.usage.input_tokens > 0 and r.usage.output_tokens >= 1


def test_openai_structured_output_request(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = lambda req: '{"model_id": [0], "subtasks": ["x"], "access_list": [[]]}'
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    w = oa_worker(openai_fake, kind="openai", structured_outputs=True)
    w.complete(MSGS, json_schema=schema)
    body = openai_fake.chat_requests()[0].json
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == schema
    # compatible endpoints without the opt-in get no response_format
    oa_worker(openai_fake).complete(MSGS, json_schema=schema)
    assert "response_format" not in openai_fake.chat_requests()[1].json


@pytest.mark.parametrize(
    ("kind", "exc", "status"),
    [
        ("auth", ProviderAuthError, 401),
        ("model_not_found", ProviderModelNotFound, 404),
        ("context_length", ProviderContextTooLong, 400),
        ("bad_request", ProviderBadRequest, 400),
        ("quota", ProviderRateLimited, 429),
        ("server_error", ProviderUnavailable, 500),
        ("unavailable", ProviderUnavailable, 503),
    ],
)
def test_openai_errors_are_typed_and_keyless(
    openai_fake: FakeOpenAIServer, kind: str, exc: type[ProviderError], status: int
) -> None:
    openai_fake.responder = lambda req: openai_error(kind, key=KEY)
    w = oa_worker(openai_fake, max_retries=1)
    with pytest.raises(exc) as info:
        w.complete(MSGS)
    err = info.value
    assert err.status == status
    for text in (str(err), repr(err), repr(w)):
        assert KEY not in text and "SuperSecret" not in text
    assert err.__cause__ is None and err.__suppress_context__
    retryable = kind in ("server_error", "unavailable")
    assert len(openai_fake.chat_requests()) == (2 if retryable else 1)


def test_anthropic_wrong_key_against_keyed_server() -> None:
    with FakeAnthropicServer(api_key="sk-ant-right") as server:
        assert isinstance(server, FakeAnthropicServer)
        with pytest.raises(ProviderAuthError):
            an_worker(server).complete(MSGS)


def test_anthropic_clients_are_shared_per_key() -> None:
    # Built per run, shared per configuration: a worker built with another key sends that key.
    with FakeAnthropicServer(api_key="sk-ant-right") as server:
        first, second = an_worker(server), an_worker(server)
        assert first._client is second._client
        info = WorkerInfo(key="an", name="AN", model="claude-haiku-4-5", provider="anthropic", timeout_s=5.0)
        right = build_worker(
            info, base_url=server.base_url, api_key="sk-ant-right", gate=gate_without_policy()
        )
        assert right._client is not first._client
        server.responder = lambda req: FakeReply("ok")
        assert right.complete(MSGS).text == "ok"
        with pytest.raises(ProviderAuthError):
            second.complete(MSGS)


def test_openai_wrong_key_against_keyed_server() -> None:
    with FakeOpenAIServer(api_key="sk-the-right-one") as server:
        assert isinstance(server, FakeOpenAIServer)
        with pytest.raises(ProviderAuthError) as info:
            oa_worker(server).complete(MSGS)
        assert KEY not in str(info.value)


def test_openai_unknown_model_via_model_list() -> None:
    with FakeOpenAIServer(models=["gpt-4o-mini"]) as server:
        assert isinstance(server, FakeOpenAIServer)
        with pytest.raises(ProviderModelNotFound, match="gpt-9"):
            oa_worker(server, model="gpt-9").complete(MSGS)


def test_openai_retry_honours_retry_after(openai_fake: FakeOpenAIServer, sleeps: list[float]) -> None:
    openai_fake.script(openai_error("rate_limited", retry_after=1), "after the wait")
    r = oa_worker(openai_fake).complete(MSGS)
    assert r.text == "after the wait"
    assert sleeps == [1.0]  # the server's Retry-After, not our own jittered backoff
    assert len(openai_fake.chat_requests()) == 2


def test_openai_retries_exhausted(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = lambda req: openai_error("rate_limited", retry_after=0)
    with pytest.raises(ProviderRateLimited):
        oa_worker(openai_fake, max_retries=2).complete(MSGS)
    assert len(openai_fake.chat_requests()) == 3


def test_openai_timeout(openai_fake: FakeOpenAIServer) -> None:
    with held_reply() as hold:
        openai_fake.responder = lambda req: FakeReply("late", hold=hold)
        with pytest.raises(ProviderTimeout):
            oa_worker(openai_fake, max_retries=0).complete(MSGS, timeout=0.3)
        assert not hold.is_set()  # the client gave up on its own: the reply was never sent


def test_openai_connection_refused() -> None:
    server = FakeOpenAIServer().start()
    url = server.base_url
    server.stop()
    w = build_worker(
        WorkerInfo("x", "X", "m", "openai_compatible"),
        base_url=url,
        max_retries=0,
        gate=gate_without_policy(),
    )
    with pytest.raises(ProviderUnavailable, match="Could not connect"):
        w.complete(MSGS)


def test_openai_stream_error_mid_stream_not_retried(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.script(openai_error("server_error"), FakeReply("fine now"))
    deltas: list[str] = []
    r = oa_worker(openai_fake).complete(MSGS, on_delta=deltas.append)
    assert r.text == "fine now" and "".join(deltas) == "fine now"  # error before first delta: retried


def test_openai_models_endpoint(openai_fake: FakeOpenAIServer) -> None:
    import openai

    client = openai.OpenAI(base_url=openai_fake.base_url, api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["gpt-4o-mini"]


# ----------------------------------------------------------------------------- Anthropic


def test_anthropic_plain_and_system_mapping(anthropic_fake: FakeAnthropicServer) -> None:
    anthropic_fake.responder = lambda req: FakeReply("Bonjour", input_tokens=9, output_tokens=2)
    r = an_worker(anthropic_fake).complete(MSGS, max_tokens=64)
    assert r.text == "Bonjour" and r.usage == Usage(9, 2)
    body = anthropic_fake.message_requests()[0].json
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": "Hello there"}]
    assert body["max_tokens"] == 64
    headers = anthropic_fake.message_requests()[0].headers
    assert ANT_KEY in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    assert r.cost_usd is not None and r.priced


def test_anthropic_streaming(anthropic_fake: FakeAnthropicServer) -> None:
    anthropic_fake.responder = lambda req: FakeReply(
        "a b c", chunks=["a ", "b ", "c"], input_tokens=5, output_tokens=3
    )
    deltas: list[str] = []
    r = an_worker(anthropic_fake).complete(MSGS, on_delta=deltas.append)
    assert deltas == ["a ", "b ", "c"] and r.text == "a b c" and r.usage == Usage(5, 3)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_json_schema_is_a_forced_tool(anthropic_fake: FakeAnthropicServer, stream: bool) -> None:
    plan = {"model_id": [0], "subtasks": ["x"], "access_list": [[]]}
    anthropic_fake.responder = lambda req: FakeReply(tool_input=plan)
    schema = {"type": "object", "properties": {"model_id": {"type": "array"}}}
    r = an_worker(anthropic_fake).complete(
        MSGS, json_schema=schema, on_delta=(lambda s: None) if stream else None
    )
    assert json.loads(r.text) == plan
    body = anthropic_fake.message_requests()[0].json
    assert body["tool_choice"] == {"type": "tool", "name": "respond"}
    assert body["tools"][0]["input_schema"] == schema


def test_anthropic_message_shaping() -> None:
    system, turns = to_anthropic(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "q"},
            {"role": "user", "content": "i"},
            {"role": "assistant", "content": "o"},
            {"role": "user", "content": "next"},
        ]
    )
    assert system == "S"
    assert turns == [
        {"role": "user", "content": "q\n\ni"},
        {"role": "assistant", "content": "o"},
        {"role": "user", "content": "next"},
    ]


@pytest.mark.parametrize(
    ("kind", "exc", "retries"),
    [
        ("auth", ProviderAuthError, 0),
        ("permission", ProviderAuthError, 0),
        ("model_not_found", ProviderModelNotFound, 0),
        ("context_length", ProviderContextTooLong, 0),
        ("bad_request", ProviderBadRequest, 0),
        ("server_error", ProviderUnavailable, 1),
        ("overloaded", ProviderUnavailable, 1),
        ("unavailable", ProviderUnavailable, 1),
        ("rate_limited", ProviderRateLimited, 1),
    ],
)
def test_anthropic_errors(
    anthropic_fake: FakeAnthropicServer, kind: str, exc: type[ProviderError], retries: int
) -> None:
    anthropic_fake.responder = lambda req: anthropic_error(kind)
    w = an_worker(anthropic_fake, max_retries=1)
    with pytest.raises(exc) as info:
        w.complete(MSGS)
    assert ANT_KEY not in str(info.value) and ANT_KEY not in repr(w)
    assert len(anthropic_fake.message_requests()) == 1 + retries


def test_anthropic_retry_after(anthropic_fake: FakeAnthropicServer, sleeps: list[float]) -> None:
    anthropic_fake.script(anthropic_error("rate_limited", retry_after=1), "ok")
    assert an_worker(anthropic_fake).complete(MSGS).text == "ok"
    assert sleeps == [1.0]
    assert len(anthropic_fake.message_requests()) == 2


# ----------------------------------------------------------------------------- helpers & pricing


def test_retry_helper_backoff_and_deadline() -> None:
    sleeps: list[float] = []
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ProviderUnavailable("down")
        return "ok"

    assert call_with_retries(flaky, max_retries=3, base_delay=0.1, sleep=sleeps.append) == "ok"
    assert len(sleeps) == 2 and all(0 <= s <= 0.2 for s in sleeps)

    def limited() -> str:
        raise ProviderRateLimited("slow down", retry_after=30)

    with pytest.raises(ProviderRateLimited):  # would sleep past the deadline: give up now
        call_with_retries(limited, max_retries=3, deadline=time.monotonic() + 1, sleep=sleeps.append)

    def fatal() -> str:
        raise ProviderAuthError("bad key")

    with pytest.raises(ProviderAuthError):
        call_with_retries(fatal, max_retries=3, sleep=sleeps.append)


def test_retry_after_parsing_and_redaction() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("garbage") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert "[redacted]" in redact(f"bad key {KEY} here", [KEY])
    assert "sk-ant" not in redact("key sk-ant-api03-abcdefghijkl leaked")


def test_pricing_rules() -> None:
    usage = Usage(1_000_000, 1_000_000)
    local = WorkerInfo("l", "L", "smol", "local")
    assert price_call(local, usage) == (Decimal(0), True)
    known = WorkerInfo("o", "O", "gpt-4o-mini", "openai")
    cost, priced = price_call(known, usage)
    assert priced and cost is not None and cost > 0
    unknown_paid = WorkerInfo("u", "U", "my-private-model", "openai_compatible")
    assert price_call(unknown_paid, usage, base_url="https://llm.example.com/v1") == (None, False)
    configured = WorkerInfo(
        "c",
        "C",
        "my-private-model",
        "openai_compatible",
        input_price_per_mtok=Decimal("1.5"),
        output_price_per_mtok=Decimal("2"),
    )
    assert price_call(configured, usage, base_url="http://localhost:8000/v1") == (Decimal("3.5"), True)
    # A self-hosted model sharing a public name is not priced from the public table.
    assert price_call(
        WorkerInfo("s", "S", "gpt-4o-mini", "openai_compatible"), usage, base_url="http://127.0.0.1:8000/v1"
    ) == (None, False)


def test_factory_rejects_unknown_kind_and_missing_base_url() -> None:
    info = WorkerInfo("x", "X", "m", "openai_compatible")
    with pytest.raises(ValueError, match="base_url"):
        build_worker(info, gate=gate_without_policy())
    with pytest.raises(ValueError, match="unknown provider kind"):
        build_worker(info, kind="nope", gate=gate_without_policy())
    w = build_worker(info, kind="local", model="other", gate=gate_without_policy())
    assert w.info.model == "other" and w.info.provider == "local"


def test_anthropic_timeout(anthropic_fake: FakeAnthropicServer) -> None:
    with held_reply() as hold:
        anthropic_fake.responder = lambda req: FakeReply("late", hold=hold)
        with pytest.raises(ProviderTimeout):
            an_worker(anthropic_fake, max_retries=0).complete(MSGS, timeout=0.3)
        assert not hold.is_set()


def test_workers_share_one_http_client_per_sdk(openai_fake: FakeOpenAIServer) -> None:
    # Building a worker must not build a fresh SSL context each time (see shared_http_client).
    from apps.engine.providers._http import shared_http_client

    a = build_worker(
        WorkerInfo(key="a", name="A", model="m", provider="openai_compatible"),
        kind="openai_compatible",
        base_url=openai_fake.base_url,
        api_key="k",
        gate=gate_without_policy(),
    )
    b = build_worker(
        WorkerInfo(key="b", name="B", model="m", provider="openai_compatible"),
        kind="openai_compatible",
        base_url=openai_fake.base_url,
        api_key="k",
        gate=gate_without_policy(),
    )
    assert a._client._client is b._client._client is shared_http_client("openai")  # type: ignore[attr-defined]
    assert a.complete([{"role": "user", "content": "hi"}]).text
