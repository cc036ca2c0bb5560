"""Secret detection: API keys of common providers, private key blocks, JWTs and generic
`api_key = ...` assignments. Labels name the kind only — never any part of the secret."""

from __future__ import annotations

import re
from collections.abc import Iterable

from apps.policies.guardrails.base import Finding

PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "openai": (
        re.compile(r"\bsk-(?:proj-|ant-(?:api\d{2}-)?|svcacct-)?[A-Za-z0-9_-]{20,}"),
        "OpenAI/Anthropic-style API key",
    ),
    "aws": (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "AWS access key id"),
    "github": (
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b"),
        "GitHub token",
    ),
    "slack": (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "Slack token"),
    "private_key": (
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|.*\Z)",
            re.S,
        ),
        "private key block",
    ),
    "jwt": (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "JSON Web Token"),
}
# `password = "…"`, `api_key: …`: only the value is the secret (the name stays readable).
GENERIC_RE = re.compile(
    r"(?i)\b(?:api[_-]?key|secret(?:[_-]?key)?|access[_-]?token|auth[_-]?token|password|passwd)\b\s*[:=]\s*[\"']?([^\s\"',;]{12,})"
)


# A pattern only runs when one of its literals occurs: `in` is ~100x cheaper than a regex scan.
NEEDLES: dict[str, tuple[str, ...]] = {
    "openai": ("sk-",),
    "aws": ("AKIA", "ASIA"),
    "github": ("gh", "github_pat_"),
    "slack": ("xox",),
    "private_key": ("PRIVATE KEY",),
    "jwt": ("eyJ",),
}
GENERIC_NEEDLES = ("key", "secret", "token", "passw")


def scan(text: str, types: Iterable[str]) -> list[Finding]:
    wanted = set(types)
    out: list[Finding] = []
    for kind, (pattern, label) in PATTERNS.items():
        if kind in wanted and any(n in text for n in NEEDLES[kind]):
            out.extend(
                Finding(kind, m.start(), m.end(), label, f"[REDACTED:{kind}]") for m in pattern.finditer(text)
            )
    if "generic" in wanted and any(n in text.lower() for n in GENERIC_NEEDLES):
        for m in GENERIC_RE.finditer(text):
            s, e = m.span(1)
            if not any(f.start <= s < f.end for f in out):
                out.append(Finding("generic", s, e, "credential in an assignment", "[REDACTED:secret]"))
    return out
