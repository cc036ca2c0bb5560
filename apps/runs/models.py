"""Runs, their steps, and the persisted event log a reconnecting websocket replays from."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models

from apps.runs.querysets import RunQuerySet


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    BLOCKED = "blocked", "Blocked"
    CANCELLED = "cancelled", "Cancelled"
    TIMED_OUT = "timed_out", "Timed out"
    # Not terminal: the plan waits for an approver (constraints.forecast / data_boundary); on
    # approval the run is queued again and resumes from its journal, on refusal it ends blocked.
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"


TERMINAL_RUN_STATUSES = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.BLOCKED, RunStatus.CANCELLED, RunStatus.TIMED_OUT}
)


class StepStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    WAITING = "waiting", "Waiting for its worker"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    TIMED_OUT = "timed_out", "Timed out"
    SKIPPED = "skipped", "Skipped"
    BLOCKED = "blocked", "Blocked"


class Strategy(models.TextChoices):
    CONDUCTOR = "conductor", "Conductor"
    SINGLE = "single", "Single worker"
    MOA = "moa", "Mixture of agents"
    PEV = "pev", "Planner-executor-verifier"
    # A contextual bandit picks one of the other strategies (an arm) per request (apps.learning).
    LEARNED = "learned", "Learned router"


# The names the playground offers (issue 42): experiments and insights name strategies the same way.
STRATEGY_NAMES = {
    "conductor-mini": "Conductor · mini",
    "conductor-ultra": "Conductor · ultra",
    "conductor": "Conductor",
    "single": "Single worker",
    "moa": "Mixture of agents",
    "pev": "Planner-executor-verifier",
    "learned": "Learned router",
}


def strategy_name(value: str) -> str:
    """``conductor-mini`` -> ``Conductor · mini``; ``single:w1`` -> ``Single worker · w1``."""
    if value.startswith("single:"):
        return f"Single worker · {value.removeprefix('single:')}"
    return STRATEGY_NAMES.get(value, value)


class Preset(models.TextChoices):
    NONE = "", "—"
    MINI = "mini", "mini"
    ULTRA = "ultra", "ultra"


class ReviewStatus(models.TextChoices):
    NONE = "", "Not queued"
    PENDING = "pending", "Awaiting review"
    APPROVED = "approved", "Approved"
    FLAGGED = "flagged", "Flagged"
    NEEDS_FOLLOW_UP = "needs_follow_up", "Needs follow-up"


class RunSource(models.TextChoices):
    PLAYGROUND = "playground", "Playground"
    OPENAI_API = "openai_api", "OpenAI-compatible API"
    REST_API = "rest_api", "REST API"


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    api_key = models.ForeignKey(
        "api.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    team = models.ForeignKey("governance.Team", on_delete=models.PROTECT, related_name="runs")
    pool = models.ForeignKey("workers.Pool", on_delete=models.PROTECT, related_name="runs")
    policy_version = models.ForeignKey(
        "policies.PolicyVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    source = models.CharField(max_length=12, choices=RunSource.choices, default=RunSource.PLAYGROUND)
    strategy = models.CharField(max_length=12, choices=Strategy.choices, default=Strategy.CONDUCTOR)
    preset = models.CharField(max_length=8, choices=Preset.choices, blank=True, default=Preset.MINI)
    # For the single strategy, the worker it names; also the worker a step replay targets.
    worker = models.ForeignKey(
        "workers.Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    classification = models.CharField(max_length=16, blank=True, default="")
    question = models.TextField()
    # Replay of one step: the exact messages to send instead of planning.
    replay_messages = models.JSONField(null=True, blank=True)
    # /v1 (issue 22): the x-request-id of the request that started the run, and what the run must
    # honour of it: {"options": GenerationOptions.to_dict(), "metadata": {...}, "conversation":
    # [...] (a pool model with tools: the chat the worker receives as it is)}.
    request_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    api_request = models.JSONField(null=True, blank=True)
    answer = models.TextField(blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    status_reason = models.TextField(blank=True)
    error = models.TextField(blank=True)
    review_status = models.CharField(max_length=16, choices=ReviewStatus.choices, blank=True, default="")
    # require_review guardrails hold the answer until a reviewer releases it.
    answer_held = models.BooleanField(default=False)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    priced = models.BooleanField(default=True)
    latency_ms = models.FloatField(null=True, blank=True)
    step_count = models.PositiveSmallIntegerField(default=0)
    last_seq = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    payload_erased_at = models.DateTimeField(null=True, blank=True)
    # Issue 14: the executor that owns a running run holds a lease it renews by heartbeat; a
    # lease that expires (dead process) sends the run back to the queue. `attempts` counts claims.
    lease_owner = models.CharField(max_length=120, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)

    objects = RunQuerySet.as_manager()

    # Not a column: the access version the run's creator or executor read with it
    # (apps.governance.access_version), which keys execution's per-process caches.
    access_stamp: int | None = None
    # Not a column: the data of the run's ``run.finished`` event, when the caller holds it.
    finished_data: dict[str, Any] | None = None

    class Meta:
        ordering = ["-created_at"]
        permissions = [("review_run", "Can review (sign off or flag) the run")]
        indexes = [
            models.Index(fields=["team", "-created_at"], name="run_team_created"),
            # A key's spend in a budget period (apps.api.budgets), as run_team_created serves a team's.
            models.Index(fields=["api_key", "-created_at"], name="run_key_created"),
            models.Index(fields=["created_by", "-created_at"], name="run_user_created"),
            models.Index(fields=["status", "-created_at"], name="run_status_created"),
            models.Index(fields=["strategy", "-created_at"], name="run_strategy_created"),
            models.Index(fields=["-created_at"], name="run_created"),
            models.Index(fields=["status", "deadline_at"], name="run_status_deadline"),
            models.Index(fields=["review_status", "-created_at"], name="run_review_created"),
            models.Index(fields=["status", "lease_expires_at"], name="run_status_lease"),
        ]

    def __str__(self) -> str:
        return f"Run {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES


class Step(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveSmallIntegerField()
    round = models.PositiveSmallIntegerField(default=1)
    worker = models.ForeignKey(
        "workers.Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    worker_key = models.CharField(max_length=60)
    worker_name = models.CharField(max_length=100, blank=True)
    instruction = models.TextField()
    access = models.JSONField(default=list)
    messages = models.JSONField(default=list)
    output = models.TextField(blank=True)
    status = models.CharField(max_length=12, choices=StepStatus.choices, default=StepStatus.PENDING)
    error = models.TextField(blank=True)
    fallback_from = models.CharField(max_length=60, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    priced = models.BooleanField(default=True)
    latency_ms = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="step_unique_index")]
        indexes = [models.Index(fields=["worker_key", "run"], name="step_worker_run")]

    def __str__(self) -> str:
        return f"Step {self.index} of {self.run_id}"


class RunEvent(models.Model):
    """Every protocol event of a run, so a reconnecting client gets exactly what it missed."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=32)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runevent_unique_seq")]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq} of {self.run_id}"


