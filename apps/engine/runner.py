"""`run_request`: one request from run.started to run.finished.

Order: run.started → input guardrails (blocked → run `blocked`) → strategy (plan → plan
validation hooks → execute, possibly several rounds) → output guardrails → run.finished.

Whatever happens — a provider outage, a blocked plan, cancellation, a bug — the run ends with
exactly one `run.finished` event in a defined terminal state, and `run_request` returns a
`RunResult` instead of raising. Reasons (`RunResult.reason`, `run.finished.reason`):
completed, input_blocked, plan_blocked, step_blocked[:<cap>], step_output_blocked,
outbound_blocked (the outbound gate refused a provider request), output_blocked, step_failed, step_timed_out,
circuit_open (the step's worker is known down: apps.engine.health), no_answer, cancelled, run_timeout, provider_error,
internal_error.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from apps.engine.events import CheckStatus, Emitter, EventSink, EventType, RunStatus, StepStatus
from apps.engine.generation import (
    GenerationOptions,
    ResponseFormat,
    json_error,
    repair_messages,
    strip_json_fence,
)
from apps.engine.hooks import CheckResult, GovernanceHooks, GuardrailOutcome, NoGovernance, RunContext
from apps.engine.plan import Plan
from apps.engine.pool import WorkerPool
from apps.engine.providers.base import ProviderError
from apps.engine.session import CancelToken, RunAborted, RunHeld, RunSession, StepRecord
from apps.engine.strategies import Strategy
from apps.engine.types import Limits, Totals

logger = logging.getLogger(__name__)

__all__ = ["Limits", "RunResult", "run_request"]


@dataclass(slots=True)
class RunResult:
    run_id: str
    status: RunStatus
    answer: str | None
    error: str | None
    reason: str
    totals: Totals
    steps: list[StepRecord] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # guardrail flags, e.g. "require_review"
    last_seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status.value,
            "answer": self.answer,
            "error": self.error,
            "reason": self.reason,
            "totals": self.totals.to_dict(),
            "flags": list(self.flags),
        }


def _emit_guardrail(session: RunSession, stage: str, outcome: GuardrailOutcome) -> None:
    session.flags.extend(f for f in outcome.flags if f not in session.flags)
    session.emitter.emit(
        EventType.GUARDRAIL_CHECKED,
        {
            "stage": stage,
            "step": None,
            "checks": [c.to_dict() for c in outcome.checks],
            "blocked": outcome.blocked,
            "flags": list(outcome.flags),
        },
    )


def run_request(
    *,
    run_id: str,
    question: str,
    pool: WorkerPool,
    strategy: Strategy,
    sink: EventSink,
    hooks: GovernanceHooks | None = None,
    cancel: CancelToken | None = None,
    limits: Limits | None = None,
    metadata: dict[str, Any] | None = None,
    generation: GenerationOptions | None = None,
    tools: Any = None,
) -> RunResult:
    """Run one request synchronously on the calling thread (steps fan out to helper threads).

    ``generation``: an API client's options for the worker that writes the answer (see
    ``apps.engine.generation``); its tool calls end the run with ``finish_reason`` ``tool_calls``
    (their arguments pass the output guardrails), a JSON ``response_format`` is checked (one
    repair, else the run fails with reason ``response_format_invalid``)."""
    hooks = hooks if hooks is not None else NoGovernance()
    limits = strategy.narrow_limits(limits if limits is not None else Limits())
    emitter = Emitter(run_id, sink)
    ctx = RunContext(
        run_id=run_id,
        question=question,
        strategy=strategy.name,
        preset=strategy.preset,
        limits=limits,
        metadata=dict(metadata or {}),
        started_monotonic=time.monotonic(),
        generation=generation,
    )
    session = RunSession(
        ctx=ctx, pool=pool, limits=limits, emitter=emitter, hooks=hooks, cancel=cancel, tools=tools
    )
    status, answer, error, reason = RunStatus.FAILED, None, None, "internal_error"
    ending: dict[str, Any] = {}
    paused: dict[str, Any] | None = None  # set when the plan is held for an approver
    try:
        conductor = pool.conductor
        emitter.emit(
            EventType.RUN_STARTED,
            {
                "strategy": strategy.name,
                "preset": strategy.preset,
                "question": question,
                "workers": [
                    {
                        "index": i,
                        "key": w.info.key,
                        "name": w.info.name,
                        "model": w.info.model,
                        "tags": list(w.info.tags),
                        # Calls it takes at once (None: no limit); the run view tells serial steps.
                        "concurrency": w.info.concurrency,
                    }
                    for i, w in enumerate(pool.workers)
                ],
                "conductor": (
                    {"key": conductor.info.key, "name": conductor.info.name, "model": conductor.info.model}
                    if conductor is not None
                    else None
                ),
                "limits": limits.to_dict(),
            },
        )
        session.checkpoint()
        checked = hooks.check_input(ctx, question)
        _emit_guardrail(session, "input", checked)
        if checked.blocked:
            raise RunAborted(
                RunStatus.BLOCKED,
                "input_blocked",
                f"The request was blocked: {checked.block_reason or 'input guardrail'}",
            )
        if checked.text != question:
            _redact_conversation(strategy, hooks, ctx)
        session.question = checked.text
        incomplete: dict[str, Any] | None = None
        try:
            raw_answer = strategy.run(session)
        except RunAborted as stop:
            partial = _partial_answer(session, stop)
            if partial is None:
                raise
            raw_answer = partial.output or ""
            incomplete = {"reason": stop.reason, "detail": stop.error, "answer_step": partial.step.index}
            logger.info(
                "run %s: %s; answering with step %d's output, marked incomplete",
                run_id,
                stop.reason,
                partial.step.index,
            )
        session.checkpoint()
        record = _answer_record(session) if incomplete is None else None
        step_ending = ctx.endings.get(record.step.index) if record is not None else None
        if step_ending is not None and step_ending.tool_calls:
            ending["tool_calls"] = _guard_tool_calls(session, hooks, ctx, step_ending.tool_calls)
            ending["finish_reason"] = "tool_calls"
        elif step_ending is not None and step_ending.finish_reason == "length":
            ending["finish_reason"] = "length"
        fmt = generation.response_format if generation is not None else None
        if incomplete is not None:
            # Each protocol's "the answer was cut short" (length / incomplete / max_tokens), with
            # why under ``incomplete`` (apps.api.v1); the output guardrails still apply below.
            ending["finish_reason"] = "length"
            ending["incomplete"] = incomplete
        elif fmt is not None and not ending.get("tool_calls") and ending.get("finish_reason") != "length":
            raw_answer = _check_format(session, fmt, raw_answer, record, generation)
        stream = session.answer_stream
        if stream is not None and (record is None or stream.index != record.step.index):
            stream = None  # a step that did not write the answer after all
        if ending.get("tool_calls") and not raw_answer.strip():
            out = GuardrailOutcome([], raw_answer)  # the tool calls were the answer, checked above
        elif stream is not None and (closed := stream.close()) is not None:
            # The answer streamed through the output gate: its record is the gate's (made from the
            # whole text), and the answer is exactly what the gate released (issue 45).
            out = GuardrailOutcome(
                closed.checks,
                closed.text,
                closed.release.blocked,
                closed.release.reason,
                list(closed.flags),
            )
            _emit_guardrail(session, "output", out)
        else:
            out = hooks.check_output(ctx, raw_answer)
            _emit_guardrail(session, "output", out)
        if out.blocked:
            raise RunAborted(
                RunStatus.BLOCKED,
                "output_blocked",
                f"The answer was blocked: {out.block_reason or 'output guardrail'}",
            )
        status, answer, reason = (
            RunStatus.SUCCEEDED,
            out.text,
            "completed" if incomplete is None else "partial",
        )
    except RunHeld as held:
        # Paused, not ended: the plan waits for an approver, so no run.finished.
        status, error, reason = held.status, held.error, held.reason
        paused = {
            "reason": held.reason,
            "error": held.error,
            "round": held.round,
            "plan": held.plan,
            "violations": held.violations,
            "hold": held.hold,
        }
    except RunAborted as stop:
        status, error, reason = stop.status, stop.error, stop.reason
    except ProviderError as err:
        status, error, reason = RunStatus.FAILED, str(err), "provider_error"
    except Exception:
        # Never leave a run without a terminal event; details go to the log, not to users.
        logger.exception("run %s failed unexpectedly", run_id)
        status, error, reason = (
            RunStatus.FAILED,
            "The engine hit an unexpected error; see the server log.",
            "internal_error",
        )
    totals = session.totals()
    try:
        if paused is not None:
            emitter.emit(EventType.RUN_AWAITING_APPROVAL, {**paused, "totals": totals.to_dict()})
        else:
            emitter.emit(
                EventType.RUN_FINISHED,
                {
                    "status": status.value,
                    "answer": answer,
                    "error": error,
                    "reason": reason,
                    "totals": totals.to_dict(),
                    **(ending if status == RunStatus.SUCCEEDED else {}),
                    **_released(session),
                    **_answer_usage(session),
                },
            )
    except Exception:  # pragma: no cover — Emitter already swallows sink errors
        logger.exception("could not emit the last event for run %s", run_id)
    return RunResult(
        run_id=run_id,
        status=status,
        answer=answer,
        error=error,
        reason=reason,
        totals=totals,
        steps=[session.records[i] for i in sorted(session.records)],
        plans=list(session.plans),
        flags=list(session.flags),
        last_seq=emitter.last_seq,
    )


def _answer_usage(session: RunSession) -> dict[str, Any]:
    """The tokens of the call that wrote the answer (issue 45): what a client's ``max_tokens``
    bounds, beside the run's totals (every planning call and step: the bill)."""
    try:
        record = _answer_record(session)
    except Exception:  # pragma: no cover - a run that ended before any step has none
        return {}
    if record is None or record.usage is None:
        return {}
    return {
        "answer_usage": {
            "input_tokens": int(record.usage.input_tokens),
            "output_tokens": int(record.usage.output_tokens),
        }
    }


