"""Team API key pages: ``/teams/<slug>/keys/`` (list, create, revoke). Team admins only."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from apps.api.forms import ApiKeyCreateForm
from apps.api.models import ApiKey
from apps.api.services import apikey_create, apikey_revoke
from apps.governance import selectors as gov
from apps.workers.grants import pools_granted_to


def _managed_team(request: HttpRequest, slug: str) -> Any:
    """The team if the user manages it; 404 if they cannot see it at all, 403 if only see it."""
    team = gov.teams_visible_to(request.user).filter(slug=slug).first()
    if team is None:
        raise Http404("No such team.")
    if not gov.can_manage_team(request.user, team):
        raise PermissionDenied("Only the team's admins manage its API keys.")
    return team


@never_cache
@require_http_methods(["GET", "POST"])
def key_list(request: HttpRequest, slug: str) -> HttpResponse:
    team = _managed_team(request, slug)
    pools = pools_granted_to(team).order_by("slug")
    created = None
    if request.method == "POST":
        form = ApiKeyCreateForm(request.POST, pools=pools)
        if form.is_valid():
            try:
                created = apikey_create(
                    actor=request.user,
                    team=team,
                    name=form.cleaned_data["name"],
                    scopes=form.cleaned_data["scopes"],
                    expires_at=form.cleaned_data["expires_at"],
                    allowed_pools=form.cleaned_data["allowed_pools"],
                    requests_per_minute=form.cleaned_data["requests_per_minute"],
                    tokens_per_minute=form.cleaned_data["tokens_per_minute"],
                )
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, errors)
            except PermissionDenied as exc:  # a scope beyond the creator's role: say which
                form.add_error("scopes", str(exc))
            else:
                form = ApiKeyCreateForm(pools=pools)
    else:
        form = ApiKeyCreateForm(pools=pools)
    keys = ApiKey.objects.filter(team=team).select_related("created_by").prefetch_related("allowed_pools")
    # The plaintext is in this response only: never cache it, and say 400 when the form failed.
    status = 400 if request.method == "POST" and created is None else 200
    return render(
        request,
        "api/key_list.html",
        {"team": team, "keys": keys, "form": form, "created": created},
        status=status,
    )


@require_POST
def key_revoke(request: HttpRequest, slug: str, key_id: int) -> HttpResponse:
    team = _managed_team(request, slug)
    key = get_object_or_404(ApiKey, pk=key_id, team=team)
    already = key.revoked_at is not None
    apikey_revoke(actor=request.user, api_key=key)
    if already:
        messages.info(request, f"The key “{key.name}” ({key.prefix}) was already revoked.")
    else:
        messages.success(request, f"Revoked the key “{key.name}” ({key.prefix}). It stops working now.")
    return redirect("api:key_list", slug=team.slug)
