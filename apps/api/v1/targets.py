"""Which pool and preset a ``/v1`` request runs on.

``resolve_model`` maps a protocol's ``model`` (a preset, ``<preset>:<pool>`` or a bare pool slug)
to a ``Target`` the key may use; ``models_payload`` is OpenAI's model list; ``check_capabilities``
refuses what the pool's workers cannot honour (tools).
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, replace
from typing import Any

from django.db.models import Count, Exists, OuterRef, Subquery

from apps.api import selectors as api_sel
from apps.api.models import ApiKey
from apps.api.v1.auth import deny
from apps.api.v1.errors import ApiError, no_retry
from apps.api.v1.run_request import RunRequest
from apps.governance import selectors as gov
from apps.governance.access_version import AccessCache
from apps.workers.models import Pool, PoolWorker

PRESETS = {"conductor-mini": "mini", "conductor-ultra": "ultra"}
# The learned router (apps.learning): strategy "learned"; ":<pool>" picks the pool like a preset.
LEARNED_MODEL = "conductor-learned"
# Provider kinds whose workers accept OpenAI-style function tools.
TOOL_PROVIDER_KINDS = frozenset({"openai", "openai_compatible"})


@dataclass(frozen=True)
class Target:
    """Where a request runs: the conductor ``preset`` on ``pool``. ``direct`` is a bare pool slug
    (a *pool model*): with tools, or when the pool has one worker (``passthrough``: planning could
    only hand the chat to that worker), it runs as one step on the pool's default worker."""

    preset: str
    pool: Any
    model: str
    direct: bool = False
    passthrough: bool = False
    strategy: str = "conductor"  # "learned" for conductor-learned
    # Whether the key's principal may start runs on the key's team (run_create's own check),
    # answered with the pool so a cached target answers both (issue #15).
    team_allowed: bool = False


# Resolved targets by access version: a grant, pool, worker, membership or user change anywhere
# misses them all at once (apps.governance.access_version). Refusals are never cached: each is
# answered and audited afresh.
_targets: AccessCache[Target] = AccessCache(size=2048)


def resolve_model(key: ApiKey, model: Any) -> Target:
    """Map a protocol's ``model`` to a preset and a pool this key may use.

    ``conductor-mini`` / ``conductor-ultra`` run on the team's default pool; ``<preset>:<pool>``
    or a bare ``<pool>`` slug pick another pool. Unknown → 404 ``model_not_found``."""
    stamp = getattr(key, "access_stamp", None)
    question = (key.pk, key.team_id, key.created_by_id, key.team.default_pool_id, model)
    hit = _targets.get(stamp, question)
    if hit is not None:
        # Each request gets its own pool instance: callers may load relations on it.
        return replace(hit, pool=copy.copy(hit.pool))
    target = _resolve_model(key, model)
    target = replace(target, team_allowed=gov.can_run_on_team(key.created_by, key.team))
    _targets.put(stamp, question, target)
    return replace(target, pool=copy.copy(target.pool))


def _resolve_model(key: ApiKey, model: Any) -> Target:
    user = key.created_by
    if not isinstance(model, str) or not model.strip():
        raise ApiError(
            400, "'model' is required: e.g. 'conductor-mini'.", param="model", code="invalid_value"
        )
    model = model.strip()
    base, sep, slug = model.partition(":")
    direct = False
    strategy = "learned" if base == LEARNED_MODEL else "conductor"
    if base in PRESETS or base == LEARNED_MODEL:
        preset = PRESETS.get(base, "mini")
        pool_slug: str | None = slug if sep else None
        if sep and not slug:
            raise ApiError(
                400, f"Name a pool after the colon: '{base}:<pool>'.", param="model", code="invalid_value"
            )
    elif not sep:
        preset, pool_slug, direct = PRESETS["conductor-mini"], base, True
    else:
        raise unknown_model(key, model)

    if pool_slug is None:
        if key.team.default_pool_id is None:
            raise ApiError(
                400,
                f"The team '{key.team.slug}' has no default pool; use '{base}:<pool>' with a pool from /v1/models.",
                param="model",
                code="no_default_pool",
            )
        candidates = Pool.objects.filter(pk=key.team.default_pool_id)
    else:
        # A pool the caller cannot see at all is reported as an unknown model, not as forbidden,
        # so keys cannot probe other teams' pool names.
        candidates = api_sel.pools_visible_for(user, key).filter(slug=pool_slug)
    # One query (issue #15): the pool, whether this key may run on it (the verdict run_create is
    # handed instead of checking again), its worker count and its default worker.
    usable = api_sel.pools_usable_for(user, key).filter(pk=OuterRef("pk"))
    candidates = candidates.annotate(key_may_use=Exists(usable))
    if direct:  # only a pool model can be a pass-through: count its workers in the same query
        workers = PoolWorker.objects.filter(pool=OuterRef("pk")).order_by().values("pool")
        candidates = candidates.annotate(worker_count=Subquery(workers.annotate(n=Count("pk")).values("n")))
    pool = candidates.select_related("default_worker").first()
    if pool is None:
        raise unknown_model(key, model)
    if not pool.key_may_use:
        raise deny(
            key,
            403,
            "pool_not_allowed",
            f"This API key may not use the pool '{pool.slug}'.",
            detail=pool.slug,
            param="model",
        )
    passthrough = direct and pool.default_worker_id is not None and pool.worker_count == 1
    return Target(
        preset=preset, pool=pool, model=model, direct=direct, passthrough=passthrough, strategy=strategy
    )


