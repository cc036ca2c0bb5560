"""Pool, worker and provider pages. Thin: visibility from the selectors (hidden → 404, visible but
not allowed → 403), writes through ``apps.workers.services``. Keys are never rendered: the
templates only ever see ``masked_hint`` and the key's source."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from apps.governance import selectors as gov
from apps.tools.pages import tool_rows
from apps.workers import selectors, services
from apps.workers.connection import ConnectionTestLimited, provider_connection_test
from apps.workers.forms import ExistingWorkerForm, PoolForm, ProviderForm, WorkerForm, apply_service_errors
from apps.workers.grants import teams_granted_pool
from apps.workers.models import Pool, Provider, ProviderKind, Worker
from apps.workers.secrets import key_status, masked_hint


def _visible_pool(request: HttpRequest, slug: str) -> Pool:
    return get_object_or_404(Pool.objects.visible_to(request.user, "view"), slug=slug)


def _editable_pool(request: HttpRequest, slug: str) -> Pool:
    pool = _visible_pool(request, slug)
    if not Pool.objects.allows(request.user, "change", pool):
        raise PermissionDenied("Only the owning team's admins and policy admins can change this pool.")
    return pool


def _bad(request: HttpRequest, template: str, ctx: dict[str, Any]) -> HttpResponse:
    return render(request, template, ctx, status=400)


# --- pools --------------------------------------------------------------------------------------


def pool_list(request: HttpRequest) -> HttpResponse:
    pools = selectors.pools_with_workers(Pool.objects.visible_to(request.user, "view"))
    usable = set(Pool.objects.visible_to(request.user, "use").values_list("pk", flat=True))
    rows = [
        {"pool": p, "health": selectors.pool_health(p, list(p.pool_workers.all())), "usable": p.pk in usable}
        for p in pools
    ]
    return render(
        request,
        "workers/pool_list.html",
        {"rows": rows, "can_create": gov.teams_configurable_by(request.user).exists()},
    )


def pool_detail(request: HttpRequest, slug: str) -> HttpResponse:
    pool = _visible_pool(request, slug)
    user = request.user
    pool_entries = selectors.pool_entries(pool)
    health = selectors.pool_health(pool, pool_entries)
    by_worker = {h.worker.pk: h for h in health.workers}
    entries = []
    for entry in pool_entries:
        w = entry.worker
        entries.append(
            {
                "entry": entry,
                "worker": w,
                "health": by_worker.get(w.pk) or selectors.worker_health(w),
                "can_edit": selectors.can_edit_worker(user, w),
                "can_test": selectors.can_test_worker(user, w),
            }
        )
    conductor = next((h for h in health.workers if h.role == "conductor"), None)
    by_role = {h.role: h for h in health.workers}
    unavailable = dict(health.presets_unavailable)
    preset_conductors = [
        {
            "preset": f"conductor-{preset}",
            "worker": getattr(pool, f"{preset}_conductor"),
            "health": by_role.get(f"conductor-{preset}"),
            "unavailable": unavailable.get(f"conductor-{preset}", ""),
        }
        for preset in ("mini", "ultra")
        if getattr(pool, f"{preset}_conductor_id")
    ]
    return render(
        request,
        "workers/pool_detail.html",
        {
            "pool": pool,
            "entries": entries,
            "health": health,
            "conductor": conductor,
            "preset_conductors": preset_conductors,
            "can_test_conductor": conductor is not None and selectors.can_test_worker(user, conductor.worker),
            "can_change": Pool.objects.allows(user, "change", pool),
            "can_use": Pool.objects.allows(user, "use", pool),
            "teams": teams_granted_pool(pool).filter(pk__in=gov.teams_visible_to(user).values("pk")),
            # Issue 43: the MCP tool servers the pool's team (and the platform) registered.
            "tool_servers": tool_rows(pool.team, user),
        },
    )


@require_http_methods(["GET", "POST"])
def pool_create(request: HttpRequest) -> HttpResponse:
    teams = gov.teams_configurable_by(request.user)
    if not teams.exists():
        raise PermissionDenied("Only team admins and policy admins can create pools.")
    form = PoolForm(
        request.POST or None,
        teams=teams,
        members=Worker.objects.none(),
        conductors=selectors.workers_editable_by(request.user),
    )
    if request.method == "POST" and form.is_valid():
        try:
            pool = services.pool_create(actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Pool “{pool.name}” created. Add its workers next.")
            return redirect("workers:pool_detail", slug=pool.slug)
    ctx = {"form": form, "title": "New pool"}
    return (
        _bad(request, "workers/form.html", ctx) if form.errors else render(request, "workers/form.html", ctx)
    )


@require_http_methods(["GET", "POST"])
def pool_edit(request: HttpRequest, slug: str) -> HttpResponse:
    pool = _editable_pool(request, slug)
    initial = {
        "name": pool.name,
        "description": pool.description,
        "default_worker": pool.default_worker_id,
        "conductor_worker": pool.conductor_worker_id,
        "mini_conductor": pool.mini_conductor_id,
        "ultra_conductor": pool.ultra_conductor_id,
        "enabled": pool.enabled,
    }
    current = [i for i in (pool.conductor_worker_id, pool.mini_conductor_id, pool.ultra_conductor_id) if i]
    # The pool's current conductors stay choosable even when the editor cannot edit them.
    conductors = (
        selectors.workers_editable_by(request.user) | Worker.objects.filter(pk__in=current)
    ).distinct()
    form = PoolForm(
        request.POST or None, initial=initial, members=pool.workers.all(), conductors=conductors, editing=True
    )
    if request.method == "POST" and form.is_valid():
        try:
            services.pool_update(actor=request.user, pool=pool, **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Pool “{pool.name}” saved.")
            return redirect("workers:pool_detail", slug=pool.slug)
    ctx = {"form": form, "title": f"Edit pool {pool.name}", "pool": pool}
    return (
        _bad(request, "workers/form.html", ctx) if form.errors else render(request, "workers/form.html", ctx)
    )


@require_http_methods(["GET", "POST"])
def pool_worker_add(request: HttpRequest, slug: str) -> HttpResponse:
    """Add a new worker (created here) or an existing one to the pool."""
    pool = _editable_pool(request, slug)
    user = request.user
    in_pool = pool.workers.values("pk")
    new_form = WorkerForm(
        request.POST if request.POST.get("mode") == "new" else None,
        providers=selectors.providers_editable_by(user),
        fallbacks=selectors.workers_editable_by(user),
        prefix="new",
    )
    existing_form = ExistingWorkerForm(
        request.POST if request.POST.get("mode") == "existing" else None,
        workers=selectors.workers_editable_by(user).exclude(pk__in=in_pool),
        prefix="existing",
    )
    if request.method == "POST":
        form = new_form if request.POST.get("mode") == "new" else existing_form
        if form.is_valid():
            try:
                with transaction.atomic():
                    if form is new_form:
                        worker = services.worker_create(actor=user, **new_form.service_kwargs())
                    else:
                        worker = existing_form.cleaned_data["worker"]
                    services.pool_add_worker(actor=user, pool=pool, worker=worker)
            except ValidationError as exc:
                apply_service_errors(form, exc)
            else:
                messages.success(request, f"“{worker.display_name}” added to {pool.name}.")
                return redirect("workers:pool_detail", slug=pool.slug)
    ctx = {"pool": pool, "new_form": new_form, "existing_form": existing_form}
    status = 400 if (new_form.errors or existing_form.errors) else 200
    return render(request, "workers/pool_worker_add.html", ctx, status=status)


@require_POST
def pool_worker_remove(request: HttpRequest, slug: str, worker_slug: str) -> HttpResponse:
    pool = _editable_pool(request, slug)
    worker = get_object_or_404(pool.workers, slug=worker_slug)
    try:
        services.pool_remove_worker(actor=request.user, pool=pool, worker=worker)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"“{worker.display_name}” removed from {pool.name}.")
    return redirect("workers:pool_detail", slug=pool.slug)


@require_POST
def pool_toggle(request: HttpRequest, slug: str) -> HttpResponse:
    pool = _editable_pool(request, slug)
    services.pool_update(actor=request.user, pool=pool, enabled=not pool.enabled)
    messages.success(request, f"Pool “{pool.name}” {'enabled' if pool.enabled else 'disabled'}.")
    return redirect("workers:pool_detail", slug=pool.slug)


# --- workers ------------------------------------------------------------------------------------


def _visible_worker(request: HttpRequest, slug: str) -> Worker:
    return get_object_or_404(selectors.workers_visible_to(request.user), slug=slug)


@require_http_methods(["GET", "POST"])
def worker_edit(request: HttpRequest, slug: str) -> HttpResponse:
    worker = _visible_worker(request, slug)
    if not selectors.can_edit_worker(request.user, worker):
        raise PermissionDenied("Only the owning team's admins and policy admins can change this worker.")
    initial = {f: getattr(worker, f) for f in services.WORKER_FIELDS if f not in ("tags", "fallback")}
    initial["tags"] = ", ".join(worker.tags or [])
    initial["fallback"] = worker.fallback_id
    form = WorkerForm(
        request.POST or None,
        initial=initial,
        providers=None,
        fallbacks=selectors.workers_editable_by(request.user).exclude(pk=worker.pk),
        editing=True,
    )
    if request.method == "POST" and form.is_valid():
        try:
            services.worker_update(actor=request.user, worker=worker, **form.service_kwargs())
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Worker “{worker.display_name}” saved.")
            return redirect(_next_url(request) or "workers:pool_list")
    ctx = {
        "form": form,
        "title": f"Edit worker {worker.display_name}",
        "worker": worker,
        "next": _next_url(request),
    }
    return (
        _bad(request, "workers/form.html", ctx) if form.errors else render(request, "workers/form.html", ctx)
    )


def _next_url(request: HttpRequest) -> str | None:
    nxt = request.POST.get("next") or request.GET.get("next")
    if nxt and url_has_allowed_host_and_scheme(
        nxt, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return nxt
    return None


@require_POST
def worker_test(request: HttpRequest, slug: str) -> HttpResponse:
    """Test connection: a tiny real request through the provider; result in plain words."""
    worker = _visible_worker(request, slug)
    if not selectors.can_test_worker(request.user, worker):
        raise PermissionDenied("Only those who configure this worker can test its connection.")
    result = services.worker_health_check(actor=request.user, worker=worker)
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse(
            {"status": result.status, "latency_ms": result.latency_ms, "detail": result.detail}
        )
    text = f"{worker.display_name}: {result.detail}"
    if result.latency_ms is not None:
        text += f" ({result.latency_ms:.0f} ms)"
    (messages.success if result.status == "ok" else messages.warning)(request, text)
    return redirect(_next_url(request) or "workers:pool_list")


# --- providers ----------------------------------------------------------------------------------


def provider_list(request: HttpRequest) -> HttpResponse:
    user = request.user
    rows = []
    for p in selectors.providers_visible_to(user).select_related("team"):
        status = key_status(p)
        rows.append(
            {
                "provider": p,
                "hint": masked_hint(p),
                "source": status.source,
                "available": status.available,
                "reason": status.reason,
                "can_edit": selectors.can_edit_provider(user, p),
            }
        )
    return render(
        request,
        "workers/provider_list.html",
        {"rows": rows, "can_create": gov.teams_configurable_by(user).exists()},
    )


def _provider_form_response(
    request: HttpRequest, form: ProviderForm, ctx: dict[str, Any], *, status: int | None = None
) -> HttpResponse:
    ctx = {**ctx, "form": form, "provider_form": True, "selected_kind": form.selected_kind()}
    if status is None:
        status = 400 if form.errors else 200
    return render(request, "workers/provider_form.html", ctx, status=status)


def _wants_json(request: HttpRequest) -> bool:
    return request.headers.get("Accept", "").startswith("application/json")


def _test_connection(
    request: HttpRequest, form: ProviderForm, ctx: dict[str, Any], *, team: Any, stored: Provider | None
) -> HttpResponse:
    """ "Test connection" on the unsaved form: JSON for the page's script, the page otherwise."""
    as_json = _wants_json(request)
    if not form.is_valid():
        if as_json:
            return JsonResponse({"ok": False, "errors": form.errors.get_json_data()}, status=400)
        return _provider_form_response(request, form, ctx)
    data = form.cleaned_data
    try:
        result = provider_connection_test(
            actor=request.user,
            team=team if stored is None else stored.team,
            kind=data.get("kind") or (stored.kind if stored is not None else ""),
            base_url=data.get("base_url") or "",
            api_key=data.get("api_key") or "",
            api_key_env=data.get("api_key_env") or "",
            model_path=data.get("model_path") or "",
            model=data.get("test_model") or "",
            stored=stored,
        )
    except ValidationError as exc:
        apply_service_errors(form, exc)
        if as_json:
            return JsonResponse({"ok": False, "errors": form.errors.get_json_data()}, status=400)
        return _provider_form_response(request, form, ctx)
    except ConnectionTestLimited as exc:
        if as_json:
            return JsonResponse({"ok": False, "stage": "rate_limit", "detail": str(exc)}, status=429)
        return _provider_form_response(request, form, {**ctx, "test_refused": str(exc)}, status=429)
    payload = {
        "ok": result.ok,
        "stage": result.stage,
        "detail": result.detail,
        "latency_ms": result.latency_ms,
        "model": result.model,
    }
    if as_json:
        return JsonResponse(payload)
    return _provider_form_response(request, form, {**ctx, "test_result": payload}, status=200)


