"""The output guardrails on a stream: an incremental gate (issue 45). Pure Python, no Django.

A stream is judged with the same checks, the same normaliser (``normalize.detect``) and the same
detectors as a whole answer (``run_stage``); what changes is *when* text may leave:

- every ``feed`` re-reads the text not yet released (plus a margin of context before it) and
  finds what the detectors find there;
- **hold-back**: text from the start of anything that could still become a finding is kept.
  That is (a) a finding that reaches the end of the text so far (a card may gain digits, a key
  characters) and (b) any *partial* match of a detector's pattern at the end (the ``regex``
  module's partial matching, on the canonical form and on the original): ``sk-pr`` or
  ``insider tra`` or ``4111 1111`` at the end are held until the next pieces decide them. The
  window is thus exactly as long as the longest thing still being decided — no fixed size that a
  long separator run could outgrow;
- a decided finding is applied: ``redact`` masks it in what is released, ``block`` ends the
  stream (nothing from the finding's start on was released), ``warn`` is recorded at the end;
- ``length`` counts what was released: ``block`` ends the stream at the limit, ``redact``
  truncates there.

Checks that need the whole answer — ``json_schema``, ``model_judge``, any check whose action is
``require_review``, or a policy pattern the partial matcher cannot read — make the gate
*buffered* (``buffered`` names the reason): the engine streams nothing and the answer comes with
the verdict.

``close`` releases the rest and makes the stage's record by running ``run_stage`` on the whole
text (the same record a plain answer gets); its ``text`` is exactly what was released.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import regex

from apps.engine.answer import Closed, Release
from apps.engine.checks import CheckResult, Stage
from apps.engine.events import CheckStatus
from apps.policies.guardrails import CHECK_ORDER, detector, own_patterns, run_stage
from apps.policies.guardrails import injection as injection_mod
from apps.policies.guardrails import pii as pii_mod
from apps.policies.guardrails import secrets as secrets_mod
from apps.policies.guardrails import terms as terms_mod
from apps.policies.guardrails.base import CheckBroken, Finding, apply_redactions, summarise
from apps.policies.guardrails.normalize import canonical, detect
from apps.policies.spec import StageGuardrails

logger = logging.getLogger(__name__)

# Context re-read before the first unreleased character: look-behinds, ``\b`` and the card
# check's neighbours need a few characters; a finding is never longer than what is held.
MARGIN = 64
STREAMABLE = ("secrets", "pii", "injection", "blocked_terms")
WHOLE_ANSWER = ("json_schema", "model_judge")
_RE_FLAGS = re.I | re.M | re.S | re.X

_PII_PATTERNS: dict[str, tuple[re.Pattern[str], ...]] = {
    "email": (pii_mod.EMAIL_RE,),
    "card": (pii_mod.CARD_RE,),
    "iban": (pii_mod.IBAN_RE,),
    "national_id": (pii_mod.SSN_RE, pii_mod.UK_NI_RE),
    "ip": (pii_mod.IPV4_RE, pii_mod.IPV6_RE),
    "phone": (pii_mod.PHONE_RE,),
}


class Unstreamable(Exception):
    """A check's patterns cannot be matched partially: the gate buffers."""


# Appended to a pattern: a character no text holds, so no match completes and the matcher tries
# every path from each start; a path that reaches the end of the text is a partial match. Without
# it a complete shorter match ("+44 20 7946") hides the longer one still being written.
_NEVER = "\U0010ffff"


def _partial(pattern: re.Pattern[str] | str) -> Any:
    flags = regex.V0
    if isinstance(pattern, str):  # a policy's own pattern (RE2 syntax, case-insensitive)
        source, flags = pattern, flags | regex.I
    else:
        source, flags = pattern.pattern, flags | (pattern.flags & _RE_FLAGS)
    if source.startswith("(?i)"):
        source, flags = source[4:], flags | regex.I
    try:
        return regex.compile(f"(?:{source}){_NEVER}", flags)
    except (regex.error, TypeError, ValueError) as err:
        raise Unstreamable(str(err)) from None


def hold_patterns(name: str, cfg: Any) -> list[Any]:
    """The patterns whose partial match at the end of a stream holds it back, for one check."""
    if name == "secrets":
        out = [_partial(p) for kind, (p, _) in secrets_mod.PATTERNS.items() if kind in cfg.types]
        if "generic" in cfg.types:
            out.append(_partial(secrets_mod.GENERIC_RE))
        return out
    if name == "pii":
        return [_partial(p) for kind in cfg.types for p in _PII_PATTERNS.get(kind, ())]
    if name == "injection":
        out = [_partial(p) for p, _, _ in injection_mod.compile_rules()]
        return out + [_partial(p) for p in cfg.extra_patterns]
    if name == "blocked_terms":
        keywords, _ = terms_mod._compile(tuple((t.pattern, t.kind) for t in cfg.terms))
        out = [_partial(keywords)] if keywords is not None else []
        return out + [_partial(t.pattern) for t in cfg.terms if t.kind == "regex"]
    return []


