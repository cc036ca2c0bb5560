"""Chat Completions ``stream: true`` streams the answer through the output gate (issue 45).

The official ``openai`` SDK (sync and async) against a live daphne; the worker is the fake OpenAI
provider on a real socket, which streams its answer and stops mid-way (``pause_after``) until the
test lets it go on: a client that holds a content chunk then has it before the provider finished.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import openai
import pytest

from apps.audit.models import AuditEvent
from apps.runs.models import Run, RunEvent
from tests.factories.policies import publish_policy
from tests.fakes.base import FakeReply
from tests.fixtures.streams import (
    SoloClient,
    content,
    leave_at_first_content,
    paused,
    settled_run,
    solo_client,
)

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

ASK = [{"role": "user", "content": "Tell me something."}]
TERMS = {
    "enabled": True,
    "action": "block",
    "terms": [{"pattern": "insider trading", "message": "No insider trading."}],
}
CARD_POLICY = {"guardrails": {"output": {"pii": {"enabled": True, "action": "redact", "types": ["card"]}}}}


@pytest.fixture
def solo(daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any) -> SoloClient:
    return solo_client(daphne_server.url, fake_pool, alpha, team_admin, name="stream")


def finished_data(run_id: str) -> dict[str, Any]:
    return RunEvent.objects.get(run_id=run_id, type="run.finished").data


def test_the_first_content_chunk_arrives_before_the_provider_finished(solo: Any) -> None:
    reply, resume = paused(["Hello ", "there, ", "this ", "is ", "streamed."], after=2)
    solo.server.script(reply)
    try:
        raw = solo.client().chat.completions.with_raw_response.create(
            model="solo", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
        assert raw.headers["x-conductor-answer"] == "streamed"
        stream = raw.parse()
        received: list[str] = []
        chunks = []
        for chunk in stream:
            chunks.append(chunk)
            piece = content(chunk)
            if piece and not resume.is_set():
                # The provider is blocked after its second chunk: this came from a live stream.
                received.append(piece)
                resume.set()
                continue
            received.append(piece)
    finally:
        resume.set()
    text = "".join(received)
    assert not reply.pause_expired  # the client had content while the provider was paused
    assert text == "Hello there, this is streamed."
    assert chunks[0].model_extra["conductor"]["answer"] == {"mode": "streamed"}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # include_usage
    run_id = chunks[0].model_extra["conductor"]["run_id"]
    run = Run.objects.get(pk=run_id)
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert run.answer == text and finished_data(run_id)["released"]["sha256"] == digest
    audit = AuditEvent.objects.filter(event_type="run.finished", payload__run_id=run_id).first() or next(
        e for e in AuditEvent.objects.filter(event_type="run.finished") if digest in str(e.payload)
    )
    assert audit.payload["released"]["sha256"] == audit.payload["answer"]["sha256"] == digest


def test_async_client_gets_the_first_chunk_mid_stream(solo: Any) -> None:
    reply, resume = paused(["one ", "two ", "three ", "four"], after=1)
    solo.server.script(reply)

    async def go() -> tuple[str, bool]:
        client = solo.async_client()
        early = False
        parts: list[str] = []
        stream = await client.chat.completions.create(model="solo", messages=ASK, stream=True)
        async for chunk in stream:
            piece = content(chunk)
            if piece and not resume.is_set():
                early = True
                resume.set()
            parts.append(piece)
        await client.close()
        return "".join(parts), early

    try:
        text, early = asyncio.run(go())
    finally:
        resume.set()
    assert early and not reply.pause_expired and text == "one two three four"


def test_a_card_split_across_provider_chunks_is_masked_in_the_stream(solo: Any, alpha: Any) -> None:
    publish_policy(alpha, CARD_POLICY)
    solo.server.script(FakeReply(chunks=["Your card: 4111 1111 ", "1111 1111, ", "keep it safe."]))
    pieces = [
        content(c) for c in solo.client().chat.completions.create(model="solo", messages=ASK, stream=True)
    ]
    text = "".join(pieces)
    assert "4111" not in text and "1111" not in text
    assert text == "Your card: [REDACTED:card], keep it safe."
    run = Run.objects.order_by("-created_at").first()
    assert run.answer == text
    assert finished_data(run.id)["released"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()


def test_a_blocked_term_mid_answer_ends_the_stream_with_the_named_error(solo: Any, alpha: Any) -> None:
    publish_policy(alpha, {"guardrails": {"output": {"blocked_terms": TERMS}}})
    solo.server.script(FakeReply(chunks=["Here is a plan ", "about insi", "der tra", "ding for ", "you."]))
    received: list[str] = []
    with pytest.raises(openai.APIError) as err:
        for chunk in solo.client().chat.completions.create(model="solo", messages=ASK, stream=True):
            received.append(content(chunk))
    text = "".join(received)
    assert text.startswith("Here is a plan")
    assert "insi" not in text and "trad" not in text
    assert "guardrails.output.blocked_terms" in str(err.value.message)
    run = Run.objects.order_by("-created_at").first()
    assert run.status == "blocked"


def test_require_review_streams_no_content_and_announces_the_hold_at_once(solo: Any, alpha: Any) -> None:
    publish_policy(alpha, {"guardrails": {"output": {"pii": {"enabled": True, "action": "require_review"}}}})
    reply, resume = paused(["Mail ", "ceo@example.com ", "today."], after=1)
    solo.server.script(reply)
    try:
        raw = solo.client().chat.completions.with_raw_response.create(model="solo", messages=ASK, stream=True)
        assert raw.headers["x-conductor-answer"] == "buffered"
        stream = raw.parse()
        first = next(iter(stream))
        # Announced while the provider is paused mid-answer.
        assert not resume.is_set() and not reply.pause_expired
        assert first.model_extra["conductor"]["answer"]["mode"] == "buffered"
        assert "review" in first.model_extra["conductor"]["answer"]["reason"]
        resume.set()
        rest = list(stream)
    finally:
        resume.set()
    assert "".join(content(c) for c in rest) == ""
    finishes = [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason]
    assert finishes == ["content_filter"]


def test_a_client_that_disconnects_mid_stream_leaves_a_truthful_run(solo: Any) -> None:
    reply, resume = paused(["first ", "second ", "third"], after=1)
    solo.server.script(reply)
    try:
        stream = solo.client().chat.completions.create(model="solo", messages=ASK, stream=True)
        run_id = leave_at_first_content(stream)  # the client goes away mid-answer
    finally:
        resume.set()
    run = settled_run(run_id)
    assert run.status in ("succeeded", "cancelled")


# --- the Responses API and Anthropic Messages: the same stream, their own shapes --------------------


def test_responses_stream_delivers_text_deltas_mid_answer_masked(solo: Any, alpha: Any) -> None:
    publish_policy(alpha, CARD_POLICY)
    reply, resume = paused(["Card 4111 1111 ", "1111 1111 noted, ", "bye."], after=2)
    solo.server.script(reply)
    deltas: list[str] = []
    try:
        with solo.client().responses.stream(model="solo", input="Tell me something.") as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                    resume.set()
            response = stream.get_final_response()
    finally:
        resume.set()
    text = "".join(deltas)
    assert deltas and not reply.pause_expired  # a delta arrived while the provider was paused
    assert "4111" not in text and text == response.output_text == "Card [REDACTED:card] noted, bye."
    assert response.status == "completed"


def test_responses_stream_blocked_mid_answer_fails_naming_the_rule(solo: Any, alpha: Any) -> None:
    publish_policy(alpha, {"guardrails": {"output": {"blocked_terms": TERMS}}})
    solo.server.script(FakeReply(chunks=["A note on insi", "der tra", "ding here."]))
    deltas: list[str] = []
    failed = None
    with solo.client().responses.stream(model="solo", input="Tell me something.") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type == "response.failed":
                failed = event.response
    assert "insi" not in "".join(deltas)
    assert failed is not None and "guardrails.output.blocked_terms" in failed.error.message


def test_anthropic_messages_stream_mid_answer_and_blocked(solo: Any, alpha: Any) -> None:
    import anthropic

    base = solo.base_url.removesuffix("/v1")
    client = anthropic.Anthropic(base_url=base, api_key=solo.api_key, max_retries=0, timeout=90)
    reply, resume = paused(["Hello ", "from ", "the ", "stream."], after=1)
    solo.server.script(reply)
    pieces: list[str] = []
    try:
        with client.messages.stream(
            model="solo", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            for text in stream.text_stream:
                pieces.append(text)
                resume.set()
            message = stream.get_final_message()
    finally:
        resume.set()
    assert not reply.pause_expired and "".join(pieces) == "Hello from the stream."
    assert message.stop_reason == "end_turn"

    publish_policy(alpha, {"guardrails": {"output": {"blocked_terms": TERMS}}})
    solo.server.script(FakeReply(chunks=["About insi", "der trad", "ing."]))
    got: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as err,
        client.messages.stream(
            model="solo", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        ) as stream,
    ):
        for text in stream.text_stream:
            got.append(text)
    assert "insi" not in "".join(got)
    assert "guardrails.output.blocked_terms" in str(err.value)


# --- usage says what it counts (issue 45, item 5) ----------------------------------------------------


def test_usage_separates_the_answer_from_the_run_on_all_three_protocols(
    solo: Any, conductor_fake: Any
) -> None:
    import anthropic

    from apps.runs.models import Step

    sdk = solo.client()
    chat = sdk.chat.completions.create(model="conductor-mini", messages=ASK, max_tokens=24)
    run = Run.objects.get(pk=chat.model_extra["conductor"]["run_id"])
    last = Step.objects.filter(run=run, status="succeeded").order_by("-index").first()
    answer_out = last.output_tokens
    usage = chat.usage
    assert usage.completion_tokens == run.output_tokens  # the standard fields: the bill
    assert usage.completion_tokens_details.reasoning_tokens == run.output_tokens - answer_out
    extra = usage.model_extra["conductor"]
    assert extra["answer"]["output_tokens"] == answer_out < run.output_tokens
    assert extra["run"] == {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens}

    chunks = list(
        sdk.chat.completions.create(
            model="conductor-mini", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
    )
    streamed = chunks[-1].usage
    assert streamed.model_extra["conductor"]["answer"]["output_tokens"] > 0
    assert (
        streamed.completion_tokens - streamed.completion_tokens_details.reasoning_tokens
        == (streamed.model_extra["conductor"]["answer"]["output_tokens"])
    )

    response = sdk.responses.create(model="conductor-mini", input="What is six times seven?")
    assert (
        response.usage.output_tokens - response.usage.output_tokens_details.reasoning_tokens
        == (response.usage.model_extra["conductor"]["answer"]["output_tokens"])
    )

    base = solo.base_url.removesuffix("/v1")
    message = anthropic.Anthropic(
        base_url=base, api_key=solo.api_key, max_retries=0, timeout=90
    ).messages.create(
        model="conductor-mini", max_tokens=50, messages=[{"role": "user", "content": "six times seven?"}]
    )
    counted = message.usage.model_extra["conductor"]
    assert counted["run"]["output_tokens"] == message.usage.output_tokens
    assert (
        counted["answer"]["output_tokens"] + counted["orchestration"]["output_tokens"]
        == message.usage.output_tokens
    )