@require_http_methods(["GET", "POST"])
def provider_create(request: HttpRequest) -> HttpResponse:
    teams = gov.teams_configurable_by(request.user)
    if not teams.exists():
        raise PermissionDenied("Only team admins and policy admins can add providers.")
    action = request.POST.get("action", "save")
    initial = {"kind": request.GET.get("kind")} if request.GET.get("kind") in ProviderKind.values else {}
    form = ProviderForm(
        request.POST or None,
        teams=teams,
        initial=initial,
        can_set_key_env=selectors.can_set_key_env(request.user),
    )
    ctx: dict[str, Any] = {"title": "New provider"}
    if request.method == "POST" and action == "kind":
        # Without JavaScript: show the chosen kind's fields, nothing checked or saved yet.
        return _provider_form_response(
            request,
            ProviderForm(
                initial=request.POST.dict(),
                teams=teams,
                can_set_key_env=selectors.can_set_key_env(request.user),
            ),
            ctx,
        )
    if request.method == "POST" and action == "test":
        team = form.cleaned_data.get("team") if form.is_valid() else None
        return _test_connection(request, form, ctx, team=team, stored=None)
    if request.method == "POST" and form.is_valid():
        try:
            provider = services.provider_create(actor=request.user, **form.service_kwargs())
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Provider “{provider.name}” added.")
            return redirect("workers:provider_list")
    return _provider_form_response(request, form, ctx)


