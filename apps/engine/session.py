"""Per-run state shared by the runner, the strategies and the executor.

A `RunSession` owns the emitter, the totals, the step records (by global index) and the
cancel/deadline checks. Strategies use three helpers: `call_conductor` (a planning call counted
in the totals), `propose` (emit plan.proposed) and `validate` (through the governance hooks);
`apps.engine.executor.execute_round` validates and runs a plan. Terminal conditions travel as
`RunAborted`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from apps.engine import calls, health, outbound, slots, threads
from apps.engine.answer import AnswerStream, buffered
from apps.engine.events import Emitter, EventType, RunStatus, StepStatus
from apps.engine.hooks import GovernanceHooks, PlanValidation, RunContext, Violation
from apps.engine.plan import CONDUCTOR_SELF, Plan, PlanError, PlanStep, plan_to_dict, validate_plan
from apps.engine.pool import WorkerPool
from apps.engine.providers.base import ProviderError, ProviderTimeout, Worker
from apps.engine.providers.gate import ProviderRequestRefused
from apps.engine.types import Limits, Message, Totals, Usage, WorkerResult

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger(__name__)

T = TypeVar("T")


class CancelToken:
    """Cooperative cancellation. The engine polls `is_cancelled()` at step boundaries and every
    `Limits.cancel_poll_s` while waiting; the Django side subclasses it to read the Run row
    (keep `is_cancelled` cheap, or rate-limit it in the subclass)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    def is_cancelled(self) -> bool:
        return self._event.is_set()


class RunAborted(Exception):
    """Ends a run early in a defined terminal state."""

    def __init__(self, status: RunStatus, reason: str, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.reason = reason
        self.error = error


class RunHeld(RunAborted):
    """Pauses a run: its plan waits for an approver (no worker was called for it)."""

    def __init__(
        self,
        reason: str,
        *,
        plan: dict[str, Any] | None,
        round: int,
        violations: list[dict[str, Any]],
        hold: dict[str, Any],
    ) -> None:
        super().__init__(
            RunStatus.AWAITING_APPROVAL, "approval_required", f"The plan waits for an approver: {reason}"
        )
        self.plan = plan
        self.round = round
        self.violations = violations
        self.hold = hold


@dataclass(slots=True)
class StepRecord:
    step: PlanStep
    round: int
    status: StepStatus
    worker_key: str
    output: str | None = None  # what later steps and the answer see (after step-output guardrails)
    error: str | None = None
    fallback_from: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: Decimal | None = Decimal(0)
    priced: bool = True
    latency_ms: float = 0.0
    messages: list[Message] = field(default_factory=list)
    replayed: bool = False  # answered from the resume journal (see apps.runs.journal)

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"replayed": True} if self.replayed else {}
        return {
            "index": self.step.index,
            "round": self.round,
            "status": self.status.value,
            "output": self.output,
            "error": self.error,
            "worker_key": self.worker_key,
            "fallback_from": self.fallback_from,
            "usage": self.usage.to_dict(),
            "cost_usd": str(self.cost_usd) if self.cost_usd is not None else None,
            "priced": self.priced,
            "latency_ms": round(self.latency_ms, 3),
            **extra,
        }


def call_in_thread(
    fn: Callable[[], T],
    *,
    timeout: float,
    cancelled: Callable[[], bool],
    poll: float,
) -> T:
    """Run a blocking call on a daemon thread and wait for it at most `timeout` seconds,
    polling `cancelled`. A call that overruns is abandoned (SDK and llama calls cannot be
    interrupted); daemon threads keep an abandoned call from blocking interpreter exit."""
    box: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)

    def target() -> None:
        try:
            box.put((True, fn()))
        except BaseException as exc:  # handed to the waiting thread, which re-raises it
            box.put((False, exc))

    threads.spawn(target, name="engine-call")
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise ProviderTimeout(f"The call did not finish within {timeout:.1f} s.")
        try:
            ok, value = box.get(timeout=min(poll, left))
        except queue.Empty:
            if cancelled():
                raise RunAborted(RunStatus.CANCELLED, "cancelled", "The run was cancelled.") from None
            continue
        if ok:
            return value
        raise value


