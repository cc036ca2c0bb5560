"""Policy UI: list, editor (+ test box), version history with diffs and rollback, budget page.

Views are thin: permissions come from `apps.governance.selectors`, reads from
`apps.policies.selectors`, writes from `apps.policies.services`.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, cast

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model, Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.core.types import Viewer
from apps.engine.types import WorkerInfo
from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.governance.visibility import is_platform_admin
from apps.policies import selectors
from apps.policies.budgets import budget_status
from apps.policies.dry_run import EFFECTS, RecordedRun, RecordedStep, dry_run, replay_runs
from apps.policies.editor import bind, build_sections, form_to_spec, normalised, short_value
from apps.policies.forms import PolicyEditForm, RollbackForm
from apps.policies.hooks import worker_output_history
from apps.policies.models import Policy, PolicyVersion, PolicyVersionStatus
from apps.policies.services import (
    effective_policy,
    policy_diff,
    policy_publish,
    policy_rollback,
    policy_save,
)
from apps.policies.spec import (
    MERGE_RULE_TEXT,
    EffectivePolicy,
    FieldError,
    PolicySpec,
    SpecError,
    default_spec,
    inert_fields,
    iter_field_help,
    merge_specs,
    parse_spec,
    shadowed_fields,
    spec_to_dict,
    validate_spec,
)
from apps.runs.models import Run
from apps.runs.selectors import run_content_visible  # the one content rule for held answers


def _team_or_404(user: Viewer, slug: str) -> Team:
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


def _platform_layer_name() -> str:
    """The layer a team's policy is overlaid on, by its version number (issue 42)."""
    platform = selectors.platform_policy()
    if platform is None or platform.current_version is None:
        return "the built-in platform defaults"
    return f"the platform default (v{platform.current_version.number})"


def _shadowed(team: Team | None, spec: PolicySpec | None) -> list[dict[str, str]]:
    """A team's fields the stricter platform layer overrides (flagged before publish and in the
    Summary, issue 42); none for the platform default itself."""
    if team is None or spec is None:
        return []
    return shadowed_fields(_platform_spec(), spec, winner=_platform_layer_name())


def _summary(spec: PolicySpec, *, shadowed: list[dict[str, str]] | None = None) -> dict[str, Any]:
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
    return {
        "c": c,
        "budgets": spec.budgets,
        "stages": stages,
        "on_check_error": g.on_check_error,
        "inert": inert_fields(spec),
        "shadowed": shadowed or [],
    }


def _draft_spec(draft: PolicyVersion | None) -> PolicySpec | None:
    if draft is None:
        return None
    try:
        return parse_spec(draft.spec)
    except ValueError:
        return None


def _draft_inert(draft: PolicyVersion | None) -> list[dict[str, str]]:
    """Inert fields of the draft under review (flagged before publish, issue 42)."""
    if draft is None:
        return []
    try:
        return inert_fields(parse_spec(draft.spec))
    except ValueError:
        return []


def _can_view_policy_of(user: Viewer, team: Team | None, policy: Policy | None) -> bool:
    if policy is not None:
        return Policy.objects.allows(user, "view", policy)
    return True if team is None else gov.can_view_team(user, team)


def _can_edit(user: Viewer, team: Team | None, policy: Policy | None) -> tuple[bool, bool]:
    """(may save drafts, may publish)."""
    if policy is not None:
        return Policy.objects.allows(user, "change", policy), Policy.objects.allows(user, "publish", policy)
    if team is None:
        ok = is_platform_admin(user)
        return ok, ok
    ok = gov.can_change_team_policy(user, team)
    return ok, ok


