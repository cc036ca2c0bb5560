"""The effective policy (the merged spec in force for a team) and the fields it leaves inert."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from apps.engine.types import Limits
from apps.policies.spec.fields import _join
from apps.policies.spec.policy import PolicySpec

# ------------------------------------------------------------------------------------ effective


PLAN_ENVELOPE_STEPS = 8  # the engine's parse bound when the policy limits steps (see engine_limits)


@dataclass(frozen=True)
class EffectivePolicy:
    """The merged spec in force for a team, and the version it came from.

    `version` is the team's current `PolicyVersion` when the team has one, else the platform
    default's current version, else None (built-in defaults). `platform_version` is recorded
    too because the team's rules are overlaid on it."""

    spec: PolicySpec
    version: Any = None
    platform_version: Any = None
    team_id: int | None = None

    @property
    def version_id(self) -> int | None:
        return getattr(self.version, "pk", None)

    def engine_limits(self) -> Any:
        """`apps.engine.types.Limits` narrowed by the policy.

        The conductor is told the policy's step limit (``max_steps``), while the parser accepts
        plans up to PLAN_ENVELOPE_STEPS (``accept_steps``) so an over-long conductor plan reaches
        `validate_plan`, where the policy repairs or blocks it with a precise violation; presets
        may narrow ``max_steps`` further. Depth, parallelism and the time caps are enforced by
        the engine directly."""
        base = Limits()
        c = self.spec.constraints
        kwargs: dict[str, Any] = {}
        if c.max_steps.value is not None:
            kwargs["max_steps"] = min(base.max_steps, c.max_steps.value)
            kwargs["accept_steps"] = max(c.max_steps.value, PLAN_ENVELOPE_STEPS)
        if c.max_depth.value is not None:
            kwargs["max_depth"] = min(base.max_depth, c.max_depth.value)
        if c.max_parallel.value is not None:
            kwargs["max_parallel"] = min(base.max_parallel, c.max_parallel.value)
        if c.caps.step_timeout_s is not None:
            kwargs["step_timeout_s"] = min(base.step_timeout_s, c.caps.step_timeout_s)
        if c.caps.max_wall_clock_s is not None:
            kwargs["run_timeout_s"] = min(base.run_timeout_s, c.caps.max_wall_clock_s)
        kwargs["partial_answers"] = c.partial_answers == "allow"
        return dataclasses.replace(base, **kwargs)


def inert_fields(spec: PolicySpec) -> list[dict[str, str]]:
    """Configured but without effect (issue 42): a field set away from its default inside a
    section that is switched off (``enabled: false``), e.g. ``constraints.forecast.max_tokens``
    with the forecast disabled. ``[{path, why}]``, for the editor's review and Summary."""
    found: list[dict[str, str]] = []

    def visit(obj: Any, path: str) -> None:
        if not isinstance(obj, BaseModel):
            return
        fields = type(obj).model_fields
        if "enabled" in fields and obj.enabled is False:  # type: ignore[attr-defined]
            try:
                default = type(obj)()
            except ValidationError:
                return  # a section without defaults: nothing to compare with
            for name in fields:
                if name != "enabled" and getattr(obj, name) != getattr(default, name):
                    found.append(
                        {
                            "path": f"{path}.{name}",
                            "why": f"{path}.enabled is off, so {path}.{name} has no effect until it is turned on",
                        }
                    )
            return
        for name in fields:
            visit(getattr(obj, name), _join(path, name) if path else name)

    visit(spec, "")
    return found