# How many names an unknown-model 404 suggests, and how close (difflib's ratio) each must be.
SUGGESTIONS = 3
SUGGESTION_CUTOFF = 0.6


def usable_model_names(key: ApiKey) -> list[str]:
    """Every ``model`` this key may send: the presets, each usable pool, and each preset on it."""
    slugs = list(
        api_sel.pools_usable_for(key.created_by, key).order_by("slug").values_list("slug", flat=True)
    )
    bases = [*PRESETS, LEARNED_MODEL]
    return [*bases, *slugs, *(f"{base}:{slug}" for base in bases for slug in slugs)]


def unknown_model(key: ApiKey, model: Any) -> ApiError:
    """404 ``model_not_found`` for ``model``, suggesting the closest names this key may use (only
    those: a pool the key cannot use is never named, so a 404 cannot probe other teams' pools)."""
    text = str(model)[:200]
    close = difflib.get_close_matches(text, usable_model_names(key), n=SUGGESTIONS, cutoff=SUGGESTION_CUTOFF)
    hint = f" Did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
    return ApiError(
        404,
        f"The model '{text}' does not exist.{hint} GET /v1/models lists the models this key may use.",
        param="model",
        code="model_not_found",
    )


def models_payload(key: ApiKey) -> dict[str, Any]:
    """OpenAI's model list: the presets, then every pool the key may use."""
    user = key.created_by
    created = int(key.team.created_at.timestamp())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "conductor"}
        for name in [*PRESETS, LEARNED_MODEL]
    ]
    for pool in api_sel.pools_usable_for(user, key).order_by("slug"):
        data.append(
            {
                "id": pool.slug,
                "object": "model",
                "created": int(pool.created_at.timestamp()),
                "owned_by": pool.team.slug if pool.team_id else "platform",
            }
        )
    return {"object": "list", "data": data}


def check_capabilities(target: Target, req: RunRequest) -> None:
    """Refuse (400, naming the parameter) what the run's workers cannot honour. Tools need every
    worker that may write the answer to speak OpenAI's tool protocol."""
    if not req.options.tools:
        return
    kinds = pool_provider_kinds(target)
    unsupported = sorted({kind for kind in kinds.values() if kind not in TOOL_PROVIDER_KINDS})
    if unsupported:
        workers = ", ".join(sorted(slug for slug, kind in kinds.items() if kind not in TOOL_PROVIDER_KINDS))
        raise ApiError(
            400,
            f"Tool calling is not supported by the pool '{target.pool.slug}': its worker(s) {workers} "
            f"use the provider kind(s) {', '.join(unsupported)}; tools need an OpenAI or "
            "OpenAI-compatible provider.",
            param=req.tools_param,
            code="unsupported_parameter",
            headers=no_retry(),
        )


def pool_provider_kinds(target: Target) -> dict[str, str]:
    """Provider kind of each worker that may write the answer: the default worker for a pool
    model, every pool worker for a conductor model."""
    pool = target.pool
    if target.direct and pool.default_worker_id:
        worker = pool.default_worker
        return {worker.slug: worker.provider.kind}
    rows = pool.pool_workers.select_related("worker__provider")
    return {row.worker.slug: row.worker.provider.kind for row in rows}
