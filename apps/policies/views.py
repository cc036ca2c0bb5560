"""Policy UI: list, editor (+ test box), version history with diffs and rollback, budget page.

Views are thin: permissions come from `apps.governance.selectors`, reads from
`apps.policies.selectors`, writes from `apps.policies.services`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.policies import selectors
from apps.policies.budgets import budget_status
from apps.policies.dry_run import dry_run
from apps.policies.forms import PolicyEditForm, RollbackForm
from apps.policies.models import Policy, PolicyVersionStatus
from apps.policies.services import (
    effective_policy,
    policy_diff,
    policy_get_or_create,
    policy_publish,
    policy_rollback,
    policy_save_draft,
)
from apps.policies.spec import (
    MERGE_RULE_TEXT,
    EffectivePolicy,
    PolicySpec,
    SpecError,
    default_spec,
    iter_field_help,
    merge_specs,
    spec_to_dict,
    validate_spec,
)


def _team_or_404(user: Any, slug: str) -> Team:
    team = get_object_or_404(Team, slug=slug)
    if not gov.can_view_team(user, team):
        raise Http404("No such team.")  # do not reveal other teams' existence
    return team


def policy_list(request: HttpRequest) -> HttpResponse:
    return render(request, "policies/policy_list.html", {"rows": selectors.policy_rows_for(request.user)})


def _platform_spec() -> PolicySpec:
    platform = selectors.platform_policy()
    if platform is None or platform.current_version is None:
        return default_spec()
    spec, _ = validate_spec(platform.current_version.spec)
    return spec or default_spec()


def _summary(spec: PolicySpec) -> dict[str, Any]:
    """A structured, human-readable view of a spec for the editor's summary panel."""
    c, g = spec.constraints, spec.guardrails
    stages = []
    for stage in ("input", "step_output", "output"):
        checks = getattr(g, stage)
        enabled = []
        for name in ("secrets", "pii", "injection", "blocked_terms", "length", "json_schema", "model_judge"):
            cfg = getattr(checks, name)
            if cfg.enabled:
                enabled.append({"name": name, "action": cfg.action})
        stages.append({"stage": stage, "checks": enabled})
    return {"c": c, "budgets": spec.budgets, "stages": stages, "on_check_error": g.on_check_error}


def _can_view_policy_of(user: Any, team: Team | None, policy: Policy | None) -> bool:
    if policy is not None:
        return gov.can_view_policy(user, policy)
    return True if team is None else gov.can_view_team(user, team)


def _can_edit(user: Any, team: Team | None, policy: Policy | None) -> tuple[bool, bool]:
    """(may save drafts, may publish)."""
    if policy is not None:
        return gov.can_change_policy(user, policy), gov.can_publish_policy(user, policy)
    if team is None:
        ok = bool(getattr(user, "is_superuser", False))
        return ok, ok
    ok = gov.can_change_team_policy(user, team)
    return ok, ok


