"""A fast pass-through's content event is framed once per stream (``live_stream.Frame``); its bytes
are the ones the events path renders for the same text, on every protocol."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from apps.api.v1 import chat, messages, responses, shaping
from apps.api.v1.live_stream import Frame

TEXTS = ["plain", 'a "quoted" \\ piece', "unicode ✓ and\nnew line\t", "\u0000MARK\u0000", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_chat_frame_matches_the_chunk(text: str) -> None:
    env = chat.Envelope(id="chatcmpl-1", created=1, model="solo", conductor={})
    live = chat.ChatLive(SimpleNamespace(), SimpleNamespace(), env)  # type: ignore[arg-type]
    assert live.piece(text) == shaping.sse(chat._chunk(env, {"content": text}))


def test_responses_frame_matches_the_delta_event_and_keeps_one_sequence() -> None:
    run_id = uuid.uuid4()
    started: Any = SimpleNamespace(run=SimpleNamespace(id=run_id))
    events = responses._Events()
    live = responses.ResponsesLive(SimpleNamespace(), started, events)  # type: ignore[arg-type]
    expected = responses._Events()
    for text in TEXTS:
        events("response.output_item.added")  # other events share the sequence
        expected("response.output_item.added")
        assert live.piece(text) == responses._delta(expected, f"msg_{run_id.hex}", text)
    assert events.seq == expected.seq


@pytest.mark.parametrize("text", TEXTS)
def test_messages_frame_matches_the_text_delta(text: str) -> None:
    live = messages.MessagesLive(SimpleNamespace(), SimpleNamespace())  # type: ignore[arg-type]
    expected = messages._event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
    assert live.piece(text) == expected


def test_a_frame_fills_its_slots_in_order() -> None:
    frame = Frame(lambda a, b: shaping.sse({"n": a, "s": b}), slots=2)
    assert frame(7, "x") == shaping.sse({"n": 7, "s": "x"})
