"""Executes one Plan on a pool.

Context isolation: a worker sees ONLY the original question, then — for each step in its access
list, in index order — that step's instruction (user turn) and output (assistant turn), then its
own instruction. Nothing else from the run reaches it (`build_messages` is the single place that
assembles worker context).

Scheduling: a step starts as soon as the steps it reads (within this plan; earlier rounds are
already done) have succeeded, with at most `Limits.max_parallel` calls in flight. Each call runs
on its own daemon thread rather than a ThreadPoolExecutor: a call that overruns its timeout
cannot be interrupted, and an abandoned call must neither hold a pool slot nor block
interpreter exit. All events except `step.delta` are emitted from the scheduling thread, so the
per-step event order is deterministic.

Slots (issue 44): a worker with a capacity (the local model: one call at a time, see
``apps.engine.slots``) gives a step its slot before the call. A step that finds every slot taken
is *waiting* (``step.waiting``), not running: its call timeout has not started, only the run's
deadline bounds the wait; when it gets the slot its call starts (``step.running``) and its timeout
with it. A call the executor abandons (its timeout, the run's deadline, cancellation) is cancelled
(``apps.engine.calls``): the local model stops generating and frees the slot for the steps behind
it, an HTTP request is closed.

Failure: a step that fails (provider error after retries, or timeout) is retried once on its
worker's `fallback_key` worker if the pool has it; otherwise it ends `failed`/`timed_out`, the
steps not yet started are `skipped` and the run ends `failed`. A *tolerant* round (issue 44: a
conductor round that ends with the conductor itself, a mixture of agents' proposals) goes on
instead: the failure is a result like any other (the conductor's re-plan sees it), a step whose
inputs are all done runs with those that succeeded (an aggregator with one proposal missing still
aggregates), one whose inputs all failed is skipped, and the round fails only if its answer step
could not run. Blocks, cancellation and the run deadline are never tolerated: they abandon
running calls (their late results are discarded) and skip the rest.
"""

from __future__ import annotations

import itertools
import logging
import queue
import time
from dataclasses import dataclass, field
from decimal import Decimal

from apps.engine import calls, health, outbound, slots, threads
from apps.engine.answer import AnswerBlocked
from apps.engine.events import EventType, RunStatus, StepStatus
from apps.engine.generation import StepEnding, final_index, step_call_kwargs
from apps.engine.health import CIRCUIT_OPEN, CircuitOpen
from apps.engine.plan import Plan, PlanStep
from apps.engine.providers.base import ProviderError, ProviderTimeout, Worker
from apps.engine.providers.gate import ProviderRequestRefused
from apps.engine.session import CancelToken, RunAborted, RunSession, StepRecord
from apps.engine.tools_loop import ToolApprovalHeld, complete_with_tools
from apps.engine.types import Message, Usage, WorkerResult

logger = logging.getLogger(__name__)

__all__ = ["CancelToken", "build_messages", "execute_plan"]

_attempt_ids = itertools.count(1)


def build_messages(question: str, step: PlanStep, records: dict[int, StepRecord]) -> list[Message]:
    """The whole context a worker receives for `step` (see module docstring)."""
    if step.messages is not None:  # a pool model's chat, passed through as it is (issue 22)
        return [dict(m) for m in step.messages]
    messages: list[Message] = [{"role": "user", "content": question}]
    for i in step.reads():
        rec = records.get(i)
        if rec is None or rec.status != StepStatus.SUCCEEDED or rec.step.is_self:
            continue  # the conductor's own re-plan step has no answer text for workers
        messages.append({"role": "user", "content": rec.step.instruction})
        messages.append({"role": "assistant", "content": rec.output or ""})
    messages.append({"role": "user", "content": step.instruction})
    return messages


def round_ms(ms: float) -> float:
    return float(f"{ms:.1f}")


def _circuit_text(worker: Worker) -> str:
    return (
        f"{CIRCUIT_OPEN}: not called, the worker “{worker.info.name}” failed repeatedly in recent "
        "calls and waits for its probe."
    )


