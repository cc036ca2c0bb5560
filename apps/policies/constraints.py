"""Workflow constraints: plan-time validation/repair and the run-time step gate (pure Python).

Plan time (`check_plan`): every violation of the original plan is reported precisely
(code, message, step). If any violated constraint says ``block`` the plan is blocked; otherwise
every violation is repaired, in this order:

1. ``too_deep``                   drop the re-planning step (the conductor naming itself);
2. ``worker_denied`` / ``worker_not_allowed`` / ``worker_tag_not_allowed`` /
   ``confidential_requires_local``  substitute an allowed worker (local for confidential
                                  requests): most shared tags first, then the closest cost rank;
3. ``too_many_steps``             keep the first N-1 steps and the final step (the answer), which
                                  keeps its access or reads everything kept when it read a dropped step;
4. ``verification_required``      append a step on a verifier worker reading all steps (after
                                  truncating one more step if the limit is reached);
5. ``too_parallel``               nothing to change in the plan: the engine runs at most N steps
                                  at once (`Limits.max_parallel`); recorded as repaired.

The repaired plan is re-checked; if a violation remains the plan is blocked instead.

Run time (`step_gate`): before each step (and before a fallback attempt) the worker rules are
re-checked and the per-run caps and the team budget are compared with what the run has used so
far plus what this step may add; a step that would cross a cap is not started and names it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from apps.engine.hooks import PlanValidation, StepGate, Violation
from apps.engine.plan import CONDUCTOR_SELF, Access, Plan, PlanStep
from apps.engine.types import Totals, WorkerInfo
from apps.policies.guardrails import regex as safe_regex
from apps.policies.spec import Constraints

VERIFY_INSTRUCTION = (
    "Verify the previous steps' answer to the question: check every fact, number and step of reasoning, "
    "correct any error, and give the final answer."
)


def _rx_search(pattern: str, text: str) -> bool:
    # Policy patterns run on RE2 (linear time, fails closed); see apps.policies.guardrails.regex.
    return safe_regex.search(pattern, text)


def is_confidential(question: str, constraints: Constraints, *, marked: str = "") -> tuple[bool, str]:
    """(confidential?, why). Only meaningful when the confidential rule is enabled."""
    rule = constraints.confidential
    if not rule.enabled:
        return False, ""
    if marked.strip().lower() == "confidential":
        return True, "marked confidential"
    if rule.detect:
        for pattern in rule.detect_patterns:
            if _rx_search(pattern, question):
                return True, "detected by a confidentiality pattern"
    return False, ""


def verification_rules_matching(question: str, constraints: Constraints) -> list[str]:
    return [r.name for r in constraints.verification.rules if _rx_search(r.pattern, question)]


# ------------------------------------------------------------------------------ worker rules


def worker_problem(
    info: WorkerInfo, constraints: Constraints, *, confidential: bool
) -> tuple[str, str] | None:
    """(code, plain reason) when `info` may not run a step under these constraints."""
    rule = constraints.workers
    if info.key in rule.denied_workers:
        return "worker_denied", f"worker {info.key!r} is denied by the policy"
    if rule.allowed_workers is not None and info.key not in rule.allowed_workers:
        return "worker_not_allowed", f"worker {info.key!r} is not in the policy's allowed workers"
    if rule.allowed_tags is not None and not set(info.tags) & set(rule.allowed_tags):
        return (
            "worker_tag_not_allowed",
            f"worker {info.key!r} has none of the allowed tags ({', '.join(rule.allowed_tags) or 'none'})",
        )
    if confidential and constraints.confidential.local_tag not in info.tags:
        return (
            "confidential_requires_local",
            f"the request is confidential and worker {info.key!r} is not tagged {constraints.confidential.local_tag!r}",
        )
    return None


def _is_verifier(info: WorkerInfo, constraints: Constraints) -> bool:
    v = constraints.verification
    return info.key in v.verifier_workers or bool(set(info.tags) & set(v.verifier_tags))


def _substitute(original: WorkerInfo, infos: Sequence[WorkerInfo], ok: list[int]) -> int | None:
    if not ok:
        return None
    tags = set(original.tags)
    return min(
        ok, key=lambda i: (-len(tags & set(infos[i].tags)), abs(infos[i].cost_rank - original.cost_rank), i)
    )


# ------------------------------------------------------------------------------ plan shape


def plan_width(plan: Plan) -> int:
    """Most steps of the plan that can run at the same time (steps per dependency level)."""
    level: dict[int, int] = {}
    for s in plan.steps:
        deps = [level[r] for r in s.reads() if r in level]
        level[s.index] = 1 + max(deps, default=0)
    counts: dict[int, int] = {}
    for s in plan.steps:
        if not s.is_self:
            counts[level[s.index]] = counts.get(level[s.index], 0) + 1
    return max(counts.values(), default=0)


def _truncate(plan: Plan, n: int) -> Plan:
    """Keep the first n-1 steps and the final step (re-indexed as the n-th)."""
    if len(plan) <= n:
        return plan
    steps = list(plan.steps)
    offset = plan.first_index
    kept = steps[: n - 1]
    last = steps[-1]
    new_index = offset + n - 1
    kept_ids = {s.index for s in kept}
    access: Access
    if last.access == "all":
        access = "all"
    else:
        refs = [r for r in last.access if r < offset or r in kept_ids]
        access = "all" if len(refs) != len(last.access) else tuple(refs)
    kept.append(PlanStep(new_index, last.worker, last.instruction, access, tools=last.tools))
    return Plan(tuple(kept))


@dataclass(slots=True)
class PlanFacts:
    """What plan validation needs to know about the run besides the plan."""

    question: str
    confidential: bool = False
    round: int = 1  # 1-based planning round (recursion depth)


def find_violations(
    plan: Plan, infos: Sequence[WorkerInfo], c: Constraints, facts: PlanFacts
) -> list[tuple[Violation, str]]:
    """Every violation with the action of the constraint it breaks."""
    out: list[tuple[Violation, str]] = []
    if plan.recurses and c.max_depth.value is not None and facts.round >= c.max_depth.value:
        out.append(
            (
                Violation(
                    "too_deep",
                    f"step {plan.last.index} asks the conductor to plan again, but the policy allows at most "
                    f"{c.max_depth.value} planning round(s)",
                    plan.last.index,
                ),
                c.max_depth.action,
            )
        )
    for s in plan.steps:
        if s.is_self:
            continue
        if not 0 <= s.worker < len(infos):
            out.append(
                (
                    Violation(
                        "unknown_worker", f"step {s.index}: worker id {s.worker} is not in the pool", s.index
                    ),
                    "block",
                )
            )
            continue
        problem = worker_problem(infos[s.worker], c, confidential=facts.confidential)
        if problem:
            code, reason = problem
            action = c.confidential.action if code == "confidential_requires_local" else c.workers.action
            out.append((Violation(code, f"step {s.index}: {reason}", s.index), action))
    if c.max_steps.value is not None and len(plan) > c.max_steps.value:
        out.append(
            (
                Violation(
                    "too_many_steps",
                    f"the plan has {len(plan)} steps; the policy allows at most {c.max_steps.value}",
                ),
                c.max_steps.action,
            )
        )
    rules = verification_rules_matching(facts.question, c)
    if rules and not plan.recurses:
        last = plan.last
        if last.is_self or not (0 <= last.worker < len(infos) and _is_verifier(infos[last.worker], c)):
            out.append(
                (
                    Violation(
                        "verification_required",
                        f"the request matches the verification rule {', '.join(repr(r) for r in rules)}: "
                        f"the plan must end with a step on a verifier worker",
                        last.index,
                    ),
                    c.verification.action,
                )
            )
    if c.max_parallel.value is not None:
        width = plan_width(plan)
        if width > c.max_parallel.value:
            out.append(
                (
                    Violation(
                        "too_parallel",
                        f"{width} steps could run at the same time; the policy allows {c.max_parallel.value} "
                        "(repair: they run at most that many at a time)",
                    ),
                    c.max_parallel.action,
                )
            )
    return out


def _repair(
    plan: Plan, infos: Sequence[WorkerInfo], c: Constraints, facts: PlanFacts, codes: set[str]
) -> tuple[Plan | None, str | None]:
    steps = list(plan.steps)
    if "too_deep" in codes and steps and steps[-1].is_self:
        if len(steps) == 1:
            return None, "the plan only re-plans, and re-planning is not allowed at this depth"
        steps = steps[:-1]
    ok = [
        i for i, info in enumerate(infos) if worker_problem(info, c, confidential=facts.confidential) is None
    ]
    for k, s in enumerate(steps):
        if s.is_self or not 0 <= s.worker < len(infos):
            continue
        if worker_problem(infos[s.worker], c, confidential=facts.confidential) is not None:
            sub = _substitute(infos[s.worker], infos, ok)
            if sub is None:
                need = " local" if facts.confidential else ""
                return (
                    None,
                    f"no{need} worker of the pool is allowed by the policy to replace {infos[s.worker].key!r}",
                )
            steps[k] = replace(s, worker=sub)
    repaired = Plan(tuple(steps))
    if c.max_steps.value is not None:
        repaired = _truncate(repaired, c.max_steps.value)
    if "verification_required" in codes:
        verifiers = [i for i in ok if _is_verifier(infos[i], c)]
        if not verifiers:
            return None, "the request needs a verification step but no allowed verifier worker is in the pool"
        if c.max_steps.value is not None and len(repaired) >= c.max_steps.value:
            if c.max_steps.value < 2:
                return None, "the step limit leaves no room for the required verification step"
            repaired = _truncate(repaired, c.max_steps.value - 1)
        last = repaired.last
        repaired = Plan((*repaired.steps, PlanStep(last.index + 1, verifiers[0], VERIFY_INSTRUCTION, "all")))
    return repaired, None


def check_plan(plan: Plan, infos: Sequence[WorkerInfo], c: Constraints, facts: PlanFacts) -> PlanValidation:
    """Validate `plan` against the constraints; repair or block per constraint (see module doc)."""
    found = find_violations(plan, infos, c, facts)
    if not found:
        return PlanValidation("accepted", [], plan)
    violations = [v for v, _ in found]
    blocking = [v for v, action in found if action == "block"]
    if blocking:
        return PlanValidation("blocked", violations, None, blocking[0].message)
    repaired, why = _repair(plan, infos, c, facts, {v.code for v in violations})
    if repaired is None:
        return PlanValidation("blocked", violations, None, f"the plan could not be repaired: {why}")
    remaining = [v for v, _ in find_violations(repaired, infos, c, facts) if v.code != "too_parallel"]
    if remaining:
        return PlanValidation(
            "blocked", violations, None, f"the plan could not be repaired: {remaining[0].message}"
        )
    return PlanValidation("repaired", violations, repaired)


# ------------------------------------------------------------------------------ run time


@dataclass(frozen=True, slots=True)
class BudgetRoom:
    """Spend left in a team budget when the run started (hard limit minus spend so far)."""

    name: str  # "daily" | "monthly"
    limit: Decimal
    remaining: Decimal


def _step_cost_bound(info: WorkerInfo) -> Decimal:
    # What this step may add at most on the output side (input is unknown before the call).
    if info.output_price_per_mtok is None:
        return Decimal(0)
    return Decimal(info.max_output_tokens) * info.output_price_per_mtok / Decimal(1_000_000)


def step_gate(
    step: PlanStep,
    info: WorkerInfo,
    totals: Totals,
    c: Constraints,
    *,
    confidential: bool,
    started_monotonic: float,
    budgets: Sequence[BudgetRoom] = (),
    now_monotonic: float | None = None,
) -> StepGate:
    """Allow the step, or block it naming the cap it would cross."""
    if step.worker != CONDUCTOR_SELF:
        problem = worker_problem(info, c, confidential=confidential)
        if problem:
            code, reason = problem
            return StepGate.block(reason, code)
    caps = c.caps
    if caps.max_wall_clock_s is not None and started_monotonic:
        elapsed = (now_monotonic if now_monotonic is not None else time.monotonic()) - started_monotonic
        if elapsed >= caps.max_wall_clock_s:
            return StepGate.block(
                f"the run's wall-clock cap ({caps.max_wall_clock_s:g} s) is reached ({elapsed:.1f} s elapsed)",
                "max_wall_clock_s",
            )
    if caps.max_total_tokens is not None:
        would = totals.total_tokens + info.max_output_tokens
        if would > caps.max_total_tokens:
            return StepGate.block(
                f"the run's token cap ({caps.max_total_tokens}) would be exceeded: {totals.total_tokens} used, "
                f"this step may add up to {info.max_output_tokens} output tokens",
                "max_total_tokens",
            )
    bound = _step_cost_bound(info)
    if caps.max_cost_usd is not None and (
        totals.cost_usd >= caps.max_cost_usd or totals.cost_usd + bound > caps.max_cost_usd
    ):
        return StepGate.block(
            f"the run's cost cap (${caps.max_cost_usd}) would be exceeded: ${totals.cost_usd:.6f} used, "
            f"this step may add up to ${bound:.6f}",
            "max_cost_usd",
        )
    for room in budgets:
        if totals.cost_usd >= room.remaining or totals.cost_usd + bound > room.remaining:
            return StepGate.block(
                f"the team's {room.name} budget (${room.limit}) would be exceeded by this step",
                f"budget_{room.name}",
            )
    return StepGate.allow()
