"""Fields a team configured that a stricter platform layer overrides (issue 42): flagged on the
policy desk before publish and in the Summary, naming the layer that wins."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from apps.policies.spec.fields import _join, _meta
from apps.policies.spec.help import MERGE_RULE_TEXT
from apps.policies.spec.overlay import _merge_value
from apps.policies.spec.policy import PolicySpec, spec_to_dict


def _value_text(value: Any) -> str:
    data = spec_to_dict(value)
    if data is None:
        return "no limit"
    if isinstance(data, bool):
        return "on" if data else "off"
    if isinstance(data, list | tuple):
        return ", ".join(str(v) if not isinstance(v, dict | list) else json.dumps(v) for v in data) or "none"
    return str(data)


def _default_of(section: Any) -> Any:
    try:
        return type(section)()
    except ValidationError:
        return None  # a section without defaults (a list item): every value counts as set


def shadowed_fields(
    platform: PolicySpec, team: PolicySpec, *, winner: str = "the platform default"
) -> list[dict[str, str]]:
    """Configured in the team's layer but overridden by the stricter platform layer (issue 42):
    a field the team sets away from its default whose merged value is not the team's, e.g. a
    team's ``max_steps.value: 8`` under a platform ``5``. (Stored specs are normalised, every
    field written out, so "configured" means "not the default".) Fields whose merge keeps both
    sides (``union``, ``all_of``) are never shadowed. ``[{path, team, effective, winner, why}]``
    in spec order; ``winner`` names the layer that wins."""
    found: list[dict[str, str]] = []

    def flag(path: str, rule: str, team_value: Any, merged: Any) -> None:
        team_text, merged_text = _value_text(team_value), _value_text(merged)
        found.append(
            {
                "path": path,
                "team": team_text,
                "effective": merged_text,
                "winner": winner,
                "why": f"{winner} wins: {merged_text} is in force, not {team_text} — {MERGE_RULE_TEXT[rule]}",
            }
        )

    def configured(t: Any, default: Any, name: str) -> bool:
        return default is None or spec_to_dict(getattr(t, name)) != spec_to_dict(getattr(default, name))

    def visit(p: Any, t: Any, path: str) -> None:
        fields = type(t).model_fields
        default = _default_of(t)
        if "enabled" in fields:
            if not p.enabled:
                return  # the platform's check is off: the team's is taken whole
            if not t.enabled:
                # The platform's check is taken whole: a team cannot switch it off.
                if configured(t, default, "enabled"):
                    flag(_join(path, "enabled"), "or", False, True)
                return
        for name, f in fields.items():
            meta = _meta(f)
            rule = meta["merge"]
            sub = _join(path, name) if path else name
            pv, tv = getattr(p, name), getattr(t, name)
            if rule == "nested":
                visit(pv, tv, sub)
                continue
            if rule in ("union", "all_of") or not configured(t, default, name):
                continue  # both sides apply, or the team left it at its default
            binds_with = meta.get("binds_with")
            if binds_with and not (getattr(p, binds_with) and getattr(t, binds_with)):
                continue  # one side imposes nothing here (see _merge_section)
            merged = _merge_value(rule, pv, tv)
            if spec_to_dict(merged) != spec_to_dict(tv):
                flag(sub, rule, tv, merged)

    visit(platform, team, "")
    return found
