"""`PolicyHooks`: the engine's `GovernanceHooks` implemented from an effective policy.

The hooks are thin: guardrails (`apps.policies.guardrails.run_stage`) and constraints
(`apps.policies.constraints`) are pure functions. Database reads happen on the run's thread only:
the team's budget room at run start (constructor) and, when plan checks are on, the workers'
output history in `validate_plan`; `before_step` — called from executor threads — never touches
the ORM.

Thread safety: the per-run state (confidential flag, planning round, the pool seen at plan time)
is written under a lock; `before_step` only reads it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from apps.engine.answer import AnswerGate, buffered
from apps.engine.events import CheckStatus
from apps.engine.hooks import (
    CheckResult,
    GuardrailOutcome,
    OutboundField,
    OutboundVerdict,
    PlanValidation,
    RunContext,
    StepGate,
    Violation,
)
from apps.engine.plan import Plan, PlanStep
from apps.engine.types import Totals, WorkerInfo
from apps.policies import ports
from apps.policies.budgets import budget_status
from apps.policies.constraints import BudgetRoom, PlanFacts, check_plan, is_confidential, step_gate
from apps.policies.forecast import forecast_plan, forecast_violations
from apps.policies.guardrails import StageEnv, run_stage
from apps.policies.guardrails.stream import answer_gate, policy_buffered_reason
from apps.policies.outbound import OutboundChecks
from apps.policies.spec import EffectivePolicy

if TYPE_CHECKING:
    from apps.engine.pool import WorkerPool

logger = logging.getLogger(__name__)


class PolicyHooks:
    def __init__(
        self,
        *,
        effective: EffectivePolicy,
        team: Any = None,
        run_id: str = "",
        classification: str | None = None,
        pool: WorkerPool | None = None,
        budget_rooms: Sequence[BudgetRoom] | None = None,
        budget_warnings: Sequence[str] | None = None,
    ) -> None:
        self.effective = effective
        self.spec = effective.spec
        self.team = team
        self.run_id = run_id
        # None: not known to the caller, read from the run (the executor passes the run's own).
        self.classification = (
            classification if classification is not None else self._run_classification(run_id)
        )
        self._lock = threading.Lock()
        self._pool = pool
        self._confidential = False
        self._confidential_why = ""
        self._rounds = 0
        # Guardrail labels (pii, secrets) the request still carries unmasked, for the data boundary.
        self._labels: set[str] = set()
        # Digests of the plans an approver let through (set by the executor on a resumed run).
        self.approved_digests: set[str] = set()
        # The outbound gate's port (issue 39): every provider request of the run is checked here.
        self.outbound = OutboundChecks(self.spec.guardrails)
        if budget_rooms is None:
            budget_rooms, budget_warnings = self._load_budgets()
        self.budget_rooms = list(budget_rooms)
        self.budget_warnings = list(budget_warnings or ())

    @staticmethod
    def _run_classification(run_id: str) -> str:
        """The classification the run was created with (`run_create(classification=...)`)."""
        try:
            uuid.UUID(str(run_id))
        except ValueError:
            return ""  # not a stored run (engine tests, the test box)
        # A database error propagates: an unknown classification must not silently mean "public".
        return ports.run_history().run_classification(str(run_id))

    def _load_budgets(self) -> tuple[list[BudgetRoom], list[str]]:
        b = self.spec.budgets
        if self.team is None or all(
            getattr(b, n).soft_usd is None and getattr(b, n).hard_usd is None for n in ("daily", "monthly")
        ):
            return [], []

        status = budget_status(team=self.team, effective=self.effective)
        return status.rooms(), status.warnings

    # ------------------------------------------------------------------ helpers

    @property
    def confidential(self) -> bool:
        return self._confidential

    def _resolve(self, key: str) -> object | None:
        pool = self._pool
        return pool.get(key) if pool is not None else None

    def _env(self) -> StageEnv:
        timeout = self.spec.constraints.caps.step_timeout_s or 60.0
        return StageEnv(
            resolve_worker=self._resolve if self._pool is not None else None, judge_timeout_s=timeout
        )

    def _stage(self, stage: str, text: str) -> GuardrailOutcome:
        g = self.spec.guardrails
        return run_stage(stage, getattr(g, stage), text, on_check_error=g.on_check_error, env=self._env())  # type: ignore[arg-type]

    # ------------------------------------------------------------------ GovernanceHooks

    def check_input(self, ctx: RunContext, text: str) -> GuardrailOutcome:
        marked = self.classification or str(ctx.metadata.get("classification") or "")
        extra: list[CheckResult] = []
        flags: list[str] = []
        if self.spec.constraints.confidential.enabled:
            t0 = time.perf_counter()
            confidential, why = is_confidential(text, self.spec.constraints, marked=marked)
            with self._lock:
                self._confidential, self._confidential_why = confidential, why
            ms = (time.perf_counter() - t0) * 1000
            if confidential:
                extra.append(
                    CheckResult(
                        "classification",
                        "input",
                        CheckStatus.INTERVENED,
                        "local_only",
                        f"confidential ({why}): local workers only",
                        ms,
                    )
                )
            else:
                extra.append(
                    CheckResult("classification", "input", CheckStatus.PASSED, "none", "not confidential", ms)
                )
        for warning in self.budget_warnings:
            extra.append(CheckResult("budget", "input", CheckStatus.INTERVENED, "warn", warning))
            if "warn" not in flags:
                flags.append("warn")
        outcome = self._stage("input", text)
        found = {
            c.name
            for c in outcome.checks
            if c.name in ("pii", "secrets")
            and c.status == CheckStatus.INTERVENED
            and c.action not in ("redact", "block")  # masked or stopped: nothing labelled flows on
        }
        with self._lock:
            self._labels = found
        outcome.checks = extra + outcome.checks
        for f in flags:
            if f not in outcome.flags:
                outcome.flags.append(f)
        return outcome

    def validate_plan(self, ctx: RunContext, plan: Plan, pool: WorkerPool) -> PlanValidation:
        with self._lock:
            self._pool = pool
            self._rounds += 1
            round_ = self._rounds
            confidential = self._confidential
        facts = PlanFacts(question=ctx.question, confidential=confidential, round=round_)
        verdict = check_plan(plan, pool.infos, self.spec.constraints, facts)
        c = self.spec.constraints
        if verdict.plan is None or not (c.forecast.enabled or c.data_boundary.enabled):
            return verdict
        return self._plan_checks(ctx, verdict, pool.infos)

    def _plan_checks(
        self, ctx: RunContext, verdict: PlanValidation, infos: Sequence[WorkerInfo]
    ) -> PlanValidation:
        """Plan checks on the plan that would run, before any worker is called: the forecast
        (cost, tokens) and the data boundary. A hard limit blocks; a plan-check limit whose
        action is require_approval holds the plan for an approver unless one approved it."""

        assert verdict.plan is not None
        c = self.spec.constraints
        hard: list[Violation] = []
        holdable: list[tuple[Violation, str]] = []  # (violation, the policy field whose action applies)
        forecast = None
        if c.forecast.enabled:
            history = worker_output_history([i.key for i in infos])
            forecast = forecast_plan(verdict.plan, infos, question=ctx.question, history=history)
            for v in forecast_violations(forecast, c, self.budget_rooms):
                if v.code == "forecast_over_limit" and c.forecast.action == "require_approval":
                    holdable.append((v, "constraints.forecast.action"))
                else:
                    hard.append(v)
        if c.data_boundary.enabled:
            for v in self._boundary_violations(verdict.plan, infos):
                if c.data_boundary.action == "require_approval":
                    holdable.append((v, "constraints.data_boundary.action"))
                else:
                    hard.append(v)
        if hard:
            return PlanValidation("blocked", [*verdict.violations, *hard], None, hard[0].message)
        if not holdable:
            return verdict
        violations = [v for v, _ in holdable]
        digest = plan_digest(verdict.plan, infos)
        if digest in self.approved_digests:
            # An approver saw exactly this plan: it runs, and the record says why it was allowed.
            return PlanValidation(
                "repaired" if verdict.action == "repaired" else "accepted",
                [
                    *verdict.violations,
                    *(Violation("approved", f"approved: {v.message}", v.step) for v in violations),
                ],
                verdict.plan,
                None,
            )
        approval = c.approval
        return PlanValidation(
            "held",
            [*verdict.violations, *violations],
            verdict.plan,
            violations[0].message,
            hold={
                "digest": digest,
                "fields": sorted({f for _, f in holdable}),
                "timeout_s": approval.timeout_s,
                "api_wait_s": approval.api_wait_s or 0,
                "forecast": (
                    {
                        "cost_usd": str(forecast.cost_usd),
                        "tokens": forecast.total_tokens,
                        "unpriced": list(forecast.unpriced),
                    }
                    if forecast is not None
                    else None
                ),
            },
        )

    def _boundary_violations(self, plan: Plan, infos: Sequence[WorkerInfo]) -> list[Violation]:
        """Steps that would carry labelled request data to a worker outside the boundary."""
        b = self.spec.constraints.data_boundary
        with self._lock:
            labels = sorted(self._labels & set(b.labels))
        if not labels:
            return []
        out: list[Violation] = []
        for step in plan.steps:
            if step.is_self or not (0 <= step.worker < len(infos)):
                continue
            info = infos[step.worker]
            if info.key in b.inside_workers or set(info.tags) & set(b.inside_tags):
                continue
            out.append(
                Violation(
                    "data_boundary",
                    f"constraints.data_boundary: step {step.index} would send data labelled "
                    f"{', '.join(labels)} to worker {info.key!r}, outside the team's data boundary",
                    step.index,
                )
            )
        return out

    def before_step(
        self, ctx: RunContext, step: PlanStep, worker_info: WorkerInfo, totals: Totals
    ) -> StepGate:
        return step_gate(
            step,
            worker_info,
            totals,
            self.spec.constraints,
            confidential=self._confidential,
            started_monotonic=ctx.started_monotonic,
            budgets=self.budget_rooms,
        )

    def check_step_output(self, ctx: RunContext, step: PlanStep, text: str) -> GuardrailOutcome:
        outcome = self._stage("step_output", text)
        # A stage with nothing enabled reports one not_run entry; for steps the engine wants
        # no checks at all then (it only emits step_output events when a check ran).
        if len(outcome.checks) == 1 and outcome.checks[0].name == "guardrails":
            outcome.checks = []
        return outcome

    def check_output(self, ctx: RunContext, answer: str) -> GuardrailOutcome:
        return self._stage("output", answer)

    def answer_gate(self, ctx: RunContext) -> AnswerGate | None:
        """The gate the answer streams through (issue 45): the answer step's step_output checks,
        then the output checks, run incrementally; None when neither stage checks anything."""
        g = self.spec.guardrails
        reason = policy_buffered_reason(g)
        if reason is not None:
            return buffered(reason)
        return answer_gate(g.output, g.step_output, on_check_error=g.on_check_error)

    # ------------------------------------------------------------------ OutboundPolicy

    def check_outbound(self, fields: Sequence[OutboundField]) -> OutboundVerdict:
        return self.outbound.check_outbound(fields)


def hooks_for_test_box(effective: EffectivePolicy) -> PolicyHooks:
    """Hooks for the policy editor's test box: no team budget, no pool (judges do not run)."""
    return PolicyHooks(effective=effective, team=None, run_id="test-box", budget_rooms=[], budget_warnings=[])


FORECAST_HISTORY_STEPS = 50


def worker_output_history(keys: Sequence[str]) -> dict[str, float]:
    """Mean output tokens of each worker's last succeeded steps (any team: a number about the
    worker, no content), for the plan forecast. Workers without history are absent."""
    history = ports.run_history()  # runs sit above policies: their steps are read through the port
    out: dict[str, float] = {}
    for key in dict.fromkeys(keys):
        recent = list(history.recent_output_tokens(key, FORECAST_HISTORY_STEPS))
        if recent:
            out[key] = sum(recent) / len(recent)
    return out


def plan_digest(plan: Plan, infos: Sequence[WorkerInfo]) -> str:
    """What an approver approves: the steps' workers, subtasks and access lists (sha256)."""
    import hashlib
    import json

    def key(worker: int) -> str:
        return infos[worker].key if 0 <= worker < len(infos) else str(worker)

    body = [
        [s.index, key(s.worker), s.instruction, s.access if s.access == "all" else list(s.access)]
        for s in plan.steps
    ]
    return hashlib.sha256(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
