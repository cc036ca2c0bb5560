"""From a registered server to what ``apps.engine.toolclient`` needs: the only place that
decrypts a tool server's credential (through ``apps.workers.secrets``)."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from apps.engine.toolclient import ToolServerSpec
from apps.tools.models import ToolServer, Transport
from apps.workers.egress import static_url_refusal
from apps.workers.secrets import decrypt


def stdio_command_refusal(command: list[str]) -> str | None:
    """Why ``command`` may not be started as a stdio server, or None. Checked at registration and
    again before every start, so a row stored before the rule changed cannot run anything else."""
    if not command or not all(isinstance(a, str) and a and "\x00" not in a for a in command):
        return "Give the command as a non-empty list of arguments."
    allowed = {str(c).strip() for c in getattr(settings, "MCP_STDIO_COMMANDS", []) or [] if str(c).strip()}
    exe = command[0]
    if not os.path.isabs(exe):
        return "The executable must be an absolute path."
    if exe not in allowed:
        return (
            f"The executable {Path(exe).name} is not allowed: only the executables in "
            "MCP_STDIO_COMMANDS may run as stdio tool servers."
        )
    return None


class ServerUnusable(Exception):
    """The server may not be contacted now; ``str`` names the rule."""


def server_spec(server: ToolServer) -> ToolServerSpec:
    timeout = float(getattr(settings, "MCP_CALL_TIMEOUT_S", 30.0))
    secret = decrypt(server.credential_encrypted) if server.credential_encrypted else ""
    if server.transport == Transport.HTTP:
        refusal = static_url_refusal(server.url)
        if refusal:
            raise ServerUnusable(refusal)
        headers: dict[str, str] = {}
        if secret:
            name = server.credential_name or "Authorization"
            headers[name] = f"Bearer {secret}" if name.lower() == "authorization" else secret
        return ToolServerSpec(transport="http", url=server.url, headers=headers, timeout_s=timeout)
    command = list(server.command or [])
    refusal = stdio_command_refusal(command)
    if refusal:
        raise ServerUnusable(refusal)
    env: dict[str, str] = {}
    if secret:
        env[server.credential_name or "MCP_SERVER_TOKEN"] = secret
    return ToolServerSpec(transport="stdio", command=tuple(command), env=env, timeout_s=timeout)
