"""Characters no stored or sent text may hold, defined once for every layer that refuses them
(the policy spec's validation, the request input limits)."""

from __future__ import annotations

import re

# NUL (PostgreSQL text cannot hold it) or a lone surrogate (not encodable as UTF-8).
BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


def has_bad_chars(text: str) -> bool:
    """Whether ``text`` holds a NUL or an unpaired surrogate."""
    return BAD_CHARS.search(text) is not None
