"""The editor's "test this policy" box and policy replay (what-if over past runs). No model call.

Pure Python over a spec, worker infos and recorded runs; model-judged checks report `not_run`.
Replay runs the same hooks as a live run (`hooks_for_test_box`: input guardrails with the
confidential rule, `check_plan` on each recorded plan, step-output and output guardrails) over
what a run stored, under the policy in force and under the draft, and reports the difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apps.engine.hooks import GuardrailOutcome, PlanValidation, RunContext, Violation
from apps.engine.plan import CONDUCTOR_SELF, PlanError, parse_plan, plan_from_dict, plan_to_dict
from apps.engine.types import WorkerInfo
from apps.policies.constraints import PlanFacts, check_plan
from apps.policies.forecast import PlanForecast, forecast_plan, forecast_violations
from apps.policies.guardrails import StageEnv, run_stage
from apps.policies.hooks import hooks_for_test_box
from apps.policies.spec import PLAN_ENVELOPE_STEPS, EffectivePolicy


@dataclass(slots=True)
class DryRunResult:
    stages: list[tuple[str, GuardrailOutcome]] = field(default_factory=list)
    confidential: bool = False
    plan_error: str | None = None
    validation: PlanValidation | None = None
    original_plan: dict[str, Any] | None = None
    final_plan: dict[str, Any] | None = None
    note: str | None = None
    forecast: PlanForecast | None = None
    forecast_violations: list[Violation] = field(default_factory=list)  # only when plan checks are on


def dry_run(
    effective: EffectivePolicy,
    *,
    prompt: str,
    plan_text: str = "",
    infos: Sequence[WorkerInfo] = (),
    classification: str = "",
    history: Mapping[str, float] | None = None,
) -> DryRunResult:
    out = DryRunResult()
    hooks = hooks_for_test_box(effective)
    hooks.classification = classification
    ctx = RunContext(
        run_id="test-box", question=prompt, strategy="conductor", metadata={"classification": classification}
    )
    checked = hooks.check_input(ctx, prompt)
    out.stages.append(("input", checked))
    out.confidential = hooks.confidential
    g = effective.spec.guardrails
    env = StageEnv(resolve_worker=None, run_judges=False)
    # What the sample would meet later: as a worker's output, and as the final answer.
    out.stages.append(
        (
            "step_output",
            run_stage("step_output", g.step_output, checked.text, on_check_error=g.on_check_error, env=env),
        )
    )
    out.stages.append(
        ("output", run_stage("output", g.output, checked.text, on_check_error=g.on_check_error, env=env))
    )
    if plan_text.strip():
        if not infos:
            out.note = "Plan validation needs the workers of the team's default pool; this team has none."
            return out
        keys = [i.key for i in infos]
        try:
            plan = parse_plan(
                plan_text, pool_size=len(infos), max_steps=max(PLAN_ENVELOPE_STEPS, 20), allow_self=True
            )
        except PlanError as err:
            out.plan_error = err.message
            return out
        facts = PlanFacts(question=checked.text, confidential=hooks.confidential, round=1)
        out.validation = check_plan(plan, infos, effective.spec.constraints, facts)
        out.original_plan = plan_to_dict(plan, keys, conductor_key="conductor")
        if out.validation.plan is not None:
            out.final_plan = plan_to_dict(out.validation.plan, keys, conductor_key="conductor")
            out.forecast = forecast_plan(
                out.validation.plan, infos, question=checked.text, history=history or {}
            )
            if effective.spec.constraints.forecast.enabled:
                out.forecast_violations = forecast_violations(out.forecast, effective.spec.constraints)
    return out


# ------------------------------------------------------------------------------------ replay

# Effects a policy can have on a run, strongest first.
EFFECTS = ("blocked", "held", "redacted", "repaired", "warned")
_ACTION_EFFECT = {"block": "blocked", "require_review": "held", "redact": "redacted", "warn": "warned"}


@dataclass(frozen=True, slots=True)
class RecordedStep:
    index: int
    round: int
    worker_key: str
    output: str


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """What a run stored, as replay needs it (built by `selectors.recorded_runs`)."""

    run_id: str
    created_at: datetime
    status: str
    question: str
    answer: str
    classification: str = ""
    plans: tuple[tuple[int, dict[str, Any]], ...] = ()  # (round, plan as in plan.proposed)
    steps: tuple[RecordedStep, ...] = ()
    infos: tuple[WorkerInfo, ...] = ()  # the run's pool as it is now, in plan-id order
    erased_at: datetime | None = None
    content_visible: bool = True  # apps.runs.selectors.run_content_visible for the viewer


@dataclass(frozen=True, slots=True)
class Reason:
    effect: str
    rule: str  # "<stage>:<check>" or "plan:<violation code>"
    action: str
    detail: str  # labels only ("e-mail address"), never the matched text


@dataclass(slots=True)
class Replayed:
    effects: set[str] = field(default_factory=set)
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RunDelta:
    run: RecordedRun
    before: list[str]  # effects under the policy in force, strongest first
    after: list[str]  # effects under the draft
    reasons: list[Reason]  # the draft's reasons for the effects it adds
    snippet: str | None  # the request with both policies' findings masked; None when withheld
    notes: list[str]

    @property
    def added(self) -> list[str]:
        return [e for e in self.after if e not in self.before]

    @property
    def removed(self) -> list[str]:
        return [e for e in self.before if e not in self.after]


@dataclass(slots=True)
class ReplayReport:
    considered: int = 0
    replayed: int = 0
    unchanged: int = 0
    not_replayable: list[tuple[RecordedRun, str]] = field(default_factory=list)
    changed: list[RunDelta] = field(default_factory=list)
    newly: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EFFECTS, 0))
    no_longer: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EFFECTS, 0))
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[tuple[str, int, int]]:
        """(effect, runs newly having it, runs no longer having it), strongest effect first."""
        return [(e, self.newly[e], self.no_longer[e]) for e in EFFECTS]


def _ordered(effects: set[str]) -> list[str]:
    return [e for e in EFFECTS if e in effects]


def _take_stage(out: Replayed, stage: str, outcome: GuardrailOutcome) -> bool:
    """Record a stage's interventions; True when it blocked."""
    for c in outcome.checks:
        status = str(c.status)
        if status == "failed":
            out.reasons.append(Reason("blocked", f"{stage}:{c.name}", "block", c.detail))
        elif status == "intervened" and c.action in _ACTION_EFFECT:
            out.reasons.append(Reason(_ACTION_EFFECT[c.action], f"{stage}:{c.name}", c.action, c.detail))
    out.effects.update(r.effect for r in out.reasons)
    if outcome.blocked:
        out.effects.add("blocked")
    return outcome.blocked


