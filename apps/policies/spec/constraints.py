"""The spec's workflow sections: constraints (steps, depth, parallelism, workers, confidential
data, caps, forecast, data boundary, approval, verification), budgets and the learned router."""

from __future__ import annotations

from decimal import Decimal

from apps.policies.spec.fields import (
    BoundaryLabel,
    ConstraintAction,
    HoldAction,
    PartialAnswers,
    Problems,
    _f,
    _Spec,
)

# ------------------------------------------------------------------------------------ constraints


class StepsLimit(_Spec):
    value: int | None = _f(
        5,
        "Most steps a conductor plan may have (per planning round). Empty: no policy limit.",
        "min",
        minimum=1,
        maximum=50,
    )
    action: ConstraintAction = _f(
        "repair", "repair: keep the first steps and the final one; block: the run ends blocked.", "stricter"
    )


class DepthLimit(_Spec):
    value: int | None = _f(
        2,
        "Most planning rounds (1 = the conductor may not re-plan itself). Empty: no policy limit.",
        "min",
        minimum=1,
        maximum=10,
    )
    action: ConstraintAction = _f(
        "repair", "repair: drop the re-planning step; block: the run ends blocked.", "stricter"
    )


class ParallelLimit(_Spec):
    value: int | None = _f(
        4, "Most steps running at the same time. Empty: no policy limit.", "min", minimum=1, maximum=64
    )
    action: ConstraintAction = _f(
        "repair",
        "repair: run the plan but at most this many steps at once; block: reject wider plans.",
        "stricter",
    )


class WorkerRule(_Spec):
    allowed_workers: tuple[str, ...] | None = _f(
        None, "Worker keys (slugs) steps may use. Empty: any worker of the pool.", "intersection"
    )
    allowed_tags: tuple[str, ...] | None = _f(
        None,
        "Steps may only use workers carrying at least one of these tags. Empty: any tag.",
        "intersection",
    )
    denied_workers: tuple[str, ...] = _f((), "Worker keys no step may ever use.", "union")
    action: ConstraintAction = _f(
        "repair", "repair: substitute an allowed worker; block: the run ends blocked.", "stricter"
    )

    def _problems(self) -> Problems:
        problems: Problems = []
        both = sorted(set(self.allowed_workers or ()) & set(self.denied_workers))
        if both:
            problems.append(("denied_workers", f"{', '.join(both)} is both allowed and denied"))
        return problems


class ConfidentialRule(_Spec):
    enabled: bool = _f(
        False, "Confidential requests may only run on workers tagged with the local tag.", "or"
    )
    detect: bool = _f(
        False,
        "Also treat a request as confidential when it matches a detection pattern (not only when marked).",
        "or",
    )
    detect_patterns: tuple[str, ...] = _f(
        (r"\bconfidential\b", r"\binternal only\b", r"\bstrictly private\b"),
        "Regular expressions (case-insensitive) that mark a request as confidential.",
        "union",
        regex=True,
    )
    local_tag: str = _f("local", "The worker tag that means 'runs on our own hardware'.", "platform")
    action: ConstraintAction = _f(
        "repair", "repair: move the step to a local worker; block: the run ends blocked.", "stricter"
    )


class Caps(_Spec):
    max_total_tokens: int | None = _f(
        None,
        "Per run: most input+output tokens. A step is not started if its worker's max output would cross it.",
        "min",
        minimum=1,
    )
    max_cost_usd: Decimal | None = _f(
        None,
        "Per run: most spend in USD. A step is not started once the run's priced cost reaches it.",
        "min",
        minimum=0,
    )
    max_wall_clock_s: float | None = _f(None, "Per run: most seconds from start to answer.", "min", minimum=1)
    step_timeout_s: float | None = _f(
        None, "Per step: most seconds one worker call may take.", "min", minimum=1
    )


class ForecastRule(_Spec):
    enabled: bool = _f(
        False,
        "Forecast each plan's tokens and cost before any worker is called (prices from genai-prices or the "
        "worker's configured prices; output lengths from the worker's recent steps) and refuse plans "
        "forecast to cross a limit below, the per-run caps or the team's remaining budget.",
        "or",
    )
    max_cost_usd: Decimal | None = _f(
        None,
        "Most forecast spend (USD) of one plan. Empty: only the caps and budgets apply.",
        "min",
        minimum=0,
    )
    max_tokens: int | None = _f(
        None, "Most forecast input+output tokens of one plan. Empty: only the caps apply.", "min", minimum=1
    )
    action: HoldAction = _f(
        "block",
        "block: a plan over a limit ends the run blocked; require_approval: the plan waits for an "
        "approver (see constraints.approval) before any worker is called.",
        "stricter",
    )


class DataBoundary(_Spec):
    enabled: bool = _f(
        False,
        "Check where labelled data goes: a plan that sends a request an input guardrail labelled "
        "(and did not mask) to a worker outside the boundary is held or blocked.",
        "or",
    )
    labels: tuple[BoundaryLabel, ...] = _f(
        ("pii", "secrets"),
        "Which input guardrail findings bind the boundary (the pii / secrets checks must be on "
        "and not redact, or nothing stays labelled).",
        "union",
    )
    inside_tags: tuple[str, ...] = _f(
        ("local",),
        "Workers carrying any of these tags are inside the team's data boundary (both sides must agree).",
        "intersection",
    )
    inside_workers: tuple[str, ...] = _f(
        (), "Worker keys inside the boundary besides the tagged ones (both sides must agree).", "intersection"
    )
    action: HoldAction = _f(
        "require_approval",
        "require_approval: the plan waits for an approver; block: the run ends blocked.",
        "stricter",
    )


