"""The one enum of audit event types. Configuration changes and run decisions share the stream."""

from django.db import models


class AuditKind(models.TextChoices):
    CONFIG = "config", "Configuration change"
    RUN = "run", "Run decision"
    SYSTEM = "system", "System"


class AuditEventType(models.TextChoices):
    # Configuration changes
    TEAM_CREATED = "team.created"
    TEAM_UPDATED = "team.updated"
    MEMBERSHIP_ADDED = "membership.added"
    MEMBERSHIP_CHANGED = "membership.changed"
    MEMBERSHIP_REMOVED = "membership.removed"
    PERMISSION_GRANTED = "permission.granted"
    PERMISSION_REVOKED = "permission.revoked"
    PROVIDER_CREATED = "provider.created"
    PROVIDER_UPDATED = "provider.updated"
    PROVIDER_DELETED = "provider.deleted"
    WORKER_CREATED = "worker.created"
    WORKER_UPDATED = "worker.updated"
    WORKER_DISABLED = "worker.disabled"
    WORKER_HEALTH_CHECKED = "worker.health_checked"
    PROVIDER_CONNECTION_TESTED = "provider.connection_tested"
    POOL_CREATED = "pool.created"
    POOL_UPDATED = "pool.updated"
    POOL_DISABLED = "pool.disabled"
    POOL_GRANTED = "pool.granted"
    POOL_REVOKED = "pool.revoked"
    POLICY_CREATED = "policy.created"
    POLICY_DRAFT_SAVED = "policy.draft_saved"
    POLICY_PUBLISHED = "policy.published"
    POLICY_ROLLED_BACK = "policy.rolled_back"
    APIKEY_CREATED = "apikey.created"
    APIKEY_REVOKED = "apikey.revoked"
    APIKEY_BUDGET_CHANGED = "apikey.budget_changed"
    APIKEY_DENIED = "apikey.denied"
    # Authentication abuse (issue 13): failed logins, lockouts, invalid API keys, key throttling
    APIKEY_REJECTED = "apikey.rejected"
    APIKEY_THROTTLED = "apikey.throttled"
    AUTH_LOGIN_FAILED = "auth.login_failed"
    AUTH_LOCKED_OUT = "auth.locked_out"
    # Run decisions
    RUN_CREATED = "run.created"
    RUN_REFUSED = "run.refused"
    RUN_STARTED = "run.started"
    RUN_INPUT_CHECKED = "run.input_checked"
    RUN_PLAN_PROPOSED = "run.plan_proposed"
    RUN_PLAN_VALIDATED = "run.plan_validated"
    RUN_STEP_STARTED = "run.step_started"
    RUN_STEP_FINISHED = "run.step_finished"
    RUN_STEP_OUTPUT_CHECKED = "run.step_output_checked"
    RUN_OUTPUT_CHECKED = "run.output_checked"
    # Issue 39: the outbound gate redacted, flagged or refused a provider request of a run (its
    # sink) or of a call outside one (an evaluator's judge, a health check). Field + rule only.
    RUN_OUTBOUND_CHECKED = "run.outbound_checked"
    OUTBOUND_CHECKED = "outbound.checked"
    # Issue 45: a /v1/embeddings call (not a run): who, which pool and worker, tokens, cost, the
    # gate's interventions and SHA-256 digests of the inputs — never their text or the vectors.
    EMBEDDING_CREATED = "embedding.created"
    EMBEDDING_REFUSED = "embedding.refused"
    RUN_FINISHED = "run.finished"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_TIMED_OUT = "run.timed_out"
    # Issue 14: an executor lost its lease (died) and the run went back to the queue.
    RUN_REQUEUED = "run.requeued"
    RUN_REVIEW_REQUESTED = "run.review_requested"
    RUN_REVIEWED = "run.reviewed"
    RUN_RELEASED = "run.released"
    RUN_RELEASE_REFUSED = "run.release_refused"  # issue 39: separation of duties (apps.audit.duties)
    RUN_FLAG_RESOLVED = "run.flag_resolved"
    RUN_PAYLOAD_ERASED = "run.payload_erased"
    # System
    AUDIT_CHECKPOINT = "audit.checkpoint"
    AUDIT_EXPORTED = "audit.exported"
    BUDGET_ALERT_RAISED = "budget.alert_raised"  # issue 18: 50/80/100 % of a budget
    BUDGET_ALERT_DELIVERED = "budget.alert_delivered"  # its webhook's final outcome
    # Issue 19: feedback as data (metrics, feedback items, automatic evaluators)
    FEEDBACK_RECORDED = "feedback.recorded"
    # Issue 39: a run's answer is held, so its team's evaluators did not score it.
    FEEDBACK_EVALUATION_SKIPPED = "feedback.evaluation_skipped"
    FEEDBACK_METRIC_CREATED = "feedback.metric_created"
    FEEDBACK_EVALUATOR_CREATED = "feedback.evaluator_created"
    # The learned router (issue 19): a run's routing decision, and the router's lifecycle
    RUN_ROUTED = "run.routed"
    ROUTER_REWARDED = "router.rewarded"
    ROUTER_SNAPSHOT = "router.snapshot"
    ROUTER_FROZEN = "router.frozen"
    ROUTER_UNFROZEN = "router.unfrozen"
    ROUTER_ROLLED_BACK = "router.rolled_back"
    ROUTER_RESET = "router.reset"
    RUN_APPROVAL_REQUESTED = "run.approval_requested"
    RUN_PLAN_APPROVED = "run.plan_approved"
    RUN_PLAN_REJECTED = "run.plan_rejected"
    RUN_APPROVAL_EXPIRED = "run.approval_expired"
    # Evaluation sets and experiments (issue 19)
    DATASET_UPLOADED = "experiment.dataset_uploaded"
    EXPERIMENT_STARTED = "experiment.started"
    EXPERIMENT_CANCELLED = "experiment.cancelled"
    EXPERIMENT_FINISHED = "experiment.finished"
    TRAINING_EXPORTED = "training.exported"
    # Governed tools (issue 43): MCP servers, their tools' versions, and every tool call
    TOOL_SERVER_REGISTERED = "tool.server_registered"
    TOOL_SERVER_UPDATED = "tool.server_updated"
    TOOL_DISCOVERED = "tool.discovered"  # a new tool or a changed one: a version waiting for acceptance
    TOOL_VERSION_ACCEPTED = "tool.version_accepted"
    TOOL_CALLED = "tool.called"  # a call outside a run (the /mcp endpoint), allowed or refused
    RUN_TOOL_CALLED = "run.tool_called"
    TOOL_APPROVAL_REQUESTED = "tool.approval_requested"
    TOOL_CALL_APPROVED = "tool.call_approved"
    TOOL_CALL_REJECTED = "tool.call_rejected"
    TOOL_APPROVAL_EXPIRED = "tool.approval_expired"

    @property
    def kind(self) -> str:
        if self.value.startswith("run.") or self.value in (
            "feedback.recorded",
            "feedback.evaluation_skipped",
            "outbound.checked",
            "tool.called",
            "tool.approval_requested",
            "tool.call_approved",
            "tool.call_rejected",
            "tool.approval_expired",
        ):
            return AuditKind.RUN  # feedback on a run, and the gate's record of a call, are decisions
        if self.value.startswith(("audit.", "auth.", "budget.")):
            return AuditKind.SYSTEM
        return AuditKind.CONFIG
