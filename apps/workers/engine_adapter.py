"""Turn a database pool into the engine's ``WorkerPool``.

Called at run time (thread or Celery task), so a key set in the environment after the pool was
configured is picked up without a restart. Key-variable and egress rules are enforced here and at
connect time, not only when a provider is saved: rows stored before the rules existed obey them. Refuses with ``PoolUnavailable`` and plain words when
the pool cannot run, rather than letting a provider fail mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from apps.engine.pool import WorkerPool
from apps.engine.providers import OutboundGate, build_worker
from apps.engine.providers import Worker as EngineWorker
from apps.engine.types import WorkerInfo
from apps.workers.egress import egress_policy, static_url_refusal
from apps.workers.health import DbWorkerHealth
from apps.workers.secrets import SecretError, key_status, resolve_api_key

if TYPE_CHECKING:
    from apps.workers.models import Pool, Worker
    from apps.workers.selectors import PoolRows


class PoolUnavailable(Exception):
    """The pool cannot run now. ``reason`` is plain words safe to show the user."""

    user_safe = True  # execution shows str() to the user

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def worker_unavailable_reason(worker: Worker) -> str | None:
    """Why ``worker`` cannot be called now, or None when it can."""
    if not worker.enabled:
        return f"The worker “{worker.display_name}” is disabled."
    status = key_status(worker.provider)
    if not status.available:
        return f"The worker “{worker.display_name}” cannot be used: {status.reason}"
    return None


def worker_info(worker: Worker, *, fallback_key: str | None = None) -> WorkerInfo:
    return WorkerInfo(
        key=worker.slug,
        name=worker.display_name,
        model=worker.model_name,
        provider=worker.provider.kind,
        strengths=worker.strengths,
        tags=tuple(str(t) for t in (worker.tags or [])),
        cost_rank=min(max(int(worker.cost_rank), 1), 5),
        input_price_per_mtok=worker.input_price_per_mtok,
        output_price_per_mtok=worker.output_price_per_mtok,
        max_output_tokens=worker.max_output_tokens,
        timeout_s=float(worker.timeout_s),
        fallback_key=fallback_key,
        concurrency=worker.max_concurrency or None,
    )


def build_engine_worker(
    worker: Worker, *, gate: OutboundGate, fallback_key: str | None = None
) -> EngineWorker:
    """An engine worker for one DB worker, whose every request passes ``gate`` (the team's
    outbound policy, issue 39). Raises ``PoolUnavailable`` when it cannot be used."""
    reason = worker_unavailable_reason(worker)
    if reason:
        raise PoolUnavailable(reason)
    provider = worker.provider
    if provider.base_url and provider.kind != "local":
        # Shape and literal addresses now, with the rule's words; names at connect time.
        refusal = static_url_refusal(provider.base_url)
        if refusal:
            raise PoolUnavailable(f"The worker “{worker.display_name}” cannot be used: {refusal}")
    try:
        api_key = resolve_api_key(provider)
    except SecretError as err:
        raise PoolUnavailable(f"The worker “{worker.display_name}” cannot be used: {err}") from None
    try:
        return build_worker(
            worker_info(worker, fallback_key=fallback_key),
            gate=gate,
            kind=provider.kind,
            base_url=provider.base_url or None,
            api_key=api_key,
            model_path=provider.model_path or None,
            # Checked again at connect time on the resolved address, whatever was saved.
            egress=egress_policy(),
        )
    except ValueError as err:
        # Configuration problems (e.g. an OpenAI-compatible provider without a base URL).
        raise PoolUnavailable(f"The worker “{worker.display_name}” is misconfigured: {err}") from None
    except Exception as err:
        # An SDK refusing the URL (httpx InvalidURL…): its message may quote the URL, not a key.
        raise PoolUnavailable(
            f"The worker “{worker.display_name}” is misconfigured: its base URL cannot be used "
            f"({type(err).__name__})."
        ) from None


@dataclass(slots=True)
class PresetWorkerPool(WorkerPool):
    """An engine pool that also holds each preset's own conductor. ``conductor`` is the pool's
    default one until ``use_preset_conductor`` picks the preset's (the strategy is known later
    than the pool: a learned run picks its arm from the pool)."""

    preset_conductors: dict[str, EngineWorker] = field(default_factory=dict)
    # preset -> why its own conductor cannot be used (that preset is unavailable, the others run)
    unavailable_presets: dict[str, str] = field(default_factory=dict)


def preset_conductor_of(pool: Pool, preset: str) -> Worker | None:
    """The worker that plans ``preset`` on ``pool``: its own, else the pool's conductor."""
    own = pool.own_preset_conductors().get(preset)
    return own or (pool.conductor_worker if pool.conductor_worker_id else None)


