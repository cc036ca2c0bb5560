"""Blocked topics and terms: keywords (whole words, case-insensitive) and regular expressions,
each with the policy's own message (shown to the user, recorded in the audit).

Keywords match in the canonical form (``normalize``) and tolerate any separators between their
words: a blocked ``insider trading`` also stops ``insider-trading`` and ``insider<U+200B>trading``.

All keywords of a policy are compiled into one alternation, so the text is scanned once however
many keywords there are (escaped literals: no backtracking blow-up, so `re` is safe); the
policy's regular expressions run one by one on RE2 (`apps.policies.guardrails.regex`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from apps.policies.guardrails import regex as safe_regex
from apps.policies.guardrails.base import Finding
from apps.policies.guardrails.normalize import canonical_text

# Between the words of a keyword: any run of separators, or none ("insider trading" also
# finds "insider-trading", "insider_trading", "insider  trading" and "insidertrading").
_SEPARATORS = re.compile(r"[\W_]+")
_WORDS = re.compile(r"\w+(?:[\W_]+\w+)*")


def keyword_key(text: str) -> str:
    """How a keyword and a match of it compare: canonical, lower case, without separators."""
    return "".join(_SEPARATORS.split(canonical_text(text).lower()))


def _keyword_re(word: str) -> str:
    if _WORDS.fullmatch(word):
        body = r"[\W_]*".join(re.escape(w) for w in _SEPARATORS.split(word) if w)
        return rf"\b{body}\b"
    # \b is far cheaper than a look-behind and means the same next to a word character.
    left = r"\b" if re.match(r"\w", word) else r"(?<!\w)"
    right = r"\b" if re.search(r"\w$", word) else r"(?!\w)"
    return left + re.escape(word) + right


@lru_cache(maxsize=256)
def _compile(
    patterns: tuple[tuple[str, str], ...],
) -> tuple[re.Pattern[str] | None, tuple[Any, ...]]:
    # Keywords are compiled in the canonical form the detectors read (normalize).
    words = sorted(
        {canonical_text(p.strip()).lower() for p, kind in patterns if kind == "keyword"} - {""},
        key=len,
        reverse=True,
    )
    keywords = re.compile("|".join(_keyword_re(w) for w in words), re.I) if words else None
    return keywords, tuple(safe_regex.compile_pattern(p) for p, kind in patterns if kind == "regex")


def scan(text: str, terms: Iterable[Any]) -> list[Finding]:
    terms = list(terms)
    keywords, regexes = _compile(tuple((t.pattern, t.kind) for t in terms))
    out: list[Finding] = []
    if keywords is not None:
        messages: dict[str, str] = {}
        for t in terms:
            if t.kind == "keyword":
                messages.setdefault(keyword_key(t.pattern), t.message)
        for m in keywords.finditer(text):
            label = messages.get(keyword_key(m.group())) or "blocked term"
            out.append(Finding("term", m.start(), m.end(), label, "[REDACTED:term]"))
    regex_terms = [t for t in terms if t.kind == "regex"]
    if regex_terms:
        safe_regex.check_input_size(text)
    for term, pattern in zip(regex_terms, regexes, strict=True):
        for m in pattern.finditer(text):
            out.append(Finding("term", m.start(), m.end(), term.message or "blocked term", "[REDACTED:term]"))
    return out