@dataclass(slots=True)
class _Attempt:
    id: int
    step: PlanStep
    worker: Worker
    messages: list[Message]
    started: float  # when its call started (or, while waiting, when it began to wait)
    deadline: float  # its call's deadline; infinite while it waits for a slot
    fallback_from: str | None = None
    live: bool = True  # False once abandoned: late deltas/results are dropped
    waiting: bool = False  # waits for its worker's slot: no call yet, no timeout running
    call: calls.CallScope = field(default_factory=calls.CallScope)

    def abandon(self, reason: str) -> None:
        self.live = False
        self.call.cancel(reason)  # the provider stops the call (apps.engine.calls)


@dataclass(slots=True)
class _Began:
    """A waiting attempt got its slot: its call (and its timeout) starts now."""

    attempt_id: int
    at: float
    timeout: float


@dataclass(slots=True)
class _Outcome:
    attempt_id: int
    result: WorkerResult | None
    error: ProviderError | None
    elapsed_ms: float


@dataclass(slots=True)
class _RoundState:
    pending: dict[int, PlanStep]
    running: dict[int, _Attempt] = field(default_factory=dict)  # attempt id -> attempt
    abort: RunAborted | None = None


def execute_round(
    session: RunSession, plan: Plan, *, round: int, allow_self: bool = True, tolerant: bool = False
) -> Plan:
    """Validate through the session's hooks, then execute every non-conductor step.

    Returns the plan that ran (the validated, possibly repaired one). A round whose plan ends
    with the conductor itself is tolerant (see the module docstring), as is one the caller says.
    """
    final = session.validate(plan, round=round, allow_self=allow_self)
    session.plans.append(final)
    execute_plan(session, final, round=round, tolerant=tolerant or final.recurses)
    return final


