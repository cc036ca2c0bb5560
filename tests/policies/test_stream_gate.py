"""The incremental output gate (issue 45): a stream is judged like a whole answer, and nothing
that turns out to be a finding is released before it is decided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.policies.guardrails import run_stage
from apps.policies.guardrails.stream import MARGIN, StreamGate, answer_gate, buffered_reason
from apps.policies.spec import StageGuardrails, parse_spec

CARD = "4111 1111 1111 1111"
TERMS = {
    "enabled": True,
    "action": "block",
    "terms": [{"pattern": "insider trading", "message": "No insider trading."}],
}
EVASIONS = [
    json.loads(line)
    for line in (Path(__file__).parents[1] / "security" / "data" / "evasions.jsonl").read_text().splitlines()
]


def stage(**checks: dict) -> StageGuardrails:
    return parse_spec({"guardrails": {"output": checks}}).guardrails.output


def stream(gate: StreamGate, pieces: list[str]) -> tuple[list[str], object]:
    """Feed ``pieces``; what each feed released (in order), then the close."""
    released: list[str] = []
    for piece in pieces:
        got = gate.feed(piece)
        released.append(got.text)
        if got.blocked:
            return released, gate.close()
    closed = gate.close()
    released.append(closed.release.text)
    return released, closed


def test_a_card_split_across_two_chunks_is_masked_before_any_digit_leaves() -> None:
    gate = StreamGate(stage(pii={"enabled": True, "action": "redact", "types": ["card"]}))
    released, closed = stream(gate, ["Your card is 4111 1111 ", "1111 1111, thanks."])
    assert released[0] == "Your card is "  # the digits are held: they may be a card
    assert "4111" not in "".join(released) and "1111" not in "".join(released)
    assert closed.text == "Your card is [REDACTED:card], thanks."
    assert "".join(released) == closed.text


def test_a_blocked_term_split_across_chunks_ends_the_stream_without_any_of_it() -> None:
    gate = StreamGate(stage(blocked_terms=TERMS))
    released, closed = stream(gate, ["The report covers insi", "der tra", "ding in detail."])
    text = "".join(released)
    assert "insi" not in text and "trad" not in text
    assert text == "The report covers "
    assert closed.release.blocked
    assert closed.release.rule == "guardrails.output.blocked_terms"
    assert "No insider trading." in closed.release.reason
    assert any(c.name == "blocked_terms" and c.action == "block" for c in closed.checks)


def test_a_long_separator_run_does_not_outgrow_the_hold_back() -> None:
    gate = StreamGate(stage(blocked_terms=TERMS))
    pieces = ["text insider", *([" "] * 300), "trading", " more"]
    released, closed = stream(gate, pieces)
    assert "insider" not in "".join(released)
    assert closed.release.blocked


def test_a_secret_is_held_while_it_grows_then_masked() -> None:
    gate = StreamGate(stage(secrets={"enabled": True, "action": "redact"}))
    key = "sk-proj-" + "A1b2C3d4" * 6
    pieces = ["key: ", *(key[i : i + 5] for i in range(0, len(key), 5)), " done"]
    released, closed = stream(gate, pieces)
    assert "sk-" not in "".join(released)
    assert closed.text == "key: [REDACTED:openai] done"


def test_clean_text_streams_with_only_the_last_word_held() -> None:
    gate = StreamGate(stage(pii={"enabled": True, "action": "redact"}, blocked_terms=TERMS))
    released, closed = stream(gate, ["Hello there, ", "how are ", "you today"])
    assert released[0] and released[1]  # released as it came, not at the end
    assert "".join(released) == closed.text == "Hello there, how are you today"


def test_length_block_and_truncate() -> None:
    gate = StreamGate(stage(length={"enabled": True, "action": "block", "max_chars": 10}))
    released, closed = stream(gate, ["12345", "67890", "abc"])
    assert len("".join(released)) <= 10 and closed.release.blocked
    gate = StreamGate(stage(length={"enabled": True, "action": "redact", "max_chars": 8}))
    released, closed = stream(gate, ["12345", "67890", "abc"])
    assert closed.text == "12345678[TRUNCATED]" == "".join(released)


@pytest.mark.parametrize(
    "checks",
    [
        {"json_schema": {"enabled": True, "schema": {"type": "object"}}},
        {"pii": {"enabled": True, "action": "require_review"}},
        {"model_judge": {"enabled": True, "judges": [{"name": "j", "worker": "w", "prompt": "ok?"}]}},
    ],
)
def test_whole_answer_checks_buffer(checks: dict) -> None:
    gate = StreamGate(stage(**checks))
    assert gate.buffered and buffered_reason(stage(**checks))
    assert gate.feed("anything at all").text == ""


def test_no_checks_means_no_gate() -> None:
    assert answer_gate(stage(), stage()) is None


def test_the_stream_and_the_whole_answer_agree_with_run_stage() -> None:
    checks = stage(pii={"enabled": True, "action": "redact"}, secrets={"enabled": True, "action": "redact"})
    text = "mail a.b@example.com or call +44 20 7946 0958; card 5555 5555 5555 4444 ok " + "x" * (2 * MARGIN)
    for size in (1, 3, 7, 64):
        gate = StreamGate(checks)
        released, closed = stream(gate, [text[i : i + size] for i in range(0, len(text), size)])
        assert "".join(released) == closed.text == run_stage("output", checks, text).text, size


@pytest.mark.parametrize(
    "case",
    [c for c in EVASIONS if c["kind"] in ("card", "email", "secret", "term") and len(c["messages"]) == 1],
    ids=lambda c: c["id"],
)
def test_unicode_evasions_split_anywhere_are_caught(case: dict) -> None:
    checks = stage(
        pii={"enabled": True, "action": "redact", "types": ["card", "email", "iban"]},
        secrets={"enabled": True, "action": "redact"},
        blocked_terms=TERMS,
    )
    text = " ".join(case["messages"])
    for size in (1, 2, 5):
        gate = StreamGate(checks)
        released, closed = stream(gate, [text[i : i + size] for i in range(0, len(text), size)])
        out = "".join(released)
        for needle in case["needles"]:
            assert needle not in out, (case["id"], size)
        if case["expect"] == "block" or case["kind"] == "term":
            assert closed.release.blocked, (case["id"], size)
        else:
            assert case["placeholder"] in out, (case["id"], size)
