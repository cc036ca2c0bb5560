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

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
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


class _Buffered:
    """The gate of an answer that must be whole before it is judged (e.g. a JSON response format
    the runner checks and may repair)."""

    def __init__(self, reason: str) -> None:
        self.buffered: str | None = reason

    def feed(self, piece: str) -> Release:
        return Release()

    def close(self) -> Closed:  # pragma: no cover - the runner never closes a buffered gate
        return Closed(Release(), "", [], [])


def buffered(reason: str) -> AnswerGate:
    return _Buffered(reason)


@dataclass(slots=True)
class AnswerStream:
    """One attempt of the answer step through its gate (``gate`` None: nothing to check, the
    provider's pieces pass through as they come). ``emit`` sends released text on its way."""

    index: int
    gate: AnswerGate | None
    emit: Callable[[str], None]
    # A buffered answer's text as the worker writes it, unchecked: for the run's live graph, whose
    # viewers the hold machinery already filters (a held run shows it to reviewers only); never
    # sent to a /v1 client (apps.api.v1.shaping.progress drops it).
    emit_unchecked: Callable[[str], None] | None = None
    released: list[str] = field(default_factory=list)
    blocked: Release | None = None
    closed: Closed | None = None
    fed: bool = False  # the provider streamed (a worker that does not never calls on_delta)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def streams(self) -> bool:
        return self.gate is None or self.gate.buffered is None

    @property
    def released_any(self) -> bool:
        return any(self.released)

    def on_delta(self, piece: str) -> None:
        with self._lock:
            self.fed = True
            if self.gate is None:
                self._send(piece)
                return
            if self.gate.buffered is not None:
                if self.emit_unchecked is not None:
                    self.emit_unchecked(piece)
                return
            if self.blocked is not None:
                return
            got = self.gate.feed(piece)
            self._send(got.text)
            if got.blocked:
                self.blocked = got
                raise AnswerBlocked(got.reason or "an output guardrail blocked the answer", rule=got.rule)

    def close(self) -> Closed | None:
        """The end of the stream (None when there was no gate): the rest released, the record."""
        with self._lock:
            if self.gate is None or self.gate.buffered is not None or not self.fed:
                return None
            if self.closed is None:
                self.closed = self.gate.close()
                if not self.closed.release.blocked:
                    self._send(self.closed.release.text)
            return self.closed

    def digest(self) -> str:
        """sha256 of everything released (what a client streaming the answer received)."""
        return hashlib.sha256("".join(self.released).encode()).hexdigest()

    def _send(self, text: str) -> None:
        if text:
            self.released.append(text)
            self.emit(text)


__all__ = ["AnswerBlocked", "AnswerGate", "AnswerStream", "Closed", "Release", "buffered"]
