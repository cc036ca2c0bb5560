"""The policy merge is monotone: the effective policy is at least as strict as EACH layer on
EVERY field (issue 13 item 5).

Random platform and team specs are generated from the spec's own declaration (model field types and
metadata: bounds, choices, excluded actions, stage restrictions), checked to be valid by the
validator, merged, and compared field by field with one relation, `looser_fields`.

The relation is written here from each field's *meaning* (which direction is stricter), not read
from the merge rule in the metadata, so a wrong merge rule is caught too; `SEMANTICS` must name
every leaf field of the spec (a new field without an entry fails the coverage test).
"""

from __future__ import annotations

import types
import typing
from decimal import Decimal
from typing import Any, Literal, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.policies.spec import (
    BlockedTermsCheck,
    BudgetLimit,
    JsonSchemaCheck,
    LengthCheck,
    ModelJudgeCheck,
    PolicySpec,
    ToolRule,
    _hints,
    is_section,
    merge_specs,
    parse_spec,
    spec_fields,
    spec_to_dict,
)

# ------------------------------------------------------------------------- the strictness relation

# Ranks by meaning, independent of apps.policies.spec.STRICTNESS (higher = stricter).
GUARD_RANK = {"warn": 1, "redact": 2, "require_review": 3, "block": 4}
CONSTRAINT_RANK = {"repair": 1, "block": 2}
HOLD_RANK = {"require_approval": 1, "block": 2}
ON_ERROR_RANK = {"fail_open": 1, "fail_closed": 2}
PARTIAL_RANK = {"allow": 1, "deny": 2}  # issue 44: denying partial answers is stricter
TOOL_RANK = {"allow": 1, "require_approval": 2, "block": 3}  # issue 43: a tool call's action