class ApprovalRule(_Spec):
    timeout_s: float | None = _f(
        3600,
        "How long a held plan waits for an approver before the run ends blocked. Empty: until decided.",
        "min",
        minimum=1,
    )
    api_wait_s: float | None = _f(
        None,
        "How long a /v1 caller waits for the decision before it gets an approval_required error "
        "(the run still resumes on approval). Empty or 0: answer at once.",
        "min",
        minimum=0,
        maximum=600,
    )


class VerificationRuleSpec(_Spec):
    name: str = _f(
        "", "A short name shown in violations, e.g. 'numbers need a check'.", "union", required=True
    )
    pattern: str = _f(
        "",
        "Regular expression (case-insensitive); a matching request must end with a verifier step.",
        "union",
        regex=True,
        required=True,
    )


class Verification(_Spec):
    rules: tuple[VerificationRuleSpec, ...] = _f(
        (), "Requests matching any rule must end with a step on a verifier worker.", "union"
    )
    verifier_workers: tuple[str, ...] = _f(
        (),
        "Worker keys that count as verifiers (with rules on both sides: only keys both accept).",
        "intersection",
        binds_with="rules",
    )
    verifier_tags: tuple[str, ...] = _f(
        ("verifier",),
        "Workers with any of these tags count as verifiers (with rules on both sides: only tags both accept).",
        "intersection",
        binds_with="rules",
    )
    action: ConstraintAction = _f(
        "repair",
        "repair: append a verification step on a verifier worker; block: the run ends blocked.",
        "stricter",
    )


class Constraints(_Spec):
    max_steps: StepsLimit = _f(StepsLimit, "Plan size limit.", "nested")
    max_depth: DepthLimit = _f(DepthLimit, "Recursion (re-planning) limit.", "nested")
    max_parallel: ParallelLimit = _f(ParallelLimit, "Concurrency limit.", "nested")
    workers: WorkerRule = _f(WorkerRule, "Which workers steps may use.", "nested")
    confidential: ConfidentialRule = _f(
        ConfidentialRule, "Confidential data stays on local workers.", "nested"
    )
    caps: Caps = _f(Caps, "Per-run caps, checked before every step.", "nested")
    forecast: ForecastRule = _f(ForecastRule, "Plan checks: forecast before execution.", "nested")
    data_boundary: DataBoundary = _f(
        DataBoundary, "Plan checks: labelled data stays inside the team's data boundary.", "nested"
    )
    approval: ApprovalRule = _f(ApprovalRule, "Plans held for an approver.", "nested")
    verification: Verification = _f(Verification, "Required verification steps.", "nested")
    partial_answers: PartialAnswers = _f(
        "allow",
        "allow: a run whose plan cannot finish (a step failed after its retries and fallback) but "
        "that holds the answer of an earlier completed round returns it, marked incomplete on every "
        "surface and checked by the output guardrails like any answer; deny: such a run ends failed.",
        "stricter",
    )


# ------------------------------------------------------------------------------------ budgets


class BudgetLimit(_Spec):
    soft_usd: Decimal | None = _f(
        None, "Spend (USD) after which runs are flagged with a warning.", "min", minimum=0
    )
    hard_usd: Decimal | None = _f(
        None, "Spend (USD) after which new runs are refused until the reset.", "min", minimum=0
    )

    def _problems(self) -> Problems:
        if self.soft_usd is not None and self.hard_usd is not None and self.soft_usd > self.hard_usd:
            return [
                ("soft_usd", f"the soft limit ({self.soft_usd}) is above the hard limit ({self.hard_usd})")
            ]
        return []


class Budgets(_Spec):
    daily: BudgetLimit = _f(BudgetLimit, "Per UTC day; resets at 00:00 UTC.", "nested")
    monthly: BudgetLimit = _f(
        BudgetLimit, "Per UTC calendar month; resets at 00:00 UTC on the 1st.", "nested"
    )


# ------------------------------------------------------------------------------------ learning


class Learning(_Spec):
    """The learned router (strategy ``learned``): a per-team contextual bandit over strategies."""

    enabled: bool = _f(
        False,
        "The learned router learns from feedback and explores. Off: runs with strategy 'learned' are "
        "still routed, greedily, by the router as it stands (it never explores or learns).",
        "or",
    )
    metric: str = _f(
        "",
        "The feedback metric the router learns from. Empty: 'helpful' (the thumbs control). The "
        "platform's choice wins when it names one, so every team is scored the same way.",
        "platform",
    )
    max_exploration: float = _f(
        0.1,
        "Largest share (0-1) of the team's routed runs that may try an arm other than the best "
        "known one; at the share, the router only exploits.",
        "min",
        minimum=0,
        maximum=1,
    )
    cost_weight: float | None = _f(
        None,
        "Reward = metric - cost_weight x normalised cost - latency_weight x normalised latency (the "
        "paper's limited-budget dial). The trade-off is the organisation's: the platform's weight "
        "wins when it sets one, otherwise the team's. Empty: 0 (cost does not count).",
        "platform",
        minimum=0,
        maximum=10,
    )
    latency_weight: float | None = _f(
        None,
        "Weight of the normalised latency in the reward (see cost_weight); platform's value wins "
        "when set. Empty: 0.",
        "platform",
        minimum=0,
        maximum=10,
    )
