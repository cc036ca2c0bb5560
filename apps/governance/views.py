"""Team pages: list, detail with members and pools, membership and default-pool changes.

Thin: visibility from ``apps.governance.selectors`` (a team you cannot see is a 404, an action you
may not take on a team you can see is a 403); writes through ``apps.governance.services``.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.governance import selectors as sel
from apps.governance import services
from apps.governance.forms import (
    DefaultPoolForm,
    MemberAddForm,
    MemberRoleForm,
    TeamCreateForm,
    apply_service_errors,
)
from apps.governance.models import Membership, Role, Team
from apps.governance.visibility import is_platform_admin
from apps.workers.engine_adapter import pool_unavailable_reason
from apps.workers.grants import pools_granted_to


def _visible_team(request: HttpRequest, slug: str) -> Team:
    return get_object_or_404(sel.teams_visible_to(request.user), slug=slug)


def _managed_team(request: HttpRequest, slug: str) -> Team:
    team = _visible_team(request, slug)
    if not sel.can_manage_team(request.user, team):
        raise PermissionDenied("Only the team's admins can change its members and settings.")
    return team


def team_list(request: HttpRequest) -> HttpResponse:
    teams = (
        sel.teams_visible_to(request.user)
        .annotate(member_count=Count("memberships"))
        .select_related("default_pool")
    )
    roles = dict(sel.memberships_of(request.user).values_list("team_id", "role"))
    rows = [
        {"team": t, "role": roles.get(t.pk), "role_label": Role(roles[t.pk]).label if t.pk in roles else ""}
        for t in teams
    ]
    return render(
        request,
        "governance/team_list.html",
        {"rows": rows, "can_create": is_platform_admin(request.user), "form": TeamCreateForm()},
    )


@require_http_methods(["GET", "POST"])
def team_create(request: HttpRequest) -> HttpResponse:
    if not is_platform_admin(request.user):
        raise PermissionDenied("Only platform administrators can create teams.")
    form = TeamCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            team = services.team_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Team “{team.name}” created.")
            return redirect("governance:team_detail", slug=team.slug)
    return render(request, "governance/team_create.html", {"form": form}, status=400 if form.errors else 200)


def _detail_context(request: HttpRequest, team: Team) -> dict:
    can_manage = sel.can_manage_team(request.user, team)
    pools = pools_granted_to(team).select_related("team")
    return {
        "team": team,
        "members": sel.team_members(team),
        "pools": [{"pool": p, "unavailable": pool_unavailable_reason(p)} for p in pools],
        "can_manage": can_manage,
        "my_role": sel.role_in(request.user, team),
        "roles": Role.choices,
        "add_form": MemberAddForm(),
        "default_form": DefaultPoolForm(pools=pools, initial={"pool": team.default_pool_id}),
    }


def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    team = _visible_team(request, slug)
    return render(request, "governance/team_detail.html", _detail_context(request, team))


def _rerender(request: HttpRequest, team: Team, **overrides: object) -> HttpResponse:
    ctx = _detail_context(request, team)
    ctx.update(overrides)
    return render(request, "governance/team_detail.html", ctx, status=400)


@require_POST
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    team = _managed_team(request, slug)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            services.membership_set(
                actor=request.user, team=team, user=form.cleaned_data["user"], role=form.cleaned_data["role"]
            )
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(
                request,
                f"{form.cleaned_data['username']} is now {Role(form.cleaned_data['role']).label.lower()} of {team.name}.",
            )
            return redirect("governance:team_detail", slug=team.slug)
    return _rerender(request, team, add_form=form)


@require_POST
def member_role(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    team = _managed_team(request, slug)
    membership = get_object_or_404(Membership, team=team, user_id=user_id)
    form = MemberRoleForm(request.POST)
    if form.is_valid():
        try:
            services.membership_set(
                actor=request.user, team=team, user=membership.user, role=form.cleaned_data["role"]
            )
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
        else:
            messages.success(
                request,
                f"{membership.user.get_username()} is now {Role(form.cleaned_data['role']).label.lower()}.",
            )
    else:
        messages.error(request, " ".join(str(e) for errs in form.errors.values() for e in errs))
    return redirect("governance:team_detail", slug=team.slug)


@require_POST
def member_remove(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    team = _managed_team(request, slug)
    user = get_object_or_404(get_user_model(), pk=user_id, memberships__team=team)
    try:
        services.membership_remove(actor=request.user, team=team, user=user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"{user.get_username()} was removed from {team.name}.")
    return redirect("governance:team_detail", slug=team.slug)


@require_POST
def default_pool(request: HttpRequest, slug: str) -> HttpResponse:
    team = _managed_team(request, slug)
    form = DefaultPoolForm(request.POST, pools=pools_granted_to(team))
    if form.is_valid():
        try:
            services.team_set_default_pool(actor=request.user, team=team, pool=form.cleaned_data["pool"])
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, "Default pool saved.")
            return redirect("governance:team_detail", slug=team.slug)
    return _rerender(request, team, default_form=form)
