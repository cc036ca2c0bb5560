"""Tool server pages: discover a server's tools and accept a version (issue 43). Thin: the
services decide permissions and write the audit rows."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from apps.governance import selectors as gov
from apps.governance.forms import apply_service_errors
from apps.tools import approvals, services
from apps.tools.forms import ToolServerForm
from apps.tools.models import ToolServer, ToolVersion


def _back(request: HttpRequest) -> HttpResponse:
    nxt = request.POST.get("next") or ""
    if nxt and url_has_allowed_host_and_scheme(
        nxt, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(nxt)
    return redirect("workers:pool_list")


def _messages(err: ValidationError) -> str:
    return " ".join(str(m) for m in err.messages)


@require_http_methods(["GET", "POST"])
def server_create(request: HttpRequest) -> HttpResponse:
    teams = gov.teams_configurable_by(request.user)
    if not teams.exists():
        raise PermissionDenied("Only team admins and policy admins can register tool servers.")
    form = ToolServerForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        data["credential"] = data.get("credential") or None
        try:
            server = services.tool_server_register(actor=request.user, **data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Tool server “{server.name}” registered: discover its tools next.")
            pool = server.team.default_pool if server.team_id and server.team else None
            return redirect("workers:pool_detail", pool.slug) if pool else redirect("workers:pool_list")
    ctx = {"form": form, "title": "Register a tool server (MCP)"}
    return render(request, "workers/form.html", ctx, status=400 if form.errors else 200)


@require_POST
def server_discover(request: HttpRequest, slug: str) -> HttpResponse:
    server = get_object_or_404(ToolServer.objects.visible_to(request.user, "view"), slug=slug)
    if not services.can_manage_server(request.user, server):
        raise PermissionDenied("You cannot manage this tool server.")
    try:
        created = services.tool_server_discover(actor=request.user, server=server)
    except ValidationError as err:
        messages.error(request, _messages(err))
    else:
        messages.success(
            request,
            f"{len(created)} new tool version(s) waiting for acceptance." if created else "No tool changed.",
        )
    return _back(request)


@require_POST
def version_accept(request: HttpRequest, pk: int) -> HttpResponse:
    servers = ToolServer.objects.visible_to(request.user, "view")
    version = get_object_or_404(
        ToolVersion.objects.select_related("tool__server"), pk=pk, tool__server__in=servers
    )
    try:
        services.tool_version_accept(actor=request.user, version=version)
    except ValidationError as err:
        messages.error(request, _messages(err))
    else:
        messages.success(request, f"Accepted {version.tool.qualified_name} v{version.number}.")
    return _back(request)


def approval_desk(request: HttpRequest) -> HttpResponse:
    """Tool calls waiting for an approver the user may be (the desk)."""
    rows = list(approvals.approvals_for_desk(request.user))
    return render(request, "tools/approvals.html", {"rows": rows})


@require_POST
def approval_decide(request: HttpRequest, pk: int) -> HttpResponse:
    approval = get_object_or_404(approvals.approvals_for_desk(request.user), pk=pk)
    decision = request.POST.get("decision")
    if decision not in ("approve", "reject"):
        messages.error(request, "Choose approve or reject.")
        return redirect("tools:approval_desk")
    try:
        approvals.tool_approval_decide(
            actor=request.user,
            approval=approval,
            approve=decision == "approve",
            note=request.POST.get("note", ""),
        )
    except approvals.ToolApprovalError as err:
        messages.error(request, f"{err} ({err.rule})")
    else:
        messages.success(request, f"{approval.qualified_name}: {decision}d.")
    return redirect("tools:approval_desk")