def _plan_for(data: dict[str, Any], infos: Sequence[WorkerInfo]) -> Any:
    """The recorded plan with worker ids re-mapped by key onto the pool as it is now."""
    index = {info.key: i for i, info in enumerate(infos)}
    steps = []
    for s in data.get("steps") or []:
        key = s.get("worker_key")
        if s.get("worker") == CONDUCTOR_SELF:
            steps.append({**s, "worker": CONDUCTOR_SELF})
        elif key in index:
            steps.append({**s, "worker": index[key]})
        else:
            raise PlanError(f"worker {key!r} is no longer in the pool")
    return plan_from_dict({"steps": steps})


def replay_one(effective: EffectivePolicy, run: RecordedRun) -> Replayed:
    """What ``effective`` would have done to the stored run (in run order; stops where it blocks)."""
    out = Replayed()
    hooks = hooks_for_test_box(effective)
    hooks.classification = run.classification
    ctx = RunContext(run_id="replay", question=run.question, strategy="conductor")
    checked = hooks.check_input(ctx, run.question)
    if _take_stage(out, "input", checked):
        return out
    facts_q = checked.text
    for round_, data in run.plans:
        try:
            plan = _plan_for(data, run.infos)
        except PlanError as err:
            out.notes.append(f"plan of round {round_} not checked: {err.message}")
            continue
        facts = PlanFacts(question=facts_q, confidential=hooks.confidential, round=round_)
        verdict = check_plan(plan, run.infos, effective.spec.constraints, facts)
        if verdict.action == "accepted":
            continue
        effect = "blocked" if verdict.action == "blocked" else "repaired"
        for v in verdict.violations:
            out.reasons.append(Reason(effect, f"plan:{v.code}", verdict.action, v.message))
        out.effects.add(effect)
        if effect == "blocked":
            return out
    g = effective.spec.guardrails
    env = StageEnv(resolve_worker=None, run_judges=False)
    for step in run.steps:
        if not step.output:
            continue
        outcome = run_stage(
            "step_output", g.step_output, step.output, on_check_error=g.on_check_error, env=env
        )
        if _take_stage(out, f"step {step.index} output", outcome):
            return out
    if run.answer:
        _take_stage(
            out, "output", run_stage("output", g.output, run.answer, on_check_error=g.on_check_error, env=env)
        )
    return out


