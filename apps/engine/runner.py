"""`run_request`: one request from run.started to run.finished.

Order: run.started → input guardrails (blocked → run `blocked`) → strategy (plan → plan
validation hooks → execute, possibly several rounds) → output guardrails → run.finished.

Whatever happens — a provider outage, a blocked plan, cancellation, a bug — the run ends with
exactly one `run.finished` event in a defined terminal state, and `run_request` returns a
`RunResult` instead of raising. Reasons (`RunResult.reason`, `run.finished.reason`):
completed, input_blocked, plan_blocked, step_blocked[:<cap>], step_output_blocked,
output_blocked, step_failed, step_timed_out, no_answer, cancelled, run_timeout, provider_error,
internal_error.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from apps.engine.events import Emitter, EventSink, EventType, RunStatus
from apps.engine.hooks import GovernanceHooks, GuardrailOutcome, NoGovernance, RunContext
from apps.engine.plan import Plan
from apps.engine.pool import WorkerPool
from apps.engine.providers.base import ProviderError
from apps.engine.session import CancelToken, RunAborted, RunSession, StepRecord
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
) -> RunResult:
    """Run one request synchronously on the calling thread (steps fan out to helper threads)."""
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
    )
    session = RunSession(ctx=ctx, pool=pool, limits=limits, emitter=emitter, hooks=hooks, cancel=cancel)
    status, answer, error, reason = RunStatus.FAILED, None, None, "internal_error"
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
        session.question = checked.text
        raw_answer = strategy.run(session)
        session.checkpoint()
        out = hooks.check_output(ctx, raw_answer)
        _emit_guardrail(session, "output", out)
        if out.blocked:
            raise RunAborted(
                RunStatus.BLOCKED,
                "output_blocked",
                f"The answer was blocked: {out.block_reason or 'output guardrail'}",
            )
        status, answer, reason = RunStatus.SUCCEEDED, out.text, "completed"
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
        emitter.emit(
            EventType.RUN_FINISHED,
            {
                "status": status.value,
                "answer": answer,
                "error": error,
                "reason": reason,
                "totals": totals.to_dict(),
            },
        )
    except Exception:  # pragma: no cover — Emitter already swallows sink errors
        logger.exception("could not emit run.finished for run %s", run_id)
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
