"""Guardrails: run one stage's checks on a text and decide what happens to it.

`run_stage(...)` is pure (no ORM) and fast; the engine hooks call it at the input, step-output
and output stages, the policy test box calls it on sample prompts.

Order within a stage: secrets → pii → injection → blocked_terms → length → json_schema →
model_judge. Each check sees the text as earlier checks left it, so a `redact` happens before
anything later — including a model judge, which is a worker too — sees the text.

The detectors (secrets, pii, injection, blocked_terms) read the canonical form of the text
(``normalize``: NFKC-style folding, zero-width characters removed, Unicode spaces, digits and
confusable letters mapped); their findings are mapped back, so a redaction masks the original.

Per check, the recorded status is:

- ``passed``      the check ran and found nothing;
- ``intervened``  it found something and its action applied (block / redact / warn / require_review);
- ``failed``      the check itself broke and the policy fails closed: the text is blocked;
- ``bypassed``    the check itself broke and the policy says ``fail_open``: the text went on unchecked;
- ``not_run``     it did not run (an earlier check already blocked the text, or the caller
                  cannot run it, e.g. model judges in the test box).

Disabled checks are not listed; a stage with no enabled check reports one ``not_run`` entry so a
record never suggests that something was checked when nothing was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from apps.engine.events import CheckStatus
from apps.engine.hooks import CheckResult, GuardrailOutcome, Stage
from apps.policies.guardrails import injection, json_schema, judge, length, pii, secrets, terms
from apps.policies.guardrails.base import CheckBroken, Finding, apply_redactions, summarise
from apps.policies.guardrails.normalize import detect
from apps.policies.spec import StageGuardrails

logger = logging.getLogger(__name__)

CHECK_ORDER = ("secrets", "pii", "injection", "blocked_terms", "length", "json_schema", "model_judge")
# The check families that find spans in a text (what the outbound gate applies to every field).
DETECTORS = ("secrets", "pii", "injection", "blocked_terms")


@dataclass(frozen=True, slots=True)
class StageEnv:
    """What a stage may use beyond the text: a resolver for judge workers (None: judges can't
    run here, e.g. the test box) and whether to run judges at all."""

    resolve_worker: Callable[[str], object | None] | None = None
    run_judges: bool = True
    judge_timeout_s: float = 60.0


def detector(name: str, cfg: object) -> Callable[[str], list[Finding]] | None:
    """The text detector of a check family (None for checks that are not detectors). Callers
    run it through ``normalize.detect``: detectors read the canonical form of a text."""
    if name == "secrets":
        return lambda text: secrets.scan(text, cfg.types)  # type: ignore[attr-defined]
    if name == "pii":
        return lambda text: pii.scan(text, cfg.types)  # type: ignore[attr-defined]
    if name == "injection":
        return lambda text: injection.scan(text, cfg.extra_patterns)  # type: ignore[attr-defined]
    if name == "blocked_terms":
        return lambda text: terms.scan(text, cfg.terms)  # type: ignore[attr-defined]
    return None


def own_patterns(name: str, cfg: object) -> bool:
    """The check runs the policy's own regular expressions (scanned on the original text too)."""
    if name == "injection":
        return bool(cfg.extra_patterns)  # type: ignore[attr-defined]
    if name == "blocked_terms":
        return any(t.kind == "regex" for t in cfg.terms)  # type: ignore[attr-defined]
    return False


def _scan(name: str, cfg: object, text: str, env: StageEnv, gate_checks: list[CheckResult]) -> list[Finding]:
    scan = detector(name, cfg)
    if scan is not None:
        return detect(text, scan, also_original=own_patterns(name, cfg))
    if name == "length":
        return length.scan(text, cfg.max_chars)  # type: ignore[attr-defined]
    if name == "json_schema":
        return json_schema.scan(text, cfg.schema)  # type: ignore[attr-defined]
    if name == "model_judge":
        found: list[Finding] = []
        for j in cfg.judges:  # type: ignore[attr-defined]
            verdict = judge.judge(
                text,
                rule=j.prompt,
                worker_key=j.worker,
                resolve=env.resolve_worker,
                timeout_s=env.judge_timeout_s,
            )
            gate_checks.extend(verdict.outbound)  # the gate's redactions of the judge's request
            if not verdict.passed:
                found.append(
                    Finding(
                        "judge",
                        0,
                        len(text),
                        f"judge '{j.name}' failed the text: {verdict.reason or 'no reason given'}",
                    )
                )
        return found
    raise CheckBroken(f"unknown check {name}")  # pragma: no cover


def run_stage(
    stage: Stage,
    checks: StageGuardrails,
    text: str,
    *,
    on_check_error: str = "fail_closed",
    env: StageEnv | None = None,
) -> GuardrailOutcome:
    env = env or StageEnv()
    results: list[CheckResult] = []
    flags: list[str] = []
    blocked = False
    block_reason: str | None = None
    current = text
    enabled = [(name, getattr(checks, name)) for name in CHECK_ORDER if getattr(checks, name).enabled]
    if not enabled:
        results.append(
            CheckResult("guardrails", stage, CheckStatus.NOT_RUN, "none", "no checks enabled for this stage")
        )
        return GuardrailOutcome(results, text)

    for name, cfg in enabled:
        if blocked:
            results.append(
                CheckResult(
                    name, stage, CheckStatus.NOT_RUN, "none", "not run: an earlier check blocked the text"
                )
            )
            continue
        if name == "model_judge" and (not env.run_judges or env.resolve_worker is None):
            results.append(
                CheckResult(name, stage, CheckStatus.NOT_RUN, "none", "model-judged checks are not run here")
            )
            continue
        t0 = time.perf_counter()
        gate_checks: list[CheckResult] = []
        try:
            findings = _scan(name, cfg, current, env, gate_checks)
        except Exception as err:
            ms = (time.perf_counter() - t0) * 1000
            # The message of a broken check must not echo the text; CheckBroken messages are ours.
            why = str(err) if isinstance(err, CheckBroken) else f"{type(err).__name__} in the check"
            if not isinstance(err, CheckBroken):
                logger.exception("guardrail %s (%s) broke", name, stage)
            if on_check_error == "fail_open":
                results.append(
                    CheckResult(
                        name,
                        stage,
                        CheckStatus.BYPASSED,
                        "none",
                        f"check broke ({why}); fail_open let the text through",
                        ms,
                    )
                )
            else:
                results.append(
                    CheckResult(
                        name, stage, CheckStatus.FAILED, "block", f"check broke ({why}); failing closed", ms
                    )
                )
                blocked, block_reason = True, f"the {name} check could not run"
            continue
        ms = (time.perf_counter() - t0) * 1000
        results.extend(gate_checks)
        if not findings:
            results.append(CheckResult(name, stage, CheckStatus.PASSED, "none", "", ms))
            continue
        action = cfg.action
        found = summarise(findings)
        if action == "redact":
            current = apply_redactions(current, findings)
            detail = f"redacted: {found}"
        elif action == "block":
            blocked, block_reason = True, f"{found} ({name})"
            detail = f"blocked: {found}"
        else:
            if action not in flags:
                flags.append(action)
            detail = f"{'flagged for review' if action == 'require_review' else 'warning'}: {found}"
        results.append(CheckResult(name, stage, CheckStatus.INTERVENED, action, detail, ms))
    return GuardrailOutcome(results, current, blocked, block_reason, flags)


__all__ = ["CHECK_ORDER", "DETECTORS", "StageEnv", "detector", "own_patterns", "run_stage"]
