"""Tool server writes: register, discover (versions), accept. Each write is one transaction with
its audit row; the credential is represented only by ``credential_set``/``credential_last4``.

``actor=None`` is the system (seeding, tests)."""

from __future__ import annotations

import time
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, stored_user
from apps.engine.toolclient import DiscoveredTool, ToolServerError, list_tools
from apps.governance.models import Team
from apps.governance.selectors import can_configure_team
from apps.governance.visibility import is_platform_admin
from apps.tools.connect import ServerUnusable, server_spec, stdio_command_refusal
from apps.tools.models import ServerHealth, Tool, ToolServer, ToolVersion, Transport, VersionStatus
from apps.workers.egress import base_url_refusal, egress_policy, url_shape_refusal
from apps.workers.secrets import encrypt, last4

# Header names a credential may not be sent in: they would change how the request is routed.
_FORBIDDEN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "cookie"})


def server_snapshot(s: ToolServer) -> dict[str, Any]:
    return {
        "slug": s.slug,
        "name": s.name,
        "team": s.team.slug if s.team_id and s.team else None,
        "transport": s.transport,
        "url": s.url,
        "command": list(s.command or []),
        "credential_name": s.credential_name,
        "credential_set": bool(s.credential_encrypted),
        "credential_last4": s.credential_last4,
        "enabled": s.enabled,
    }


def version_snapshot(v: ToolVersion) -> dict[str, Any]:
    return {
        "tool": v.tool.qualified_name,
        "version": v.number,
        "digest": v.digest,
        "description": v.description,
        "input_schema": v.input_schema,
        "status": v.status,
    }


def can_manage_server(actor: Actor, server: ToolServer) -> bool:
    if server.transport == Transport.STDIO or server.team_id is None:
        return is_platform_admin(actor)
    return can_configure_team(actor, server.team)


def _check_manage(actor: Actor, team: Team | None, transport: str) -> None:
    if actor is None:
        return
    if transport == Transport.STDIO and not is_platform_admin(actor):
        # A stdio server is a command on this host: a platform decision, like a key's env name.
        raise PermissionDenied(
            "Only platform administrators may register a stdio tool server (it runs a command)."
        )
    if team is None and not is_platform_admin(actor):
        raise PermissionDenied("Only platform administrators can manage platform tool servers.")
    if team is not None and not can_configure_team(actor, team):
        raise PermissionDenied(f"You cannot manage tool servers of {team.name}.")


def tool_server_register(
    *,
    actor: Actor,
    slug: str,
    name: str,
    transport: str,
    team: Team | None = None,
    url: str = "",
    command: list[str] | None = None,
    credential: str | None = None,
    credential_name: str = "",
) -> ToolServer:
    """Register a server (nothing is contacted yet: ``tool_server_discover`` lists its tools)."""
    _check_manage(actor, team, transport)
    errors: dict[str, list[str]] = {}
    if not slug or slugify(slug) != slug or "." in slug:
        errors.setdefault("slug", []).append("Use lowercase letters, digits and hyphens only.")
    elif ToolServer.objects.filter(slug=slug).exists():
        errors.setdefault("slug", []).append(f"The slug “{slug}” is already taken.")
    if not name.strip():
        errors.setdefault("name", []).append("Give the server a name.")
    url = url.strip()
    command = list(command or [])
    if transport == Transport.HTTP:
        if not url.startswith(("http://", "https://")):
            errors.setdefault("url", []).append("The URL must start with http:// or https://.")
        else:
            # The same egress rule as a provider's base URL (EGRESS_ALLOW), checked again per connection.
            refusal = base_url_refusal(url) if actor is not None else url_shape_refusal(url)
            if refusal:
                errors.setdefault("url", []).append(refusal)
        command = []
    elif transport == Transport.STDIO:
        refusal = stdio_command_refusal(command)
        if refusal:
            errors.setdefault("command", []).append(refusal)
        url = ""
    else:
        errors.setdefault("transport", []).append("Choose http or stdio.")
    credential_name = credential_name.strip() or (
        "Authorization" if transport == Transport.HTTP else "MCP_SERVER_TOKEN"
    )
    if not credential_name.replace("-", "").replace("_", "").isalnum() or (
        credential_name.lower() in _FORBIDDEN_HEADERS
    ):
        errors.setdefault("credential_name", []).append("Use a plain header or variable name.")
    if (
        credential is not None
        and credential != ""
        and (len(credential) < 8 or any(c.isspace() for c in credential))
    ):
        errors.setdefault("credential", []).append(
            "That does not look like a token (8+ characters, no spaces)."
        )
    if errors:
        raise ValidationError(errors)
    server = ToolServer(
        team=team,
        slug=slug,
        name=name.strip(),
        transport=transport,
        url=url,
        command=command,
        credential_name=credential_name,
    )
    if credential:
        server.credential_encrypted = encrypt(credential)
        server.credential_last4 = last4(credential)
    with transaction.atomic():
        server.save()
        audit_record(
            event_type=AuditEventType.TOOL_SERVER_REGISTERED,
            actor=actor,
            team=team,
            obj=server,
            after=server_snapshot(server),
        )
    return server