@require_http_methods(["GET", "POST"])
def provider_edit(request: HttpRequest, slug: str) -> HttpResponse:
    provider: Provider = get_object_or_404(selectors.providers_visible_to(request.user), slug=slug)
    if not selectors.can_edit_provider(request.user, provider):
        raise PermissionDenied("Only the owning team's admins and policy admins can change this provider.")
    initial = {k: getattr(provider, k) for k in ("name", "kind", "base_url", "model_path", "api_key_env")}
    if request.GET.get("kind") in ProviderKind.values:
        initial["kind"] = request.GET["kind"]
    action = request.POST.get("action", "save")
    can_env = selectors.can_set_key_env(request.user) or bool(provider.api_key_env)
    form = ProviderForm(
        request.POST or None,
        initial=initial,
        editing=True,
        current_kind=provider.kind,
        can_set_key_env=can_env,
    )
    ctx: dict[str, Any] = {
        "title": f"Edit provider {provider.name}",
        "provider": provider,
        "hint": masked_hint(provider),
    }
    if request.method == "POST" and action == "kind":
        unbound = ProviderForm(
            initial={**initial, **request.POST.dict()},
            editing=True,
            current_kind=provider.kind,
            can_set_key_env=can_env,
        )
        return _provider_form_response(request, unbound, ctx)
    if request.method == "POST" and action == "test":
        return _test_connection(request, form, ctx, team=provider.team, stored=provider)
    if request.method == "POST" and form.is_valid():
        try:
            services.provider_update(actor=request.user, provider=provider, **form.service_kwargs())
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Provider “{provider.name}” saved.")
            return redirect("workers:provider_list")
    return _provider_form_response(request, form, ctx)
