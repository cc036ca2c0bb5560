"""The fast pass-through (issue 45): a streamed one-worker pool executes in the serving process and
its released answer goes to the client from a tap on the run's sink (``apps.runs.live``), with
the provider's events read raw (no SDK object per chunk).

The official ``openai`` SDK (sync and async) against a live daphne; the worker is the fake OpenAI
provider on a real socket, streaming slowly (``pause_after``: it stops mid-answer until the test
lets it go on). Each test checks ``X-Conductor-Stream``: ``direct`` is the fast path, ``events``
the run's stored events (what a policy that needs the whole answer keeps).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import httpx
import openai
import pytest

from apps.runs.live import LiveTap
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
STREAM = "x-conductor-stream"


@pytest.fixture
def solo(fast_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any) -> SoloClient:
    return solo_client(fast_server.url, fake_pool, alpha, team_admin, name="fast")


def released_sha(run_id: Any) -> str:
    return RunEvent.objects.get(run_id=run_id, type="run.finished").data["released"]["sha256"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_sync_sdk_gets_content_before_the_provider_finished_with_usage(solo: Any) -> None:
    reply, resume = paused(["Fast ", "path, ", "token ", "by ", "token."], after=2)
    solo.server.script(reply)
    early = False
    chunks = []
    try:
        raw = solo.client().chat.completions.with_raw_response.create(
            model="solo", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
        assert raw.headers[STREAM] == "direct" and raw.headers["x-conductor-answer"] == "streamed"
        for chunk in raw.parse():
            chunks.append(chunk)
            if content(chunk) and not resume.is_set():
                early = True  # the provider is paused after its second chunk
                resume.set()
    finally:
        resume.set()
    text = "".join(content(c) for c in chunks)
    assert early and not reply.pause_expired
    assert text == "Fast path, token by token."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage = chunks[-1].usage  # include_usage: the last chunk, no choices
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens > 0
    run_id = chunks[0].model_extra["conductor"]["run_id"]
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded" and run.answer == text
    assert released_sha(run_id) == sha(text)  # the released digest is the stored answer's
    assert usage.total_tokens == run.input_tokens + run.output_tokens


def test_uvicorn_serves_the_fast_path_and_the_run_page(
    uvicorn_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    """WEB_SERVER=uvicorn (issue 45): the same stream, token by token, on uvloop and httptools;
    and the pages are served too."""
    solo = solo_client(uvicorn_server.url, fake_pool, alpha, team_admin, name="uvicorn")
    reply, resume = paused(["On ", "uvicorn, ", "too."], after=1)
    solo.server.script(reply)
    early = False
    parts: list[str] = []
    try:
        raw = solo.client().chat.completions.with_raw_response.create(model="solo", messages=ASK, stream=True)
        assert raw.headers[STREAM] == "direct"
        for chunk in raw.parse():
            if content(chunk) and not resume.is_set():
                early = True
                resume.set()
            parts.append(content(chunk))
    finally:
        resume.set()
    assert early and "".join(parts) == "On uvicorn, too."
    run = Run.objects.get(pk=raw.headers["x-conductor-run"])
    assert run.status == "succeeded" and released_sha(run.id) == sha(run.answer)
    with httpx.Client(base_url=uvicorn_server.url) as browser:
        login = browser.get("/accounts/login/")
        assert login.status_code == 200 and "csrfmiddlewaretoken" in login.text


def test_async_sdk_gets_content_before_the_provider_finished(solo: Any) -> None:
    reply, resume = paused(["one ", "two ", "three ", "four"], after=1)
    solo.server.script(reply)

    async def go() -> tuple[str, bool, str]:
        client = solo.async_client()
        early = False
        parts: list[str] = []
        raw = await client.chat.completions.with_raw_response.create(model="solo", messages=ASK, stream=True)
        async for chunk in raw.parse():
            piece = content(chunk)
            if piece and not resume.is_set():
                early = True
                resume.set()
            parts.append(piece)
        await client.close()
        return "".join(parts), early, raw.headers[STREAM]

    try:
        text, early, path = asyncio.run(go())
    finally:
        resume.set()
    assert path == "direct"
    assert early and not reply.pause_expired and text == "one two three four"


def test_a_card_split_across_provider_chunks_is_masked_on_the_fast_path(solo: Any, alpha: Any) -> None:
    publish_policy(
        alpha, {"guardrails": {"output": {"pii": {"enabled": True, "action": "redact", "types": ["card"]}}}}
    )
    solo.server.script(FakeReply(chunks=["Card: 4111 1111 ", "1111 1111, ", "noted."]))
    raw = solo.client().chat.completions.with_raw_response.create(model="solo", messages=ASK, stream=True)
    assert raw.headers[STREAM] == "direct"
    chunks = list(raw.parse())
    text = "".join(content(c) for c in chunks)
    assert "4111" not in text and "1111" not in text
    assert text == "Card: [REDACTED:card], noted."
    run_id = chunks[0].model_extra["conductor"]["run_id"]
    assert Run.objects.get(pk=run_id).answer == text and released_sha(run_id) == sha(text)


def test_a_blocked_term_ends_the_fast_stream_with_the_named_error(solo: Any, alpha: Any) -> None:
    terms = {"enabled": True, "action": "block", "terms": [{"pattern": "insider trading"}]}
    publish_policy(alpha, {"guardrails": {"output": {"blocked_terms": terms}}})
    solo.server.script(FakeReply(chunks=["A plan ", "about insi", "der tra", "ding for ", "you."]))
    raw = solo.client().chat.completions.with_raw_response.create(model="solo", messages=ASK, stream=True)
    assert raw.headers[STREAM] == "direct"
    received: list[str] = []
    run_id = None
    with pytest.raises(openai.APIError) as err:
        for chunk in raw.parse():
            run_id = run_id or (chunk.model_extra or {}).get("conductor", {}).get("run_id")
            received.append(content(chunk))
    text = "".join(received)
    assert text.startswith("A plan") and "insi" not in text and "trad" not in text
    assert "guardrails.output.blocked_terms" in str(err.value.message)
    run = Run.objects.get(pk=run_id)
    assert run.status == "blocked"
    assert released_sha(run_id) == sha(text)  # exactly what the client received is on record


@pytest.mark.parametrize(
    "guardrails",
    [
        {"output": {"pii": {"enabled": True, "action": "require_review"}}},
        {"output": {"json_schema": {"enabled": True, "schema": {"type": "object"}}}},
    ],
    ids=["require_review", "json_schema"],
)
def test_whole_answer_checks_do_not_take_the_fast_path(solo: Any, alpha: Any, guardrails: Any) -> None:
    publish_policy(alpha, {"guardrails": guardrails})
    reply, resume = paused(['{"a": ', '"ceo@example.com"}'], after=1)
    solo.server.script(reply)
    try:
        raw = solo.client().chat.completions.with_raw_response.create(model="solo", messages=ASK, stream=True)
        assert raw.headers[STREAM] == "events" and raw.headers["x-conductor-answer"] == "buffered"
        stream = raw.parse()
        first = next(iter(stream))
        assert not resume.is_set()  # announced at once, while the provider is paused
        assert first.model_extra["conductor"]["answer"]["mode"] == "buffered"
        resume.set()
        rest = list(stream)
    finally:
        resume.set()
    # Nothing before the verdict: held (no content), or the checked answer whole.
    assert "".join(content(c) for c in rest) in ("", '{"a": "ceo@example.com"}')


def test_a_client_that_disconnects_leaves_a_finished_run(solo: Any) -> None:
    reply, resume = paused(["first ", "second ", "third"], after=1)
    solo.server.script(reply)
    try:
        raw = solo.client().chat.completions.with_raw_response.create(model="solo", messages=ASK, stream=True)
        assert raw.headers[STREAM] == "direct"
        run_id = leave_at_first_content(raw.parse())  # the client goes away mid-answer
    finally:
        resume.set()
    run = settled_run(run_id)
    assert run.status == "succeeded" and run.answer == "first second third"
    assert released_sha(run_id) == sha(run.answer)


# --- the tap itself -------------------------------------------------------------------------------


def test_tap_hands_a_burst_over_as_one_piece_and_says_when_it_ended() -> None:
    async def go() -> list[tuple[str, bool] | None]:
        tap = LiveTap(asyncio.get_running_loop())
        got: list[tuple[str, bool] | None] = [await tap.take(0.01)]  # nothing yet: a keep-alive
        pusher = threading.Thread(target=lambda: [tap.push(p) for p in ("a", "b", "c")])
        pusher.start()
        pusher.join()
        got.append(await tap.take(5))
        threading.Thread(target=lambda: (tap.push("d"), tap.end())).start()
        taken = await tap.take(5)
        while taken is not None and not taken[1]:  # "d" may come before the end
            got.append(taken)
            taken = await tap.take(5)
        got.append(taken)
        return got

    got = asyncio.run(go())
    assert got[0] is None and got[1] == ("abc", False)
    assert "".join(g[0] for g in got[2:] if g) == "d" and got[-1] is not None and got[-1][1]