def replay_runs(
    *, current: EffectivePolicy, draft: EffectivePolicy, runs: Sequence[RecordedRun], examples: int = 20
) -> ReplayReport:
    """Replay ``runs`` under the policy in force and under the draft; report what would change."""
    report = ReplayReport(considered=len(runs))
    for stage in ("step_output", "output"):
        if getattr(draft.spec.guardrails, stage).model_judge.enabled:
            report.notes.append(f"Model-judged checks ({stage}) are not replayed: replay calls no model.")
    # Issue 42: say what the counts leave out, so "unchanged" is not read as "forecast-safe".
    forecasts = (current.spec.constraints.forecast, draft.spec.constraints.forecast)
    if any(f.enabled for f in forecasts) or forecasts[0] != forecasts[1]:
        report.notes.append(
            "Plan forecasts (constraints.forecast) are not replayed: replay re-checks recorded plans "
            "and text, it does not forecast tokens or cost again, so plans the forecast would block "
            "or hold for approval are not counted above."
        )
    for run in runs:
        if run.erased_at is not None:
            report.not_replayable.append(
                (run, f"retention erased its content on {run.erased_at:%Y-%m-%d}; only hashes remain")
            )
            continue
        if not run.question:
            report.not_replayable.append((run, "no request was stored"))
            continue
        report.replayed += 1
        before, after = replay_one(current, run), replay_one(draft, run)
        if before.effects == after.effects:
            report.unchanged += 1
            continue
        for e in after.effects - before.effects:
            report.newly[e] += 1
        for e in before.effects - after.effects:
            report.no_longer[e] += 1
        if len(report.changed) >= examples:
            continue
        added = after.effects - before.effects
        reasons = [r for r in after.reasons if r.effect in added] or after.reasons
        snippet = None
        if run.content_visible:
            masked = _masked(current, _masked(draft, run.question))
            snippet = masked[:200] + ("…" if len(masked) > 200 else "")
        report.changed.append(
            RunDelta(run, _ordered(before.effects), _ordered(after.effects), reasons, snippet, after.notes)
        )
    return report


def _masked(effective: EffectivePolicy, text: str) -> str:
    """``text`` with everything the policy's input checks find masked, whatever their action:
    an example shows where a rule fires, never the finding itself."""
    checks = effective.spec.guardrails.input
    masking = {
        name: getattr(checks, name).model_copy(update={"action": "redact"})
        for name in ("pii", "secrets", "injection", "blocked_terms")
        if getattr(checks, name).enabled
    }
    if not masking:
        return text
    stage = checks.model_copy(update=masking)
    return run_stage("input", stage, text, on_check_error="fail_open", env=StageEnv(run_judges=False)).text
