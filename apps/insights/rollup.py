"""Keeps the hourly rollups in step with the run events (in the event's own transaction).

Each event's additions are merged per row (its hour row and its day row, every table it touches)
and written as one upsert per table (``Bumps``): a 2-step run costs ~9 statements, where a
get-or-create plus an update per row and grain cost ~50 (issue 15).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db.models import Max

from apps.core.compiled import CompiledRead
from apps.insights import reviews
from apps.insights.models import RUN_ROW, GuardrailRollup, HistogramRollup, Rollup
from apps.insights.upsert import Bumps
from apps.runs.models import Run
from apps.runs.observers import RunEventView

# Upper bounds in ms; the last bucket catches everything slower.
LATENCY_BUCKETS_MS = (
    50.0, 100.0, 200.0, 350.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0, 7500.0,
    10000.0, 15000.0, 20000.0, 30000.0, 60000.0, 120000.0, float("inf"),
)  # fmt: skip


def latency_bucket(ms: float) -> float:
    return next(b for b in LATENCY_BUCKETS_MS if ms <= b)


def hour_of(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC).replace(minute=0, second=0, microsecond=0)


def _decimal(value: Any) -> Decimal:
    try:
        return Decimal(str(value)) if value is not None else Decimal(0)
    except (InvalidOperation, ValueError):
        return Decimal(0)


# Time to first token: run.started and the run's first step.delta as this process saw them. The
# engine emits a run's events in the one process that executes it; a run resumed elsewhere after
# a crash has no first-token figure (unknown is not guessed). Bounded: runs that never finish here
# fall off the end.
_FIRST_TOKEN_RUNS = 10_000
_first_token: OrderedDict[Any, list[float | None]] = OrderedDict()
_first_token_lock = threading.Lock()


def _note_first_token(view: RunEventView) -> float | None:
    """Track the run's start and first delta; at run.finished return its TTFT in ms (or None)."""
    ts = float(view.event.get("ts") or 0)
    with _first_token_lock:
        if view.type == "run.started":
            _first_token[view.run_id] = [ts, None]
            while len(_first_token) > _FIRST_TOKEN_RUNS:
                _first_token.popitem(last=False)
        elif view.type == "step.delta":
            seen = _first_token.get(view.run_id)
            if seen is not None and seen[1] is None:
                seen[1] = ts
        elif view.type == "run.finished":
            seen = _first_token.pop(view.run_id, None)
            if seen is not None and seen[0] is not None and seen[1] is not None:
                return max(0.0, (seen[1] - seen[0]) * 1000)
    return None


def on_batch(views: Sequence[RunEventView]) -> None:
    """The rollups of one committed batch of a run's events: what its events add to the same row
    (the run row of step.finished and run.finished, two guardrail checks of one rule) is merged,
    and each table gets one upsert per batch, not one per event (issue #15)."""
    bumps = Bumps()
    for view in views:
        _add(bumps, view)
    bumps.flush()


_RUN_END_COLUMNS = ("review_status", "answer_held", "created_at", "depth")
# Read once per run end: compiled once per process (apps.core.compiled, issue #15).
_RUN_END_READ = CompiledRead(
    lambda vendor, run_id: (
        Run.objects.filter(pk=run_id)
        .values(*_RUN_END_COLUMNS[:3])
        .annotate(depth=Max("steps__round"))
        .order_by()[:1]
    ),
    placeholders=[Run._meta.pk],
)


def _add(bumps: Bumps, view: RunEventView) -> None:
    ttft_ms = _note_first_token(view) if view.type in ("run.started", "step.delta", "run.finished") else None
    handler = _HANDLERS.get(view.type)
    if handler is None:
        return
    base = {
        "team_id": view.team_id,
        "pool_id": view.pool_id,
        "strategy": view.strategy,
        "hour": hour_of(view.event["ts"]),
    }
    handler(bumps, base, view.data)
    if ttft_ms is not None:
        bumps.add(
            HistogramRollup,
            {**base, "worker_key": RUN_ROW, "metric": "ttft", "bucket": latency_bucket(ttft_ms)},
            count=1,
        )
    if view.type == "run.finished":
        # One read for what the run row now says: the last planning round it reached (recursion
        # depth, 1 = no re-plan) and the review state the sink's run end gave it.
        found = _RUN_END_READ.rows(view.run_id)
        run: dict[str, Any] | None = dict(zip(_RUN_END_COLUMNS, found[0], strict=True)) if found else None
        depth = (run or {}).get("depth") or 1
        bumps.add(
            HistogramRollup,
            {**base, "worker_key": RUN_ROW, "metric": "depth", "bucket": float(depth)},
            count=1,
        )
        if run is not None:
            reviews.at_run_end(bumps, base, run)