class RunDispatch(models.Model):
    """Transactional outbox: written with the Run (or its re-queue) in one transaction, so an
    accepted run is handed to an executor even if the broker was down at commit. A row lives
    until an executor claims the run; `dispatched_at` is set when the hand-off succeeded."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="dispatch")
    created_at = models.DateTimeField(auto_now_add=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # Who handed it off: a thread pool's queue dies with its process, a broker's does not.
    dispatched_by = models.CharField(max_length=120, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["dispatched_at", "next_attempt_at"], name="rundispatch_pending")]

    def __str__(self) -> str:
        return f"Dispatch of {self.run_id}"


class RunCall(models.Model):
    """Resume journal: every completed provider call of a running run (planning and steps),
    written the moment it returns. A re-queued run replays matching calls from here instead of
    calling (and paying) the provider again, so it resumes after its last completed step. Rows
    hold model output like Step rows do, and go when the run ends (`apps.runs.journal.forget`)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="calls")
    # sha256 of (worker key, messages, generation options): the same call asked again
    digest = models.CharField(max_length=64)
    worker_key = models.CharField(max_length=100)
    attempt = models.PositiveSmallIntegerField(default=1)
    result = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["run", "digest"], name="runcall_run_digest")]

    def __str__(self) -> str:
        return f"Call {self.digest[:12]} of {self.run_id}"


class ApprovalDecision(models.TextChoices):
    PENDING = "pending", "Waiting"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Refused"
    EXPIRED = "expired", "Expired"


class PlanApproval(models.Model):
    """A plan held for an approver (plan checks: constraints.forecast / data_boundary with action
    require_approval). The run pauses in ``awaiting_approval``; an approval lets exactly the plan
    with ``digest`` run (the next attempt replays the planning call from the journal), a refusal
    or the deadline ends the run blocked. Holds no model output beyond the plan's subtasks."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    # "plan" (a held plan) or "tool" (issue 43: a tool call inside the run waits for an approver;
    # ``tool_approval`` is the call's approval, ``digest`` its arguments' digest). Either pauses
    # the run the same way and is decided on the same desk.
    kind = models.CharField(max_length=8, default="plan")
    tool_approval = models.ForeignKey(
        "tools.ToolApproval", null=True, blank=True, on_delete=models.SET_NULL, related_name="run_holds"
    )
    round = models.PositiveSmallIntegerField(default=1)
    digest = models.CharField(max_length=64)
    reason = models.TextField()
    # [{code, message, step}] and the policy fields whose action held it
    violations = models.JSONField(default=list)
    fields = models.JSONField(default=list)
    plan = models.JSONField(null=True, blank=True)
    forecast = models.JSONField(null=True, blank=True)
    requested_at = models.DateTimeField()
    deadline_at = models.DateTimeField(null=True, blank=True)
    # How long a /v1 caller waits for the decision (constraints.approval.api_wait_s).
    api_wait_until = models.DateTimeField(null=True, blank=True)
    decision = models.CharField(
        max_length=10, choices=ApprovalDecision.choices, default=ApprovalDecision.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["decision", "deadline_at"], name="planapproval_open")]

    def __str__(self) -> str:
        return f"Approval of {self.run_id} round {self.round}: {self.decision}"
