"""User-supplied regular expressions run on RE2: linear time, no catastrophic backtracking.

Every pattern a policy admin writes (blocked-term regexes, injection ``extra_patterns``,
confidential ``detect_patterns``, verification rule patterns) is compiled here, never by `re`:
a pattern such as ``(a+)+$`` takes exponential time in a backtracking engine on ``"a"*26 + "!"``
and would freeze the server. RE2 refuses what it cannot run in linear time (backreferences,
look-around); `regex_problem` names the reason so the editor can refuse it at save/publish time.

The built-in PII/secret/injection detectors are fixed, reviewed patterns (bounded repetitions)
and stay on `re`; they need its look-arounds.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

from apps.policies.guardrails.base import CheckBroken

# RE2's own compile-time memory bound (bytes) for one pattern: a huge counted repetition such as
# `(x{1000}){1000}` is refused instead of building a giant automaton.
MAX_PROGRAM_MEMORY = 8 << 20
# Most characters one user regex scans per check: RE2 is linear (~1 GB/s here), so this bounds
# the work per request; a longer text makes the check fail as "could not run" (fail_closed
# blocks it, fail_open records it as bypassed) rather than silently skipping the tail.
MAX_INPUT_CHARS = 1_000_000


class UnsafePattern(CheckBroken):
    """RE2 cannot compile the pattern (the message says why); at run time the check "could not
    run" and the policy's on_check_error decides."""


def _options() -> Any:
    opts = re2.Options()
    opts.case_sensitive = False  # every policy pattern is documented as case-insensitive
    opts.log_errors = False  # the reason is returned to the editor, not logged to stderr
    opts.max_mem = MAX_PROGRAM_MEMORY
    return opts


def _reason(err: Exception) -> str:
    raw = err.args[0] if err.args else str(err)
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if "perl operator" in text and "(?" in text:
        text += " (look-ahead/look-behind is not supported)"
    elif "escape sequence" in text and any(f"\\{d}" in text for d in "123456789"):
        text += " (backreferences are not supported)"
    return text


@lru_cache(maxsize=512)
def compile_pattern(pattern: str) -> Any:
    """The compiled RE2 pattern (case-insensitive); raises `UnsafePattern`."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as err:
        raise UnsafePattern(_reason(err)) from None


def regex_problem(pattern: str) -> str | None:
    """Why RE2 refuses `pattern`, or None when it compiles."""
    try:
        compile_pattern(pattern)
    except UnsafePattern as err:
        return str(err)
    return None


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
