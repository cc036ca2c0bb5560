"""The Django side of ``apps.engine.tools_loop``: the tools a plan step may see and the runner
its tool calls go through (``tool_call`` with the step's grant: policy, approvals, output gate
and audit as everywhere)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from apps.engine.tools_loop import ToolRun, ToolSpec
from apps.policies.services import effective_policy
from apps.policies.spec import EffectivePolicy
from apps.tools import selectors
from apps.tools.calls import tool_call


def tools_for_step(
    team: Any, granted: Sequence[str], effective: EffectivePolicy | None = None
) -> list[ToolSpec]:
    """What the step's worker is offered: granted by the plan, allowed by the policy, accepted and
    current. The description is the accepted version's, never what the server says now."""
    policy = (effective or effective_policy(team)).spec.tools
    blocked = {r.tool for r in policy.rules if r.action == "block"}
    out: list[ToolSpec] = []
    for name in dict.fromkeys(granted):
        if name in policy.denied_tools or name in blocked or policy.default_action == "block":
            continue
        if policy.allowed_tools is not None and name not in policy.allowed_tools:
            continue
        tool = selectors.tool_by_name(team, name)
        version = selectors.usable_version(tool) if tool is not None else None
        if version is not None:
            out.append(
                ToolSpec(name=name, description=version.description, input_schema=version.input_schema)
            )
    return out


def step_tool_runner(
    *,
    team: Any,
    granted: Sequence[str],
    run_id: UUID | None = None,
    step_index: int | None = None,
    actor: Any = None,
    effective: EffectivePolicy | None = None,
) -> Callable[[str, dict[str, Any]], ToolRun]:
    grant = tuple(granted)

    def run(qualified: str, arguments: dict[str, Any]) -> ToolRun:
        outcome = tool_call(
            team=team,
            qualified=qualified,
            arguments=arguments,
            actor=actor,
            run_id=run_id,
            step_index=step_index,
            granted=grant,
            effective=effective,
        )
        text = outcome.for_model()
        if not outcome.ok:
            text = f"[tool call {outcome.status} ({outcome.rule}): {outcome.message}]"
        return ToolRun(status=outcome.status, text=text, rule=outcome.rule)

    return run