@require_http_methods(["GET", "POST"])
def policy_edit(request: HttpRequest, team_slug: str | None = None) -> HttpResponse:
    team = _team_or_404(request.user, team_slug) if team_slug else None
    policy = selectors.team_policy(team) if team is not None else selectors.platform_policy()
    if not _can_view_policy_of(request.user, team, policy):
        raise Http404("No such policy.")
    can_change, can_publish = _can_edit(request.user, team, policy)
    draft = selectors.policy_draft(policy)
    current = policy.current_version if policy is not None else None
    base = draft or current
    initial_spec = base.spec if base is not None else spec_to_dict(default_spec())
    spec_errors: list[Any] = []
    test_result = None
    candidate: PolicySpec | None = None

    if request.method == "POST":
        form = PolicyEditForm(request.POST)
        action = request.POST.get("action", "validate")
        if form.is_valid():
            data = form.cleaned_data["spec"]
            candidate, spec_errors = validate_spec(data)
            if action in ("save", "publish") and not can_change:
                raise PermissionDenied("You may not change this policy.")
            if action == "publish" and not can_publish:
                raise PermissionDenied("You may not publish this policy.")
            if candidate is not None and action in ("save", "publish"):
                try:
                    policy = policy_get_or_create(actor=request.user, team=team)
                    version = policy_save_draft(
                        actor=request.user, policy=policy, spec=data, note=form.cleaned_data["note"]
                    )
                    if action == "publish":
                        policy_publish(actor=request.user, version=version)
                        messages.success(request, f"Version {version.number} is published and in force.")
                    else:
                        messages.success(
                            request, f"Draft version {version.number} saved. Publish it to put it in force."
                        )
                except SpecError as err:
                    spec_errors = err.errors
                else:
                    return redirect(request.path)
            elif candidate is not None and action == "test":
                platform = _platform_spec()
                tested = EffectivePolicy(merge_specs(platform, candidate) if team is not None else candidate)
                test_result = dry_run(
                    tested,
                    prompt=form.cleaned_data["sample_prompt"] or "",
                    plan_text=form.cleaned_data["sample_plan"] or "",
                    infos=selectors.pool_worker_infos(team),
                    classification=form.cleaned_data["sample_classification"] or "",
                )
            elif candidate is not None:
                messages.info(request, "The policy is valid.")
    else:
        form = PolicyEditForm(initial={"spec": json.dumps(initial_spec, indent=2)})
        candidate, _ = validate_spec(initial_spec)

    effective = effective_policy(team) if team is not None else None
    context = {
        "team": team,
        "policy": policy,
        "draft": draft,
        "current": current,
        "form": form,
        "spec_errors": spec_errors,
        "can_change": can_change,
        "can_publish": can_publish,
        "field_help": list(iter_field_help()),
        "merge_rules": MERGE_RULE_TEXT,
        "summary": _summary(candidate) if candidate is not None else None,
        "effective_summary": _summary(effective.spec) if effective is not None else None,
        "effective": effective,
        "test_result": test_result,
    }
    return render(request, "policies/policy_edit.html", context)


def policy_history(request: HttpRequest, policy_id: int) -> HttpResponse:
    policy = get_object_or_404(Policy.objects.select_related("team", "current_version"), pk=policy_id)
    if not gov.can_view_policy(request.user, policy):
        raise Http404("No such policy.")
    versions = list(selectors.policy_versions(policy))
    by_number = {v.number: v for v in versions}
    a = _int(request.GET.get("a"))
    b = _int(request.GET.get("b"))
    if b is None and versions:
        b = versions[0].number
    if a is None and b is not None:
        older = [v.number for v in versions if v.number < b]
        a = older[0] if older else None
    va, vb = by_number.get(a) if a else None, by_number.get(b) if b else None
    diff = policy_diff(va, vb) if vb is not None else []
    context = {
        "policy": policy,
        "versions": versions,
        "a": a,
        "b": b,
        "va": va,
        "vb": vb,
        "diff": [{**d, "old_json": _j(d["old"]), "new_json": _j(d["new"])} for d in diff],
        "can_publish": gov.can_publish_policy(request.user, policy),
        "rollback_form": RollbackForm(),
        "rollbackable": {PolicyVersionStatus.PUBLISHED, PolicyVersionStatus.SUPERSEDED},
    }
    return render(request, "policies/policy_history.html", context)


def _j(value: Any) -> str:
    return "—" if value is None else json.dumps(value)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


@require_POST
def policy_rollback_view(request: HttpRequest, policy_id: int, number: int) -> HttpResponse:
    policy = get_object_or_404(Policy, pk=policy_id)
    if not gov.can_view_policy(request.user, policy):
        raise Http404("No such policy.")
    if not gov.can_publish_policy(request.user, policy):
        raise PermissionDenied("You may not publish this policy.")
    target = get_object_or_404(policy.versions, number=number)
    form = RollbackForm(request.POST)
    note = form.cleaned_data["note"] if form.is_valid() else ""
    try:
        new = policy_rollback(actor=request.user, policy=policy, to_version=target, note=note)
    except ValueError as err:
        messages.error(request, str(err))
    else:
        messages.success(
            request, f"Rolled back: version {new.number} (a copy of version {number}) is now in force."
        )
    return redirect("policies:policy_history", policy_id=policy.pk)


def budget_page(request: HttpRequest, team_slug: str) -> HttpResponse:
    team = _team_or_404(request.user, team_slug)
    effective = effective_policy(team)
    status = budget_status(team=team, effective=effective)
    now = status.now or datetime.now(UTC)
    rows = [
        {
            "w": w,
            "resets_in_h": round((w.resets_at - now).total_seconds() / 3600, 1),
        }
        for w in status.windows
    ]
    return render(
        request,
        "policies/budget.html",
        {"team": team, "rows": rows, "status": status, "effective": effective},
    )
