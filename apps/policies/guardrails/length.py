"""Input and output length limits (characters)."""

from __future__ import annotations

from apps.policies.guardrails.base import Finding


def scan(text: str, max_chars: int | None) -> list[Finding]:
    if max_chars is None:
        raise ValueError("length check enabled without max_chars")
    if len(text) <= max_chars:
        return []
    # `redact` truncates: the span is everything past the limit.
    return [
        Finding(
            "length", max_chars, len(text), f"{len(text)} characters; the limit is {max_chars}", "[TRUNCATED]"
        )
    ]