def execute_plan(session: RunSession, plan: Plan, *, round: int, tolerant: bool = False) -> None:
    """Run the plan's worker steps (a trailing CONDUCTOR_SELF step is left to the strategy).
    Returns when every step has a terminal record; raises RunAborted for a run-ending outcome."""
    steps = [s for s in plan.steps if not s.is_self]
    state = _RoundState(pending={s.index: s for s in steps})
    in_plan = set(state.pending)
    done: dict[int, StepStatus] = {}
    # A tolerant round's first step failure: raised at the end if the round's answer never came.
    tolerated: list[RunAborted] = []
    inbox: queue.Queue[_Outcome | _Began] = queue.Queue()
    limits = session.limits
    # The step that writes the answer gets the API client's generation options (issue 22).
    answer_index = final_index(steps, plan.recurses)

    def deps_ready(step: PlanStep) -> bool:
        reads = [i for i in step.reads() if i in in_plan]
        if tolerant:  # every input done; the failed ones are simply not in its context
            return all(i in done for i in reads)
        return all(done.get(i) == StepStatus.SUCCEEDED for i in reads)

    def inputs_all_failed(step: PlanStep) -> bool:
        reads = [i for i in step.reads() if i in in_plan]
        return bool(reads) and not any(done.get(i) == StepStatus.SUCCEEDED for i in reads)

    def finish(rec: StepRecord) -> None:
        session.record(rec)
        done[rec.step.index] = rec.status
        session.emit_step_finished(rec)

    def skip_pending(reason: str) -> None:
        for index in sorted(state.pending):
            step = state.pending.pop(index)
            finish(StepRecord(step, round, StepStatus.SKIPPED, session.worker_key(step.worker), error=reason))

    def abandon_running(status: StepStatus, error: str, waited: str) -> None:
        for att in sorted(state.running.values(), key=lambda a: a.step.index):
            att.abandon(error)
            # An abandoned call may still be billed: its cost is unknown, not zero. A step that
            # still waited for its slot made no call: it costs nothing and has no latency.
            finish(
                StepRecord(
                    att.step,
                    round,
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
                session.add_usage(Usage(), None, False)
        state.running.clear()

    def drop_waiting(reason: str) -> None:
        # A step still waiting for its slot when the round ends has made no call: it is not run.
        for att in sorted(state.running.values(), key=lambda a: a.step.index):
            if att.waiting:
                del state.running[att.id]
                att.abandon(reason)
                finish(StepRecord(att.step, round, StepStatus.SKIPPED, att.worker.info.key, error=reason))

    def call_timeout(worker: Worker) -> float:
        return max(0.001, min(limits.step_timeout_s, worker.info.timeout_s, session.remaining()))

    def grace(timeout: float) -> float:
        # Small grace so a provider that honours `timeout` reports its own ProviderTimeout first.
        return min(0.5, 0.1 * timeout)

    def launch(step: PlanStep, worker: Worker, messages: list[Message], fallback_from: str | None) -> None:
        now = time.monotonic()
        timeout = call_timeout(worker)
        slot = slots.worker_slot(worker)
        waiting = slot is not None and not slot.try_acquire()
        att = _Attempt(
            next(_attempt_ids),
            step,
            worker,
            messages,
            now,
            float("inf") if waiting else now + timeout + grace(timeout),
            fallback_from,
            waiting=waiting,
        )
        if waiting:
            assert slot is not None
            session.emitter.emit(
                EventType.STEP_WAITING,
                {
                    "index": step.index,
                    "round": round,
                    "worker_key": worker.info.key,
                    "worker_name": worker.info.name,
                    "capacity": slot.capacity,
                    "reason": (
                        f"waiting for {worker.info.name}: it runs "
                        + ("one call at a time" if slot.capacity == 1 else f"{slot.capacity} calls at a time")
                        + " and is busy"
                    ),
                },
            )
        state.running[att.id] = att
        max_tokens = limits.max_tokens_per_step or worker.info.max_output_tokens
        if limits.max_tokens_per_step is not None:
            max_tokens = min(max_tokens, worker.info.max_output_tokens)
        extra = step_call_kwargs(
            session.ctx.generation, is_final=step.index == answer_index, max_tokens=max_tokens
        )
        if extra:
            max_tokens = extra["options"].max_tokens or max_tokens

        # The answer's text leaves only through the output gate (issue 45).
        answer = session.open_answer(step.index) if step.index == answer_index else None

        def on_delta(text: str) -> None:
            if not (att.live and text):
                return
            if answer is not None:
                answer.on_delta(text)  # raises AnswerBlocked: the provider call stops here
            else:
                session.emitter.emit(EventType.STEP_DELTA, {"index": step.index, "text": text})

        def target() -> None:
            call_timeout_s = timeout
            if waiting:
                assert slot is not None
                # Bounded by the run's deadline: the scheduler abandons the attempt then.
                if not slot.acquire(give_up=lambda: not att.live):
                    return  # abandoned while it waited: the scheduler already ended the step
                if not att.live:  # abandoned just as the slot came free: no call
                    slot.release()
                    return
                call_timeout_s = call_timeout(worker)
                inbox.put(_Began(att.id, time.monotonic(), call_timeout_s))
            t0 = time.perf_counter()
            result: WorkerResult | None = None
            error: ProviderError | None = None
            try:
                with calls.scope(att.call), slots.held(slot):
                    # Issue 43: a step granted tools runs the bounded tool loop (apps.engine.tools_loop).
                    result = complete_with_tools(
                        session,
                        step,
                        worker,
                        messages,
                        max_tokens=max_tokens,
                        timeout=call_timeout_s,
                        extra=extra,
                    )
                    if result is None:
                        result = worker.complete(
                            messages,
                            max_tokens=max_tokens,
                            timeout=call_timeout_s,
                            on_delta=on_delta if limits.stream else None,
                            **extra,
                        )
            except ProviderError as err:
                error = err
            except Exception as err:
                # Unknown failure inside a provider: keep the details in the log, show plain words.
                logger.exception("worker %s raised unexpectedly", worker.info.key)
                error = ProviderError(f"The worker failed unexpectedly ({type(err).__name__}).")
            finally:
                if slot is not None:
                    slot.release()
            inbox.put(_Outcome(att.id, result, error, (time.perf_counter() - t0) * 1000))

        threads.spawn(target, name=f"engine-step-{step.index}")

    def try_start(step: PlanStep) -> None:
        worker = session.pool.workers[step.worker]
        gate = session.hooks.before_step(session.ctx, step, worker.info, session.totals())
        if not gate.allowed:
            reason = gate.reason or "a policy limit was reached"
            finish(StepRecord(step, round, StepStatus.BLOCKED, worker.info.key, error=reason))
            cap = f":{gate.cap}" if gate.cap else ""
            state.abort = RunAborted(
                RunStatus.BLOCKED, f"step_blocked{cap}", f"Step {step.index} was blocked: {reason}"
            )
            return
        messages = build_messages(session.question, step, session.records)
        session.emitter.emit(
            EventType.STEP_STARTED,
            {
                "index": step.index,
                "round": round,
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
            att = _Attempt(next(_attempt_ids), step, worker, messages, now, now)
            on_failure(att, CircuitOpen(_circuit_text(worker)), 0.0)
            return
        launch(step, worker, messages, None)

    def fallback_for(att: _Attempt) -> Worker | None:
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
        allowed = limits.allowed_workers
        if allowed is not None and key not in allowed:
            return None
        gate = session.hooks.before_step(session.ctx, att.step, fb.info, session.totals())
        if not gate.allowed:
            return None
        return fb if health.admit(session.pool.health, key) else None

    def on_failure(att: _Attempt, error: ProviderError, elapsed_ms: float) -> None:
        if isinstance(error, ToolApprovalHeld):
            # Issue 43: a tool call waits for an approver. Not a provider failure (no health
            # record, no fallback): the run pauses; the step is rebuilt from the journal on resume.
            finish(StepRecord(att.step, round, StepStatus.BLOCKED, att.worker.info.key, error=str(error)))
            if state.abort is None:
                state.abort = error.run_held(round)
            return
        if isinstance(error, ProviderRequestRefused):
            # The outbound gate refused the request (issue 39): nothing was sent, the step is
            # blocked naming the field and rule, and no fallback gets the same request.
            outbound.report(session, step=att.step.index, checks=error.checks, blocked=True)
            finish(StepRecord(att.step, round, StepStatus.BLOCKED, att.worker.info.key, error=str(error)))
            if state.abort is None:
                state.abort = RunAborted(
                    RunStatus.BLOCKED, outbound.BLOCKED_REASON, f"Step {att.step.index} was blocked: {error}"
                )
            return
        if isinstance(error, AnswerBlocked):
            # The output gate blocked the answer mid-stream: nothing of the offending text was
            # released; the step is blocked and the run ends naming the rule.
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
            finish(
                StepRecord(
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
            )
            session.add_usage(Usage(), None, False)  # the call was cut: billed, amount unknown
            if state.abort is None:
                rule = f" (rule: {error.rule})" if error.rule else ""
                state.abort = RunAborted(
                    RunStatus.BLOCKED, "output_blocked", f"The answer was blocked: {error}{rule}"
                )
            return
        health.record(session.pool.health, att.worker.info.key, error=error, latency_ms=elapsed_ms)
        fb = fallback_for(att)
        if fb is not None and state.abort is None and not session.is_cancelled():
            logger.info(
                "step %d: %s failed (%s); falling back to %s",
                att.step.index,
                att.worker.info.key,
                error.code,
                fb.info.key,
            )
            launch(att.step, fb, att.messages, att.worker.info.key)
            return
        timed_out = isinstance(error, ProviderTimeout)
        circuit_open = isinstance(error, CircuitOpen)
        status = (
            StepStatus.TIMED_OUT if timed_out else StepStatus.SKIPPED if circuit_open else StepStatus.FAILED
        )
        finish(
            StepRecord(
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
        )
        if timed_out:
            session.add_usage(Usage(), None, False)
        what = "timed out" if timed_out else "was skipped" if circuit_open else "failed"
        failure = RunAborted(
            RunStatus.FAILED,
            "step_timed_out" if timed_out else CIRCUIT_OPEN if circuit_open else "step_failed",
            f"Step {att.step.index} ({att.worker.info.name}) {what}: {error}",
        )
        if tolerant:
            tolerated.append(failure)  # a result the round goes on with (module docstring)
        elif state.abort is None:
            state.abort = failure

    def on_success(att: _Attempt, result: WorkerResult, elapsed_ms: float) -> None:
        if not result.replayed:  # a journaled answer is not a call
            latency = result.latency_ms or elapsed_ms
            health.record(session.pool.health, att.worker.info.key, error=None, latency_ms=latency)
        outbound.report(session, step=att.step.index, checks=result.outbound, blocked=False)
        session.add_usage(result.usage, result.cost_usd, result.priced)
        session.ctx.endings[att.step.index] = StepEnding(result.finish_reason, list(result.tool_calls))
        guard = session.hooks.check_step_output(session.ctx, att.step, result.text)
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
        session.flags.extend(f for f in guard.flags if f not in session.flags)
        status = StepStatus.BLOCKED if guard.blocked else StepStatus.SUCCEEDED
        finish(
            StepRecord(
                att.step,
                round,
                status,
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
        )
        if guard.blocked and state.abort is None:
            reason = guard.block_reason or "a guardrail blocked it"
            state.abort = RunAborted(
                RunStatus.BLOCKED,
                "step_output_blocked",
                f"The output of step {att.step.index} was blocked: {reason}",
            )

    # ------------------------------------------------------------------ scheduling loop
    while state.pending or state.running:
        if state.abort is None or state.abort.status not in (RunStatus.CANCELLED, RunStatus.TIMED_OUT):
            try:
                session.checkpoint()
            except RunAborted as stop:
                state.abort = stop
                what = (
                    "cancelled" if stop.status == RunStatus.CANCELLED else "stopped at the run's time limit"
                )
                abandon_running(
                    StepStatus.SKIPPED if stop.status == RunStatus.CANCELLED else StepStatus.TIMED_OUT,
                    f"The run was {what} while this step was running.",
                    f"The run was {what} while this step waited for its worker (no call started).",
                )
                skip_pending(f"The run was {what} before this step started.")
                break

        if state.abort is not None:
            skip_pending(f"Not run: {state.abort.error}")
            drop_waiting(f"Not run: {state.abort.error}")
        else:
            for index in sorted(state.pending):
                if len(state.running) >= limits.max_parallel or state.abort is not None:
                    break
                step = state.pending[index]
                if deps_ready(step):
                    del state.pending[index]
                    if tolerant and inputs_all_failed(step):
                        finish(
                            StepRecord(
                                step,
                                round,
                                StepStatus.SKIPPED,
                                session.worker_key(step.worker),
                                error="Not run: every step it reads failed.",
                            )
                        )
                        continue
                    try_start(step)
            if state.abort is not None:
                continue
        if not state.running:
            if state.pending:  # unreachable with a valid plan; guards against a scheduling stall
                skip_pending("Not run: its inputs never became available.")
                state.abort = state.abort or RunAborted(
                    RunStatus.FAILED, "internal_error", "The plan stalled."
                )
            break

        now = time.monotonic()
        nearest = min(a.deadline for a in state.running.values())
        wait = max(0.0, min(limits.cancel_poll_s, nearest - now, session.remaining()))
        try:
            out = inbox.get(timeout=wait)
        except queue.Empty:
            now = time.monotonic()
            for att in sorted(state.running.values(), key=lambda a: a.step.index):
                if now >= att.deadline:
                    del state.running[att.id]
                    timeout = att.deadline - att.started
                    att.abandon(f"the step timed out after {timeout:.1f} s")
                    on_failure(
                        att,
                        ProviderTimeout(f"The worker did not answer within {timeout:.1f} s."),
                        (now - att.started) * 1000,
                    )
            continue
        if isinstance(out, _Began):
            began = state.running.get(out.attempt_id)
            if began is not None and began.waiting:
                began.waiting = False
                waited_ms = (out.at - began.started) * 1000
                began.started = out.at
                began.deadline = out.at + out.timeout + grace(out.timeout)
                session.emitter.emit(
                    EventType.STEP_RUNNING,
                    {"index": began.step.index, "round": round, "waited_ms": round_ms(waited_ms)},
                )
            continue
        found = state.running.pop(out.attempt_id, None)
        if found is None:
            continue  # a late answer from an abandoned attempt
        found.live = False
        if out.result is not None:
            on_success(found, out.result, out.elapsed_ms)
        else:
            assert out.error is not None
            on_failure(found, out.error, out.elapsed_ms)

    if state.abort is not None:
        raise state.abort
    if tolerated and not plan.recurses and steps and done.get(steps[-1].index) != StepStatus.SUCCEEDED:
        raise tolerated[0]  # the round's answer step could not run: the first failure says why
