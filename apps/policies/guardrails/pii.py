"""PII detection: e-mail, phone, payment card (Luhn), IBAN (ISO 13616 mod 97), national IDs
(US SSN, UK National Insurance number), IP addresses (v4 and v6).

Validation beyond the pattern (Luhn, mod 97, octet ranges) keeps false positives down: order
numbers and timestamps are not cards, version strings are not IPs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from apps.policies.guardrails.base import Finding

EMAIL_RE = re.compile(r"\b[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}\b")
# 13-19 digits, optionally grouped by single spaces, dashes or dots (the detectors read the
# canonical form: NBSP, U+202F and other spaces are plain spaces there, zero-width joiners gone).
# Look-arounds on every position are slow; plain \b here plus `_isolated` on the few matches.
CARD_RE = re.compile(r"\b(?:\d[ .-]?){12,18}\d\b")
CARD_SEPARATORS = re.compile(r"[ .-]")
IBAN_RE = re.compile(r"\b[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]){11,30}\b")
SSN_RE = re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b")
UK_NI_RE = re.compile(r"\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
UK_NI_BAD_PREFIXES = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})
# International (+cc) or North-American/European grouped numbers with at least 9 digits.
PHONE_RE = re.compile(
    r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,4}(?![\w-])"
    r"|(?<![\w+])\+\d{9,15}(?!\w)"
)
IPV4_RE = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
IPV6_RE = re.compile(
    r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{1,4}:){2,7}[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{1,4}){0,6}(?![0-9A-Fa-f:])"
)


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def iban_ok(iban: str) -> bool:
    s = iban.replace(" ", "").replace("-", "").upper()
    if not 15 <= len(s) <= 34:
        return False
    rearranged = s[4:] + s[:4]
    try:
        numeric = "".join(str(int(c, 36)) for c in rearranged)
    except ValueError:
        return False
    return int(numeric) % 97 == 1


def _isolated(text: str, start: int, end: int, chars: str) -> bool:
    """Neither neighbour is one of `chars` (a dash-joined or dotted run is something else)."""
    return not (start > 0 and text[start - 1] in chars) and not (
        end < len(text) and text[end] in chars and end + 1 < len(text) and text[end + 1].isdigit()
    )


def _cards(text: str) -> Iterable[Finding]:
    for m in CARD_RE.finditer(text):
        start = m.start()
        if not _isolated(text, start, m.end(), "-.") or (
            start > 1 and text[start - 1] in " -." and text[start - 2].isdigit()
        ):
            continue  # the tail of a longer digit run (an account number, an IBAN) is not a card
        digits = CARD_SEPARATORS.sub("", m.group())
        if 13 <= len(digits) <= 19 and len(set(digits)) > 1 and luhn_ok(digits):
            yield Finding("card", m.start(), m.end(), f"payment card ending {digits[-4:]}")


def _ibans(text: str) -> Iterable[Finding]:
    for m in IBAN_RE.finditer(text):
        raw = m.group().rstrip()
        if iban_ok(raw):
            yield Finding(
                "iban",
                m.start(),
                m.start() + len(raw),
                f"IBAN ({raw[:2]}) ending {raw.replace(' ', '').replace('-', '')[-4:]}",
            )


def _ips(text: str) -> Iterable[Finding]:
    for m in IPV4_RE.finditer(text):
        if not _isolated(text, m.start(), m.end(), "."):
            continue
        try:
            ipaddress.IPv4Address(m.group())
        except ValueError:
            continue
        yield Finding("ip", m.start(), m.end(), "IPv4 address")
    for m in IPV6_RE.finditer(text):
        if m.group().count(":") < 2:
            continue
        try:
            ipaddress.IPv6Address(m.group())
        except ValueError:
            continue
        yield Finding("ip", m.start(), m.end(), "IPv6 address")


def _phones(text: str, taken: list[tuple[int, int]]) -> Iterable[Finding]:
    for m in PHONE_RE.finditer(text):
        digits = sum(c.isdigit() for c in m.group())
        if not 9 <= digits <= 15:
            continue
        if any(m.start() < e and s < m.end() for s, e in taken):
            continue  # a card/IBAN/IP already covers it
        yield Finding("phone", m.start(), m.end(), "phone number")


def scan(text: str, types: Iterable[str]) -> list[Finding]:
    wanted = set(types)
    out: list[Finding] = []
    if "email" in wanted:
        out.extend(Finding("email", m.start(), m.end(), "e-mail address") for m in EMAIL_RE.finditer(text))
    if "card" in wanted:
        out.extend(_cards(text))
    if "iban" in wanted:
        out.extend(_ibans(text))
    if "national_id" in wanted:
        out.extend(
            Finding("national_id", m.start(), m.end(), "US social security number")
            for m in SSN_RE.finditer(text)
        )
        out.extend(
            Finding("national_id", m.start(), m.end(), "UK National Insurance number")
            for m in UK_NI_RE.finditer(text)
            if m.group()[:2] not in UK_NI_BAD_PREFIXES
        )
    if "ip" in wanted:
        out.extend(_ips(text))
    if "phone" in wanted:
        taken = [(f.start, f.end) for f in out]
        out.extend(_phones(text, taken))
    return out
