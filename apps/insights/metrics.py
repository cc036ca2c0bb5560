"""Prometheus ``/metrics``: correct under several daphne and Celery processes.

Two sources:

- **Counts from the database at scrape time** (a custom collector): runs finished by status and
  strategy, guardrail checks by rule and outcome (both from the insights rollups), budget left,
  audit sequence length and sequencer lag. Every process answers the same numbers, so they are
  correct by construction whichever process is scraped.
- **In-process timings** (the GenAI semantic-convention histograms ``gen_ai_client_token_usage``
  and ``gen_ai_client_operation_duration_seconds``), observed where the model calls happen (the
  executor: a daphne thread or a Celery worker). With ``PROMETHEUS_MULTIPROC_DIR`` set in every
  process (before start, one shared empty directory) prometheus-client writes them to files that
  any process sums at scrape; without it they are this process's own (the embedded mode, where
  runs execute inside the server).

Access: ``METRICS_BEARER_TOKEN``. Unset → the endpoint is disabled (404); a request without the
bearer token → 401, with a wrong one → 403; both name the setting.
"""

from __future__ import annotations

import functools
import hmac
import logging
import os
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Count, Max, Q, Sum
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from apps.audit.models import AuditEvent
from apps.governance.models import Team
from apps.insights.models import HOUR, RUN_ROW, GuardrailRollup, Rollup
from apps.insights.telemetry import PROVIDER_NAMES
from apps.policies.budgets import budget_status
from apps.policies.services import effective_policy
from apps.tools.models import ToolApproval, ToolCall
from apps.workers.health import worker_traffic
from apps.workers.models import Worker

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from apps.runs.observers import RunEventView

logger = logging.getLogger(__name__)

TOKEN_SETTING = "METRICS_BEARER_TOKEN"  # noqa: S105 (a setting name, not a secret)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Bucket boundaries from the OpenTelemetry GenAI metrics conventions.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
LABELS = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "team")

# Multiprocess mode ignores the registry the metric was made with (values go to files); without
# it this private registry is what a scrape reads.
_LOCAL = CollectorRegistry(auto_describe=True)
TOKEN_USAGE = Histogram(
    "gen_ai_client_token_usage",
    "Tokens used per model call (GenAI semconv), by token type",
    (*LABELS, "gen_ai_token_type"),
    buckets=TOKEN_BUCKETS,
    registry=_LOCAL,
)
OPERATION_DURATION = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "Duration of a model call (GenAI semconv)",
    LABELS,
    buckets=DURATION_BUCKETS,
    registry=_LOCAL,
)

# Live websocket viewers of runs in this server process; "livesum" adds the live processes'
# values in multiprocess mode (a dead daphne's viewers are gone with it).
WEBSOCKET_VIEWERS = Gauge(
    "conductor_websocket_viewers",
    "Websocket viewers of runs connected now",
    registry=_LOCAL,
    multiprocess_mode="livesum",
)


def websocket_viewer(delta: int) -> None:
    """A run page's websocket was accepted (+1) or ended (-1)."""
    WEBSOCKET_VIEWERS.inc(delta)


def on_run_event(view: RunEventView) -> None:
    """After-commit observer: one observation per model call (planning and steps)."""
    if view.type not in ("plan.proposed", "step.finished"):
        return

    data = view.data
    if view.type == "step.finished" and data.get("latency_ms") is None:
        return  # the step never called a model (skipped/blocked)
    key = str(data.get("worker_key") or "")  # plan.proposed names its planner too
    known = view.workers.get(key)  # the sink knows the pool's workers: no read per model call
    worker = (
        (known[1], known[2])
        if known is not None
        else Worker.objects.filter(slug=key).values_list("model_name", "provider__kind").first()
    )

    tokens_in, tokens_out, duration = _series(
        PROVIDER_NAMES.get(worker[1], worker[1]) if worker else "unknown",
        worker[0] if worker else key,
        # The sink passes the slug it knows; a read only when it did not (issue #15).
        view.team_slug or Team.objects.filter(pk=view.team_id).values_list("slug", flat=True).first() or "",
    )
    usage = data.get("usage") or {}
    tokens_in.observe(int(usage.get("input_tokens") or 0))
    tokens_out.observe(int(usage.get("output_tokens") or 0))
    if data.get("latency_ms") is not None:
        duration.observe(float(data["latency_ms"]) / 1000)


@functools.lru_cache(maxsize=4096)
def _series(provider: str, model: str, team: str) -> tuple[Any, Any, Any]:
    """The input-token, output-token and duration series of one provider, model and team.

    ``labels()`` checks and locks on every call; three per model call were a third of this
    observer's time, which runs on the request's thread (issue #15)."""
    labels = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": provider,
        "gen_ai_request_model": model,
        "team": team,
    }
    tokens_in, tokens_out = (TOKEN_USAGE.labels(*labels.values(), kind) for kind in ("input", "output"))
    return tokens_in, tokens_out, OPERATION_DURATION.labels(**labels)


