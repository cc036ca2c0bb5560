"""Secret masking for before/after values: a credential never reaches an audit row."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

_SECRET_KEY_RE = re.compile(r"(?i)(api_?key|secret|token|password|credential|authorization)")
# Field names that hold *where* a secret lives, not the secret itself.
_ALLOWED = {"api_key_env", "api_key_last4", "api_key_id", "api_key_set", "max_tokens", "token_usage"}


def mask_value(value: Any) -> str:
    text = str(value or "")
    if not text:
        return ""
    return "•••• " + text[-4:] if len(text) >= 12 else "••••"


@lru_cache(maxsize=4096)
def _is_secret_key(key: str) -> bool:
    # Cached: payload keys repeat on every append, the regex need not run each time.
    return key not in _ALLOWED and bool(_SECRET_KEY_RE.search(key)) and not key.endswith("_tokens")


def mask_secrets(data: Any) -> Any:
    """Recursively replace values under secret-looking keys with a fixed mask."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(key, str) and _is_secret_key(key):
                out[key] = "••••" if value else ""
            else:
                out[key] = mask_secrets(value)
        return out
    if isinstance(data, list | tuple):
        return [mask_secrets(v) for v in data]
    return data


def diff_values(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """The fields that changed, masked: ``{field: {"before": ..., "after": ...}}``."""
    # Compare the raw values (so a rotated key shows up as a change) but record only masked ones.
    raw_before, raw_after = before or {}, after or {}
    masked_before, masked_after = mask_secrets(raw_before), mask_secrets(raw_after)
    keys = sorted(set(raw_before) | set(raw_after))
    return {
        k: {"before": masked_before.get(k), "after": masked_after.get(k)}
        for k in keys
        if raw_before.get(k) != raw_after.get(k)
    }
