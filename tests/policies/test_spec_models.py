"""The spec as pydantic models (issue 16): pinned defaults, pydantic's errors in the project's
format, and the structured editor generated from the models' JSON schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from apps.policies.editor import build_sections, iter_fields
from apps.policies.services import effective_policy
from apps.policies.spec import (
    PolicySpec,
    StepsLimit,
    field_meta,
    iter_field_help,
    merge_specs,
    parse_spec,
    policy_json_schema,
    spec_to_dict,
    validate_spec,
)
from tests.factories.policies import publish_policy

# Written by the dataclass validator before the models replaced it: the defaults must not move.
# Built-in defaults (no policy stored) and the effective policy of a stored empty document (saving
# normalises the document, so its whole numbers come back as the float fields they are: 3600.0).
DEFAULTS = Path(__file__).parent / "fixtures" / "effective_defaults.json"
EMPTY_DOCUMENT = Path(__file__).parent / "fixtures" / "effective_empty_document.json"


def _dumped(spec: PolicySpec) -> str:
    return json.dumps(spec_to_dict(spec), indent=2) + "\n"


def test_the_default_policy_is_byte_identical_to_the_pinned_one() -> None:
    assert _dumped(merge_specs(PolicySpec(), parse_spec({}))) == DEFAULTS.read_text()
    stored = spec_to_dict(parse_spec({}))
    assert _dumped(merge_specs(parse_spec(stored), parse_spec(stored))) == EMPTY_DOCUMENT.read_text()


@pytest.mark.django_db
def test_a_team_without_a_policy_gets_the_pinned_defaults(alpha: Any) -> None:
    assert _dumped(effective_policy(alpha).spec) == DEFAULTS.read_text()


@pytest.mark.django_db
def test_a_team_with_an_empty_document_gets_the_pinned_defaults(alpha: Any) -> None:
    publish_policy(None, {})
    publish_policy(alpha, {})
    eff = effective_policy(alpha)
    assert eff.version is not None
    assert _dumped(eff.spec) == EMPTY_DOCUMENT.read_text()


def test_the_models_refuse_unknown_fields_and_the_errors_keep_their_paths() -> None:
    with pytest.raises(ValidationError):
        StepsLimit.model_validate({"value": 3, "limit": 4})
    _spec, errors = validate_spec({"constraints": {"max_steps": {"limit": 4, "value": "x"}}, "budgets": []})
    messages = {e.path: e.message for e in errors}
    assert messages == {
        "constraints.max_steps.limit": "unknown field (known: value, action)",
        "constraints.max_steps.value": "must be a whole number, got 'x'",
        "budgets": "must be an object, got a list",
    }


def test_merge_rules_and_help_come_from_the_field_declarations() -> None:
    meta = field_meta(StepsLimit, "value")
    assert meta["merge"] == "min" and meta["minimum"] == 1
    assert (StepsLimit.model_fields["value"].description or "").startswith("Most steps")
    helps = {h.path: h for h in iter_field_help()}
    assert helps["constraints.max_steps.value"].merge == "min"


def test_the_json_schema_carries_help_merge_rules_and_bounds() -> None:
    schema = policy_json_schema()
    steps = schema["$defs"]["StepsLimit"]["properties"]["value"]
    assert steps["merge"] == "min" and steps["minimum"] == 1 and steps["maximum"] == 50
    assert steps["description"].startswith("Most steps")
    assert schema["$defs"]["StepsLimit"]["additionalProperties"] is False


def test_the_editor_is_generated_from_the_json_schema() -> None:
    schema = json.loads(json.dumps(policy_json_schema()))
    # A schema change shows up in the form: the editor reads nothing but the schema.
    prop = schema["$defs"]["StepsLimit"]["properties"]["value"]
    prop["description"] = "Changed help."
    prop["maximum"] = 7
    schema["$defs"]["StepsLimit"]["properties"]["action"]["enum"] = ["block"]
    fields = {f.path: f for f in iter_fields(build_sections(schema))}
    assert fields["constraints.max_steps.value"].help == "Changed help."
    assert fields["constraints.max_steps.value"].maximum == 7
    assert fields["constraints.max_steps.action"].choices == ("block",)
    # And the real schema gives every leaf of the spec one input of the right kind.
    real = {f.path: f for f in iter_fields(build_sections())}
    leaves = {h.path for h in iter_field_help() if h.merge != "nested" and "[]" not in h.path}
    assert set(real) == leaves
    assert real["budgets.daily.hard_usd"].kind == "decimal" and real["budgets.daily.hard_usd"].nullable
    assert real["guardrails.output.json_schema.action"].choices == ("block", "warn", "require_review")
    assert real["guardrails.input.pii.types"].kind == "multi"
