"""Reads for tool servers and tools (issue 43)."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, Q, QuerySet

from apps.tools.models import Tool, ToolServer, ToolVersion


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