def _released(session: RunSession) -> dict[str, Any]:
    """What of the answer reached streaming clients: its sha256 and length (issue 45). The
    audit keeps it; for a run that succeeded it is the digest of the stored answer."""
    stream = session.answer_stream
    if stream is None or not stream.streams or not stream.fed:
        return {}
    text = "".join(stream.released)
    return {"released": {"sha256": stream.digest(), "chars": len(text)}}


# --- the answer step's extras (issue 22) ------------------------------------------------------------


# Run endings a partial answer may stand in for: a step that failed after its retries and
# fallback, or one skipped because its worker is known down (issue 44). Not a block (a rule said
# no), a cancel (the user said stop) or the run's deadline.
_PARTIAL_REASONS = frozenset({"step_failed", "step_timed_out", "circuit_open"})


def _partial_answer(session: RunSession, stop: RunAborted) -> StepRecord | None:
    """The answer of the latest round whose last worker step succeeded (a recursing round's too:
    its last step is what the conductor re-planned from), when the policy allows partial answers
    and ``stop`` is a step's failure; None otherwise."""
    if stop.reason not in _PARTIAL_REASONS or not session.limits.partial_answers:
        return None
    for plan in reversed(session.plans):
        steps = [s for s in plan.steps if not s.is_self]
        if not steps:
            continue
        rec = session.records.get(steps[-1].index)
        if rec is not None and rec.status == StepStatus.SUCCEEDED and (rec.output or "").strip():
            return rec
    return None


