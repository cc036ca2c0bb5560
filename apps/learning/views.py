"""The team's router page: versions, arm counts, recent decisions ("why this arm") and the
freeze / rollback / reset / snapshot buttons (team admins only; refusals name the permission)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.learning import selectors
from apps.learning.services import (
    RouterError,
    live_router,
    router_freeze,
    router_reset,
    router_rollback,
    router_snapshot,
)


def _team_for_admin(request: HttpRequest, slug: str) -> Team:
    team = gov.teams_visible_to(request.user).filter(slug=slug).first()
    if team is None:
        raise Http404("No such team.")
    if not gov.can_manage_team(request.user, team):
        raise PermissionDenied("The router page needs the manage_team permission (team admins).")
    return team


def router_page(request: HttpRequest, team_slug: str) -> HttpResponse:
    team = _team_for_admin(request, team_slug)
    return render(
        request,
        "learning/team.html",
        {
            "team": team,
            "live": live_router(team.pk),
            "versions": selectors.router_versions(team)[:50],
            "arm_counts": selectors.arm_counts(team),
            "explored_share": selectors.explored_share(team),
            "decisions": selectors.recent_decisions(team),
        },
    )


@require_POST
def router_action(request: HttpRequest, team_slug: str) -> HttpResponse:
    team = _team_for_admin(request, team_slug)
    action = request.POST.get("action", "")
    try:
        if action in ("freeze", "unfreeze"):
            router_freeze(actor=request.user, team=team, frozen=action == "freeze")
        elif action == "snapshot":
            router_snapshot(actor=request.user, team=team)
        elif action == "reset":
            router_reset(actor=request.user, team=team)
        elif action == "rollback":
            raw = request.POST.get("version", "")
            if not raw.isdigit():
                return HttpResponse("version: a version number is required.", status=400)
            router_rollback(actor=request.user, team=team, version=int(raw))
        else:
            return HttpResponse("action: one of freeze, unfreeze, snapshot, reset, rollback.", status=400)
    except RouterError as exc:
        return HttpResponse(str(exc), status=400)
    messages.success(request, f"Router: {action} done.")
    return redirect("learning:router", team_slug=team.slug)
