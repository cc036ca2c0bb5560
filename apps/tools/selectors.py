"""Reads for tool servers and tools (issue 43)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet

from apps.tools.models import Tool, ToolApproval, ToolCall, ToolServer, ToolVersion


def servers_for_team(team: Any) -> QuerySet[ToolServer]:
    """A team's own servers and the platform's, with their tools and versions (the pool page)."""
    team_q = Q(team__isnull=True) if team is None else (Q(team=team) | Q(team__isnull=True))
    return (
        ToolServer.objects.filter(team_q)
        .select_related("team")
        .prefetch_related(
            Prefetch(
                "tools",
                queryset=Tool.objects.select_related("accepted_version").prefetch_related(
                    Prefetch("versions", queryset=ToolVersion.objects.order_by("-number"))
                ),
            )
        )
        .order_by("slug")
    )


def latest_version(tool: Tool) -> ToolVersion | None:
    return tool.versions.order_by("-number").first()


def usable_version(tool: Tool) -> ToolVersion | None:
    """The version calls run under: accepted, and still what the server last announced. A newer
    pending version (a changed description or schema) makes the tool unusable until accepted."""
    if not tool.present or not tool.server.enabled or tool.accepted_version_id is None:
        return None
    latest = latest_version(tool)
    if latest is None or latest.pk != tool.accepted_version_id:
        return None
    return latest


def tool_by_name(team: Any, qualified: str) -> Tool | None:
    """``<server slug>.<tool name>`` among the team's and the platform's servers."""
    slug, sep, name = qualified.partition(".")
    if not sep or not slug or not name:
        return None
    team_q = (
        Q(server__team__isnull=True)
        if team is None
        else (Q(server__team=team) | Q(server__team__isnull=True))
    )
    return (
        Tool.objects.filter(team_q, server__slug=slug, name=name)
        .select_related("server", "server__team")
        .first()
    )


STATUS_COLUMNS = (
    "succeeded",
    "failed",
    "refused",
    "blocked",
    "held",
    "pending_approval",
    "approved",
    "approval_refused",
    "approval_expired",
)
# ToolApproval.state -> column ("used" was approved, then ran).
APPROVAL_COLUMNS = {
    "approved": "approved",
    "used": "approved",
    "rejected": "approval_refused",
    "expired": "approval_expired",
}


def tool_call_counts(team_ids: list[int], start: Any, end: Any) -> list[dict[str, Any]]:
    """Per tool: calls by status in [start, end) for the given teams (the /insights/ table)."""
    rows: dict[str, dict[str, Any]] = {}
    for r in (
        ToolCall.objects.filter(team_id__in=team_ids, created_at__gte=start, created_at__lt=end)
        .values("qualified_name", "status")
        .annotate(n=Count("pk"))
        .order_by("qualified_name")
    ):
        row = rows.setdefault(
            r["qualified_name"], {"tool": r["qualified_name"], "total": 0, **dict.fromkeys(STATUS_COLUMNS, 0)}
        )
        row[r["status"]] = row.get(r["status"], 0) + r["n"]
        row["total"] += r["n"]
    # Approvals asked in the window, by what the approver (or the clock) decided.
    for a in (
        ToolApproval.objects.filter(team_id__in=team_ids, requested_at__gte=start, requested_at__lt=end)
        .values("qualified_name", "state")
        .annotate(n=Count("pk"))
    ):
        row = rows.setdefault(
            a["qualified_name"], {"tool": a["qualified_name"], "total": 0, **dict.fromkeys(STATUS_COLUMNS, 0)}
        )
        key = APPROVAL_COLUMNS.get(a["state"])
        if key:
            row[key] = row.get(key, 0) + a["n"]
    return list(rows.values())