def record_health(server: ToolServer, *, ok: bool, detail: str, latency_ms: float | None) -> None:
    """Health from traffic: the last discovery or call decides (no audit row: it is not a change)."""
    ToolServer.objects.filter(pk=server.pk).update(
        health_status=ServerHealth.OK if ok else ServerHealth.ERROR,
        health_detail=detail[:300],
        health_latency_ms=latency_ms,
        health_checked_at=timezone.now(),
    )


def tool_server_discover(*, actor: Actor, server: ToolServer) -> list[ToolVersion]:
    """List the server's tools and store what changed: a new tool or a new (description, schema)
    digest is a new *pending* version. Returns the new versions. Nothing is accepted here."""
    if actor is not None and not can_manage_server(actor, server):
        raise PermissionDenied(f"You cannot manage the tool server {server.name}.")
    started = time.perf_counter()
    try:
        found = list_tools(server_spec(server), egress_policy())
    except (ToolServerError, ServerUnusable) as err:
        record_health(server, ok=False, detail=str(err), latency_ms=None)
        raise ValidationError({"server": [str(err)]}) from None
    record_health(server, ok=True, detail="", latency_ms=(time.perf_counter() - started) * 1000)
    return store_discovery(actor, server, found)


def store_discovery(actor: Actor, server: ToolServer, found: list[DiscoveredTool]) -> list[ToolVersion]:
    created: list[ToolVersion] = []
    with transaction.atomic():
        locked = ToolServer.objects.select_for_update().get(pk=server.pk)
        seen: set[str] = set()
        for item in found:
            if item.name in seen or not item.name or len(item.name) > 128:
                continue
            seen.add(item.name)
            tool, _ = Tool.objects.get_or_create(server=locked, name=item.name)
            if not tool.present:
                tool.present = True
                tool.save(update_fields=["present"])
            digest = item.digest
            if tool.versions.filter(digest=digest).exists():
                continue
            number = (tool.versions.order_by("-number").values_list("number", flat=True).first() or 0) + 1
            version = ToolVersion.objects.create(
                tool=tool,
                number=number,
                description=item.description,
                input_schema=item.input_schema,
                digest=digest,
            )
            created.append(version)
            audit_record(
                event_type=AuditEventType.TOOL_DISCOVERED,
                actor=actor,
                team=locked.team,
                obj=version,
                object_repr=f"{tool.qualified_name} v{number}",
                payload={**version_snapshot(version), "changed": number > 1},
            )
        Tool.objects.filter(server=locked).exclude(name__in=seen).update(present=False)
        ToolServer.objects.filter(pk=locked.pk).update(discovered_at=timezone.now())
    return created


def tool_version_accept(*, actor: Actor, version: ToolVersion) -> ToolVersion:
    """An administrator accepts what the tool now says it does: calls use this version from now on."""
    server = version.tool.server
    if actor is not None and not can_manage_server(actor, server):
        raise PermissionDenied(f"You cannot accept tools of {server.name}.")
    with transaction.atomic():
        version = ToolVersion.objects.select_for_update().select_related("tool__server").get(pk=version.pk)
        if version.status == VersionStatus.ACCEPTED:
            return version
        tool = version.tool
        latest = tool.versions.order_by("-number").values_list("pk", flat=True).first()
        if latest != version.pk:
            # Accepting an older text would bless a contract the server no longer announces.
            raise ValidationError({"version": ["Only the latest version of a tool can be accepted."]})
        before = (
            version_snapshot(tool.accepted_version)
            if tool.accepted_version_id and tool.accepted_version
            else None
        )
        tool.versions.filter(status=VersionStatus.ACCEPTED).update(status=VersionStatus.SUPERSEDED)
        version.status = VersionStatus.ACCEPTED
        version.accepted_by = stored_user(actor)  # the system and anonymity record nobody
        version.accepted_at = timezone.now()
        version.save(update_fields=["status", "accepted_by", "accepted_at"])
        tool.accepted_version = version
        tool.save(update_fields=["accepted_version"])
        audit_record(
            event_type=AuditEventType.TOOL_VERSION_ACCEPTED,
            actor=actor,
            team=server.team,
            obj=version,
            object_repr=f"{tool.qualified_name} v{version.number}",
            before=before,
            after=version_snapshot(version),
        )
    return version
