"""The event protocol: engine → sink → websocket.

Every event is `{"type", "run_id", "seq", "ts", "data"}` (see `Event.to_dict`); `seq` starts at 1
and increases by exactly 1 per event of a run, in the order the sink receives them, even though
the executor emits from several threads. `ts` is a Unix timestamp (seconds, float). Decimals
(costs) are serialised as strings.

Payloads (`data`) by type — the websocket UI depends on these shapes:

run.started
    {strategy, preset, question, workers: [{index, key, name, model, tags, concurrency}],
     conductor: {key, name, model} | None, limits}
guardrail.checked
    {stage: "input"|"step_output"|"output", step: int|None,
     checks: [{name, stage, status, action, detail, latency_ms}], blocked: bool, flags: [str]}
    statuses: passed intervened failed not_run bypassed. Without governance the engine reports
    a single `not_run` check for the input and output stages, never `passed`; step_output
    events are only emitted when some check actually ran.
plan.started
    {round, worker_key, worker_name, model, first, messages: [Message]}
    Emitted the moment a conductor planning call (or a re-plan in recursion) begins, before
    any model call, so a viewer sees planning as a live node long before plan.proposed; `first`
    is the global index the round's steps will start at. Strategies without a conductor call
    (single, moa, pev, a pool without a conductor) emit none. Its usage and cost arrive on the
    round's plan.proposed events.
plan.waiting / plan.running
    {round, worker_key, worker_name, capacity, reason} / {round, waited_ms}
    Issue 44: like step.waiting / step.running, for a planning call whose conductor (the local
    model) is busy with another call: planning has not started, only the run's deadline runs.
plan.delta
    {round, attempt, text}
    The planning call's text as the conductor writes it (when the provider streams and
    limits.stream is on); consecutive deltas of one round may arrive coalesced. A journal replay
    sends the whole text at once. Withheld from viewers who may not see a held run's content.
plan.proposed
    {round, attempt, source: "conductor"|"repair"|"fallback"|"fixed",
     plan: {steps: [{index, worker, worker_key, instruction, access}]} | None,
     raw: str|None, error: str|None, usage: {input_tokens, output_tokens},
     cost_usd: str|None, priced: bool, latency_ms}
    One event per conductor attempt; a rejected attempt has `plan: None` and `error` set.
    `worker` -1 (CONDUCTOR_SELF) is the conductor itself; its worker_key is the conductor's key.
plan.validated
    {round, action: "accepted"|"repaired"|"blocked"|"held", violations: [{code, message, step}],
     original: plan, plan: plan|None, reason: str|None}
step.started
    {index, round, worker_key, worker_name, instruction, access: [int], messages: [Message]}
    Indices are global across recursion rounds (round 2 continues after round 1).
step.waiting
    {index, round, worker_key, worker_name, capacity, reason}
    Issue 44: right after step.started, when every slot of the step's worker is taken (the local
    model runs one call at a time; ``apps.engine.slots``). The step is *waiting*, not running: no
    call was made and its call timeout has not started; only the run's deadline bounds the wait.
step.running
    {index, round, waited_ms}
    The waiting step got its slot: its call, and its call timeout, start now. A step that never
    waited has no step.waiting / step.running (step.started means running). A step abandoned
    while waiting ends with step.finished (skipped or timed_out) saying no call started.
step.delta
    {index, text, answer?: true}
    ``answer: true``: the step writes the run's answer, and ``text`` is what the output gate
    released (issue 45, ``apps.engine.answer``): only text the output guardrails decided on
    (masked where they redact), never a part of what they block; none while the policy buffers
    the answer (checks that need the whole of it). The pieces joined equal run.finished's answer.
    ``unchecked: true``: a buffered answer's text as the worker writes it, before the output
    checks: for the live graph only (held runs show it to reviewers only); /v1 never sends it.
step.finished
    {index, round, status, output, error, worker_key, fallback_from: str|None,
     usage: {input_tokens, output_tokens}, cost_usd: str|None, priced: bool, latency_ms}
    Steps that never started (skipped/blocked) get a step.finished without a step.started.
    A conductor-itself step (worker_key = the conductor's key) gets step.started when the
    re-plan begins and step.finished after the next round's plan.proposed events; its output is
    the new plan in text form and its usage is zero — the planning calls' usage and cost are on
    those plan.proposed events (summing both would double count).
run.finished
    {status, answer, error, reason, totals: {input_tokens, output_tokens, cost_usd, priced,
     latency_ms, steps}}
    Always the last event of a run, whatever happened.
run.awaiting_approval
    {reason, error, round, plan, violations: [{code, message, step}], hold: {...}, totals}
    Instead of run.finished when a plan is held for an approver (plan.validated action "held"):
    this attempt ends, the run does not. On approval the Django side queues it again and writes
    run.plan_decided {decision, by, note}; the next attempt's events follow (run.started again,
    planning replayed from the journal). On refusal or timeout a run.finished (blocked) follows.
run.requeued
    {attempt, restart: "resume"|"clean"}
    Written by the Django side when a lost executor's run goes back to the queue (issue 44): the
    run is queued, not planning or running; the next attempt's events follow (run.started
    again, answered calls replayed from the journal).

Step statuses: pending waiting running succeeded failed timed_out skipped blocked.
Run statuses: queued running succeeded failed blocked cancelled timed_out, and awaiting_approval
(paused: not terminal).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


class EventType(StrEnum):
    RUN_STARTED = "run.started"
    GUARDRAIL_CHECKED = "guardrail.checked"
    PLAN_STARTED = "plan.started"
    PLAN_WAITING = "plan.waiting"  # issue 44: the planning call waits for the conductor's slot
    PLAN_RUNNING = "plan.running"  # issue 44: it got the slot, the planning call starts
    PLAN_DELTA = "plan.delta"
    PLAN_PROPOSED = "plan.proposed"
    PLAN_VALIDATED = "plan.validated"
    STEP_STARTED = "step.started"
    STEP_WAITING = "step.waiting"  # issue 44: the step waits for its worker's slot, no call yet
    STEP_RUNNING = "step.running"  # issue 44: a waiting step got its slot, its call starts
    STEP_DELTA = "step.delta"
    STEP_FINISHED = "step.finished"
    RUN_FINISHED = "run.finished"
    RUN_AWAITING_APPROVAL = "run.awaiting_approval"
    RUN_PLAN_DECIDED = "run.plan_decided"  # written by the Django side (apps.runs.approvals)
    RUN_REQUEUED = "run.requeued"  # written by the Django side (apps.runs.execution.requeue_run)
    TOOL_CALLED = "tool.called"  # a step's worker called a tool (issue 43): a node of the live graph


class StepStatus(StrEnum):
    PENDING = "pending"
    WAITING = "waiting"  # started, but waits for its worker's slot: no call, no call timeout yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    BLOCKED = "blocked"


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    AWAITING_APPROVAL = "awaiting_approval"  # paused, not ended: the plan waits for an approver


class CheckStatus(StrEnum):
    PASSED = "passed"
    INTERVENED = "intervened"
    FAILED = "failed"
    NOT_RUN = "not_run"
    BYPASSED = "bypassed"


def json_safe(value: Any) -> Any:
    """Convert Decimals (to str), tuples, enums and dataclass-like values into JSON types."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return json_safe(to_dict())
    return str(value)


