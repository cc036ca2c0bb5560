"""Shared types for guardrail checks (pure Python).

A check family scans text and returns `Finding`s: where (span), what kind, and a label that is
safe to record — it never contains the matched secret or personal datum itself
("payment card ending 4242", "AWS access key"). The stage runner (`apps.policies.guardrails`)
turns findings into an action (block / redact / warn / require_review) and a `CheckResult`.
"""

from __future__ import annotations

from dataclasses import dataclass


class CheckBroken(Exception):
    """The check itself could not run (bad config at run time, a judge that failed...)."""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # e.g. "card", "email", "openai", "injection", "term"
    start: int
    end: int
    label: str  # safe to show and audit: never the matched text for PII/secrets
    replacement: str = ""  # what `redact` puts in place of the span ("" → "[REDACTED:<kind>]")

    @property
    def placeholder(self) -> str:
        return self.replacement or f"[REDACTED:{self.kind}]"


def apply_redactions(text: str, findings: list[Finding]) -> str:
    """Replace every finding's span; overlapping spans are merged (the earliest one's placeholder)."""
    if not findings:
        return text
    spans = sorted(findings, key=lambda f: (f.start, -f.end))
    out: list[str] = []
    pos = 0
    for f in spans:
        if f.end <= pos:
            continue  # inside a span already replaced
        start = max(f.start, pos)
        out.append(text[pos:start])
        out.append(f.placeholder)
        pos = f.end
    out.append(text[pos:])
    return "".join(out)


def summarise(findings: list[Finding], limit: int = 6) -> str:
    """'payment card ending 4242, e-mail address (2)' — labels with counts, bounded."""
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.label] = counts.get(f.label, 0) + 1
    parts = [f"{label} ({n})" if n > 1 else label for label, n in counts.items()]
    more = len(parts) - limit
    text = ", ".join(parts[:limit])
    return text + (f" and {more} more" if more > 0 else "")