def _digest(spec: Any) -> str:
    """Fingerprint of a draft's spec: publishing from the review refuses a draft changed since."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _mode(request: HttpRequest) -> str:
    # A post without `editor_mode` is the JSON form (scripts and older clients post `spec`).
    if request.method == "POST":
        return "form" if request.POST.get("editor_mode") == "form" else "json"
    return "json" if request.GET.get("mode") == "json" else "form"


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
    mode = _mode(request)
    spec_errors: list[FieldError] = []
    test_result = None
    replay = None
    candidate: PolicySpec | None = None
    data: dict[str, Any] | None = None
    posted_values: Any = None  # raw form inputs, re-shown when the post did not validate

    if request.method == "POST":
        form = PolicyEditForm(request.POST)
        action = request.POST.get("action", "validate")
        # The refusal names what is missing: a permission on the team's policy, or the platform role.
        who = "platform administrators only" if team is None else "permission policies.{}_policy"
        if action in ("save", "review", "publish", "publish_draft") and not can_change:
            raise PermissionDenied(f"You may not change this policy ({who.format('change')}).")
        if action in ("publish", "publish_draft") and not can_publish:
            raise PermissionDenied(f"You may not publish this policy ({who.format('publish')}).")
        if action == "publish_draft":
            return _publish_draft(request, draft)
        if form.is_valid():
            if mode == "form":
                data, spec_errors = form_to_spec(request.POST)
                posted_values = request.POST
            else:
                data = form.cleaned_data["spec"]
            if not spec_errors:
                candidate, spec_errors = validate_spec(data)
            if candidate is None:
                pass  # nothing to act on: the field errors are shown with the form
            elif action == "switch":
                # Same policy, other editor: the form re-renders from the validated spec.
                mode, posted_values = ("json" if mode == "form" else "form"), None
                form = PolicyEditForm(
                    initial={
                        "spec": json.dumps(spec_to_dict(candidate), indent=2),
                        "note": form.cleaned_data["note"],
                    }
                )
            elif action in ("save", "review", "publish"):
                try:
                    # One transaction for policy, draft and publish (issue #16).
                    version = policy_save(
                        actor=request.user,
                        team=team,
                        spec=data,
                        note=form.cleaned_data["note"],
                        publish=action == "publish",
                    )
                    if action == "publish":
                        messages.success(request, f"Version {version.number} is published and in force.")
                    elif action == "review":
                        messages.info(
                            request,
                            f"Draft version {version.number} saved. Check the changes below, then publish.",
                        )
                    else:
                        messages.success(
                            request, f"Draft version {version.number} saved. Publish it to put it in force."
                        )
                except SpecError as err:
                    spec_errors = err.errors
                else:
                    suffix = "?mode=json" if mode == "json" else ""
                    anchor = "#publish-review" if action == "review" else ""
                    return redirect(request.path + suffix + anchor)
            elif action in ("test", "replay"):
                tested = _effective_candidate(team, candidate)
                if action == "test":
                    infos = selectors.pool_worker_infos(team)
                    test_result = dry_run(
                        tested,
                        prompt=form.cleaned_data["sample_prompt"] or "",
                        plan_text=form.cleaned_data["sample_plan"] or "",
                        infos=infos,
                        classification=form.cleaned_data["sample_classification"] or "",
                        history=worker_output_history([i.key for i in infos]),
                    )
                elif team is None:
                    spec_errors = [
                        FieldError("", "Replay runs over one team's past runs; open a team's policy.")
                    ]
                else:
                    limit = form.cleaned_data["replay_count"] or 50
                    replay = replay_runs(
                        current=effective_policy(team),
                        draft=tested,
                        runs=recorded_runs(user=request.user, team=team, limit=limit),
                    )
            else:
                messages.info(request, "The policy is valid.")
    else:
        form = PolicyEditForm(initial={"spec": json.dumps(initial_spec, indent=2), "replay_count": 50})
        candidate, _ = validate_spec(initial_spec)

    published = normalised(_spec_or_none(current.spec) if current is not None else default_spec())
    platform = normalised(_platform_spec()) if team is not None else None
    shown = normalised(candidate) if candidate is not None else (data or {})
    editor = bind(
        build_sections(),
        values=posted_values if spec_errors else None,
        spec=shown,
        published=published,
        platform=platform,
        errors=spec_errors,
    )
    effective = effective_policy(team) if team is not None else None
    draft_diff = policy_diff(current, draft) if draft is not None else []
    context = {
        "team": team,
        "policy": policy,
        "draft": draft,
        "draft_digest": _digest(draft.spec) if draft is not None else "",
        "draft_diff": [
            {**d, "old_text": short_value(d["old"]), "new_text": short_value(d["new"])} for d in draft_diff
        ],
        "draft_inert": _draft_inert(draft),
        "draft_shadowed": _shadowed(team, _draft_spec(draft)),
        "current": current,
        "form": form,
        "mode": mode,
        "editor": editor,
        "spec_errors": spec_errors,
        "can_change": can_change,
        "can_publish": can_publish,
        "field_help": list(iter_field_help()),
        "merge_rules": MERGE_RULE_TEXT,
        "summary": _summary(candidate, shadowed=_shadowed(team, candidate))
        if candidate is not None
        else None,
        "effective_summary": _summary(effective.spec) if effective is not None else None,
        "effective": effective,
        "test_result": test_result,
        "replay": replay,
        "effects": EFFECTS,
    }
    return render(request, "policies/policy_edit.html", context)


def _spec_or_none(raw: Any) -> PolicySpec | None:
    spec, _ = validate_spec(raw)
    return spec


def _effective_candidate(team: Team | None, candidate: PolicySpec) -> EffectivePolicy:
    """The candidate as it would be in force: a team's spec overlaid on the platform default."""
    if team is None:
        return EffectivePolicy(candidate)
    return EffectivePolicy(merge_specs(_platform_spec(), candidate), team_id=team.pk)