# Leaf field → what "stricter" means for it. Paths are dotted from the spec root; `*` is a stage.
#   limit         a number; smaller is stricter; None means no limit
#   rank:<table>  an action; higher rank is stricter
#   switch        a boolean; True is stricter
#   more          a list of things that each add a restriction; a superset is stricter
#   fewer         an allow list; a subset is stricter; None means "anything"
#   verifiers     who satisfies a verification rule: a subset is stricter, binding only a layer
#                 that has rules
#   schema        a JSON schema the answer must match: the layer's schema must still apply
#   platform_tag  which tag means "local hardware": the platform's definition stands
SEMANTICS: dict[str, str] = {
    "constraints.max_steps.value": "limit",
    "constraints.max_steps.action": "rank:constraint",
    "constraints.max_depth.value": "limit",
    "constraints.max_depth.action": "rank:constraint",
    "constraints.max_parallel.value": "limit",
    "constraints.max_parallel.action": "rank:constraint",
    "constraints.workers.allowed_workers": "fewer",
    "constraints.workers.allowed_tags": "fewer",
    "constraints.workers.denied_workers": "more",
    "constraints.workers.action": "rank:constraint",
    "constraints.forecast.enabled": "switch",
    "constraints.forecast.max_cost_usd": "limit",
    "constraints.forecast.max_tokens": "limit",
    "constraints.forecast.action": "rank:hold",
    "constraints.data_boundary.enabled": "switch",
    "constraints.data_boundary.labels": "more",
    "constraints.data_boundary.inside_tags": "fewer",
    "constraints.data_boundary.inside_workers": "fewer",
    "constraints.data_boundary.action": "rank:hold",
    "constraints.approval.timeout_s": "limit",
    "constraints.approval.api_wait_s": "limit",
    "constraints.confidential.enabled": "switch",
    "constraints.confidential.detect": "switch",
    "constraints.confidential.detect_patterns": "more",
    "constraints.confidential.local_tag": "platform_tag",
    "constraints.confidential.action": "rank:constraint",
    "constraints.caps.max_total_tokens": "limit",
    "constraints.caps.max_cost_usd": "limit",
    "constraints.caps.max_wall_clock_s": "limit",
    "constraints.caps.step_timeout_s": "limit",
    "constraints.verification.rules": "more",
    "constraints.verification.verifier_workers": "verifiers",
    "constraints.verification.verifier_tags": "verifiers",
    "constraints.verification.action": "rank:constraint",
    "constraints.partial_answers": "rank:partial",
    "budgets.daily.soft_usd": "limit",
    "budgets.daily.hard_usd": "limit",
    "budgets.monthly.soft_usd": "limit",
    "budgets.monthly.hard_usd": "limit",
    # The learned router (issue 19): less exploration is stricter; the reward's metric and weights
    # are the platform's when it sets them (the organisation's limited-budget dial).
    "learning.enabled": "switch",
    "learning.max_exploration": "limit",
    "learning.metric": "platform_tag",
    "learning.cost_weight": "platform_tag",
    "learning.latency_weight": "platform_tag",
    "guardrails.on_check_error": "rank:on_error",
    "guardrails.*.pii.enabled": "switch",
    "guardrails.*.pii.action": "rank:guard",
    "guardrails.*.pii.types": "more",
    "guardrails.*.secrets.enabled": "switch",
    "guardrails.*.secrets.action": "rank:guard",
    "guardrails.*.secrets.types": "more",
    "guardrails.*.injection.enabled": "switch",
    "guardrails.*.injection.action": "rank:guard",
    "guardrails.*.injection.extra_patterns": "more",
    "guardrails.*.blocked_terms.enabled": "switch",
    "guardrails.*.blocked_terms.action": "rank:guard",
    "guardrails.*.blocked_terms.terms": "more",
    "guardrails.*.length.enabled": "switch",
    "guardrails.*.length.action": "rank:guard",
    "guardrails.*.length.max_chars": "limit",
    "guardrails.*.json_schema.enabled": "switch",
    "guardrails.*.json_schema.action": "rank:guard",
    "guardrails.*.json_schema.schema": "schema",
    "guardrails.*.model_judge.enabled": "switch",
    "guardrails.*.model_judge.action": "rank:guard",
    "guardrails.*.model_judge.judges": "more",
    # Governed tools (issue 43): an allow list narrows, denials and rules only add restrictions.
    "tools.allowed_tools": "fewer",
    "tools.denied_tools": "more",
    "tools.default_action": "rank:tool",
    "tools.rules": "more",
    "tools.max_calls_per_run": "limit",
    "tools.output.injection.enabled": "switch",
    "tools.output.injection.action": "rank:guard",
    "tools.output.injection.extra_patterns": "more",
    "tools.output.pii.enabled": "switch",
    "tools.output.pii.action": "rank:guard",
    "tools.output.pii.types": "more",
    "tools.output.secrets.enabled": "switch",
    "tools.output.secrets.action": "rank:guard",
    "tools.output.secrets.types": "more",
}
RANKS = {
    "guard": GUARD_RANK,
    "constraint": CONSTRAINT_RANK,
    "on_error": ON_ERROR_RANK,
    "hold": HOLD_RANK,
    "partial": PARTIAL_RANK,
    "tool": TOOL_RANK,
}


def _semantic(path: str) -> str:
    parts = path.split(".")
    if parts[0] == "guardrails" and len(parts) == 4:
        parts[1] = "*"
    return SEMANTICS[".".join(parts)]


def _schema_parts(schema: Any) -> list[Any]:
    if isinstance(schema, dict) and set(schema) == {"allOf"}:
        return [p for part in schema["allOf"] for p in _schema_parts(part)]
    return [schema]


def _leaf_ok(kind: str, eff: Any, layer: Any, eff_parent: Any, layer_parent: Any) -> bool:
    if kind == "limit":
        return layer is None or (eff is not None and eff <= layer)
    if kind.startswith("rank:"):
        ranks = RANKS[kind.split(":", 1)[1]]
        return ranks[eff] >= ranks[layer]
    if kind == "switch":
        return eff or not layer
    if kind == "more":
        return set(eff) >= set(layer)
    if kind == "fewer":
        return layer is None or (eff is not None and set(eff) <= set(layer))
    if kind == "verifiers":
        return not layer_parent.rules or set(eff) <= set(layer)
    if kind == "schema":
        return layer is None or layer in _schema_parts(eff)
    if kind == "platform_tag":
        return True  # checked against the platform layer in `looser_fields(platform=True)`
    raise AssertionError(f"unknown semantic {kind}")


