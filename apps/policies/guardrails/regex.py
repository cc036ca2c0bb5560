"""User-supplied regular expressions run on RE2: linear time, no catastrophic backtracking.

Every pattern a policy admin writes (blocked-term regexes, injection ``extra_patterns``,
confidential ``detect_patterns``, verification rule patterns) is compiled here, never by `re`:
a pattern such as ``(a+)+$`` takes exponential time in a backtracking engine on ``"a"*26 + "!"``
and would freeze the server. RE2 refuses what it cannot run in linear time (backreferences,
look-around); `apps.policies.patterns.regex_problem` names the reason so the editor can refuse it at
save/publish time.

The built-in PII/secret/injection detectors are fixed, reviewed patterns (bounded repetitions)
and stay on `re`; they need its look-arounds.
"""

from __future__ import annotations

from typing import Any

import re2

from apps.policies.guardrails.base import CheckBroken
from apps.policies.patterns import compile_re2, refusal_reason

# Most characters one user regex scans per check: RE2 is linear (~1 GB/s here), so this bounds
# the work per request; a longer text makes the check fail as "could not run" (fail_closed
# blocks it, fail_open records it as bypassed) rather than silently skipping the tail.
MAX_INPUT_CHARS = 1_000_000


class UnsafePattern(CheckBroken):
    """RE2 cannot compile the pattern (the message says why); at run time the check "could not
    run" and the policy's on_check_error decides."""


def compile_pattern(pattern: str) -> Any:
    """The compiled RE2 pattern (case-insensitive, cached); raises `UnsafePattern`."""
    try:
        return compile_re2(pattern)
    except re2.error as err:
        raise UnsafePattern(refusal_reason(err)) from None


def check_input_size(text: str) -> None:
    if len(text) > MAX_INPUT_CHARS:
        raise CheckBroken(
            f"the text has {len(text)} characters; policy regular expressions scan at most {MAX_INPUT_CHARS}"
        )


def search(pattern: str, text: str) -> bool:
    """Does `pattern` occur in `text`? Fails closed: a pattern RE2 refuses (only possible for a
    version stored before patterns were checked) or an over-long text counts as a match."""
    if len(text) > MAX_INPUT_CHARS:
        return True
    try:
        return compile_pattern(pattern).search(text) is not None
    except UnsafePattern:
        return True
