"""The fast pass-through (issue 45) on the Responses API and the Anthropic Messages API.

The same path as Chat Completions' (``apps.api.v1.live_stream``): a streamed one-worker pool with
nothing that needs the whole answer executes in the serving process and its released answer goes
to the client from the run's tap. Official SDKs (``openai`` Responses, ``anthropic`` Messages)
against a live daphne; the worker is the fake OpenAI provider on a real socket, streaming slowly
(``pause_after``: it stops mid-answer until the test lets it go on).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import anthropic
import pytest

from apps.runs.models import Run, RunEvent
from tests.factories.policies import publish_policy
from tests.fakes.base import FakeReply
from tests.fixtures.streams import SoloClient, paused, solo_client

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

STREAM = "x-conductor-stream"
RUN = "x-conductor-run"
ASK = "Tell me something."
HI = [{"role": "user", "content": "Hi"}]
CARD_POLICY = {"guardrails": {"output": {"pii": {"enabled": True, "action": "redact", "types": ["card"]}}}}
TERMS_POLICY = {
    "guardrails": {
        "output": {
            "blocked_terms": {"enabled": True, "action": "block", "terms": [{"pattern": "insider trading"}]}
        }
    }
}
REVIEW_POLICY = {"guardrails": {"output": {"pii": {"enabled": True, "action": "require_review"}}}}


@pytest.fixture
def solo(fast_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any) -> SoloClient:
    return solo_client(fast_server.url, fake_pool, alpha, team_admin, name="fast-protocols")


def claude(solo: SoloClient) -> anthropic.Anthropic:
    base = solo.base_url.removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key=solo.api_key, max_retries=0, timeout=90)


def released_sha(run_id: Any) -> str:
    return RunEvent.objects.get(run_id=run_id, type="run.finished").data["released"]["sha256"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- the Responses API ------------------------------------------------------------------------------


def held_opening(solo: SoloClient, alpha: Any, start: Callable[[], Any]) -> tuple[Any, list[Any]]:
    """Under a require_review policy: the stream's first event (read while the provider is still
    paused: the hold is announced at once) and the rest once it went on."""
    publish_policy(alpha, REVIEW_POLICY)
    reply, resume = paused(["Mail ", "ceo@example.com ", "today."], after=1)
    solo.server.script(reply)
    try:
        raw = start()
        assert raw.headers[STREAM] == "events" and raw.headers["x-conductor-answer"] == "buffered"
        stream = iter(raw.parse())
        first = next(stream)
        assert not resume.is_set() and not reply.pause_expired  # announced while the provider waits
        resume.set()
        return first, list(stream)
    finally:
        resume.set()


def test_responses_first_delta_arrives_before_the_provider_finished(solo: SoloClient) -> None:
    reply, resume = paused(["Fast ", "responses, ", "delta ", "by ", "delta."], after=2)
    solo.server.script(reply)
    deltas: list[str] = []
    events: list[Any] = []
    early = False
    try:
        raw = solo.client().responses.with_raw_response.create(model="solo", input=ASK, stream=True)
        assert raw.headers[STREAM] == "direct" and raw.headers["x-conductor-answer"] == "streamed"
        for event in raw.parse():
            events.append(event)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                if not resume.is_set():
                    early = True  # the provider is paused after its second chunk
                    resume.set()
    finally:
        resume.set()
    text = "".join(deltas)
    assert early and not reply.pause_expired
    assert text == "Fast responses, delta by delta."
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta")
    assert kinds[-1] == "response.completed"
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(len(events)))  # one sequence, direct pieces included
    done = events[-1].response
    assert done.status == "completed" and done.output_text == text
    assert done.usage is not None and done.usage.output_tokens > 0
    run = Run.objects.get(pk=raw.headers[RUN])
    assert run.status == "succeeded" and run.answer == text
    assert released_sha(run.id) == sha(text)  # the released digest is the stored answer's
    assert done.usage.total_tokens == run.input_tokens + run.output_tokens


def test_responses_card_split_across_provider_chunks_is_masked(solo: SoloClient, alpha: Any) -> None:
    publish_policy(alpha, CARD_POLICY)
    solo.server.script(FakeReply(chunks=["Card: 4111 1111 ", "1111 1111, ", "noted."]))
    raw = solo.client().responses.with_raw_response.create(model="solo", input=ASK, stream=True)
    assert raw.headers[STREAM] == "direct"
    events = list(raw.parse())
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "4111" not in text and "1111" not in text
    assert text == "Card: [REDACTED:card], noted." == events[-1].response.output_text
    run = Run.objects.get(pk=raw.headers[RUN])
    assert run.answer == text and released_sha(run.id) == sha(text)


def test_responses_blocked_term_fails_naming_the_rule(solo: SoloClient, alpha: Any) -> None:
    publish_policy(alpha, TERMS_POLICY)
    solo.server.script(FakeReply(chunks=["A plan ", "about insi", "der tra", "ding for ", "you."]))
    raw = solo.client().responses.with_raw_response.create(model="solo", input=ASK, stream=True)
    assert raw.headers[STREAM] == "direct"
    events = list(raw.parse())
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.startswith("A plan") and "insi" not in text and "trad" not in text
    assert events[-1].type == "response.failed"
    assert "guardrails.output.blocked_terms" in events[-1].response.error.message
    run = Run.objects.get(pk=raw.headers[RUN])
    assert run.status == "blocked"
    assert released_sha(run.id) == sha(text)  # exactly what the client received is on record


def test_responses_require_review_goes_through_events_and_announces_the_hold(
    solo: SoloClient, alpha: Any
) -> None:
    first, rest = held_opening(
        solo,
        alpha,
        lambda: solo.client().responses.with_raw_response.create(model="solo", input=ASK, stream=True),
    )
    assert first.type == "response.created"
    assert first.response.model_extra["conductor"]["answer"]["mode"] == "buffered"
    assert not [e for e in rest if e.type == "response.output_text.delta"]
    assert rest[-1].type == "response.incomplete"
    assert rest[-1].response.incomplete_details.reason == "content_filter"


# --- the Anthropic Messages API ------------------------------------------------------------------------


def test_messages_first_text_arrives_before_the_provider_finished(solo: SoloClient) -> None:
    reply, resume = paused(["Hello ", "from ", "the ", "fast ", "path."], after=2)
    solo.server.script(reply)
    pieces: list[str] = []
    early = False
    try:
        with claude(solo).messages.stream(model="solo", max_tokens=100, messages=HI) as stream:
            assert stream.response.headers[STREAM] == "direct"
            run_id = stream.response.headers[RUN]
            for text in stream.text_stream:
                pieces.append(text)
                if not resume.is_set():
                    early = True
                    resume.set()
            message = stream.get_final_message()
    finally:
        resume.set()
    text = "".join(pieces)
    assert early and not reply.pause_expired
    assert text == "Hello from the fast path." == message.content[0].text
    assert message.stop_reason == "end_turn"
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded" and run.answer == text
    assert message.usage.output_tokens == run.output_tokens > 0
    assert released_sha(run.id) == sha(text)


def test_messages_card_split_across_provider_chunks_is_masked(solo: SoloClient, alpha: Any) -> None:
    publish_policy(alpha, CARD_POLICY)
    solo.server.script(FakeReply(chunks=["Card: 4111 1111 ", "1111 1111, ", "noted."]))
    with claude(solo).messages.stream(model="solo", max_tokens=100, messages=HI) as stream:
        assert stream.response.headers[STREAM] == "direct"
        run_id = stream.response.headers[RUN]
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert "4111" not in text and "1111" not in text
    assert text == "Card: [REDACTED:card], noted."
    assert message.stop_reason == "end_turn"
    run = Run.objects.get(pk=run_id)
    assert run.answer == text and released_sha(run_id) == sha(text)


def test_messages_blocked_term_ends_with_the_error_event_naming_the_rule(
    solo: SoloClient, alpha: Any
) -> None:
    publish_policy(alpha, TERMS_POLICY)
    solo.server.script(FakeReply(chunks=["A plan ", "about insi", "der tra", "ding for ", "you."]))
    got: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as err,
        claude(solo).messages.stream(model="solo", max_tokens=100, messages=HI) as stream,
    ):
        assert stream.response.headers[STREAM] == "direct"
        run_id = stream.response.headers[RUN]
        for text in stream.text_stream:
            got.append(text)
    text = "".join(got)
    assert text.startswith("A plan") and "insi" not in text and "trad" not in text
    assert "guardrails.output.blocked_terms" in str(err.value)
    run = Run.objects.get(pk=run_id)
    assert run.status == "blocked"
    assert released_sha(run_id) == sha(text)


def test_messages_require_review_goes_through_events_and_announces_the_hold(
    solo: SoloClient, alpha: Any
) -> None:
    first, rest = held_opening(
        solo,
        alpha,
        lambda: claude(solo).messages.with_raw_response.create(
            model="solo", max_tokens=100, messages=HI, stream=True
        ),
    )
    assert first.type == "message_start"
    assert first.message.model_extra["conductor"]["answer"]["mode"] == "buffered"
    assert not [e for e in rest if e.type == "content_block_delta"]
    stops = [e.delta.stop_reason for e in rest if e.type == "message_delta"]
    assert stops == ["refusal"]


def test_a_stop_sequence_keeps_messages_on_the_events_path(solo: SoloClient) -> None:
    """Stop sequences are cut from the whole answer (``messages.stream_buffered``)."""
    solo.server.script(FakeReply(chunks=["one ", "two ", "three"]))
    with claude(solo).messages.stream(
        model="solo", max_tokens=100, messages=HI, stop_sequences=["three"]
    ) as stream:
        assert stream.response.headers[STREAM] == "events"
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert "three" not in text and message.stop_reason in ("stop_sequence", "end_turn")
