"""The editor's "test this policy" box: guardrails and plan validation on a sample, no model call.

Pure Python over a spec and worker infos; model-judged checks report `not_run` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from apps.engine.hooks import GuardrailOutcome, PlanValidation, RunContext
from apps.engine.plan import PlanError, parse_plan, plan_to_dict
from apps.engine.types import WorkerInfo
from apps.policies.constraints import PlanFacts, check_plan
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


def dry_run(
    effective: EffectivePolicy,
    *,
    prompt: str,
    plan_text: str = "",
    infos: Sequence[WorkerInfo] = (),
    classification: str = "",
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
    return out