def looser_fields(eff: Any, layer: Any, *, is_platform: bool, path: str = "") -> list[str]:
    """Paths where `eff` is LESS strict than `layer` (empty: at least as strict everywhere).

    A check that the layer leaves disabled imposes nothing, so it cannot be loosened."""
    if "enabled" in {f.name for f in spec_fields(layer)} and not layer.enabled:
        return []
    out: list[str] = []
    for f in spec_fields(layer):
        here = f"{path}.{f.name}" if path else f.name
        e, v = getattr(eff, f.name), getattr(layer, f.name)
        if is_section(type(v)):
            out.extend(looser_fields(e, v, is_platform=is_platform, path=here))
            continue
        kind = _semantic(here)
        if kind == "platform_tag":
            if is_platform and v and e != v:
                out.append(here)
        elif not _leaf_ok(kind, e, v, eff, layer):
            out.append(f"{here}: effective {e!r} vs layer {v!r}")
    return out


# ------------------------------------------------------------------------- specs from the metadata

REGEXES = (r"\bsecret\b", r"project\s+\w+", "internal", r"\d{4}-\d{2}", "(a+)+$")
WORDS = ("alpha", "beta", "gamma", "local", "verifier", "gpu")
SCHEMAS = (
    {"type": "object"},
    {"type": "object", "required": ["answer"]},
    {"type": "array"},
    {"type": "object", "properties": {"n": {"type": "integer"}}},
)


def _text(meta: dict[str, Any]) -> st.SearchStrategy[str]:
    if meta.get("regex"):
        return st.sampled_from(REGEXES)
    return st.sampled_from(WORDS)


def _value(tp: Any, meta: dict[str, Any]) -> st.SearchStrategy[Any]:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = next(a for a in args if a is not type(None))
        return st.one_of(st.none(), _value(inner, meta))
    if is_section(tp):
        return _dataclass(tp)
    if origin is Literal:
        return st.sampled_from([a for a in args if a not in meta.get("exclude", ())])
    if tp is bool:
        return st.booleans()
    lo = meta.get("minimum", 0)
    hi = meta.get("maximum", 10_000)
    if tp is int:
        return st.integers(min_value=lo, max_value=min(hi, lo + 50))
    if tp is float:
        return st.integers(min_value=lo, max_value=min(hi, lo + 50)).map(float)
    if tp is Decimal:
        return st.integers(min_value=lo, max_value=min(hi, lo + 50)).map(Decimal)
    if tp is str:
        return _text(meta)
    if origin is tuple:
        item = args[0]
        if meta.get("choices"):
            return st.lists(st.sampled_from(meta["choices"]), max_size=4, unique=True).map(tuple)
        item_meta = {"regex": meta.get("regex", False)}
        return st.lists(_value(item, item_meta), max_size=3, unique=True).map(tuple)
    if origin is dict:
        return st.sampled_from(SCHEMAS)
    raise AssertionError(f"no strategy for {tp!r}")


def _repair(obj: Any) -> Any:
    """Satisfy the validator's cross-field rules (the generator draws fields independently)."""
    if isinstance(obj, BudgetLimit) and obj.soft_usd is not None and obj.hard_usd is not None:
        lo, hi = sorted((obj.soft_usd, obj.hard_usd))
        return obj.model_copy(update={"soft_usd": lo, "hard_usd": hi})
    if isinstance(obj, LengthCheck) and obj.enabled and obj.max_chars is None:
        return obj.model_copy(update={"max_chars": 100})
    if isinstance(obj, JsonSchemaCheck) and obj.enabled and obj.schema is None:
        return obj.model_copy(update={"schema": {"type": "object"}})
    if isinstance(obj, ModelJudgeCheck) and obj.enabled and not obj.judges:
        return obj.model_copy(update={"enabled": False})
    if isinstance(obj, BlockedTermsCheck) and obj.enabled and not obj.terms:
        return obj.model_copy(update={"enabled": False})
    if isinstance(obj, ToolRule):  # a tool is named <server>.<tool>; a pattern needs its argument
        argument = obj.argument if obj.pattern else ""
        return obj.model_copy(
            update={"tool": f"crm.{obj.tool}", "argument": argument or ("q" if obj.pattern else "")}
        )
    if hasattr(obj, "allowed_workers") and obj.allowed_workers:
        return obj.model_copy(
            update={"denied_workers": tuple(w for w in obj.denied_workers if w not in obj.allowed_workers)}
        )
    return obj


