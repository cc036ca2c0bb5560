"""The overlay ("tighten, never loosen": each field's merge rule) and the diff of two specs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.policies.spec.fields import STRICTNESS, _join, _meta
from apps.policies.spec.policy import PolicySpec

# ------------------------------------------------------------------------------------ overlay


def _merge_value(rule: str, platform: Any, team: Any) -> Any:
    if rule == "nested":
        return _merge_section(platform, team)
    if rule == "min":
        if platform is None:
            return team
        if team is None:
            return platform
        return min(platform, team)
    if rule == "stricter":
        return team if STRICTNESS.get(team, 0) > STRICTNESS.get(platform, 0) else platform
    if rule == "or":
        return bool(platform) or bool(team)
    if rule == "union":
        return tuple(dict.fromkeys([*platform, *team]))
    if rule == "intersection":
        if platform is None:
            return team
        if team is None:
            return platform
        return tuple(v for v in platform if v in set(team))
    if rule == "all_of":
        if platform in (None, {}) or platform == team:
            return team
        if team in (None, {}):
            return platform
        return {"allOf": [platform, team]}
    if rule == "platform":
        return platform if platform not in (None, "") else team
    raise ValueError(f"unknown merge rule {rule!r}")  # a bug in this module


def _merge_section(platform: Any, team: Any) -> Any:
    fields = type(platform).model_fields
    # A disabled check imposes nothing: merging its default action ("block") with an enabled
    # team check would silently turn the team's warn/require_review into a block.
    if "enabled" in fields:
        if not platform.enabled:
            return team
        if not team.enabled:
            return platform
    merged = {}
    for name, f in fields.items():
        meta = _meta(f)
        p, t = getattr(platform, name), getattr(team, name)
        binds_with = meta.get("binds_with")
        # A side without the sibling entries (e.g. no verification rules) imposes nothing here.
        if binds_with and not getattr(platform, binds_with):
            merged[name] = t
        elif binds_with and not getattr(team, binds_with):
            merged[name] = p
        else:
            merged[name] = _merge_value(meta["merge"], p, t)
    # Both sides were validated; the merge of two valid sections is not validated again (as before).
    return type(platform).model_construct(**merged)


def merge_specs(platform: PolicySpec, team: PolicySpec | None) -> PolicySpec:
    """Overlay the team's spec on the platform default: tighten, never loosen (see module doc)."""
    if team is None:
        return platform
    merged: PolicySpec = _merge_section(platform, team)
    return merged


# ------------------------------------------------------------------------------------ diff


def diff_dicts(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """Leaf-level differences between two JSON values: [{path, old, new}] (missing = None)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[dict[str, Any]] = []
        for key in list(dict.fromkeys([*old, *new])):
            out.extend(diff_dicts(old.get(key), new.get(key), _join(path, str(key))))
        return out
    if old != new:
        return [{"path": path or "(root)", "old": old, "new": new}]
    return []


def walk(obj: Any, fn: Callable[[str, Any], None], path: str = "") -> None:
    """Call fn(path, leaf) for every leaf of a spec dict (used by the structured summary)."""
    if isinstance(obj, dict) and not path.endswith("schema"):
        for k, v in obj.items():
            walk(v, fn, _join(path, k))
    else:
        fn(path, obj)
