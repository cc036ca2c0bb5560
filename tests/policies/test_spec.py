"""The policy spec: validation with field paths, the tighten-never-loosen overlay, help text."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.policies.spec import (
    PLAN_ENVELOPE_STEPS,
    EffectivePolicy,
    PolicySpec,
    SpecError,
    default_spec,
    diff_dicts,
    iter_field_help,
    merge_specs,
    parse_spec,
    spec_to_dict,
    validate_spec,
)


def errors_of(data: object) -> dict[str, str]:
    spec, errors = validate_spec(data)
    assert spec is None
    return {e.path: e.message for e in errors}


def test_empty_spec_is_the_default() -> None:
    assert parse_spec({}) == default_spec()
    assert parse_spec(spec_to_dict(default_spec())) == default_spec()


def test_errors_name_the_field_path_and_collect_every_problem() -> None:
    errs = errors_of(
        {
            "constraints": {
                "max_steps": {"value": 0, "action": "fix"},
                "bogus": 1,
                "caps": {"max_cost_usd": "cheap"},
            },
            "budgets": {"daily": {"soft_usd": 10, "hard_usd": 5}},
            "guardrails": {
                "on_check_error": "maybe",
                "input": {
                    "json_schema": {"enabled": True, "schema": {"type": "object"}},
                    "pii": {"types": ["email", "dna"], "action": "redact"},
                },
                "output": {"length": {"enabled": True}, "model_judge": {"enabled": True, "action": "redact"}},
            },
        }
    )
    assert errs["constraints.max_steps.value"] == "must be at least 1, got 0"
    assert "repair, block" in errs["constraints.max_steps.action"]
    assert errs["constraints.bogus"].startswith("unknown field")
    assert "USD" in errs["constraints.caps.max_cost_usd"]
    assert "above the hard limit" in errs["budgets.daily.soft_usd"]
    assert "fail_closed" in errs["guardrails.on_check_error"]
    assert "output stage" in errs["guardrails.input.json_schema"]
    assert "unknown value 'dna'" in errs["guardrails.input.pii.types[1]"]
    assert "required" in errs["guardrails.output.length.max_chars"]
    assert "not available" in errs["guardrails.output.model_judge.action"]


def test_bad_regex_and_bad_json_schema_are_reported() -> None:
    errs = errors_of(
        {
            "constraints": {"verification": {"rules": [{"name": "n", "pattern": "([a-"}]}},
            "guardrails": {
                "input": {"blocked_terms": {"enabled": True, "terms": [{"pattern": "(x", "kind": "regex"}]}},
                "output": {"json_schema": {"enabled": True, "schema": {"type": "nonsense"}}},
            },
        }
    )
    assert "invalid regular expression" in errs["constraints.verification.rules[0].pattern"]
    assert "invalid regular expression" in errs["guardrails.input.blocked_terms.terms[0].pattern"]
    assert "invalid JSON schema" in errs["guardrails.output.json_schema.schema"]


def test_required_fields_of_list_items() -> None:
    errs = errors_of(
        {"guardrails": {"output": {"model_judge": {"enabled": True, "judges": [{"name": "x"}]}}}}
    )
    assert errs["guardrails.output.model_judge.judges[0].worker"] == "is required"
    assert errs["guardrails.output.model_judge.judges[0].prompt"] == "is required"


def test_parse_spec_raises_with_all_errors() -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec({"budgets": {"daily": {"hard_usd": -1}}, "x": 1})
    assert len(exc.value.errors) == 2


def test_booleans_are_not_numbers() -> None:
    errs = errors_of({"constraints": {"max_steps": {"value": True}}})
    assert "whole number" in errs["constraints.max_steps.value"]


def test_overlay_tightens_and_never_loosens() -> None:
    platform = parse_spec(
        {
            "constraints": {
                "max_steps": {"value": 4, "action": "repair"},
                "workers": {"allowed_workers": ["a", "b", "c"], "denied_workers": ["x"]},
                "caps": {"max_cost_usd": "1.00"},
            },
            "budgets": {"daily": {"hard_usd": 50}},
            "guardrails": {"input": {"pii": {"enabled": True, "action": "redact", "types": ["email"]}}},
        }
    )
    team = parse_spec(
        {
            "constraints": {
                "max_steps": {"value": 9, "action": "block"},  # looser value, stricter action
                "workers": {"allowed_workers": ["b", "c", "d"], "denied_workers": ["y"], "action": "repair"},
                "caps": {"max_cost_usd": "5"},
            },
            "budgets": {"daily": {"hard_usd": 10}},
            "guardrails": {
                "on_check_error": "fail_open",
                "input": {"pii": {"enabled": False, "action": "warn", "types": ["card"]}},
            },
        }
    )
    m = merge_specs(platform, team)
    assert m.constraints.max_steps.value == 4
    assert m.constraints.max_steps.action == "block"
    assert m.constraints.workers.allowed_workers == ("b", "c")
    assert m.constraints.workers.denied_workers == ("x", "y")
    assert m.constraints.caps.max_cost_usd == Decimal("1.00")
    assert m.budgets.daily.hard_usd == Decimal(10)
    assert m.guardrails.on_check_error == "fail_closed"
    assert m.guardrails.input.pii.enabled is True
    assert m.guardrails.input.pii.action == "redact"
    # The team's check is disabled, so its settings are inert: the platform's check stands as is.
    assert set(m.guardrails.input.pii.types) == {"email"}


def test_null_limit_is_no_limit_in_the_overlay() -> None:
    platform = parse_spec({"constraints": {"caps": {"max_total_tokens": None}}})
    team = parse_spec({"constraints": {"caps": {"max_total_tokens": 1000}}})
    assert merge_specs(platform, team).constraints.caps.max_total_tokens == 1000
    assert merge_specs(team, platform).constraints.caps.max_total_tokens == 1000


def test_every_field_has_help_and_a_merge_rule() -> None:
    helps = list(iter_field_help())
    assert len(helps) > 60
    for h in helps:
        assert h.help.strip(), h.path
        assert h.merge in {"nested", "min", "stricter", "or", "union", "intersection", "all_of", "platform"}
    paths = {h.path for h in helps}
    assert "guardrails.output.model_judge.judges[].prompt" in paths
    assert "budgets.monthly.hard_usd" in paths


def test_engine_limits_keep_an_envelope_for_plan_repair() -> None:
    eff = EffectivePolicy(
        parse_spec(
            {
                "constraints": {
                    "max_steps": {"value": 4},
                    "max_depth": {"value": 1},
                    "caps": {"step_timeout_s": 30, "max_wall_clock_s": 90},
                }
            }
        )
    )
    limits = eff.engine_limits()
    # The conductor is told 4; the parser still accepts longer plans so the policy can repair them.
    assert limits.max_steps == 4
    assert limits.accept_steps == limits.plan_bound == PLAN_ENVELOPE_STEPS
    assert limits.max_depth == 1
    assert limits.step_timeout_s == 30
    assert limits.run_timeout_s == 90


def test_diff_dicts_reports_leaf_paths() -> None:
    a = spec_to_dict(PolicySpec())
    b = spec_to_dict(parse_spec({"constraints": {"max_steps": {"value": 3}}}))
    assert diff_dicts(a, b) == [{"path": "constraints.max_steps.value", "old": 5, "new": 3}]


def test_disabled_platform_check_does_not_harden_the_team_action() -> None:
    from apps.policies.spec import merge_specs, parse_spec

    platform = parse_spec({})
    team = parse_spec(
        {
            "guardrails": {
                "input": {"blocked_terms": {"enabled": True, "action": "warn", "terms": [{"pattern": "x"}]}}
            }
        }
    )
    merged = merge_specs(platform, team)
    assert merged.guardrails.input.blocked_terms.action == "warn"
    # An enabled platform check still wins over a looser team action.
    strict = parse_spec(
        {
            "guardrails": {
                "input": {"blocked_terms": {"enabled": True, "action": "block", "terms": [{"pattern": "y"}]}}
            }
        }
    )
    merged = merge_specs(strict, team)
    assert merged.guardrails.input.blocked_terms.action == "block"
    assert {t.pattern for t in merged.guardrails.input.blocked_terms.terms} == {"x", "y"}
