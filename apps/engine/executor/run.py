"""Runs one round: `PlanExecution` schedules the plan's worker steps and records how each ended.

The scheduling thread owns every dict here; call threads report through the inbox only (see
`apps.engine.executor.attempt`). The package docstring says what the rules are.
"""

from __future__ import annotations

import logging
import queue
import time
from decimal import Decimal
from typing import Any

from apps.engine import health, outbound, slots, threads
from apps.engine.answer import AnswerBlocked, AnswerStream
from apps.engine.events import EventType, RunStatus, StepStatus
from apps.engine.executor import outcomes
from apps.engine.executor.attempt import (
    Attempt,
    Began,
    Inbox,
    Outcome,
    WorkerCall,
    circuit_text,
    grace,
    next_attempt_id,
    round_ms,
    run_call,
)
from apps.engine.executor.context import build_messages
from apps.engine.generation import StepEnding, final_index, step_call_kwargs
from apps.engine.health import CircuitOpen
from apps.engine.plan import Plan, PlanStep
from apps.engine.providers.base import DeltaCallback, ProviderError, ProviderTimeout, Worker
from apps.engine.providers.gate import ProviderRequestRefused
from apps.engine.session import RunAborted, RunSession, StepRecord
from apps.engine.tools_loop import ToolApprovalHeld
from apps.engine.types import Message, Usage, WorkerResult

logger = logging.getLogger(__name__)


def execute_round(
    session: RunSession, plan: Plan, *, round: int, allow_self: bool = True, tolerant: bool = False
) -> Plan:
    """Validate through the session's hooks, then execute every non-conductor step.

    Returns the plan that ran (the validated, possibly repaired one). A round whose plan ends
    with the conductor itself is tolerant (see the package docstring), as is one the caller says.
    """
    final = session.validate(plan, round=round, allow_self=allow_self)
    session.plans.append(final)
    execute_plan(session, final, round=round, tolerant=tolerant or final.recurses)
    return final


def execute_plan(session: RunSession, plan: Plan, *, round: int, tolerant: bool = False) -> None:
    """Run the plan's worker steps (a trailing CONDUCTOR_SELF step is left to the strategy).
    Returns when every step has a terminal record; raises RunAborted for a run-ending outcome."""
    PlanExecution(session, plan, round=round, tolerant=tolerant).run()