def buffered_reason(checks: StageGuardrails, stage: str = "output") -> str | None:
    """Why a stage's checks cannot run on a stream (the answer is buffered), or None."""
    for name in CHECK_ORDER:
        cfg = getattr(checks, name)
        if not cfg.enabled:
            continue
        if name in WHOLE_ANSWER:
            return f"the {stage} {name} check reads the whole answer"
        if cfg.action == "require_review":
            return f"the {stage} {name} check may hold the answer for review"
        if name == "length" and cfg.max_chars is None:
            return f"the {stage} length check has no limit set"
        try:
            hold_patterns(name, cfg)
        except (Unstreamable, CheckBroken):
            return f"a pattern of the {stage} {name} check cannot be checked on a stream"
    return None


def policy_buffered_reason(guardrails: Any) -> str | None:
    """Why a policy's answers cannot stream (None: they stream through the gate). A check that
    may hold the answer for review, at any stage, buffers it: a held answer is never partly shown."""
    for stage in ("input", "step_output", "output"):
        checks = getattr(guardrails, stage)
        for name in CHECK_ORDER:
            cfg = getattr(checks, name)
            if cfg.enabled and cfg.action == "require_review":
                return f"the {stage} {name} check may hold the answer for review"
    return buffered_reason(guardrails.step_output, "step_output") or buffered_reason(guardrails.output)


def any_enabled(checks: StageGuardrails) -> bool:
    return any(getattr(checks, name).enabled for name in CHECK_ORDER)


@dataclass(slots=True)
class _Found:
    name: str
    action: str
    finding: Finding


