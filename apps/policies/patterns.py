"""RE2 compilation of the regular expressions a policy admin writes: linear time, no catastrophic
backtracking (why never `re`: see ``apps.policies.guardrails.regex``, which runs them).

A module of its own, below both the spec (which refuses at save/publish time what RE2 cannot run)
and the guardrails package (which runs the patterns): the guardrails package imports the spec, so
the spec cannot import anything from inside that package.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

# RE2's own compile-time memory bound (bytes) for one pattern: a huge counted repetition such as
# `(x{1000}){1000}` is refused instead of building a giant automaton.
MAX_PROGRAM_MEMORY = 8 << 20


def _options() -> Any:
    opts = re2.Options()
    opts.case_sensitive = False  # every policy pattern is documented as case-insensitive
    opts.log_errors = False  # the reason is returned to the editor, not logged to stderr
    opts.max_mem = MAX_PROGRAM_MEMORY
    return opts


def refusal_reason(err: Exception) -> str:
    """Why RE2 refused a pattern, in words a policy admin can act on."""
    raw = err.args[0] if err.args else str(err)
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if "perl operator" in text and "(?" in text:
        text += " (look-ahead/look-behind is not supported)"
    elif "escape sequence" in text and any(f"\\{d}" in text for d in "123456789"):
        text += " (backreferences are not supported)"
    return text


@lru_cache(maxsize=512)
def compile_re2(pattern: str) -> Any:
    """The compiled RE2 pattern (case-insensitive); raises ``re2.error``."""
    return re2.compile(pattern, _options())


def regex_problem(pattern: str) -> str | None:
    """Why RE2 refuses `pattern`, or None when it compiles."""
    try:
        compile_re2(pattern)
    except re2.error as err:
        return refusal_reason(err)
    return None