class PlanExecution:
    """One round's worker steps: which are pending, running (by attempt id) and done, the
    run-ending outcome once there is one, and the inbox the call threads report to."""

    def __init__(self, session: RunSession, plan: Plan, *, round: int, tolerant: bool = False) -> None:
        self.session = session
        self.plan = plan
        self.round = round
        self.tolerant = tolerant
        self.limits = session.limits
        self.steps = [s for s in plan.steps if not s.is_self]
        self.pending: dict[int, PlanStep] = {s.index: s for s in self.steps}
        self.in_plan = set(self.pending)
        self.running: dict[int, Attempt] = {}
        self.done: dict[int, StepStatus] = {}
        self.abort: RunAborted | None = None
        # A tolerant round's step failures: the first is raised at the end if the answer never came.
        self.tolerated: list[RunAborted] = []
        self.inbox: Inbox = queue.Queue()
        # The step that writes the answer gets the API client's generation options (issue 22).
        self.answer_index = final_index(self.steps, plan.recurses)

    # ------------------------------------------------------------------ the scheduling loop

    def run(self) -> None:
        while self.pending or self.running:
            if self._run_stopped():
                break
            if self.abort is not None:
                self._skip_pending(f"Not run: {self.abort.error}")
                self._drop_waiting(f"Not run: {self.abort.error}")
            else:
                self._start_ready_steps()
                if self.abort is not None:
                    continue
            if not self.running:
                self._skip_stalled()
                break
            self._wait_for_news()
        self._raise_outcome()

    def _run_stopped(self) -> bool:
        """Whether the run was just cancelled or hit its deadline; everything in flight ends."""
        if self.abort is not None and self.abort.status in (RunStatus.CANCELLED, RunStatus.TIMED_OUT):
            return False
        try:
            self.session.checkpoint()
        except RunAborted as stop:
            self.abort = stop
            cancelled = stop.status == RunStatus.CANCELLED
            what = "cancelled" if cancelled else "stopped at the run's time limit"
            self._abandon_running(
                StepStatus.SKIPPED if cancelled else StepStatus.TIMED_OUT,
                f"The run was {what} while this step was running.",
                f"The run was {what} while this step waited for its worker (no call started).",
            )
            self._skip_pending(f"The run was {what} before this step started.")
            return True
        return False

    def _start_ready_steps(self) -> None:
        for index in sorted(self.pending):
            if len(self.running) >= self.limits.max_parallel or self.abort is not None:
                break
            step = self.pending[index]
            if not self._deps_ready(step):
                continue
            del self.pending[index]
            if self.tolerant and self._inputs_all_failed(step):
                reason = "Not run: every step it reads failed."
                self._finish(
                    self._record(step, StepStatus.SKIPPED, self.session.worker_key(step.worker), reason)
                )
                continue
            self._try_start(step)

    def _skip_stalled(self) -> None:
        if self.pending:  # unreachable with a valid plan; guards against a scheduling stall
            self._skip_pending("Not run: its inputs never became available.")
            self.abort = self.abort or RunAborted(RunStatus.FAILED, "internal_error", "The plan stalled.")

    def _wait_for_news(self) -> None:
        """Wait for a call thread's report, the nearest call deadline or the next cancel poll."""
        nearest = min(a.deadline for a in self.running.values())
        wait = max(0.0, min(self.limits.cancel_poll_s, nearest - time.monotonic(), self.session.remaining()))
        try:
            out = self.inbox.get(timeout=wait)
        except queue.Empty:
            self._time_out_overdue()
            return
        if isinstance(out, Began):
            self._on_began(out)
        else:
            self._on_outcome(out)

    def _raise_outcome(self) -> None:
        if self.abort is not None:
            raise self.abort
        unanswered = bool(self.steps) and self.done.get(self.steps[-1].index) != StepStatus.SUCCEEDED
        if self.tolerated and not self.plan.recurses and unanswered:
            raise self.tolerated[0]  # the round's answer step could not run: the first failure says why

    # ------------------------------------------------------------------ dependencies

    def _reads_in_plan(self, step: PlanStep) -> list[int]:
        return [i for i in step.reads() if i in self.in_plan]

    def _deps_ready(self, step: PlanStep) -> bool:
        if self.tolerant:  # every input done; the failed ones are simply not in its context
            return all(i in self.done for i in self._reads_in_plan(step))
        return all(self.done.get(i) == StepStatus.SUCCEEDED for i in self._reads_in_plan(step))

    def _inputs_all_failed(self, step: PlanStep) -> bool:
        reads = self._reads_in_plan(step)
        return bool(reads) and not any(self.done.get(i) == StepStatus.SUCCEEDED for i in reads)

    # ------------------------------------------------------------------ records

    def _record(self, step: PlanStep, status: StepStatus, worker_key: str, error: str | None) -> StepRecord:
        return StepRecord(step, self.round, status, worker_key, error=error)

    def _finish(self, rec: StepRecord) -> None:
        self.session.record(rec)
        self.done[rec.step.index] = rec.status
        self.session.emit_step_finished(rec)

    def _skip_pending(self, reason: str) -> None:
        for index in sorted(self.pending):
            step = self.pending.pop(index)
            self._finish(self._record(step, StepStatus.SKIPPED, self.session.worker_key(step.worker), reason))

    def _abandon_running(self, status: StepStatus, error: str, waited: str) -> None:
        for att in sorted(self.running.values(), key=lambda a: a.step.index):
            att.abandon(error)
            # An abandoned call may still be billed: its cost is unknown, not zero. A step that
            # still waited for its slot made no call: it costs nothing and has no latency.
            self._finish(
                StepRecord(
                    att.step,
                    self.round,
                    status,
                    att.worker.info.key,
                    error=waited if att.waiting else error,
                    fallback_from=att.fallback_from,
                    cost_usd=Decimal(0) if att.waiting else None,
                    priced=att.waiting,
                    latency_ms=0.0 if att.waiting else (time.monotonic() - att.started) * 1000,
                    messages=att.messages,
                )
            )
            if not att.waiting:
                self.session.add_usage(Usage(), None, False)
        self.running.clear()

    def _drop_waiting(self, reason: str) -> None:
        # A step still waiting for its slot when the round ends has made no call: it is not run.
        for att in sorted(self.running.values(), key=lambda a: a.step.index):
            if att.waiting:
                del self.running[att.id]
                att.abandon(reason)
                self._finish(self._record(att.step, StepStatus.SKIPPED, att.worker.info.key, reason))

    # ------------------------------------------------------------------ starting a step

    def _try_start(self, step: PlanStep) -> None:
        session = self.session
        worker = session.pool.workers[step.worker]
        gate = session.hooks.before_step(session.ctx, step, worker.info, session.totals())
        if not gate.allowed:
            reason = gate.reason or "a policy limit was reached"
            self._finish(self._record(step, StepStatus.BLOCKED, worker.info.key, reason))
            cap = f":{gate.cap}" if gate.cap else ""
            self.abort = RunAborted(
                RunStatus.BLOCKED, f"step_blocked{cap}", f"Step {step.index} was blocked: {reason}"
            )
            return
        messages = build_messages(session.question, step, session.records)
        session.emitter.emit(
            EventType.STEP_STARTED,
            {
                "index": step.index,
                "round": self.round,
                "worker_key": worker.info.key,
                "worker_name": worker.info.name,
                "instruction": step.instruction,
                "access": list(step.reads()),
                "messages": messages,
            },
        )
        session.count_step()
        if not health.admit(session.pool.health, worker.info.key):
            # Known down (issue 44): not called, not waited on; its fallback may take the step.
            now = time.monotonic()
            att = Attempt(next_attempt_id(), step, worker, messages, now, now)
            self._on_failure(att, CircuitOpen(circuit_text(worker)), 0.0)
            return
        self._launch(step, worker, messages, None)

    def _call_timeout(self, worker: Worker) -> float:
        return max(0.001, min(self.limits.step_timeout_s, worker.info.timeout_s, self.session.remaining()))

    def _launch(
        self, step: PlanStep, worker: Worker, messages: list[Message], fallback_from: str | None
    ) -> None:
        """Start an attempt's thread: it calls now, or first waits for its worker's slot."""
        now = time.monotonic()
        timeout = self._call_timeout(worker)
        slot = slots.worker_slot(worker)
        waiting = slot is not None and not slot.try_acquire()
        deadline = float("inf") if waiting else now + timeout + grace(timeout)
        att = Attempt(
            next_attempt_id(), step, worker, messages, now, deadline, fallback_from, waiting=waiting
        )
        if waiting:
            assert slot is not None
            self._emit_waiting(step, worker, slot)
        self.running[att.id] = att
        max_tokens, extra = self._call_options(step, worker)
        # The answer's text leaves only through the output gate (issue 45).
        answer = self.session.open_answer(step.index) if step.index == self.answer_index else None
        on_delta = self._delta_sink(att, answer)
        job = WorkerCall(
            self.session,
            att,
            slot,
            waiting,
            timeout,
            lambda: self._call_timeout(worker),
            max_tokens,
            extra,
            on_delta if self.limits.stream else None,
            self.inbox,
        )
        threads.spawn(lambda: run_call(job), name=f"engine-step-{step.index}")

    def _call_options(self, step: PlanStep, worker: Worker) -> tuple[int, dict[str, Any]]:
        """The call's token budget, and the API client's generation options for the answer step."""
        max_tokens = self.limits.max_tokens_per_step or worker.info.max_output_tokens
        if self.limits.max_tokens_per_step is not None:
            max_tokens = min(max_tokens, worker.info.max_output_tokens)
        extra = step_call_kwargs(
            self.session.ctx.generation, is_final=step.index == self.answer_index, max_tokens=max_tokens
        )
        if extra:
            max_tokens = extra["options"].max_tokens or max_tokens
        return max_tokens, extra

    def _delta_sink(self, att: Attempt, answer: AnswerStream | None) -> DeltaCallback:
        emitter = self.session.emitter

        def on_delta(text: str) -> None:
            if not (att.live and text):
                return
            if answer is not None:
                answer.on_delta(text)  # raises AnswerBlocked: the provider call stops here
            else:
                emitter.emit(EventType.STEP_DELTA, {"index": att.step.index, "text": text})

        return on_delta

    def _emit_waiting(self, step: PlanStep, worker: Worker, slot: slots.Slot) -> None:
        at_a_time = "one call at a time" if slot.capacity == 1 else f"{slot.capacity} calls at a time"
        self.session.emitter.emit(
            EventType.STEP_WAITING,
            {
                "index": step.index,
                "round": self.round,
                "worker_key": worker.info.key,
                "worker_name": worker.info.name,
                "capacity": slot.capacity,
                "reason": f"waiting for {worker.info.name}: it runs {at_a_time} and is busy",
            },
        )

    # ------------------------------------------------------------------ news from the call threads

    def _time_out_overdue(self) -> None:
        now = time.monotonic()
        for att in sorted(self.running.values(), key=lambda a: a.step.index):
            if now >= att.deadline:
                del self.running[att.id]
                timeout = att.deadline - att.started
                att.abandon(f"the step timed out after {timeout:.1f} s")
                error = ProviderTimeout(f"The worker did not answer within {timeout:.1f} s.")
                self._on_failure(att, error, (now - att.started) * 1000)

    def _on_began(self, began: Began) -> None:
        att = self.running.get(began.attempt_id)
        if att is None or not att.waiting:
            return
        att.waiting = False
        waited_ms = (began.at - att.started) * 1000
        att.started = began.at
        att.deadline = began.at + began.timeout + grace(began.timeout)
        self.session.emitter.emit(
            EventType.STEP_RUNNING,
            {"index": att.step.index, "round": self.round, "waited_ms": round_ms(waited_ms)},
        )

    def _on_outcome(self, out: Outcome) -> None:
        att = self.running.pop(out.attempt_id, None)
        if att is None:
            return  # a late answer from an abandoned attempt
        att.live = False
        if out.result is not None:
            self._on_success(att, out.result, out.elapsed_ms)
        else:
            assert out.error is not None
            self._on_failure(att, out.error, out.elapsed_ms)

    # ------------------------------------------------------------------ how an attempt ended

    def _abort_once(self, abort: RunAborted) -> None:
        if self.abort is None:  # the first run-ending outcome is the one the run reports
            self.abort = abort

    def _on_failure(self, att: Attempt, error: ProviderError, elapsed_ms: float) -> None:
        if isinstance(error, ToolApprovalHeld):
            self._hold_for_approval(att, error)
        elif isinstance(error, ProviderRequestRefused):
            self._block_refused_request(att, error)
        elif isinstance(error, AnswerBlocked):
            outcomes.close_blocked_answer(self.session)
            rec, abort = outcomes.answer_blocked(att, error, elapsed_ms, round=self.round)
            self._finish(rec)
            self.session.add_usage(Usage(), None, False)  # the call was cut: billed, amount unknown
            self._abort_once(abort)
        else:
            self._fall_back_or_fail(att, error, elapsed_ms)

    def _hold_for_approval(self, att: Attempt, error: ToolApprovalHeld) -> None:
        # Issue 43: a tool call waits for an approver. Not a provider failure (no health
        # record, no fallback): the run pauses; the step is rebuilt from the journal on resume.
        self._finish(self._record(att.step, StepStatus.BLOCKED, att.worker.info.key, str(error)))
        if self.abort is None:
            self.abort = error.run_held(self.round)

    def _block_refused_request(self, att: Attempt, error: ProviderRequestRefused) -> None:
        # The outbound gate refused the request (issue 39): nothing was sent, the step is
        # blocked naming the field and rule, and no fallback gets the same request.
        outbound.report(self.session, step=att.step.index, checks=error.checks, blocked=True)
        self._finish(self._record(att.step, StepStatus.BLOCKED, att.worker.info.key, str(error)))
        self._abort_once(
            RunAborted(
                RunStatus.BLOCKED, outbound.BLOCKED_REASON, f"Step {att.step.index} was blocked: {error}"
            )
        )

    def _fall_back_or_fail(self, att: Attempt, error: ProviderError, elapsed_ms: float) -> None:
        session = self.session
        health.record(session.pool.health, att.worker.info.key, error=error, latency_ms=elapsed_ms)
        fb = outcomes.fallback_worker(session, att)
        if fb is not None and self.abort is None and not session.is_cancelled():
            logger.info(
                "step %d: %s failed (%s); falling back to %s",
                att.step.index,
                att.worker.info.key,
                error.code,
                fb.info.key,
            )
            self._launch(att.step, fb, att.messages, att.worker.info.key)
            return
        rec, failure = outcomes.failed(att, error, elapsed_ms, round=self.round)
        self._finish(rec)
        if rec.status == StepStatus.TIMED_OUT:
            session.add_usage(Usage(), None, False)
        if self.tolerant:
            self.tolerated.append(failure)  # a result the round goes on with (package docstring)
        else:
            self._abort_once(failure)

    def _on_success(self, att: Attempt, result: WorkerResult, elapsed_ms: float) -> None:
        session = self.session
        if not result.replayed:  # a journaled answer is not a call
            latency = result.latency_ms or elapsed_ms
            health.record(session.pool.health, att.worker.info.key, error=None, latency_ms=latency)
        outbound.report(session, step=att.step.index, checks=result.outbound, blocked=False)
        session.add_usage(result.usage, result.cost_usd, result.priced)
        session.ctx.endings[att.step.index] = StepEnding(result.finish_reason, list(result.tool_calls))
        guard = session.hooks.check_step_output(session.ctx, att.step, result.text)
        outcomes.emit_step_guard(session, att, guard)
        session.flags.extend(f for f in guard.flags if f not in session.flags)
        rec, blocked = outcomes.succeeded(att, result, guard, elapsed_ms, round=self.round)
        self._finish(rec)
        if blocked is not None:
            self._abort_once(blocked)