def _answer_record(session: RunSession) -> StepRecord | None:
    """The record whose output is the answer (as ``RunSession.answer`` picks it)."""
    for index in sorted(session.records, reverse=True):
        rec = session.records[index]
        if not rec.step.is_self and rec.status == StepStatus.SUCCEEDED:
            return rec
    return None


def _guard_tool_calls(
    session: RunSession, hooks: GovernanceHooks, ctx: RunContext, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Tool-call arguments are model output: each passes the output guardrails like an answer
    (redacted or blocked); one guardrail event per call, so each is audited."""
    guarded = []
    for call in calls:
        fn = dict(call.get("function") or {})
        out = hooks.check_output(ctx, str(fn.get("arguments") or ""))
        _emit_guardrail(session, "output", out)
        if out.blocked:
            raise RunAborted(
                RunStatus.BLOCKED,
                "output_blocked",
                f"The arguments of the tool call {fn.get('name')!r} were blocked: "
                f"{out.block_reason or 'output guardrail'}",
            )
        fn["arguments"] = out.text
        guarded.append({"id": call.get("id"), "type": "function", "function": fn})
    return guarded


def _check_format(
    session: RunSession,
    fmt: ResponseFormat,
    answer: str,
    record: StepRecord | None,
    generation: GenerationOptions | None,
) -> str:
    """The answer as valid JSON for ``fmt``: checked, repaired once by the worker that wrote it,
    else the run fails naming the rule. The check is a guardrail event (audited)."""
    candidate = strip_json_fence(answer)
    problem = json_error(candidate, fmt)
    rule = f"response_format {fmt.type}"
    if problem is None:
        check = CheckResult("response_format", "output", CheckStatus.PASSED, "none", f"{rule}: valid")
        _emit_guardrail(session, "output", GuardrailOutcome([check], candidate))
        return candidate
    worker = session.pool.get(record.worker_key) if record is not None else None
    repaired: str | None = None
    if worker is not None and record is not None:
        try:
            result = session.call_conductor(
                repair_messages(list(record.messages), answer, problem),
                json_schema=fmt.schema if fmt.type == "json_schema" else None,
                max_tokens=generation.max_tokens if generation is not None else None,
                worker=worker,
            )
        except ProviderError as err:
            logger.info("response_format repair call failed: %s", err)
        else:
            repaired = strip_json_fence(result.text)
    still = json_error(repaired, fmt) if repaired is not None else problem
    status = CheckStatus.INTERVENED if still is None else CheckStatus.FAILED
    detail = f"{rule}: {problem}; " + (
        "repaired by the worker" if still is None else f"repair failed: {still}"
    )
    check = CheckResult("response_format", "output", status, "repair" if still is None else "block", detail)
    _emit_guardrail(
        session, "output", GuardrailOutcome([check], repaired or candidate, blocked=still is not None)
    )
    if still is not None or repaired is None:
        raise RunAborted(
            RunStatus.FAILED,
            "response_format_invalid",
            f"The answer does not satisfy the requested {rule} (rule: response_format, one repair tried): {still}.",
        )
    return repaired


def _redact_conversation(strategy: Strategy, hooks: GovernanceHooks, ctx: RunContext) -> None:
    """The input guardrail changed the question (redaction): a chat passed through as it is must
    carry the same redactions, message by message."""
    conversation = getattr(strategy, "conversation", None)
    if not conversation:
        return
    redacted = []
    for message in conversation:
        m = dict(message)
        if m.get("content"):
            m["content"] = hooks.check_input(ctx, str(m["content"])).text
        calls = []
        for call in m.get("tool_calls") or []:
            fn = dict(call.get("function") or {})
            fn["arguments"] = hooks.check_input(ctx, str(fn.get("arguments") or "")).text
            calls.append({**call, "function": fn})
        if calls:
            m["tool_calls"] = calls
        redacted.append(m)
    strategy.conversation = tuple(redacted)  # type: ignore[attr-defined]
