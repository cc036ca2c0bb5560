"""What the pool page shows about tool servers (a page helper: may read from any app)."""

from __future__ import annotations

from typing import Any

from apps.core.types import Viewer
from apps.tools import selectors
from apps.tools.models import VersionStatus
from apps.tools.services import can_manage_server


def tool_rows(team: Any, user: Viewer) -> list[dict[str, Any]]:
    rows = []
    for server in selectors.servers_for_team(team):
        tools = []
        for tool in server.tools.all():
            versions = list(tool.versions.all())
            latest = versions[0] if versions else None
            pending = latest if latest is not None and latest.status == VersionStatus.PENDING else None
            tools.append(
                {
                    "tool": tool,
                    "accepted": tool.accepted_version,
                    "pending": pending,
                    "usable": tool.present
                    and latest is not None
                    and tool.accepted_version_id == latest.pk
                    and server.enabled,
                }
            )
        rows.append(
            {
                "server": server,
                "tools": tools,
                "can_manage": can_manage_server(user, server),
                "credential_hint": masked_hint_for(server),
            }
        )
    return rows


def masked_hint_for(server: Any) -> str:
    if not server.credential_encrypted:
        return ""
    return f"•••• {server.credential_last4}" if server.credential_last4 else "••••"