class DatabaseCollector(Collector):
    """Numbers read from the database at scrape time (the same from every process)."""

    def collect(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "conductor_runs_finished",
            "Runs finished, by outcome and strategy",
            labels=["team", "strategy", "status"],
        )
        rows = (
            Rollup.objects.filter(worker_key=RUN_ROW, grain=HOUR)
            .values("team__slug", "strategy")
            .annotate(
                succeeded=Sum("succeeded"), failed=Sum("failed"), blocked=Sum("blocked"), total=Sum("runs")
            )
            .order_by("team__slug", "strategy")
        )
        for r in rows:
            for status in ("succeeded", "failed", "blocked"):
                runs.add_metric([r["team__slug"], r["strategy"], status], int(r[status] or 0))
        yield runs

        checks = CounterMetricFamily(
            "conductor_guardrail_checks",
            "Guardrail checks by rule, stage, status and action",
            labels=["team", "rule", "stage", "status", "action"],
        )
        for g in (
            GuardrailRollup.objects.filter(grain=HOUR)
            .values("team__slug", "rule", "stage", "status", "action")
            .annotate(n=Sum("count"))
            .order_by("team__slug", "rule", "stage", "status", "action")
        ):
            checks.add_metric([g["team__slug"], g["rule"], g["stage"], g["status"], g["action"]], int(g["n"]))
        yield checks

        budget = GaugeMetricFamily(
            "conductor_budget_remaining_usd", "Room left under each hard budget", labels=["team", "period"]
        )
        for team in Team.objects.order_by("slug"):
            try:
                room = budget_status(team=team, effective=effective_policy(team))
            except Exception:  # a broken policy must not break the scrape
                logger.exception("budget of team %s unreadable", team.slug)
                continue
            for window in room.windows:
                remaining = window.remaining
                if remaining is not None:
                    budget.add_metric([team.slug, window.name], float(Decimal(remaining)))
        yield budget

        # Issue 43: every tool call, allowed or refused (refusals and approvals are statuses).
        tools = CounterMetricFamily(
            "conductor_tool_calls",
            "Tool calls by tool, status (succeeded, failed, refused, blocked, held, pending_approval) and source",
            labels=["team", "tool", "status", "source"],
        )
        for t in (
            ToolCall.objects.values("team__slug", "qualified_name", "status", "source")
            .annotate(n=Count("pk"))
            .order_by("team__slug", "qualified_name", "status", "source")
        ):
            tools.add_metric(
                [t["team__slug"] or "", t["qualified_name"], t["status"], t["source"]], int(t["n"])
            )
        yield tools
        # Approvals of tool calls by what became of them (a run's held call, or one from /mcp).
        approvals = CounterMetricFamily(
            "conductor_tool_approvals",
            "Tool calls held for an approver, by state (pending, approved, rejected, expired, used) and source",
            labels=["team", "tool", "state", "source"],
        )
        for a in (
            ToolApproval.objects.values("team__slug", "qualified_name", "state")
            .annotate(
                in_runs=Count("pk", filter=Q(call__run_id__isnull=False)),
                mcp=Count("pk", filter=Q(call__run_id__isnull=True)),
            )
            .order_by("team__slug", "qualified_name", "state")
        ):
            for source, key in (("run", "in_runs"), ("mcp", "mcp")):
                if a[key]:
                    approvals.add_metric(
                        [a["team__slug"] or "", a["qualified_name"], a["state"], source], int(a[key])
                    )
        yield approvals
        yield from _worker_health_families()

        audit = AuditEvent.objects.aggregate(top=Max("seq"), lag=Count("pk", filter=Q(seq__isnull=True)))
        yield GaugeMetricFamily(
            "conductor_audit_sequence_length",
            "Numbered audit events (highest seq)",
            value=int(audit["top"] or 0),
        )
        yield GaugeMetricFamily(
            "conductor_audit_sequencer_lag",
            "Audit events committed but not yet numbered",
            value=int(audit["lag"]),
        )


def _worker_health_families() -> Iterator[Metric]:
    """Each worker's circuit breaker and figures from its real calls (issue 44), and its last
    explicit check: the same numbers the pool page shows."""
    labels = ["worker"]
    state = GaugeMetricFamily(
        "conductor_worker_circuit_state", "1 for the breaker's current state", labels=["worker", "state"]
    )
    success = GaugeMetricFamily(
        "conductor_worker_success_ratio", "Share of the recent real calls that answered", labels=labels
    )
    p50 = GaugeMetricFamily(
        "conductor_worker_latency_p50_seconds", "Median latency of recent answers", labels=labels
    )
    p95 = GaugeMetricFamily(
        "conductor_worker_latency_p95_seconds", "95th percentile of recent answers", labels=labels
    )
    checked = GaugeMetricFamily(
        "conductor_worker_last_check_timestamp_seconds",
        "When the last explicit health check ran, by its outcome",
        labels=["worker", "status"],
    )
    workers = list(
        Worker.objects.order_by("slug").values_list("pk", "slug", "health_status", "health_checked_at")
    )
    traffic = worker_traffic(pk for pk, *_ in workers)
    for pk, slug, status, checked_at in workers:
        if checked_at is not None:
            checked.add_metric([slug, status], checked_at.timestamp())
        t = traffic.get(pk)
        if t is None:
            continue
        for name in ("closed", "open", "half_open"):
            state.add_metric([slug, name], 1.0 if t.state == name else 0.0)
        success.add_metric([slug], t.success_rate)
        if t.p50_ms is not None and t.p95_ms is not None:
            p50.add_metric([slug], t.p50_ms / 1000)
            p95.add_metric([slug], t.p95_ms / 1000)
    yield from (state, success, p50, p95, checked)


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        for metric in (TOKEN_USAGE, OPERATION_DURATION, WEBSOCKET_VIEWERS):
            registry.register(metric)
    registry.register(DatabaseCollector())
    return registry


def _refuse(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = (
            f'Bearer realm="metrics", error="invalid_request", scope="{TOKEN_SETTING}"'
        )
    return response


def expected_token() -> str:
    return str(getattr(settings, TOKEN_SETTING, "") or os.environ.get(TOKEN_SETTING, "") or "")


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = expected_token()
    if not token:
        return _refuse(404, f"/metrics is disabled: {TOKEN_SETTING} is not set.")
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return _refuse(401, f"/metrics needs 'Authorization: Bearer <{TOKEN_SETTING}>'.")
    if not hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), token.encode()):
        return _refuse(403, f"The bearer token does not match {TOKEN_SETTING}.")
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)
