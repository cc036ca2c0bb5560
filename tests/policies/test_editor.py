"""The structured policy editor: generated from the spec's metadata, round-trips a policy through
the form as a browser would submit it, shows the platform value each field tightens, and shows
the draft's diff against the published version before publishing it."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client

from apps.audit.models import AuditEvent
from apps.policies.editor import build_sections, form_to_spec, iter_fields
from apps.policies.models import Policy, PolicyVersion
from apps.policies.services import effective_policy
from apps.policies.spec import iter_field_help, spec_to_dict, validate_spec
from tests.factories.policies import publish_policy

pytestmark = pytest.mark.django_db

URL = "/policies/team/alpha/"

RICH = {
    "constraints": {
        "max_steps": {"value": 3, "action": "block"},
        "workers": {"allowed_tags": ["fast", "local"], "denied_workers": ["big-one"]},
        "caps": {"max_cost_usd": "0.25", "step_timeout_s": 12.5},
        "verification": {"rules": [{"name": "numbers", "pattern": "\\d+ percent"}]},
    },
    "budgets": {"daily": {"soft_usd": "1", "hard_usd": "2.50"}},
    "guardrails": {
        "input": {
            "pii": {"enabled": True, "action": "redact", "types": ["email", "phone"]},
            "blocked_terms": {
                "enabled": True,
                "terms": [{"pattern": "project x", "message": "secret project"}],
            },
        },
        "output": {"json_schema": {"enabled": True, "schema": {"type": "object"}}},
    },
}


class FormFields(HTMLParser):
    """What a browser would submit from the form with id ``policy-form`` (successful controls only)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.fields: list[tuple[str, str]] = []
        self._textarea: str | None = None
        self._select: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.inside = a.get("id") == "policy-form"
        if not self.inside or "disabled" in a:
            return
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button"):
            if a.get("type") == "checkbox":
                if "checked" in a:
                    self.fields.append((name, a.get("value") or "on"))
            else:
                self.fields.append((name, a.get("value") or ""))
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.fields.append((self._select, a.get("value") or ""))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "textarea" and self._textarea is not None:
            text = "".join(self._text)
            self.fields.append((self._textarea, text[1:] if text.startswith("\n") else text))
            self._textarea = None
        elif tag == "select":
            self._select = None


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def scrape(html: str) -> dict[str, list[str]]:
    parser = FormFields()
    parser.feed(html)
    out: dict[str, list[str]] = {}
    for k, v in parser.fields:
        out.setdefault(k, []).append(v)
    return out


def test_every_spec_field_has_an_input_generated_from_its_metadata() -> None:
    leaves = {h.path for h in iter_field_help() if h.merge != "nested" and "[]" not in h.path}
    fields = {f.path: f for f in iter_fields(build_sections())}
    assert set(fields) == leaves
    assert fields["constraints.max_steps.action"].choices == ("repair", "block")
    assert fields["guardrails.output.json_schema.action"].choices == ("block", "warn", "require_review")
    assert fields["guardrails.input.pii.types"].kind == "multi"
    assert fields["constraints.workers.allowed_workers"].kind == "lines"
    assert fields["constraints.verification.rules"].kind == "json"
    assert fields["constraints.max_steps.value"].maximum == 50
    assert "smaller limit wins" in fields["constraints.max_steps.value"].rule_text


def test_a_policy_round_trips_through_the_form_as_a_browser_submits_it(policy_admin: Any, alpha: Any) -> None:
    publish_policy(alpha, RICH)
    c = client_for(policy_admin)
    page = c.get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-testid="structured-editor"' in html and 'data-testid="spec-editor"' not in html
    posted = scrape(html)
    assert posted["editor_mode"] == ["form"]
    data, errors = form_to_spec(_querydict(posted))
    assert errors == []
    spec, problems = validate_spec(data)
    assert problems == [] and spec is not None
    expected, _ = validate_spec(RICH)
    assert spec_to_dict(spec) == spec_to_dict(expected)
    # Nothing changed: the draft saved from the untouched form has an empty diff.
    saved = c.post(URL, {**posted, "action": "review"})
    assert saved.status_code == 302 and saved["Location"].endswith("#publish-review")
    review = c.get(URL).content.decode()
    assert 'data-testid="draft-diff-empty"' in review


def _querydict(fields: dict[str, list[str]]) -> Any:
    from django.http import QueryDict

    q = QueryDict(mutable=True)
    for k, values in fields.items():
        q.setlist(k, values)
    return q