def _preset_workers(pool: Pool, rows: PoolRows | None) -> dict[str, Worker]:
    """Each preset's *own* conductor (not the fallback), read from ``rows`` when given."""
    return dict(rows.presets) if rows is not None else pool.own_preset_conductors()


def build_engine_pool(pool: Pool, rows: PoolRows | None = None, *, gate: OutboundGate) -> PresetWorkerPool:
    """The engine pool for ``pool``: workers in position order (their plan ids), default, conductor
    (and each preset's own conductor), every one sending through ``gate``. ``rows``: the pool's
    worker rows already read (``apps.workers.selectors.pool_rows``)."""
    if not pool.enabled:
        raise PoolUnavailable(f"The pool “{pool.name}” is disabled.")
    entries = (
        list(rows.entries)
        if rows is not None
        else list(
            pool.pool_workers.select_related("worker", "worker__provider", "worker__fallback").order_by(
                "position"
            )
        )
    )
    if not entries:
        raise PoolUnavailable(f"The pool “{pool.name}” has no workers.")
    slugs = {e.worker.slug for e in entries}
    workers: list[EngineWorker] = []
    default_index = 0
    for i, entry in enumerate(entries):
        w = entry.worker
        fallback_key = w.fallback.slug if w.fallback_id and w.fallback and w.fallback.slug in slugs else None
        workers.append(build_engine_worker(w, gate=gate, fallback_key=fallback_key))
        if pool.default_worker_id == w.pk:
            default_index = i
    conductor = None
    if pool.conductor_worker_id:
        own = rows.conductor if rows is not None else pool.conductor_worker
        conductor = build_engine_worker(own, gate=gate)  # type: ignore[arg-type]
    presets: dict[str, EngineWorker] = {}
    unavailable: dict[str, str] = {}
    for preset, worker in _preset_workers(pool, rows).items():
        # A preset conductor that cannot run takes down its preset only, not the pool.
        try:
            presets[preset] = build_engine_worker(worker, gate=gate)
        except PoolUnavailable as err:
            unavailable[preset] = f"The conductor of conductor-{preset}: {err.reason}"
    return PresetWorkerPool(
        workers=workers,
        default_index=default_index,
        conductor=conductor,
        preset_conductors=presets,
        unavailable_presets=unavailable,
        health=DbWorkerHealth(),  # every call feeds, and open breakers steer, the run (issue 44)
    )


def use_preset_conductor(engine_pool: Any, preset: str | None) -> None:
    """Make ``preset``'s own conductor the one that plans this run (no-op without one).

    Raises ``PoolUnavailable`` naming the preset when its own conductor cannot be used. The run's
    call journal wraps every preset conductor too (``apps.runs.journal.journal_pool``), so a
    resumed attempt replays its plan; a bare one re-points a wrapper around the default conductor."""
    if not preset:
        return
    reason = getattr(engine_pool, "unavailable_presets", {}).get(preset)
    if reason:
        raise PoolUnavailable(reason)
    chosen = getattr(engine_pool, "preset_conductors", {}).get(preset)
    if chosen is None:
        return
    holder = engine_pool.conductor
    if holder is not None and hasattr(holder, "inner") and not hasattr(chosen, "inner"):
        holder.inner = chosen  # a wrapper around the default conductor, re-pointed
        holder.info = chosen.info
    else:
        engine_pool.conductor = chosen  # already wrapped by the run's journal, or no wrapper


def pool_unavailable_reason(pool: Pool, rows: PoolRows | None = None) -> str | None:
    """Why ``pool`` cannot run now (without building clients), or None. For UI and pre-checks."""
    if not pool.enabled:
        return f"The pool “{pool.name}” is disabled."
    entries = (
        list(rows.entries)
        if rows is not None
        else list(pool.pool_workers.select_related("worker", "worker__provider"))
    )
    if not entries:
        return f"The pool “{pool.name}” has no workers."
    for entry in entries:
        reason = worker_unavailable_reason(entry.worker)
        if reason:
            return reason
    if pool.conductor_worker_id:
        own = rows.conductor if rows is not None else pool.conductor_worker
        return worker_unavailable_reason(own)  # type: ignore[arg-type]
    return None
