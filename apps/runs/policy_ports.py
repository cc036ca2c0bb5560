"""What runs (and, through runs, workers) provide to policies (below them): run history for
budgets, classifications and forecasts, and the engine view of a worker (`apps.policies.ports`);
and to workers: the outbound gate with a team's policy, for health checks (`apps.workers.ports`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Sum

from apps.engine.providers.gate import OutboundGate
from apps.policies import ports
from apps.policies.outbound import outbound_gate
from apps.policies.selectors import effective_policy_cached
from apps.runs.models import Run, Step
from apps.workers import ports as workers_ports
from apps.workers.engine_adapter import worker_info
from apps.workers.models import EmbeddingSpend


def team_spend(team: Any, start: datetime, end: datetime) -> Decimal:
    total = Run.objects.filter(team=team, created_at__gte=start, created_at__lt=end).aggregate(
        s=Sum("cost_usd")
    )["s"]
    # /v1/embeddings calls are not runs, but they spend the same budget (issue 45).
    embedded = EmbeddingSpend.objects.filter(team=team, created_at__gte=start, created_at__lt=end).aggregate(
        s=Sum("cost_usd")
    )["s"]
    return Decimal(total or 0) + Decimal(embedded or 0)


def run_classification(run_id: str) -> str:
    # A database error propagates: an unknown classification must not silently mean "public".
    return Run.objects.filter(pk=run_id).values_list("classification", flat=True).first() or ""


def recent_output_tokens(worker_key: str, limit: int) -> Sequence[int]:
    return list(
        Step.objects.filter(worker_key=worker_key, status="succeeded", output_tokens__gt=0)
        .order_by("-id")
        .values_list("output_tokens", flat=True)[:limit]
    )


def team_outbound_gate(team: Any) -> OutboundGate:
    """The outbound gate with ``team``'s effective policy (None: the platform default)."""
    return outbound_gate(effective_policy_cached(team))


def install_policy_ports() -> None:
    ports.register_run_history(
        ports.RunHistoryPort(
            team_spend=team_spend,
            run_classification=run_classification,
            recent_output_tokens=recent_output_tokens,
        )
    )
    ports.register_workers(ports.WorkersPort(worker_info=worker_info))
    # Health checks call providers too: through the gate, with the provider's team's policy.
    workers_ports.register_outbound_gate(team_outbound_gate)