class StreamGate:
    """One stage's checks over a stream (see the module docstring). Not thread-safe: one
    provider call feeds it from one thread."""

    def __init__(
        self, checks: StageGuardrails, *, stage: Stage = "output", on_check_error: str = "fail_closed"
    ):
        self.checks = checks
        self.stage = stage
        self.on_check_error = on_check_error
        self.buffered = buffered_reason(checks, stage)
        self._detectors: list[tuple[str, Any, Callable[[str], list[Finding]]]] = []
        self._holds: list[tuple[Any, bool]] = []  # (pattern, also on the original text)
        if self.buffered is None:
            for name in STREAMABLE:
                cfg = getattr(checks, name)
                if cfg.enabled:
                    scan = detector(name, cfg)
                    assert scan is not None
                    self._detectors.append((name, cfg, scan))
                    mine = own_patterns(name, cfg)
                    self._holds.extend((p, mine) for p in hold_patterns(name, cfg))
        self._length = checks.length if checks.length.enabled else None
        self.raw = ""  # everything fed
        self.sent = 0  # raw characters decided and released (or masked)
        self.out: list[str] = []  # what was released
        self._out_len = 0
        self._truncated = False
        self._blocked: Release | None = None
        self._broken: set[str] = set()  # checks that broke with fail_open: not run again

    # -- the stream ------------------------------------------------------------------------------

    @property
    def released(self) -> str:
        return "".join(self.out)

    def feed(self, piece: str) -> Release:
        if self._blocked is not None or self.buffered is not None:
            return Release()
        self.raw += piece
        return self._advance(closing=False)

    def close(self) -> Closed:
        if self._blocked is not None:
            return self._closed(Release(blocked=True, reason=self._blocked.reason, rule=self._blocked.rule))
        record = run_stage(self.stage, self.checks, self.raw, on_check_error=self.on_check_error)
        if record.blocked:
            # Whatever the whole text shows that the stream did not stop: the rest stays held.
            rule = next(
                (f"guardrails.{self.stage}.{c.name}" for c in record.checks if c.action == "block"), None
            )
            self._blocked = Release(blocked=True, reason=record.block_reason, rule=rule)
            return Closed(self._blocked, self.released, record.checks, list(record.flags))
        release = self._advance(closing=True)
        if release.blocked:
            return self._closed(release)
        if self._truncated:
            release.text += "[TRUNCATED]"
            self.out.append("[TRUNCATED]")
        return Closed(release, self.released, record.checks, list(record.flags))

    def _closed(self, release: Release) -> Closed:
        record = run_stage(self.stage, self.checks, self.raw, on_check_error=self.on_check_error)
        checks = list(record.checks)
        if not record.blocked:
            checks.append(
                CheckResult(
                    (release.rule or "stream").rsplit(".", 1)[-1],
                    self.stage,
                    CheckStatus.INTERVENED,
                    "block",
                    f"blocked in the stream: {release.reason}",
                )
            )
        return Closed(release, self.released, checks, list(record.flags))

    def _advance(self, *, closing: bool) -> Release:
        end = len(self.raw)
        if self._truncated:
            self.sent = end
            return Release()
        base = max(0, self.sent - MARGIN)
        window = self.raw[base:]
        found: list[_Found] = []
        for name, cfg, scan in self._detectors:
            if name in self._broken:
                continue
            try:
                hits = detect(window, scan, also_original=own_patterns(name, cfg))
            except Exception as err:
                why = str(err) if isinstance(err, CheckBroken) else f"{type(err).__name__} in the check"
                if self.on_check_error == "fail_open":
                    self._broken.add(name)
                    continue
                return self._block(f"the {name} check could not run ({why})", name)
            found.extend(
                _Found(name, cfg.action, replace(f, start=f.start + base, end=f.end + base)) for f in hits
            )
        release_to = end if closing else min(end, self._hold_from(window, base))
        live = [f for f in found if f.finding.end > self.sent]
        if not closing:
            for f in live:
                if f.finding.end >= end:  # reaches the end: it may still grow
                    release_to = min(release_to, f.finding.start)
            live = [f for f in live if f.finding.end < end]
        for f in live:
            if f.action == "block":
                label = summarise([f.finding])
                return self._block(f"{label} ({f.name})", f.name)
        masks = [f.finding for f in live if f.action == "redact"]
        moved = True
        while moved:  # never cut a decided finding in two
            moved = False
            for m in masks:
                if m.start < release_to < m.end:
                    release_to, moved = m.start, True
        release_to = max(release_to, self.sent)
        if release_to == self.sent:
            return Release()
        segment = self.raw[self.sent : release_to]
        inside = [
            replace(m, start=max(0, m.start - self.sent), end=m.end - self.sent)
            for m in masks
            if m.end > self.sent and m.start < release_to
        ]
        text = apply_redactions(segment, inside)
        self.sent = release_to
        limit = self._length
        if limit is not None and limit.max_chars is not None and self._out_len + len(text) > limit.max_chars:
            if limit.action == "block":
                total = self._out_len + len(text)
                return self._block(f"{total} characters; the limit is {limit.max_chars} (length)", "length")
            if limit.action == "redact":
                text = text[: limit.max_chars - self._out_len]
                self._truncated = True
                self.sent = end
        self.out.append(text)
        self._out_len += len(text)
        return Release(text)

    def _hold_from(self, window: str, base: int) -> int:
        """The first original index that a pattern may still be matching at the end."""
        end = base + len(window)
        hold = end
        if not self._holds:
            return hold
        canon = canonical(window)
        texts = [(canon.text, True)] if canon.identical else [(canon.text, True), (window, False)]
        for text, is_canon in texts:
            size = len(text)
            for pattern, own in self._holds:
                if not is_canon and not own:
                    continue
                m = pattern.search(text, partial=True)
                if m is not None and m.start() < size:
                    start = canon.span(m.start(), m.start() + 1)[0] if is_canon else m.start()
                    hold = min(hold, base + start)
        return hold

    def _block(self, reason: str, name: str) -> Release:
        self._blocked = Release(blocked=True, reason=reason, rule=f"guardrails.{self.stage}.{name}")
        return self._blocked


class ChainGate:
    """Two stages in a row (the answer step's step_output checks, then the output checks): what
    the first releases is fed to the second."""

    def __init__(self, first: StreamGate, second: StreamGate) -> None:
        self.first, self.second = first, second
        self.buffered = first.buffered or second.buffered

    def feed(self, piece: str) -> Release:
        got = self.first.feed(piece)
        if got.blocked:
            return got
        return self.second.feed(got.text) if got.text else Release()

    def close(self) -> Closed:
        first = self.first.close()
        if first.release.blocked:
            return first
        if first.release.text:
            fed = self.second.feed(first.release.text)
            if fed.blocked:
                return self.second.close()
            tail = self.second.close()
            tail.release.text = fed.text + tail.release.text
            return tail
        return self.second.close()


def answer_gate(
    output: StageGuardrails, step_output: StageGuardrails, *, on_check_error: str = "fail_closed"
) -> StreamGate | ChainGate | None:
    """The gate of a run's answer stream (None: no check applies, the stream passes through)."""
    gates = [
        StreamGate(checks, stage=stage, on_check_error=on_check_error)
        for stage, checks in (("step_output", step_output), ("output", output))
        if any_enabled(checks)
    ]
    if not gates:
        return None
    return gates[0] if len(gates) == 1 else ChainGate(gates[0], gates[1])


__all__ = ["MARGIN", "ChainGate", "StreamGate", "answer_gate", "buffered_reason", "policy_buffered_reason"]
