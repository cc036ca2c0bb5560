"""The team's outbound policy (issue 39), on the gate without a server: every field, messages
read together, JSON schema keys and values, warn/review flags, broken checks, and the record
(field and rule, never the content)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.engine.generation import GenerationOptions, ResponseFormat
from apps.engine.providers.gate import OutboundGate, ProviderRequestRefused
from apps.policies import outbound
from apps.policies.outbound import OutboundChecks
from apps.policies.spec import parse_spec

CARD = "4111 1111 1111 1111"


def gate(input_checks: dict[str, Any], on_check_error: str = "fail_closed") -> OutboundGate:
    spec = parse_spec({"guardrails": {"on_check_error": on_check_error, "input": input_checks}})
    return OutboundGate(OutboundChecks(spec.guardrails))


PII = {"pii": {"enabled": True, "action": "redact", "types": ["card", "email"]}}


def test_every_field_is_read_and_masked_in_place() -> None:
    options = GenerationOptions(
        stop=(f"stop {CARD}",),
        tools=(
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": f"for {CARD}",
                    "parameters": {"type": "object", "properties": {f"card {CARD}": {"type": "string"}}},
                },
            },
        ),
        response_format=None,
    )
    messages = [
        {"role": "user", "content": "hi", "name": f"n {CARD}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"id {CARD}",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": f'{{"c": "{CARD}"}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"id {CARD}", "content": "done"},
    ]
    admitted = gate(PII).admit(messages, options=options)
    sent = repr((admitted.messages, admitted.options))
    assert CARD not in sent and sent.count("[REDACTED:card]") == 7
    tool = admitted.options.tools[0]["function"]  # type: ignore[union-attr]
    assert list(tool["parameters"]["properties"]) == ["card [REDACTED:card]"]  # a key, renamed in place
    assert messages[0]["name"] == f"n {CARD}"  # the caller's values are not touched
    details = [c.detail for c in admitted.checks]
    assert all(CARD not in d and "guardrails.input.pii" in d for d in details)
    assert any(d.startswith("tools[0].function.parameters[#1][#0 key]") for d in details)


def test_a_response_format_schema_is_read() -> None:
    fmt = ResponseFormat("json_schema", {"type": "object", "description": f"about {CARD}"}, "report")
    admitted = gate(PII).admit(
        [{"role": "user", "content": "hi"}], options=GenerationOptions(response_format=fmt)
    )
    assert admitted.options.response_format.schema["description"] == "about [REDACTED:card]"  # type: ignore[union-attr]


def test_messages_are_read_together_and_one_by_one() -> None:
    admitted = gate(PII).admit(
        [{"role": "user", "content": "card 4111 1111"}, {"role": "user", "content": "1111 1111 thanks"}]
    )
    assert [m["content"] for m in admitted.messages] == ["card [REDACTED:card]", "[REDACTED:card] thanks"]
    # The turns of one question made from a chat (a conductor model) are read apart too.
    admitted = gate(PII).admit(
        [{"role": "user", "content": "User: card 4111 1111\n\nUser: 1111 1111 thanks"}]
    )
    assert admitted.messages[0]["content"] == "User: card [REDACTED:card]\n\nUser: [REDACTED:card] thanks"


def test_a_block_names_the_field_and_the_rule() -> None:
    key = "sk-proj-" + "Ab3dE5fG7h" * 4
    with pytest.raises(ProviderRequestRefused) as refused:
        gate({"secrets": {"enabled": True, "action": "block"}}).admit(
            [{"role": "user", "content": "hi"}], options=GenerationOptions(stop=(key,))
        )
    err = refused.value
    assert (err.field, err.rule) == ("stop[0]", "guardrails.input.secrets")
    assert key not in str(err) and "stop[0]" in str(err)
    assert [c.action for c in err.checks] == ["block"]


def test_warn_and_review_flag_without_changing_the_text() -> None:
    admitted = gate({"pii": {"enabled": True, "action": "require_review", "types": ["card"]}}).admit(
        [{"role": "user", "content": f"card {CARD}"}]
    )
    assert admitted.messages[0]["content"] == f"card {CARD}"
    assert [c.action for c in admitted.checks] == ["require_review"]


def test_a_broken_check_fails_closed_or_is_recorded_as_bypassed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str, cfg: Any) -> Any:
        def scan(text: str) -> list[Any]:
            raise RuntimeError(f"boom on {text}")

        return scan

    monkeypatch.setattr(outbound, "detector", broken)
    with pytest.raises(ProviderRequestRefused) as refused:
        gate(PII).admit([{"role": "user", "content": f"card {CARD}"}])
    assert "could not run" in str(refused.value) and CARD not in str(refused.value)
    admitted = gate(PII, on_check_error="fail_open").admit([{"role": "user", "content": "hi"}])
    assert [c.status.value for c in admitted.checks] == ["bypassed"]  # type: ignore[union-attr]


def test_no_enabled_detector_rewrites_nothing() -> None:
    admitted = gate({}).admit([{"role": "user", "content": f"card {CARD}"}])
    assert admitted.messages[0]["content"] == f"card {CARD}" and admitted.checks == ()