class RunSession:
    def __init__(
        self,
        *,
        ctx: RunContext,
        pool: WorkerPool,
        limits: Limits,
        emitter: Emitter,
        hooks: GovernanceHooks,
        cancel: CancelToken | None,
        tools: Any = None,
    ) -> None:
        self.ctx = ctx
        # The host's tool port (apps.engine.tools_loop.ToolPort), None: no step may call tools.
        self.tools = tools
        self.pool = pool
        self.limits = limits
        self.emitter = emitter
        self.hooks = hooks
        self.cancel = cancel
        self.question = ctx.question  # replaced by the input guardrail's (possibly redacted) text
        self.started = time.monotonic()
        self.deadline = self.started + limits.run_timeout_s
        self.records: dict[int, StepRecord] = {}
        self.plans: list[Plan] = []
        self._totals = Totals()
        self._lock = threading.Lock()
        self.flags: list[str] = []
        # The answer step's stream through the output gate (issue 45), once that step started.
        self.answer_stream: AnswerStream | None = None

    def open_answer(self, index: int) -> AnswerStream:
        """The stream of one attempt of the step that writes the answer. The policy's gate (the
        hooks' optional ``answer_gate(ctx)``; None: nothing to check) decides what is released;
        a JSON response format is checked (and maybe repaired) on the whole answer: buffered."""
        make = getattr(self.hooks, "answer_gate", None)
        gate = make(self.ctx) if make is not None else None
        generation = self.ctx.generation
        if generation is not None and generation.response_format is not None:
            gate = buffered("a JSON response format is checked on the whole answer")

        def emit(text: str) -> None:
            self.emitter.emit(EventType.STEP_DELTA, {"index": index, "text": text, "answer": True})

        def unchecked(text: str) -> None:
            self.emitter.emit(EventType.STEP_DELTA, {"index": index, "text": text, "unchecked": True})

        self.answer_stream = AnswerStream(index, gate, emit, unchecked)
        return self.answer_stream

    # ------------------------------------------------------------------ bookkeeping

    def add_usage(self, usage: Usage, cost_usd: Decimal | None, priced: bool) -> None:
        with self._lock:
            self._totals.add(usage, cost_usd, priced)

    def count_step(self) -> None:
        with self._lock:
            self._totals.steps += 1

    def totals(self) -> Totals:
        with self._lock:
            snap = self._totals.copy()
        snap.latency_ms = (time.monotonic() - self.started) * 1000
        return snap

    def record(self, rec: StepRecord) -> None:
        with self._lock:
            self.records[rec.step.index] = rec

    @property
    def next_index(self) -> int:
        last = max((p.steps[-1].index for p in self.plans), default=-1)
        return max(last, max(self.records, default=-1)) + 1

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def is_cancelled(self) -> bool:
        if self.cancel is None:
            return False
        try:
            return bool(self.cancel.is_cancelled())
        except Exception:
            # A failing cancel check (e.g. DB hiccup) must not kill the run; keep going.
            logger.exception("cancel token check failed (run %s)", self.ctx.run_id)
            return False

    def checkpoint(self) -> None:
        """Raise RunAborted if the run was cancelled or its deadline has passed."""
        if self.is_cancelled():
            raise RunAborted(RunStatus.CANCELLED, "cancelled", "The run was cancelled.")
        if self.remaining() <= 0:
            raise RunAborted(
                RunStatus.TIMED_OUT,
                "run_timeout",
                f"The run exceeded its time limit of {self.limits.run_timeout_s:g} s.",
            )

    def worker_key(self, worker: int) -> str:
        if worker == CONDUCTOR_SELF:
            return self.conductor_key
        return self.pool.workers[worker].info.key

    @property
    def conductor_key(self) -> str:
        return self.pool.conductor.info.key if self.pool.conductor is not None else "conductor"

    def plan_dict(self, plan: Plan | None) -> dict[str, Any] | None:
        if plan is None:
            return None
        return plan_to_dict(plan, self.pool.keys, conductor_key=self.conductor_key)

    # ------------------------------------------------------------------ conductor calls

    def call_conductor(
        self,
        messages: list[Message],
        *,
        json_schema: dict | None = None,
        max_tokens: int | None = None,
        worker: Worker | None = None,
        on_delta: Callable[[str], None] | None = None,
        round: int | None = None,
    ) -> WorkerResult:
        """One planning call, bounded by the step timeout and the run deadline; counted in the
        run totals whether or not its plan turns out valid. Like a step, it first takes its
        worker's slot (issue 44): while it waits (``plan.waiting`` when ``round`` is given) only
        the run's deadline runs, and the call's timeout starts with the call."""
        worker = worker or self.pool.conductor
        if worker is None:
            raise ProviderError("No conductor model is configured for this pool.")
        self.checkpoint()
        slot = self._take_slot(worker, round)
        timeout = max(0.001, min(self.limits.step_timeout_s, worker.info.timeout_s, self.remaining()))
        started = time.monotonic()
        scope = calls.CallScope()

        def call() -> WorkerResult:
            try:
                with calls.scope(scope), slots.held(slot):
                    return worker.complete(
                        messages,
                        max_tokens=max_tokens,
                        timeout=timeout,
                        json_schema=json_schema,
                        on_delta=on_delta if self.limits.stream else None,
                    )
            finally:
                if slot is not None:
                    slot.release()

        try:
            result = call_in_thread(
                call, timeout=timeout, cancelled=self.is_cancelled, poll=self.limits.cancel_poll_s
            )
        except ProviderRequestRefused as refused:
            # The outbound gate refused the planning request (issue 39): the run is blocked.
            outbound.report(self, step=None, checks=refused.checks, blocked=True)
            raise RunAborted(
                RunStatus.BLOCKED, outbound.BLOCKED_REASON, f"The planning request was blocked: {refused}"
            ) from None
        except ProviderTimeout as err:
            scope.cancel("the planning call timed out")  # stops a generation still running
            health.record(self.pool.health, worker.info.key, error=err, latency_ms=None)
            self.checkpoint()  # the run deadline, not just the call, may be what ran out
            raise
        except ProviderError as err:
            health.record(self.pool.health, worker.info.key, error=err, latency_ms=None)
            raise
        except BaseException:
            scope.cancel("the planning call was abandoned")  # cancelled run: stop the call
            raise
        if not result.replayed:  # the planning call feeds the conductor's breaker too (issue 44)
            latency = result.latency_ms or (time.monotonic() - started) * 1000
            health.record(self.pool.health, worker.info.key, error=None, latency_ms=latency)
        outbound.report(self, step=None, checks=result.outbound, blocked=False)
        self.add_usage(result.usage, result.cost_usd, result.priced)
        return result

    def _take_slot(self, worker: Worker, round: int | None) -> slots.Slot | None:
        """The worker's slot for a planning call, waited for within the run's deadline."""
        slot = slots.worker_slot(worker)
        if slot is None or slot.try_acquire():
            return slot
        waited = time.monotonic()
        if round is not None:
            self.emitter.emit(
                EventType.PLAN_WAITING,
                {
                    "round": round,
                    "worker_key": worker.info.key,
                    "worker_name": worker.info.name,
                    "capacity": slot.capacity,
                    "reason": f"waiting for {worker.info.name}: it runs one call at a time and is busy"
                    if slot.capacity == 1
                    else f"waiting for {worker.info.name}: its {slot.capacity} slots are busy",
                },
            )
        while not slot.acquire(timeout=self.limits.cancel_poll_s):
            self.checkpoint()  # the run's deadline and cancellation end the wait
        if round is not None:
            self.emitter.emit(
                EventType.PLAN_RUNNING,
                {"round": round, "waited_ms": float(f"{(time.monotonic() - waited) * 1000:.1f}")},
            )
        return slot

    # ------------------------------------------------------------------ events

    def propose(
        self,
        *,
        round: int,
        attempt: int,
        source: str,
        plan: Plan | None,
        raw: str | None = None,
        error: str | None = None,
        result: WorkerResult | None = None,
    ) -> None:
        self.emitter.emit(
            EventType.PLAN_PROPOSED,
            {
                "round": round,
                "attempt": attempt,
                "source": source,
                "worker_key": self.conductor_key,  # the planner, for per-model metrics and traces
                "plan": self.plan_dict(plan),
                "raw": raw,
                "error": error,
                "usage": (result.usage if result else Usage()).to_dict(),
                "cost_usd": (str(result.cost_usd) if result.cost_usd is not None else None)
                if result
                else "0",
                "priced": result.priced if result else True,
                "latency_ms": float(f"{result.latency_ms:.3f}")
                if result
                else 0.0,  # `round` is shadowed here
                **({"replayed": True} if result is not None and result.replayed else {}),
            },
        )

    def emit_step_finished(self, rec: StepRecord) -> None:
        self.emitter.emit(EventType.STEP_FINISHED, rec.to_dict())

    # ------------------------------------------------------------------ validation & execution

    def engine_violations(
        self, plan: Plan, *, allow_self: bool, max_steps: int | None = None
    ) -> list[Violation]:
        """The engine's own constraints (structure, max steps, allowed workers), checked before
        governance (with the accept bound) and on the plan that will run (with max_steps)."""
        out: list[Violation] = []
        try:
            validate_plan(
                plan,
                pool_size=len(self.pool),
                max_steps=self.limits.plan_bound if max_steps is None else max_steps,
                allow_self=allow_self,
            )
        except PlanError as err:
            out.append(Violation("invalid_plan", err.message))
        allowed = set(self.pool.allowed_indices(self.limits.allowed_workers))
        for s in plan.steps:
            if not s.is_self and 0 <= s.worker < len(self.pool) and s.worker not in allowed:
                out.append(
                    Violation(
                        "worker_not_allowed",
                        f"step {s.index}: worker {self.worker_key(s.worker)!r} is not allowed by the limits in force",
                        s.index,
                    )
                )
        return out

    def validate(self, plan: Plan, *, round: int, allow_self: bool = True) -> Plan:
        """Engine checks + governance `validate_plan`; emits plan.validated; returns the plan to
        execute or raises RunAborted(blocked)."""
        violations = self.engine_violations(plan, allow_self=allow_self)
        if violations:
            verdict = PlanValidation("blocked", violations, None, violations[0].message)
        else:
            verdict = self.hooks.validate_plan(self.ctx, plan, self.pool)
            if verdict.action == "repaired":
                repaired = verdict.plan
                problems = (
                    self.engine_violations(repaired, allow_self=allow_self)
                    if repaired is not None
                    else [Violation("invalid_repair", "governance repaired the plan but returned none")]
                )
                if problems:
                    verdict = PlanValidation(
                        "blocked",
                        list(verdict.violations) + problems,
                        None,
                        "The policy's repaired plan is itself invalid: " + problems[0].message,
                    )
            elif verdict.action == "accepted":
                verdict.plan = plan
            # Whatever governance let through must fit the limits the run was given.
            if verdict.action != "blocked" and verdict.plan is not None:
                over = self.engine_violations(
                    verdict.plan, allow_self=allow_self, max_steps=self.limits.max_steps
                )
                if over:
                    verdict = PlanValidation(
                        "blocked", list(verdict.violations) + over, None, over[0].message
                    )
        final = verdict.plan if verdict.action not in ("blocked", "held") else None
        self.emitter.emit(
            EventType.PLAN_VALIDATED,
            {
                "round": round,
                "action": verdict.action,
                "violations": [v.to_dict() for v in verdict.violations],
                "original": self.plan_dict(plan),
                "plan": self.plan_dict(final),
                "reason": verdict.reason,
            },
        )
        if verdict.action == "held":
            held = verdict.plan if verdict.plan is not None else plan
            raise RunHeld(
                verdict.reason or "the plan needs an approver",
                plan=self.plan_dict(held),
                round=round,
                violations=[v.to_dict() for v in verdict.violations],
                hold=dict(verdict.hold or {}),
            )
        if final is None:
            reason = verdict.reason or (
                verdict.violations[0].message if verdict.violations else "blocked by policy"
            )
            raise RunAborted(RunStatus.BLOCKED, "plan_blocked", f"The plan was blocked: {reason}")
        return final

    def answer(self) -> str:
        """The last executed step's output (the conductor's own steps are not answers)."""
        for index in sorted(self.records, reverse=True):
            rec = self.records[index]
            if not rec.step.is_self and rec.status == StepStatus.SUCCEEDED:
                return rec.output or ""
        raise RunAborted(RunStatus.FAILED, "no_answer", "No step produced an answer.")

    def outputs_for(self, indices: Sequence[int]) -> list[StepRecord]:
        return [self.records[i] for i in sorted(indices) if i in self.records]

    def with_limits(self, limits: Limits) -> None:
        self.limits = limits
        self.ctx.limits = limits
        self.deadline = self.started + limits.run_timeout_s


__all__ = ["CancelToken", "RunAborted", "RunHeld", "RunSession", "StepRecord", "call_in_thread"]
