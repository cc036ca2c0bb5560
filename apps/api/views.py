"""Team API key pages: ``/teams/<slug>/keys/`` (list, create, revoke). Team admins only."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from apps.api.budgets import key_windows
from apps.api.forms import ApiKeyBudgetForm, ApiKeyCreateForm
from apps.api.models import ApiKey
from apps.api.services import apikey_create, apikey_revoke, apikey_set_budget
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
                    budget_period=form.cleaned_data["budget_period"] or "monthly",
                    budget_soft_usd=form.cleaned_data["budget_soft_usd"],
                    budget_hard_usd=form.cleaned_data["budget_hard_usd"],
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
    # The plaintext is in this response only: never cache it, and say 400 when the form failed.
    status = 400 if request.method == "POST" and created is None else 200
    return _render_list(request, team, form=form, created=created, status=status)


def _render_list(
    request: HttpRequest,
    team: Any,
    *,
    form: ApiKeyCreateForm,
    created: Any = None,
    status: int = 200,
    budget_form: tuple[int, ApiKeyBudgetForm] | None = None,
) -> HttpResponse:
    keys = list(
        ApiKey.objects.filter(team=team).select_related("created_by").prefetch_related("allowed_pools")
    )
    windows = key_windows([k for k in keys if k.revoked_at is None])
    rows = []
    for key in keys:
        if budget_form is not None and budget_form[0] == key.pk:
            bform = budget_form[1]
        else:
            bform = ApiKeyBudgetForm(
                initial={
                    "budget_period": key.budget_period,
                    "budget_soft_usd": key.budget_soft_usd,
                    "budget_hard_usd": key.budget_hard_usd,
                },
                prefix=f"k{key.pk}",
            )
        rows.append({"key": key, "window": windows.get(key.pk), "budget_form": bform})
    return render(
        request,
        "api/key_list.html",
        {"team": team, "keys": keys, "rows": rows, "form": form, "created": created},
        status=status,
    )


@require_POST
def key_budget(request: HttpRequest, slug: str, key_id: int) -> HttpResponse:
    """Set one key's dollar budgets (audited as ``apikey.budget_changed``)."""
    team = _managed_team(request, slug)
    key = get_object_or_404(ApiKey, pk=key_id, team=team)
    form = ApiKeyBudgetForm(request.POST, prefix=f"k{key.pk}")
    if form.is_valid():
        try:
            apikey_set_budget(
                actor=request.user,
                api_key=key,
                period=form.cleaned_data["budget_period"],
                soft_usd=form.cleaned_data["budget_soft_usd"],
                hard_usd=form.cleaned_data["budget_hard_usd"],
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, f"Saved the budget of the key “{key.name}” ({key.prefix}).")
            return redirect("api:key_list", slug=team.slug)
    pools = pools_granted_to(team).order_by("slug")
    return _render_list(
        request, team, form=ApiKeyCreateForm(pools=pools), status=400, budget_form=(key.pk, form)
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
