"""The answer's output gate on a stream: the engine's port (issue 45). Pure Python, no Django.

The step that writes a run's answer streams through an ``AnswerGate`` (filled by
``apps.policies.guardrails.stream``): every provider delta is fed to it, and only what it
*releases* leaves the engine (``answer.delta`` events). The gate runs the checks that can judge a
prefix (detectors, blocked terms, bounded regexes, length) with a hold-back: text that could still
turn out to be part of a finding is not released until it is decided. ``redact`` masks in the
stream; ``block`` ends it (``AnswerBlocked`` unwinds the provider call) and nothing of the
offending text was released. A policy with checks that need the whole answer (``require_review``,
JSON schema, model judges) *buffers*: ``buffered`` says why, nothing is released while the worker
writes, and the answer comes with the run's verdict.

``close()`` ends the stream: the rest is released and the stage's record is made from the whole
text (``GuardrailOutcome``), whose ``text`` is exactly what was released — the stored answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from apps.engine.checks import CheckResult
from apps.engine.providers.base import ProviderError


@dataclass(slots=True)
class Release:
    """What one ``feed`` (or ``close``) lets out: ``text`` goes to the client now. ``blocked``:
    the stream ends here, ``reason`` in plain words, ``rule`` the policy rule
    (``guardrails.output.blocked_terms``)."""

    text: str = ""
    blocked: bool = False
    reason: str | None = None
    rule: str | None = None


@dataclass(slots=True)
class Closed:
    """The end of a stream: the last ``release`` and the output stage's record. ``text`` is
    everything released (the answer); ``checks`` the stage's checks on the whole text."""

    release: Release
    text: str
    checks: list[CheckResult]
    flags: list[str]


@runtime_checkable
class AnswerGate(Protocol):
    buffered: str | None  # why the answer cannot stream (whole-answer checks), or None

    def feed(self, piece: str) -> Release: ...

    def close(self) -> Closed: ...


class AnswerBlocked(ProviderError):
    """Raised from a delta callback: the output gate blocked the answer mid-stream. Never retried;
    the executor ends the step ``blocked`` and the run ``blocked`` naming the rule."""

    code = "output_blocked"
    retryable = False

    def __init__(self, message: str, *, rule: str | None = None) -> None:
        super().__init__(message)
        self.rule = rule


__all__ = ["AnswerBlocked", "AnswerGate", "Closed", "Release"]
