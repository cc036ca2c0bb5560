"""Issue 42 item 1 (rest): a field a team configures but the stricter platform layer overrides is
flagged before publish and in the Summary, naming the layer that wins."""

from __future__ import annotations

from typing import Any

import pytest

from apps.policies.spec import merge_specs, parse_spec, shadowed_fields, spec_to_dict
from tests.factories.policies import draft_policy, publish_policy

pytestmark = pytest.mark.django_db

PLATFORM = {
    "constraints": {
        "max_steps": {"value": 5, "action": "block"},
        "workers": {"allowed_tags": ["local", "external"]},
    },
    "guardrails": {"input": {"pii": {"enabled": True, "action": "block"}}},
}
TEAM = {
    "constraints": {
        "max_steps": {"value": 8},  # shadowed: the platform's 5 is lower
        "max_depth": {"value": 2},  # the platform sets no limit: the team's applies
        "workers": {
            "allowed_tags": ["local", "gpu"],
            "denied_workers": ["w9"],
        },  # gpu dropped; deny is a union
    },
    "guardrails": {"input": {"pii": {"enabled": True, "action": "warn"}}},  # the platform's block is stricter
}


def _paths(found: list[dict[str, str]]) -> list[str]:
    return [f["path"] for f in found]


def test_fields_the_platform_overrides_are_named_with_the_winner() -> None:
    found = shadowed_fields(parse_spec(PLATFORM), parse_spec(TEAM), winner="the platform default (v3)")
    assert _paths(found) == [
        "constraints.max_steps.value",
        "constraints.workers.allowed_tags",
        "guardrails.input.pii.action",
    ]
    first = found[0]
    assert (
        first["team"] == "8" and first["effective"] == "5" and first["winner"] == "the platform default (v3)"
    )
    assert first["why"] == (
        "the platform default (v3) wins: 5 is in force, not 8 — team may only lower it (smaller limit wins)"
    )
    # What is flagged is exactly what the merge changes.
    merged = spec_to_dict(merge_specs(parse_spec(PLATFORM), parse_spec(TEAM)))
    assert merged["constraints"]["max_steps"] == {"value": 5, "action": "block"}
    assert merged["constraints"]["max_depth"]["value"] == 2


def test_a_team_cannot_switch_off_a_platform_check_that_is_on_by_default() -> None:
    platform = parse_spec({"guardrails": {"input": {"injection": {"enabled": True}}}})
    team = parse_spec({"guardrails": {"input": {"injection": {"enabled": False}}}})
    defaults_on = parse_spec({}).guardrails.input.injection.enabled
    found = shadowed_fields(platform, team)
    if defaults_on:  # only a switch away from its default counts as configured
        assert _paths(found) == ["guardrails.input.injection.enabled"] and found[0]["effective"] == "on"
    else:
        assert found == []


def test_nothing_is_shadowed_when_the_team_only_tightens_or_keeps_defaults() -> None:
    tighter = {"constraints": {"max_steps": {"value": 3, "action": "block"}}}
    assert shadowed_fields(parse_spec(PLATFORM), parse_spec(tighter)) == []
    assert shadowed_fields(parse_spec(PLATFORM), parse_spec({})) == []
    # A stored spec is normalised (every field written out): defaults are still not "configured".
    assert shadowed_fields(parse_spec(PLATFORM), parse_spec(spec_to_dict(parse_spec({})))) == []


def test_publish_review_and_summary_flag_the_shadowed_fields(
    client: Any, alpha: Any, policy_admin: Any
) -> None:
    platform = publish_policy(None, PLATFORM)
    draft_policy(alpha, TEAM, actor=policy_admin)
    client.force_login(policy_admin)
    page = client.get(f"/policies/team/{alpha.slug}/").content.decode()
    review = page.split('data-testid="publish-review"', 1)[1].split("</section>", 1)[0]
    assert 'data-testid="draft-shadowed"' in review
    assert 'data-path="constraints.max_steps.value"' in review
    assert f"the platform default (v{platform.number}) wins" in review
    summary = page.split('data-testid="spec-summary"', 1)[1]
    assert (
        'data-testid="summary-shadowed"' in summary and 'data-path="guardrails.input.pii.action"' in summary
    )


def test_the_platform_policy_itself_flags_nothing(client: Any, superuser: Any) -> None:
    publish_policy(None, PLATFORM)
    client.force_login(superuser)
    page = client.get("/policies/platform/").content.decode()
    assert "summary-shadowed" not in page and "draft-shadowed" not in page
