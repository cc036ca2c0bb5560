"""Governance hook interface. The engine calls these; the governance app implements them.

Call points (all synchronous; `before_step` may be called from executor threads, the others
from the run's thread — implementations must be thread-safe):

1. `check_input(ctx, question)`      before planning; blocked → run `blocked`.
2. `validate_plan(ctx, plan, pool)`  after each plan (every strategy, every round): accept,
   repair (the engine executes the repaired plan) or block (run `blocked`).
3. `before_step(ctx, step, worker, totals)`  before each step (and before a fallback attempt):
   allow, or block naming the cap (token/cost/time budget, worker not allowed) → step
   `blocked`, run `blocked`.
4. `check_step_output(ctx, step, text)`  after each step: may redact what later steps and the
   answer see (`GuardrailOutcome.text`), or block.
5. `check_output(ctx, answer)`       at the end: may redact or block the answer.

Never report `passed` for a check that did not run: use `not_run` (NoGovernance does).

The outbound gate (``apps.engine.providers.gate``) takes a separate port, `OutboundPolicy`
(``apps.engine.checks``, re-exported here):
every request to a model provider is read field by field (`OutboundField`) and the policy
rewrites or refuses it (`OutboundVerdict`) before a socket opens. `PolicyHooks` implements both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from apps.engine.checks import CheckResult, OutboundField, OutboundPolicy, OutboundVerdict, Stage
from apps.engine.events import CheckStatus
from apps.engine.generation import GenerationOptions, StepEnding
from apps.engine.plan import Plan, PlanStep
from apps.engine.types import Limits, Totals, WorkerInfo

if TYPE_CHECKING:
    from apps.engine.pool import WorkerPool

# "held": the plan waits for an approver; the run pauses (run.awaiting_approval) before any
# worker is called and resumes, re-planning from its journal, once approved.
PlanAction = Literal["accepted", "repaired", "blocked", "held"]


@dataclass(slots=True)
class RunContext:
    """Per-run facts handed to every hook. `metadata` is free for the Django side
    (team id, policy version, user id...)."""

    run_id: str
    question: str
    strategy: str
    preset: str | None = None
    limits: Limits = field(default_factory=Limits)
    metadata: dict[str, Any] = field(default_factory=dict)
    started_monotonic: float = 0.0  # set by the runner; lets time caps compute elapsed time
    # What the API client asked of the worker that writes the answer (apps.engine.generation),
    # and how each step's call ended (finish reason, tool calls), by step index.
    generation: GenerationOptions | None = None
    endings: dict[int, StepEnding] = field(default_factory=dict)


@dataclass(slots=True)
class GuardrailOutcome:
    checks: list[CheckResult]
    text: str  # the (possibly redacted) text to use from here on
    blocked: bool = False
    block_reason: str | None = None
    flags: list[str] = field(default_factory=list)  # e.g. "warn", "require_review"


@dataclass(slots=True)
class Violation:
    code: str  # e.g. too_many_steps, worker_not_allowed, recursion_not_allowed
    message: str
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "step": self.step}


@dataclass(slots=True)
class PlanValidation:
    action: PlanAction
    violations: list[Violation] = field(default_factory=list)
    plan: Plan | None = None  # the plan to execute: the original (accepted) or the repaired one
    reason: str | None = None  # for "blocked" / "held": plain words shown to the user
    hold: dict[str, Any] | None = None  # for "held": what the Django side needs to ask (opaque here)


@dataclass(slots=True)
class StepGate:
    allowed: bool = True
    reason: str | None = None  # plain words, e.g. "the team's daily cost budget ($5.00) is spent"
    cap: str | None = None  # machine name of the cap, e.g. max_cost_usd, max_tokens, worker_not_allowed

    @classmethod
    def allow(cls) -> StepGate:
        return cls(True)

    @classmethod
    def block(cls, reason: str, cap: str | None = None) -> StepGate:
        return cls(False, reason, cap)


@runtime_checkable
class GovernanceHooks(Protocol):
    def check_input(self, ctx: RunContext, text: str) -> GuardrailOutcome: ...

    def validate_plan(self, ctx: RunContext, plan: Plan, pool: WorkerPool) -> PlanValidation: ...

    def before_step(
        self, ctx: RunContext, step: PlanStep, worker_info: WorkerInfo, totals: Totals
    ) -> StepGate: ...

    def check_step_output(self, ctx: RunContext, step: PlanStep, text: str) -> GuardrailOutcome: ...

    def check_output(self, ctx: RunContext, answer: str) -> GuardrailOutcome: ...


class NoGovernance:
    """Runs nothing. Input and output stages report one `not_run` check so the record shows
    that nothing was checked; steps report no checks at all."""

    def _not_run(self, stage: Stage, text: str) -> GuardrailOutcome:
        check = CheckResult(
            "governance", stage, CheckStatus.NOT_RUN, "none", "no governance policy configured"
        )
        return GuardrailOutcome([check], text)

    def check_input(self, ctx: RunContext, text: str) -> GuardrailOutcome:
        return self._not_run("input", text)

    def validate_plan(self, ctx: RunContext, plan: Plan, pool: WorkerPool) -> PlanValidation:
        return PlanValidation("accepted", [], plan)

    def before_step(
        self, ctx: RunContext, step: PlanStep, worker_info: WorkerInfo, totals: Totals
    ) -> StepGate:
        return StepGate.allow()

    def check_step_output(self, ctx: RunContext, step: PlanStep, text: str) -> GuardrailOutcome:
        return GuardrailOutcome([], text)

    def check_output(self, ctx: RunContext, answer: str) -> GuardrailOutcome:
        return self._not_run("output", answer)

    def check_outbound(self, fields: Sequence[OutboundField]) -> OutboundVerdict:
        return OutboundVerdict()  # no policy: the gate still reads every field, and rewrites none


__all__ = [
    "CheckResult",
    "GovernanceHooks",
    "GuardrailOutcome",
    "NoGovernance",
    "OutboundField",
    "OutboundPolicy",
    "OutboundVerdict",
    "PlanAction",
    "PlanValidation",
    "RunContext",
    "Stage",
    "StepGate",
    "Violation",
]
