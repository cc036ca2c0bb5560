"""The chain's arithmetic, independent of the ORM so the offline verifier can share it."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

GENESIS_DIGEST = "0" * 64

# The exact fields covered by an event's digest, in this order; changing this list is a format
# change that breaks every existing chain.
DIGEST_FIELDS = (
    "seq",
    "created_at",
    "event_type",
    "kind",
    "actor_id",
    "actor_label",
    "api_key_id",
    "ip",
    "user_agent",
    "team_id",
    "object_type",
    "object_id",
    "object_repr",
    "run_id",
    "policy_version_id",
    "payload",
)


_PLAIN_TYPES = frozenset({type(None), bool, int, float, str, list, dict})
# One encoder instance: json.dumps() with non-default options builds a new one per call, which
# dominates verification time at millions of rows. Output is identical to json.dumps(...).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _normalise(value: Any) -> Any:
    if type(value) in _PLAIN_TYPES:  # fast path for the common exact types
        return value
    if isinstance(value, datetime):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, bool | int | float | str | list | dict):
        return value
    return str(value)


def canonical_json(content: dict[str, Any]) -> str:
    return _ENCODER.encode({k: _normalise(content.get(k)) for k in DIGEST_FIELDS})


def compute_digest(key: bytes, content: dict[str, Any], prev_digest: str) -> str:
    message = canonical_json(content).encode() + b"|" + prev_digest.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def column_mac(key: bytes, digest: str, seq: int, created_us: int, display_row: bytes) -> str:
    """MAC binding a sequenced row's columns, as the database renders them, to its digest.

    ``display_row`` is PostgreSQL's text form of the row's content columns (``PG_DISPLAY_ROW``),
    taken in the sequencing transaction from the same row version its canonical entry was built
    from; verify re-renders it (cheap: no JSON parsing) instead of re-encoding every row.
    """
    message = f"{digest}|{seq}|{created_us}|".encode() + display_row
    return hmac.new(key, message, hashlib.sha256).hexdigest()


# PostgreSQL's text form of a row's content columns (everything a reader sees except seq and
# created_at, which the sequencer sets and which column_mac takes as numbers). Only values go in:
# the rendering of bigint, text, inet, uuid and jsonb does not depend on session settings.
PG_DISPLAY_ROW = (
    "convert_to(row(event_type, kind, actor_id, actor_label, api_key_id, ip, user_agent, team_id, "
    "object_type, object_id, object_repr, run_id, policy_version_id, payload)::text, 'UTF8')"
)
PG_CREATED_US = "(extract(epoch from created_at) * 1000000)::bigint"


def content_sha256(text: str | None) -> dict[str, Any]:
    """What audit payloads hold instead of prompt/output text (see models docstring)."""
    data = (text or "").encode()
    return {"sha256": hashlib.sha256(data).hexdigest(), "chars": len(text or "")}