@dataclass(frozen=True, slots=True)
class Event:
    type: EventType
    run_id: str
    seq: int
    ts: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "run_id": self.run_id,
            "seq": self.seq,
            "ts": self.ts,
            "data": json_safe(self.data),
        }


@runtime_checkable
class EventSink(Protocol):
    """Receives every event of a run in `seq` order. Called from engine threads, one call at a
    time per run (the Emitter serialises). A sink that raises does not stop the run: the error
    is logged and the run continues (the Django sink should persist before publishing)."""

    def emit(self, event: Event) -> None: ...


class ListSink:
    """Collects events in memory (tests, benchmarks)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def of_type(self, type_: EventType | str) -> list[Event]:
        return [e for e in self.events if e.type == type_]

    def types(self) -> list[str]:
        return [e.type.value for e in self.events]


class NullSink:
    def emit(self, event: Event) -> None:
        return None


class Emitter:
    """Assigns the per-run `seq` and hands events to the sink under one lock, so the sink sees
    them in seq order with no gaps even when steps finish on different threads."""

    def __init__(self, run_id: str, sink: EventSink) -> None:
        self.run_id = run_id
        self.sink = sink
        self._seq = 0
        self._lock = threading.Lock()
        self.sink_errors = 0

    @property
    def last_seq(self) -> int:
        return self._seq

    def emit(self, type_: EventType, data: dict[str, Any]) -> Event:
        with self._lock:
            self._seq += 1
            event = Event(type_, self.run_id, self._seq, time.time(), data)
            try:
                self.sink.emit(event)
            except Exception:
                # A broken sink must not leave the run half-executed with no terminal state.
                self.sink_errors += 1
                logger.exception("event sink failed on %s seq=%d (run %s)", type_, event.seq, self.run_id)
            return event
