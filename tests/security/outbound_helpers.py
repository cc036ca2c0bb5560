"""Shared helpers for the outbound-gate tests (issue 39): what the fake provider received, as bytes."""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

CARD = "4111 1111 1111 1111"  # a Luhn-valid test card
CARD_DIGITS = CARD.replace(" ", "")
EMAIL = "bob.smith@example.com"


def fresh_secret() -> str:
    """An OpenAI-style project key nobody has sent before (so finding it proves a leak)."""
    tail = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))
    return f"sk-proj-{tail}"


def spellings(needle: str) -> list[bytes]:
    """The ways ``needle`` can appear in a JSON body on the wire: raw UTF-8 and JSON-escaped."""
    escaped = json.dumps(needle)[1:-1]
    return list(dict.fromkeys([needle.encode(), escaped.encode()]))


def leaked(received: bytes, needle: str) -> bool:
    return any(s in received for s in spellings(needle))


def card_leaked(received: bytes, card: str = CARD) -> bool:
    """The card in any grouping: as sent, or its digits contiguous."""
    return leaked(received, card) or leaked(received, card.replace(" ", ""))


def bodies(server: Any) -> list[dict[str, Any]]:
    return [r.json or {} for r in server.requests if r.method == "POST"]