def _plan_proposed(bumps: Bumps, base: dict[str, Any], data: dict[str, Any]) -> None:
    usage = data.get("usage") or {}
    bumps.add(
        Rollup,
        {**base, "worker_key": RUN_ROW},
        orch_input_tokens=int(usage.get("input_tokens") or 0),
        orch_output_tokens=int(usage.get("output_tokens") or 0),
        orch_cost_usd=_decimal(data.get("cost_usd")),
        fallbacks=1 if data.get("source") == "fallback" else 0,
    )


def _plan_validated(bumps: Bumps, base: dict[str, Any], data: dict[str, Any]) -> None:
    action = data.get("action")
    bumps.add(
        Rollup,
        {**base, "worker_key": RUN_ROW},
        repairs=1 if action == "repaired" else 0,
        plans_blocked=1 if action == "blocked" else 0,
    )


def _step_finished(bumps: Bumps, base: dict[str, Any], data: dict[str, Any]) -> None:
    if data.get("status") in ("skipped", "blocked") and not data.get("latency_ms"):
        return  # never ran: no worker work to count
    usage = data.get("usage") or {}
    key = {**base, "worker_key": str(data.get("worker_key") or "?")[:60]}
    latency = data.get("latency_ms")
    bumps.add(
        Rollup,
        key,
        steps=1,
        steps_failed=0 if data.get("status") == "succeeded" else 1,
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cost_usd=_decimal(data.get("cost_usd")),
        latency_ms_sum=float(latency or 0),
        latency_count=1 if latency is not None else 0,
    )
    if latency is not None:
        bumps.add(
            HistogramRollup, {**key, "metric": "latency", "bucket": latency_bucket(float(latency))}, count=1
        )


def _guardrail_checked(bumps: Bumps, base: dict[str, Any], data: dict[str, Any]) -> None:
    for check in data.get("checks") or []:
        bumps.add(
            GuardrailRollup,
            {
                **base,
                "rule": str(check.get("name") or "?")[:80],
                "stage": str(check.get("stage") or data.get("stage") or "")[:16],
                "status": str(check.get("status") or "")[:12],
                "action": str(check.get("action") or "")[:24],
            },
            count=1,
        )


def _run_finished(bumps: Bumps, base: dict[str, Any], data: dict[str, Any]) -> None:
    totals = data.get("totals") or {}
    status = data.get("status") or "failed"
    latency = totals.get("latency_ms")
    key = {**base, "worker_key": RUN_ROW}
    bumps.add(
        Rollup,
        key,
        runs=1,
        succeeded=1 if status == "succeeded" else 0,
        failed=1 if status in ("failed", "timed_out", "cancelled") else 0,
        blocked=1 if status == "blocked" else 0,
        held=1 if data.get("answer_held") else 0,
        steps=int(totals.get("steps") or 0),
        input_tokens=int(totals.get("input_tokens") or 0),
        output_tokens=int(totals.get("output_tokens") or 0),
        cost_usd=_decimal(totals.get("cost_usd")),
        latency_ms_sum=float(latency or 0),
        latency_count=1 if latency is not None else 0,
    )
    if latency is not None:
        bumps.add(
            HistogramRollup, {**key, "metric": "latency", "bucket": latency_bucket(float(latency))}, count=1
        )
    bumps.add(HistogramRollup, {**key, "metric": "steps", "bucket": float(totals.get("steps") or 0)}, count=1)


_HANDLERS = {
    "plan.proposed": _plan_proposed,
    "plan.validated": _plan_validated,
    "step.finished": _step_finished,
    "guardrail.checked": _guardrail_checked,
    "run.finished": _run_finished,
}
