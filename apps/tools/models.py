"""MCP tool servers, their tools and the tools' versions (issue 43).

A server belongs to a team (or the platform) like a provider: its credential is encrypted at rest
by ``apps.workers.secrets`` and only the last four characters are kept in clear. Each tool the
server offers is stored as versions: the name, description and input schema the server announced,
with their digest. A version is usable only once an administrator accepted it, so a server that
changes what a tool says it does ("rug pull", a poisoned description) gets a new pending version
and the tool keeps running the accepted one's contract, or nothing, until someone looks.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.tools.querysets import ToolServerQuerySet


class Transport(models.TextChoices):
    HTTP = "http", "Streamable HTTP"
    STDIO = "stdio", "Local command (stdio)"


class ServerHealth(models.TextChoices):
    UNKNOWN = "unknown", "Not used yet"
    OK = "ok", "Reachable"
    ERROR = "error", "Error"


class ToolServer(models.Model):
    team = models.ForeignKey(
        "governance.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="tool_servers"
    )
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    transport = models.CharField(max_length=8, choices=Transport.choices)
    url = models.URLField(blank=True, max_length=300)
    # argv of a stdio server; its executable must be one the operator allowed (MCP_STDIO_COMMANDS).
    command = models.JSONField(default=list, blank=True)
    # Header carrying the credential on HTTP (``Authorization`` gets ``Bearer <credential>``); for
    # stdio, the environment variable the child receives it in.
    credential_name = models.CharField(max_length=100, blank=True, default="Authorization")
    credential_encrypted = models.TextField(blank=True, editable=False)
    credential_last4 = models.CharField(max_length=4, blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    # Health from traffic: every discovery and call updates it.
    health_status = models.CharField(max_length=8, choices=ServerHealth.choices, default=ServerHealth.UNKNOWN)
    health_detail = models.CharField(max_length=300, blank=True)
    health_latency_ms = models.FloatField(null=True, blank=True)
    health_checked_at = models.DateTimeField(null=True, blank=True)
    discovered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ToolServerQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


class Tool(models.Model):
    server = models.ForeignKey(ToolServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=128)
    # The version calls run under; null until an administrator accepted one.
    accepted_version = models.ForeignKey(
        "ToolVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Still announced by the server at the last discovery.
    present = models.BooleanField(default=True)

    class Meta:
        ordering = ["server", "name"]
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="tool_unique_name")]

    def __str__(self) -> str:
        return f"{self.server.slug}/{self.name}"

    @property
    def qualified_name(self) -> str:
        """The name the policy, plans and /mcp use: ``<server slug>.<tool name>``."""
        return f"{self.server.slug}.{self.name}"


class VersionStatus(models.TextChoices):
    PENDING = "pending", "Waiting for acceptance"
    ACCEPTED = "accepted", "Accepted"
    SUPERSEDED = "superseded", "Superseded"


class ToolVersion(models.Model):
    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    digest = models.CharField(max_length=64)
    status = models.CharField(max_length=12, choices=VersionStatus.choices, default=VersionStatus.PENDING)
    discovered_at = models.DateTimeField(auto_now_add=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    accepted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tool", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["tool", "number"], name="toolversion_unique_number"),
            models.UniqueConstraint(fields=["tool", "digest"], name="toolversion_unique_digest"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} v{self.number} ({self.status})"


class CallStatus(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"  # the server failed or was unreachable
    REFUSED = "refused", "Refused"  # a rule refused it before anything was sent
    BLOCKED = "blocked", "Output blocked"  # the output gate blocked what came back
    HELD = "held", "Output held for review"
    PENDING_APPROVAL = "pending_approval", "Waiting for approval"


class ToolCall(models.Model):
    """One tool call, allowed or refused: the row insights count and the run's graph shows.

    ``arguments`` are stored as sent (after the input gate's redaction); ``output`` as the output
    gate left it (a blocked or held output is kept for reviewers only and never returned)."""

    team = models.ForeignKey(
        "governance.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    tool = models.ForeignKey(Tool, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls")
    version = models.ForeignKey(
        ToolVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    qualified_name = models.CharField(max_length=200)
    run_id = models.UUIDField(null=True, blank=True, db_index=True)
    step_index = models.IntegerField(null=True, blank=True)
    api_key_id = models.BigIntegerField(null=True, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    source = models.CharField(max_length=8, default="run")  # run | mcp
    arguments = models.JSONField(default=dict)
    arguments_digest = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=CallStatus.choices)
    rule = models.CharField(max_length=200, blank=True)
    message = models.CharField(max_length=500, blank=True)
    output = models.TextField(blank=True)
    output_digest = models.CharField(max_length=64, blank=True)
    checks = models.JSONField(default=list)
    latency_ms = models.FloatField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["team", "qualified_name", "-created_at"], name="toolcall_team_tool_time")
        ]

    def __str__(self) -> str:
        return f"{self.qualified_name} {self.status}"


class ApprovalState(models.TextChoices):
    PENDING = "pending", "Waiting"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Refused"
    EXPIRED = "expired", "Expired"
    USED = "used", "Approved and run"


class ToolApproval(models.Model):
    """A tool call held for an approver (``require_approval``). It approves exactly one call: the
    tool and the digest of its arguments; the first identical call after approval consumes it (one
    conditional update, so it runs once however often it is retried)."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    call = models.OneToOneField(ToolCall, on_delete=models.CASCADE, related_name="approval")
    qualified_name = models.CharField(max_length=200)
    arguments_digest = models.CharField(max_length=64)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rule = models.CharField(max_length=200)
    state = models.CharField(max_length=10, choices=ApprovalState.choices, default=ApprovalState.PENDING)
    requested_at = models.DateTimeField(auto_now_add=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    used_by_call = models.ForeignKey(
        ToolCall, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["team", "state", "qualified_name"], name="toolapproval_open")]

    def __str__(self) -> str:
        return f"{self.qualified_name} {self.state}"