def _publish_draft(request: HttpRequest, draft: PolicyVersion | None) -> HttpResponse:
    """Publish the draft the user reviewed, and only if it is still the draft they saw."""
    number = _int(request.POST.get("draft_number"))
    if draft is None or draft.number != number or request.POST.get("draft_digest") != _digest(draft.spec):
        messages.error(
            request,
            "The draft changed since you reviewed it (or was published): check the changes again before publishing.",
        )
        return redirect(request.path + "#publish-review")
    try:
        policy_publish(actor=request.user, version=draft)
    except (SpecError, ValueError) as err:
        messages.error(request, f"Not published: {err}")
    else:
        messages.success(request, f"Version {draft.number} is published and in force.")
    return redirect(request.path)


REPLAY_MAX_RUNS = 200
_TERMINAL = ("succeeded", "failed", "blocked", "cancelled", "timed_out")  # runs.models.TERMINAL_RUN_STATUSES


def recorded_runs(*, user: Viewer, team: Any, limit: int) -> list[Any]:
    """The team's last ``limit`` finished runs that ``user`` may view, as replay inputs.

    Here rather than in selectors: it reads the runs app, which sits above policies (pages may
    read every app; the core may not, see the import contracts in pyproject.toml).

    Row visibility is the one rule (`Run.objects.visible_to(user, "view")`); whether the viewer may see a
    run's content (held answers) is `apps.runs.selectors.run_content_visible`, carried on each
    record so the replay page shows only rule names for withheld runs."""

    qs = Run.objects.visible_to(user, "view").filter(team=team, status__in=_TERMINAL)
    # RunEvent through the Run relation: this module names no model of the runs app.
    event_model = cast("type[Model]", qs.model._meta.get_field("events").related_model)
    runs = list(
        qs.select_related("team", "pool")
        .prefetch_related(
            "steps",
            Prefetch(
                "events",
                queryset=event_model._default_manager.filter(type="plan.proposed").order_by("seq"),
                to_attr="plan_events",
            ),
        )
        .order_by("-created_at")[: max(1, min(limit, REPLAY_MAX_RUNS))]
    )
    infos_by_pool: dict[int, tuple[WorkerInfo, ...]] = {}
    out = []
    for run in runs:
        if run.pool_id not in infos_by_pool:
            infos_by_pool[run.pool_id] = tuple(selectors.pool_infos(run.pool))
        plans: dict[int, dict[str, Any]] = {}
        for ev in run.plan_events:
            raw = getattr(ev, "data", None)
            data = raw if isinstance(raw, dict) else {}
            if isinstance(data.get("plan"), dict):
                plans[int(data.get("round") or 1)] = data["plan"]  # the last attempt of a round ran
        steps = sorted(run.steps.all(), key=lambda s: s.index)
        out.append(
            RecordedRun(
                run_id=str(run.pk),
                created_at=run.created_at,
                status=run.status,
                question=run.question,
                answer=run.answer,
                classification=run.classification,
                plans=tuple(sorted(plans.items())),
                steps=tuple(RecordedStep(s.index, s.round, s.worker_key, s.output) for s in steps),
                infos=infos_by_pool[run.pool_id],
                erased_at=run.payload_erased_at,
                content_visible=run_content_visible(user=user, run=run),
            )
        )
    return out


def policy_history(request: HttpRequest, policy_id: int) -> HttpResponse:
    policy = get_object_or_404(Policy.objects.select_related("team", "current_version"), pk=policy_id)
    if not Policy.objects.allows(request.user, "view", policy):
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
        "can_publish": Policy.objects.allows(request.user, "publish", policy),
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
    if not Policy.objects.allows(request.user, "view", policy):
        raise Http404("No such policy.")
    if not Policy.objects.allows(request.user, "publish", policy):
        raise PermissionDenied("You may not publish this policy.")
    target = get_object_or_404(policy.versions, number=number)
    form = RollbackForm(request.POST)
    note = form.cleaned_data["note"] if form.is_valid() else ""
    current = policy.current_version
    if request.POST.get("confirm") != _digest(target.spec):
        # Like publish (issue 42): a rollback shows what changes and asks before it acts; the
        # confirmation carries the target's fingerprint, so a stale page cannot confirm.
        diff = policy_diff(current, target)
        return render(
            request,
            "policies/rollback_confirm.html",
            {
                "policy": policy,
                "target": target,
                "current": current,
                "note": note,
                "confirm": _digest(target.spec),
                "diff": [
                    {**d, "old_text": short_value(d["old"]), "new_text": short_value(d["new"])} for d in diff
                ],
            },
        )
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
