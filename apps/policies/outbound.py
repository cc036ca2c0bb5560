"""The team's outbound policy: the input guardrails' detectors on every field of every request to
a model provider (issue 39). Fills the engine's ``OutboundPolicy`` port
(``apps.engine.hooks``); the gate that asks it sits in the provider layer
(``apps.engine.providers.gate``).

What applies: the *detectors* of ``guardrails.input`` — secrets, pii, injection, blocked_terms —
each with its own action. ``redact`` masks the finding in the field (the original text with the
span replaced), ``block`` refuses the whole request naming the field and the rule, ``warn`` and
``require_review`` flag the run. The length limit and model judges stay on the question (a judge
is a provider call itself; the length of our own prompts is not the user's). Detectors read the
canonical form of each field (``guardrails.normalize``), and message contents are also read
joined together (and the turns of a chat made one question for a conductor model, apart), so a
card split across two messages is found and masked in both halves.

Checks that break follow ``guardrails.on_check_error`` as at every stage: ``fail_closed`` refuses
the request, ``fail_open`` records the check as bypassed.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.db import transaction

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor
from apps.engine.events import CheckStatus
from apps.engine.hooks import CheckResult, OutboundField, OutboundVerdict
from apps.engine.providers.gate import OutboundGate
from apps.policies.guardrails import DETECTORS, detector, own_patterns
from apps.policies.guardrails.base import CheckBroken, Finding, apply_redactions, summarise
from apps.policies.guardrails.normalize import detect
from apps.policies.spec import EffectivePolicy, Guardrails

logger = logging.getLogger(__name__)

# A request retried, or sent again by a fallback worker, is scanned once per check. Bounded;
# cleared when full.
CACHE_ENTRIES = 256
JOIN = " "  # between message contents when they are read together


class OutboundChecks:
    """``OutboundPolicy`` for one policy's guardrails. Thread-safe (one instance serves every
    worker thread of a run)."""

    def __init__(self, guardrails: Guardrails) -> None:
        stage = guardrails.input
        self.on_check_error = guardrails.on_check_error
        self.checks = [(name, getattr(stage, name)) for name in DETECTORS if getattr(stage, name).enabled]
        self._cache: dict[tuple[str, str], list[Finding]] = {}
        self._lock = threading.Lock()

    def _scan(self, name: str, cfg: Any, text: str) -> list[Finding]:
        key = (name, text)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        scan = detector(name, cfg)
        assert scan is not None  # DETECTORS are detectors
        found = detect(text, scan, also_original=own_patterns(name, cfg))
        with self._lock:
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = found
        return found

    def check_outbound(self, fields: Sequence[OutboundField]) -> OutboundVerdict:
        verdict = OutboundVerdict()
        if not self.checks or not fields:
            return verdict
        texts = {f.path: f.text for f in fields}
        order = [f.path for f in fields]
        for name, cfg in self.checks:
            rule = f"guardrails.input.{name}"
            try:
                # One scan of the whole request per check (as earlier checks left it): a request
                # has many small fields, and a scan costs about as much for 40 bytes as for 4 KB.
                joined, pieces = _join(fields, texts)
                found = _per_field(self._scan(name, cfg, joined), pieces)
            except Exception as err:
                # Our own words only: the message of an unexpected error may quote the text.
                why = str(err) if isinstance(err, CheckBroken) else f"{type(err).__name__} in the check"
                if not isinstance(err, CheckBroken):
                    logger.exception("outbound check %s broke", name)
                if self.on_check_error == "fail_open":
                    detail = f"check broke ({why}); fail_open let the request through ({rule})"
                    verdict.checks.append(CheckResult(name, "outbound", CheckStatus.BYPASSED, "none", detail))
                    continue
                detail = f"check broke ({why}); failing closed ({rule})"
                verdict.checks.append(CheckResult(name, "outbound", CheckStatus.FAILED, "block", detail))
                verdict.blocked, verdict.rule = True, rule
                verdict.block_reason = (
                    f"the {name} check could not run on the request ({rule}); nothing was sent"
                )
                break
            for path in (p for p in order if p in found):
                self._apply(verdict, texts, name, cfg.action, rule, path, found[path])
            if verdict.blocked:
                break
        verdict.texts = {f.path: texts[f.path] for f in fields if texts[f.path] != f.text}
        return verdict

    @staticmethod
    def _apply(
        verdict: OutboundVerdict,
        texts: dict[str, str],
        name: str,
        action: str,
        rule: str,
        path: str,
        found: list[Finding],
    ) -> None:
        what = summarise(found)
        if action == "redact":
            texts[path] = apply_redactions(texts[path], found)
            detail = f"{path}: redacted ({rule}): {what}"
        elif action == "block":
            detail = f"{path}: blocked ({rule}): {what}"
            if not verdict.blocked:
                verdict.blocked, verdict.field_path, verdict.rule = True, path, rule
                verdict.block_reason = (
                    f"the request field {path} holds {what} ({rule}: block); nothing was sent"
                )
        else:
            if action not in verdict.flags:
                verdict.flags.append(action)
            word = "flagged for review" if action == "require_review" else "warning"
            detail = f"{path}: {word} ({rule}): {what}"
        verdict.checks.append(CheckResult(name, "outbound", CheckStatus.INTERVENED, action, detail))


# Between two fields that are not consecutive message contents: a blank line stops every
# pattern that reads within a line (cards, keys, e-mails, the injection phrases). Keywords may
# still join across it, as across messages: a blocked term split over two fields is found.
# ASCII, so a request with no other non-ASCII character keeps the canonical form's fast path.
FIELD_SEP = "\n\n"

# (path, offset of the piece in its field, start, end in the joined text)
Piece = tuple[str, int, int, int]


def _join(fields: Sequence[OutboundField], texts: dict[str, str]) -> tuple[str, list[Piece]]:
    """The request's texts as one, and where each piece of it came from. Message contents (and
    the turns of a chat made one question for a conductor model) follow each other as text does,
    so a value split across messages reads whole; other fields stand apart."""
    parts: list[str] = []
    pieces: list[Piece] = []
    pos = 0
    previous_was_message = False
    for f in fields:
        text = texts[f.path]
        turns = _turns(text) if f.message is not None else [(0, text)]
        for offset, piece in turns:
            if parts:
                if f.message is not None and previous_was_message:
                    # One space, none where one already ends or starts with a space: a value
                    # split after its separator ("4111 1111 " + "1111 1111") reads as it was.
                    sep = "" if parts[-1][-1:].isspace() or piece[:1].isspace() else JOIN
                else:
                    sep = FIELD_SEP
                parts.append(sep)
                pos += len(sep)
            pieces.append((f.path, offset, pos, pos + len(piece)))
            parts.append(piece)
            pos += len(piece)
            previous_was_message = f.message is not None
    return "".join(parts), pieces


def _per_field(findings: list[Finding], pieces: list[Piece]) -> dict[str, list[Finding]]:
    """Each finding as spans of the fields it covers (a split card: a span in each message)."""
    out: dict[str, list[Finding]] = {}
    for finding in findings:
        for path, offset, s, e in pieces:
            if finding.start < e and s < finding.end:
                start, end = max(finding.start, s) - s + offset, min(finding.end, e) - s + offset
                out.setdefault(path, []).append(replace(finding, start=start, end=end))
    return out


# A chat sent to a conductor model is one question whose turns are labelled by role
# (apps.api.v1.run_request.question_from_turns): its turns are read apart like messages.
TURN = re.compile(r"\n\n(?:System|User|Assistant|Tool): ")


def _turns(text: str) -> list[tuple[int, str]]:
    """(offset, text) of each turn of a content (the whole content when it has one turn)."""
    out: list[tuple[int, str]] = []
    pos = 0
    for m in TURN.finditer(text):
        out.append((pos, text[pos : m.start()]))
        pos = m.end()
    out.append((pos, text[pos:]))
    return out


def outbound_gate(effective: EffectivePolicy) -> OutboundGate:
    """The gate for provider calls made outside a run (evaluators, health checks), from the
    team's effective policy. A run's gate is built on its ``PolicyHooks`` (the same checks)."""
    return OutboundGate(OutboundChecks(effective.spec.guardrails))


def audit_outbound(
    *,
    purpose: str,
    checks: Sequence[CheckResult],
    blocked: bool,
    team: Any = None,
    run_id: Any = None,
    actor: Actor = None,
) -> None:
    """Audit what the gate did to a provider call made outside a run (a run's own calls are
    audited by its sink). Names the purpose, the fields and the rules; never the content."""
    if not checks:
        return
    with transaction.atomic():
        _audit_outbound(
            purpose=purpose, checks=checks, blocked=blocked, team=team, run_id=run_id, actor=actor
        )


def _audit_outbound(
    *, purpose: str, checks: Sequence[CheckResult], blocked: bool, team: Any, run_id: Any, actor: Actor
) -> None:
    audit_record(
        event_type=AuditEventType.OUTBOUND_CHECKED,
        actor=actor,
        team=team,
        object_type="runs.run" if run_id is not None else "",
        object_id=str(run_id) if run_id is not None else None,
        run_id=run_id,
        payload={
            "purpose": purpose,
            "checks": [
                {k: c.to_dict()[k] for k in ("name", "stage", "status", "action", "detail")} for c in checks
            ],
            "blocked": blocked,
        },
    )
