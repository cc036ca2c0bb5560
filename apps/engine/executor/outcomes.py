"""How a step's attempt ended, as records and run outcomes; and which worker may take over.

Pure pieces of the executor's bookkeeping: `PlanExecution` decides, these build what it records.
"""

from __future__ import annotations

from decimal import Decimal

from apps.engine import health
from apps.engine.answer import AnswerBlocked
from apps.engine.events import EventType, RunStatus, StepStatus
from apps.engine.executor.attempt import Attempt
from apps.engine.health import CIRCUIT_OPEN, CircuitOpen
from apps.engine.hooks import GuardrailOutcome
from apps.engine.providers.base import ProviderError, ProviderTimeout, Worker
from apps.engine.session import RunAborted, RunSession, StepRecord
from apps.engine.types import WorkerResult


def fallback_worker(session: RunSession, att: Attempt) -> Worker | None:
    """The worker that may retry a failed attempt's step, if any (one switch per step)."""
    if att.fallback_from is not None:
        return None  # one switch per step: fallback chains would hide a broken pool
    answer = session.answer_stream
    if answer is not None and answer.index == att.step.index and answer.released_any:
        return None  # part of the answer reached the client: another worker cannot go on with it
    key = att.worker.info.fallback_key
    if not key or key == att.worker.info.key:
        return None
    fb = session.pool.get(key)
    if fb is None:
        return None
    allowed = session.limits.allowed_workers
    if allowed is not None and key not in allowed:
        return None
    gate = session.hooks.before_step(session.ctx, att.step, fb.info, session.totals())
    if not gate.allowed:
        return None
    return fb if health.admit(session.pool.health, key) else None


def failed(
    att: Attempt, error: ProviderError, elapsed_ms: float, *, round: int
) -> tuple[StepRecord, RunAborted]:
    """A provider failure with no fallback left: the step's record and the run outcome it means."""
    timed_out = isinstance(error, ProviderTimeout)
    circuit_open = isinstance(error, CircuitOpen)
    status = StepStatus.TIMED_OUT if timed_out else StepStatus.SKIPPED if circuit_open else StepStatus.FAILED
    rec = StepRecord(
        att.step,
        round,
        status,
        att.worker.info.key,
        error=str(error),
        fallback_from=att.fallback_from,
        # A timed-out call may have been billed; a rejected one was not.
        cost_usd=None if timed_out else Decimal(0),
        priced=not timed_out,
        latency_ms=elapsed_ms,
        messages=att.messages,
    )
    what = "timed out" if timed_out else "was skipped" if circuit_open else "failed"
    failure = RunAborted(
        RunStatus.FAILED,
        "step_timed_out" if timed_out else CIRCUIT_OPEN if circuit_open else "step_failed",
        f"Step {att.step.index} ({att.worker.info.name}) {what}: {error}",
    )
    return rec, failure


def answer_blocked(
    att: Attempt, error: AnswerBlocked, elapsed_ms: float, *, round: int
) -> tuple[StepRecord, RunAborted]:
    """The output gate cut the answer mid-stream: the step is blocked and so is the run."""
    rec = StepRecord(
        att.step,
        round,
        StepStatus.BLOCKED,
        att.worker.info.key,
        error=str(error),
        cost_usd=None,
        priced=False,
        latency_ms=elapsed_ms,
        messages=att.messages,
    )
    rule = f" (rule: {error.rule})" if error.rule else ""
    abort = RunAborted(RunStatus.BLOCKED, "output_blocked", f"The answer was blocked: {error}{rule}")
    return rec, abort


def close_blocked_answer(session: RunSession) -> None:
    """Close the answer stream the gate blocked and report its checks (nothing offending left)."""
    answer = session.answer_stream
    closed = answer.close() if answer is not None else None
    if closed is not None:
        session.emitter.emit(
            EventType.GUARDRAIL_CHECKED,
            {
                "stage": "output",
                "step": None,
                "checks": [c.to_dict() for c in closed.checks],
                "blocked": True,
                "flags": list(closed.flags),
                "streamed": True,
            },
        )


def succeeded(
    att: Attempt, result: WorkerResult, guard: GuardrailOutcome, elapsed_ms: float, *, round: int
) -> tuple[StepRecord, RunAborted | None]:
    """A call that answered: its record after the step-output guardrails, and the block if any."""
    rec = StepRecord(
        att.step,
        round,
        StepStatus.BLOCKED if guard.blocked else StepStatus.SUCCEEDED,
        att.worker.info.key,
        output=None if guard.blocked else guard.text,
        error=guard.block_reason if guard.blocked else None,
        fallback_from=att.fallback_from,
        usage=result.usage,
        cost_usd=result.cost_usd,
        priced=result.priced,
        latency_ms=result.latency_ms or elapsed_ms,
        messages=att.messages,
        replayed=result.replayed,
    )
    if not guard.blocked:
        return rec, None
    reason = guard.block_reason or "a guardrail blocked it"
    abort = RunAborted(
        RunStatus.BLOCKED, "step_output_blocked", f"The output of step {att.step.index} was blocked: {reason}"
    )
    return rec, abort


def emit_step_guard(session: RunSession, att: Attempt, guard: GuardrailOutcome) -> None:
    if guard.checks:
        session.emitter.emit(
            EventType.GUARDRAIL_CHECKED,
            {
                "stage": "step_output",
                "step": att.step.index,
                "checks": [c.to_dict() for c in guard.checks],
                "blocked": guard.blocked,
                "flags": list(guard.flags),
            },
        )