def test_edit_in_the_form_review_the_diff_then_publish(policy_admin: Any, alpha: Any) -> None:
    v1 = publish_policy(alpha, {"constraints": {"max_steps": {"value": 4}}})
    c = client_for(policy_admin)
    posted = scrape(c.get(URL).content.decode())
    posted["f-constraints.max_steps.value"] = ["2"]
    posted["f-guardrails.input.secrets.enabled"] = ["on"]
    posted["note"] = ["tighter"]
    assert c.post(URL, {**posted, "action": "review"}).status_code == 302
    assert effective_policy(alpha).spec.constraints.max_steps.value == 4  # nothing in force yet

    review = c.get(URL).content.decode()
    assert 'data-testid="publish-review"' in review and f"published v{v1.number}" in review
    diff = review.split('data-testid="draft-diff"')[1].split("</table>")[0]
    assert "constraints.max_steps.value" in diff and "guardrails.input.secrets.enabled" in diff
    assert "constraints.max_parallel" not in diff  # only what changed
    # The changed fields are marked in the form itself, and their sections render open.
    assert 'class="pe-field pe-changed" data-field="constraints.max_steps.value"' in review
    assert 'data-testid="section-constraints.max_steps" open' in review

    confirm = scrape(
        review.replace('id="policy-form"', 'id="x"').replace('class="toolbar">', 'id="policy-form">', 1)
    )
    confirm_post = {k: v[0] for k, v in confirm.items()}
    assert confirm_post["draft_number"] == "2"
    resp = c.post(URL, {**confirm_post, "action": "publish_draft"})
    assert resp.status_code == 302
    assert effective_policy(alpha).spec.constraints.max_steps.value == 2
    assert effective_policy(alpha).spec.guardrails.input.secrets.enabled is True
    event = AuditEvent.objects.filter(event_type="policy.published").order_by("-pk").first()
    assert event is not None and any(
        d["path"] == "constraints.max_steps.value" for d in event.payload["diff"]
    )


def test_publishing_a_draft_changed_since_review_is_refused(policy_admin: Any, alpha: Any) -> None:
    from tests.factories.policies import draft_policy

    publish_policy(alpha, {})
    draft = draft_policy(alpha, {"constraints": {"max_steps": {"value": 2}}})
    c = client_for(policy_admin)
    review = c.get(URL).content.decode()
    digest = review.split('name="draft_digest" value="')[1].split('"')[0]
    # Someone saves the draft again in between (same number, other content).
    draft_policy(alpha, {"constraints": {"max_steps": {"value": 1}}})
    resp = c.post(
        URL, {"action": "publish_draft", "draft_number": draft.number, "draft_digest": digest}, follow=True
    )
    assert "changed since you reviewed it" in resp.content.decode()
    assert PolicyVersion.objects.get(pk=draft.pk).status == "draft"
    assert effective_policy(alpha).spec.constraints.max_steps.value == 5


def test_form_errors_name_the_field_and_keep_what_was_typed(policy_admin: Any, alpha: Any) -> None:
    c = client_for(policy_admin)
    posted = scrape(c.get(URL).content.decode())
    posted["f-constraints.max_steps.value"] = ["lots"]
    posted["f-constraints.max_depth.value"] = ["0"]
    posted["f-constraints.verification.rules"] = ["[{"]
    page = c.post(URL, {**posted, "action": "save"})
    html = page.content.decode()
    assert "<code>constraints.max_steps.value</code>: must be a whole number, got &#x27;lots&#x27;" in html
    assert "<code>constraints.verification.rules</code>: not valid JSON" in html
    assert 'value="lots"' in html  # re-shown, not reset
    assert 'data-testid="section-constraints.max_steps" open' in html
    assert not Policy.objects.filter(team=alpha).exists()
    # Once the type errors are fixed the validator's bounds still name the field.
    posted["f-constraints.max_steps.value"] = ["3"]
    posted["f-constraints.verification.rules"] = [""]
    html = c.post(URL, {**posted, "action": "save"}).content.decode()
    assert "<code>constraints.max_depth.value</code>: must be at least 1, got 0" in html


def test_team_fields_show_the_platform_value_they_tighten(
    policy_admin: Any, superuser: Any, alpha: Any
) -> None:
    publish_policy(
        None, {"constraints": {"max_steps": {"value": 4}, "workers": {"denied_workers": ["gpt-x"]}}}
    )
    html = client_for(policy_admin).get(URL).content.decode()
    assert (
        'data-testid="platform-constraints.max_steps.value">Platform value it tightens: <code>4</code>'
        in html
    )
    assert "Platform value it tightens: <code>gpt-x</code>" in html
    platform = client_for(superuser).get("/policies/platform/").content.decode()
    assert "Platform value it tightens" not in platform


def test_switching_to_json_and_back_keeps_the_policy(policy_admin: Any, alpha: Any) -> None:
    c = client_for(policy_admin)
    posted = scrape(c.get(URL).content.decode())
    posted["f-constraints.max_parallel.value"] = ["2"]
    html = c.post(URL, {**posted, "action": "switch"}).content.decode()
    assert 'data-testid="spec-editor"' in html and 'name="editor_mode" value="json"' in html
    as_json = scrape(html)
    spec = json.loads(as_json["spec"][0])
    assert spec["constraints"]["max_parallel"]["value"] == 2
    back = c.post(URL, {**as_json, "action": "switch"}).content.decode()
    assert 'name="editor_mode" value="form"' in back
    assert scrape(back)["f-constraints.max_parallel.value"] == ["2"]


def test_read_only_members_get_disabled_inputs_and_a_named_refusal(owner: Any, alpha: Any) -> None:
    publish_policy(alpha, {"constraints": {"max_steps": {"value": 3}}})
    c = client_for(owner)
    html = c.get(URL).content.decode()
    assert "needs policies.change_policy" in html and 'data-testid="publish"' not in html
    resp = c.post(URL, {"action": "publish_draft", "draft_number": "1", "draft_digest": "x"})
    assert resp.status_code == 403
    assert "policies.change_policy" in resp.content.decode()