@st.composite
def _build(draw: Any, cls: Any, stage: str | None = None) -> Any:
    kwargs: dict[str, Any] = {}
    for f in spec_fields(cls):
        tp = f.type
        meta = dict(f.metadata)
        if is_section(tp):
            child_stage = f.name if cls.__name__ == "Guardrails" and f.name != "on_check_error" else stage
            value = draw(_build(tp, child_stage))
            stages = meta.get("stages")
            if stages and stage is not None and stage not in stages and getattr(value, "enabled", False):
                value = value.model_copy(update={"enabled": False})  # the check does not exist here
        else:
            value = draw(_value(tp, meta))
        kwargs[f.name] = value
    return _repair(cls.model_construct(**kwargs))  # drawn whole; the test validates it


def _dataclass(cls: type) -> st.SearchStrategy[Any]:
    return _build(cls)


specs = _build(PolicySpec)


def _leaf_paths(cls: type = PolicySpec, prefix: str = "") -> list[str]:
    out = []
    for f in spec_fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        tp = _hints(cls)[f.name]
        if is_section(tp):
            out.extend(_leaf_paths(tp, path))
        else:
            out.append(path)
    return out


# ------------------------------------------------------------------------- the properties


def test_the_relation_names_every_field_of_the_spec() -> None:
    for path in _leaf_paths():
        assert _semantic(path), path  # KeyError names a field without a declared meaning


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(platform=specs, team=specs)
def test_effective_policy_is_at_least_as_strict_as_each_layer(platform: PolicySpec, team: PolicySpec) -> None:
    # The generated specs are valid policies: they survive the validator unchanged.
    assert parse_spec(spec_to_dict(platform)) == platform
    assert parse_spec(spec_to_dict(team)) == team
    effective = merge_specs(platform, team)
    assert looser_fields(effective, platform, is_platform=True) == []
    assert looser_fields(effective, team, is_platform=False) == []


def test_team_block_is_not_weakened_by_a_platform_redact() -> None:
    """The reproduction: platform PII `redact` + team PII `block` gave `redact`."""
    platform = parse_spec({"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}})
    team = parse_spec({"guardrails": {"input": {"pii": {"enabled": True, "action": "block"}}}})
    for a, b in ((platform, team), (team, platform)):
        assert merge_specs(a, b).guardrails.input.pii.action == "block"


@pytest.mark.parametrize(
    ("weak", "strong"),
    [("warn", "redact"), ("redact", "require_review"), ("require_review", "block"), ("warn", "block")],
)
def test_guard_actions_are_ordered(weak: str, strong: str) -> None:
    def spec(action: str) -> PolicySpec:
        return parse_spec({"guardrails": {"output": {"secrets": {"enabled": True, "action": action}}}})

    assert merge_specs(spec(weak), spec(strong)).guardrails.output.secrets.action == strong
    assert merge_specs(spec(strong), spec(weak)).guardrails.output.secrets.action == strong


def test_a_team_cannot_add_its_own_verifier_to_a_platform_rule() -> None:
    rule = {"name": "numbers", "pattern": r"\d"}
    platform = parse_spec({"constraints": {"verification": {"rules": [rule], "verifier_tags": ["verifier"]}}})
    team = parse_spec(
        {
            "constraints": {
                "verification": {"rules": [rule], "verifier_workers": ["cheap"], "verifier_tags": ["any"]}
            }
        }
    )
    merged = merge_specs(platform, team).constraints.verification
    assert merged.verifier_workers == () and merged.verifier_tags == ()
    # A platform without rules imposes no verifier list: the team's own rule keeps its verifiers.
    alone = merge_specs(PolicySpec(), team).constraints.verification
    assert alone.verifier_workers == ("cheap",) and alone.verifier_tags == ("any",)


def test_both_output_schemas_apply() -> None:
    def spec(schema: dict[str, Any]) -> PolicySpec:
        return parse_spec({"guardrails": {"output": {"json_schema": {"enabled": True, "schema": schema}}}})

    a, b = {"type": "object", "required": ["x"]}, {"type": "object", "required": ["y"]}
    merged = merge_specs(spec(a), spec(b)).guardrails.output.json_schema.schema
    assert merged == {"allOf": [a, b]}
