"""The run bridge: everything a ``/v1`` protocol adapter needs, whatever protocol it speaks.

An adapter (Chat Completions, Responses, Messages) does three things:

1. ``started = await sync_to_async(start_run)(request, parse)`` — ``parse(body) -> RunRequest``
   turns the protocol's JSON into the neutral ``RunRequest``; ``start_run`` authenticates the key
   (401/429 before any parsing), parses, checks the key's scope, resolves the model to a pool
   (``resolve_model``), refuses what the pool cannot honour (``check_capabilities``), checks the
   token rate limit and creates the run (``run_create``: policy, budget, audit, dispatch). Every
   refusal is an ``OpenAIError`` (render it with ``errors.error_response(err, shape)``).
2. Follow the run: ``await wait_for_run(run)`` (plain) or ``async for update in follow_run(run)``
   (streaming: each persisted event in ``seq`` order, keep-alive ticks, then the final run).
3. Answer from the final run: ``run_outcome_error`` (the error for a run that ended without a
   releasable answer), ``final_answer`` (text, tool calls, finish reason, held), ``usage``,
   ``conductor_info`` / ``held_info`` (the ``conductor`` field), ``count_tokens`` (the key's
   token budget). A failure while following becomes ``follow_failure_error`` (it names the run).

Headers: ``apps.api.v1.middleware`` puts ``x-request-id``, ``openai-processing-ms``, the
``x-ratelimit-*`` pairs and CORS on every ``/v1`` response; adapters add ``run_headers(run,
url)``. ``request_state(request)`` is the per-request record the middleware and ``authenticate``
share (request id, rate-limit decisions).

The views are async: waiting for a run costs no thread. A run's progress is followed by joining its
channel group ``run.<id>`` (a wake-up) and reading ``RunEvent`` rows by ``seq`` (the truth), so no
event is lost or repeated whichever channel layer is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from apps.api import keyguard, ratelimit
from apps.api import selectors as api_sel
from apps.api.authentication import presented_key
from apps.api.models import ApiKey, ApiScope
from apps.api.services import ApiKeyInvalid, apikey_record_denied
from apps.api.v1.errors import OpenAIError, no_retry
from apps.engine.generation import GenerationOptions

logger = logging.getLogger(__name__)

PRESETS = {"conductor-mini": "mini", "conductor-ultra": "ultra"}
# The learned router (apps.learning): strategy "learned"; ":<pool>" picks the pool like a preset.
LEARNED_MODEL = "conductor-learned"
# How long a follower sleeps between database reads when no channel message wakes it.
FOLLOW_POLL_S = 0.25
# Joining or leaving the run's channel group may not stall a client longer than this.
LAYER_OP_TIMEOUT_S = 2.0
# A streaming client re-reads the Run row this often, besides its events.
STATUS_CHECK_S = 2.0
# A client waits this long past the run's own deadline for its final event (the engine stops at
# the deadline, then records the verdict) before it is told to follow the run at its URL.
FOLLOW_GRACE_S = 30.0
# A quiet stream sends a keep-alive this often so proxies do not close it.
KEEPALIVE_S = 15.0
# Provider kinds whose workers accept OpenAI-style function tools.
TOOL_PROVIDER_KINDS = frozenset({"openai", "openai_compatible"})


# --- per-request state (shared with apps.api.v1.middleware) --------------------------------------


@dataclass
class RequestState:
    """What one ``/v1`` request learned that its response headers report."""

    request_id: str
    started: float = field(default_factory=time.monotonic)
    requests: ratelimit.Decision | None = None  # the request-count decision for the key
    tokens: ratelimit.Decision | None = None  # the key's token window (peeked)
    # Time the request's run spent waiting on model providers (``run.finished``'s ``provider_ms``),
    # known once a plain response's run ended: x-conductor-overhead-ms is the rest.
    provider_ms: float | None = None


# The state of the /v1 request being served (set by the middleware), so the bridge can note the
# provider wait whichever adapter waits for the run.
_current_state: contextvars.ContextVar[RequestState | None] = contextvars.ContextVar(
    "v1_request_state", default=None
)


def bind_state(state: RequestState) -> None:
    _current_state.set(state)


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_state(request: HttpRequest) -> RequestState:
    """The request's state (made on first use when no middleware made it, e.g. in unit tests)."""
    state = getattr(request, "v1_state", None)
    if state is None:
        state = RequestState(new_request_id())
        request.v1_state = state  # type: ignore[attr-defined]
    return state


def rate_limit_headers(state: RequestState) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers from the decisions taken for this request."""
    headers: dict[str, str] = {}
    for name, decision in (("requests", state.requests), ("tokens", state.tokens)):
        if decision is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(decision.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(max(0, decision.limit - decision.count))
        headers[f"x-ratelimit-reset-{name}"] = f"{decision.retry_after_s}s"
    return headers


def run_headers(run: Any, url: str) -> dict[str, str]:
    """The headers naming the run a response belongs to (also sent before a stream's body)."""
    return {"X-Conductor-Run": str(run.id), "X-Conductor-Run-Url": url}


# --- authentication and model resolution (sync: ORM) ---------------------------------------------


def authenticate(request: HttpRequest) -> ApiKey:
    """The key the request presents (``Authorization: Bearer`` or ``x-api-key``), counted against
    its request rate limit. Raises ``OpenAIError`` 401 / 429 (with ``Retry-After``)."""
    state = request_state(request)
    raw = presented_key(request)
    if raw is None:
        raise OpenAIError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer cw_…'.",
            code="missing_api_key",
        )
    try:
        key = keyguard.authenticate(request, raw)
    except keyguard.KeyThrottled as exc:
        raise OpenAIError(
            429,
            exc.message,
            type_="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from None
    except ApiKeyInvalid as exc:
        raise OpenAIError(401, exc.reason, code=exc.code) from None
    decision = ratelimit.hit_requests(key_prefix=key.prefix, limit=key.requests_per_minute)
    state.requests = decision
    try:
        state.tokens = ratelimit.check_tokens(key_prefix=key.prefix, limit=key.tokens_per_minute)
    except Exception:  # headers are informative; never fail a request over them
        logger.debug("could not read the token window", exc_info=True)
    if not decision.allowed:
        raise OpenAIError(
            429,
            f"Rate limit reached: {decision.limit} requests per minute for this key. "
            f"Try again in {decision.retry_after_s}s.",
            type_="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(decision.retry_after_s)},
        )
    return key


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


def deny(key: ApiKey, status: int, reason: str, message: str, detail: str = "", **kw: Any) -> OpenAIError:
    """A refusal recorded in the audit trail as ``apikey.denied`` (not retried by SDKs)."""
    apikey_record_denied(api_key=key, reason=reason, detail=detail)
    return OpenAIError(status, message, code=reason, headers=no_retry(), **kw)


def resolve_model(key: ApiKey, model: Any) -> Target:
    """Map a protocol's ``model`` to a preset and a pool this key may use.

    ``conductor-mini`` / ``conductor-ultra`` run on the team's default pool; ``<preset>:<pool>``
    or a bare ``<pool>`` slug pick another pool. Unknown → 404 ``model_not_found``."""
    from apps.workers.models import Pool

    user = key.created_by
    if not isinstance(model, str) or not model.strip():
        raise OpenAIError(
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
            raise OpenAIError(
                400, f"Name a pool after the colon: '{base}:<pool>'.", param="model", code="invalid_value"
            )
    elif not sep:
        preset, pool_slug, direct = PRESETS["conductor-mini"], base, True
    else:
        raise OpenAIError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")

    if pool_slug is None:
        pool = key.team.default_pool
        if pool is None:
            raise OpenAIError(
                400,
                f"The team '{key.team.slug}' has no default pool; use '{base}:<pool>' with a pool from /v1/models.",
                param="model",
                code="no_default_pool",
            )
    else:
        pool = Pool.objects.filter(slug=pool_slug).first()
        # A pool the caller cannot see at all is reported as an unknown model, not as forbidden,
        # so keys cannot probe other teams' pool names.
        if pool is None or not api_sel.pools_visible_for(user, key).filter(pk=pool.pk).exists():
            raise OpenAIError(
                404, f"The model '{model}' does not exist.", param="model", code="model_not_found"
            )
    if not api_sel.pools_usable_for(user, key).filter(pk=pool.pk).exists():
        raise deny(
            key,
            403,
            "pool_not_allowed",
            f"This API key may not use the pool '{pool.slug}'.",
            detail=pool.slug,
            param="model",
        )
    passthrough = direct and pool.default_worker_id is not None and pool.pool_workers.count() == 1
    return Target(
        preset=preset, pool=pool, model=model, direct=direct, passthrough=passthrough, strategy=strategy
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


# --- the neutral request -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRequest:
    """What a client asked for, in no protocol's words.

    ``messages`` are OpenAI-style chat messages (``role``, ``content`` text, and for tool
    conversations ``tool_calls`` / ``tool_call_id``); ``question`` is the one conductor question
    made from them (``question_from_turns``). ``options`` are the generation options for the
    worker that writes the answer (``max_tokens``, ``stop``, ``temperature``, ``top_p``, ``seed``,
    ``response_format``, ``tools``, ``tool_choice``)."""

    model: Any
    question: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    options: GenerationOptions = field(default_factory=GenerationOptions)
    stream: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    # The protocol field that carried the tools (for "not supported" messages): tools, functions.
    tools_param: str = "tools"
    extra: dict[str, Any] = field(default_factory=dict)  # adapter-specific (e.g. include_usage)
    # Adapter data kept on the run (``Run.api_request["protocol"]``), e.g. a stored response's
    # input for ``previous_response_id``. Content keys ("messages", "instructions") are erased
    # with the run's payload.
    keep: dict[str, Any] = field(default_factory=dict)


ROLE_LABELS = {
    "system": "System",
    "developer": "System",
    "user": "User",
    "assistant": "Assistant",
    "tool": "Tool",
}


def question_from_turns(messages: list[dict[str, Any]]) -> str:
    """One conductor question from a chat: a single turn as is, else every turn labelled by role
    (assistant tool calls and tool results included), the last user turn last."""
    turns: list[tuple[str, str]] = []
    for message in messages:
        role = str(message.get("role") or "user")
        text = str(message.get("content") or "")
        calls = message.get("tool_calls") or []
        if calls:
            rendered = "; ".join(
                f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments') or ''})"
                for c in calls
                if isinstance(c, dict)
            )
            text = f"{text}\n[tool calls: {rendered}]".strip()
        if role == "tool" and message.get("tool_call_id"):
            text = f"[result of {message['tool_call_id']}] {text}"
        turns.append((role, text))
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{ROLE_LABELS.get(role, 'User')}: {text}" for role, text in turns if text.strip())


def check_capabilities(target: Target, req: RunRequest) -> None:
    """Refuse (400, naming the parameter) what the run's workers cannot honour. Tools need every
    worker that may write the answer to speak OpenAI's tool protocol."""
    if not req.options.tools:
        return
    kinds = pool_provider_kinds(target)
    unsupported = sorted({kind for kind in kinds.values() if kind not in TOOL_PROVIDER_KINDS})
    if unsupported:
        workers = ", ".join(sorted(slug for slug, kind in kinds.items() if kind not in TOOL_PROVIDER_KINDS))
        raise OpenAIError(
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


# --- starting the run (sync: ORM, transaction) ------------------------------------------------------


def run_url(request: HttpRequest, run_id: Any) -> str:
    try:
        path = reverse("runs:detail", args=[run_id])
    except NoReverseMatch:
        path = f"/runs/{run_id}/"
    return request.build_absolute_uri(path)


@dataclass(frozen=True)
class Started:
    key: ApiKey
    req: RunRequest
    target: Target
    run: Any


def api_request_record(req: RunRequest, target: Target) -> dict[str, Any]:
    """What the run row keeps of the request so execution can honour it (see
    ``apps.runs.execution``): generation options, and for a pool model with tools the
    conversation that goes to the worker as it is."""
    record: dict[str, Any] = {"options": req.options.to_dict()}
    if req.metadata:
        record["metadata"] = dict(req.metadata)
    if target.direct and (req.options.tools or target.passthrough):
        record["conversation"] = [dict(m) for m in req.messages]
    if req.keep:
        record["protocol"] = dict(req.keep)
    return record


def start_run(
    request: HttpRequest,
    parse: Callable[[bytes], RunRequest],
    prepare: Callable[[RunRequest, ApiKey], RunRequest] | None = None,
) -> Started:
    """``_start_run``, with any failure of a part (the database busy past its timeout, Redis)
    turned into a 503 naming the part: no run was started, and the client hears why in its
    protocol's error shape rather than an HTML 500."""
    try:
        return _start_run(request, parse, prepare)
    except OpenAIError:
        raise
    except Exception as exc:
        logger.exception("could not start a run")
        raise OpenAIError(503, f"No run was started: {failure_cause(exc)}.", type_="server_error") from exc


def _start_run(
    request: HttpRequest,
    parse: Callable[[bytes], RunRequest],
    prepare: Callable[[RunRequest, ApiKey], RunRequest] | None = None,
) -> Started:
    """Authenticate, parse, authorise, resolve, check and create the run. Raises OpenAIError.

    ``prepare(req, key)`` (optional) completes the parsed request with what only the key may
    read, e.g. the history of a ``previous_response_id``; it runs after the scope check."""
    from apps.runs.models import RunSource
    from apps.runs.services import RunRefused, run_create

    key = authenticate(request)
    req = parse(request.body)
    refusal = api_sel.scope_refusal(key, ApiScope.RUNS_WRITE)
    if refusal is not None:
        raise deny(key, 403, "insufficient_scope", refusal, detail=ApiScope.RUNS_WRITE)
    if prepare is not None:
        req = prepare(req, key)
    target = resolve_model(key, req.model)
    check_capabilities(target, req)
    tokens = request_state(request).tokens or ratelimit.check_tokens(
        key_prefix=key.prefix, limit=key.tokens_per_minute
    )
    if not tokens.allowed:
        raise OpenAIError(
            429,
            f"Rate limit reached: {tokens.limit} tokens per minute for this key. Try again in {tokens.retry_after_s}s.",
            type_="tokens",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(tokens.retry_after_s)},
        )
    record = api_request_record(req, target)
    try:
        run = run_create(
            actor=key.created_by,
            team=key.team,
            pool=target.pool,
            question=req.question,
            # A pool model's tool conversation (or any chat, on a one-worker pool) runs as one step
            # on the default worker.
            strategy="single" if "conversation" in record else target.strategy,
            preset=target.preset,
            source=RunSource.OPENAI_API,
            api_key=key,
            request_id=request_state(request).request_id,
            api_request=record,
        )
    except RunRefused as refused:
        raise refusal_error(refused) from None
    return Started(key=key, req=req, target=target, run=run)


def refusal_error(refused: Any) -> OpenAIError:
    """``RunRefused`` (nothing stored, no model called) as the client's error."""
    if refused.code == "budget_exhausted":
        headers = no_retry()
        if refused.retry_after_s:
            headers["Retry-After"] = str(int(refused.retry_after_s))
        return OpenAIError(
            429, refused.message, type_="insufficient_quota", code="budget_exhausted", headers=headers
        )
    if refused.code == "pool_not_allowed":
        return OpenAIError(403, refused.message, param="model", code="pool_not_allowed", headers=no_retry())
    if refused.code == "pool_unavailable":
        return OpenAIError(
            503, refused.message, type_="server_error", code="pool_unavailable", headers=no_retry()
        )
    return OpenAIError(400, refused.message, param="messages", code="invalid_value")


# --- following a run -------------------------------------------------------------------------------


class _LayerState:
    """Whether channel-layer wake-ups work in this process; logs once per transition, not per client."""

    def __init__(self) -> None:
        self.failing_since: float | None = None

    def failed(self, where: str, exc: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = time.time()
            logger.warning(
                "channel layer failed on %s (%s); /v1 clients follow runs by polling the database",
                where,
                type(exc).__name__,
            )

    def ok(self) -> None:
        if self.failing_since is not None:
            self.failing_since = None
            logger.warning("channel layer answers again; /v1 clients are woken by run events")


_layer_state = _LayerState()


class RunFollower:
    """Joins ``run.<id>`` to be woken when the run emits; readers then go to the database.

    The channel layer is only a wake-up: any failure of it (join, receive, discard — e.g. Redis
    timing out or going away) switches this follower to polling the database, which holds every
    event, so a client always reaches the run's ending.
    """

    def __init__(self, run_id: Any) -> None:
        self.group = f"run.{run_id}"
        self.layer: Any = None
        self.channel: str | None = None

    async def __aenter__(self) -> RunFollower:
        try:
            from channels.layers import get_channel_layer

            from apps.runs.sink import register_server_loop

            self.layer = get_channel_layer()
            if self.layer is not None:
                register_server_loop(asyncio.get_running_loop())
                self.channel = await asyncio.wait_for(self.layer.new_channel(), LAYER_OP_TIMEOUT_S)
                await asyncio.wait_for(self.layer.group_add(self.group, self.channel), LAYER_OP_TIMEOUT_S)
                _layer_state.ok()
        except Exception as exc:  # the database poll still finds every event
            _layer_state.failed("join", exc)
            self.channel = None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.layer is not None and self.channel is not None:
            try:
                await asyncio.wait_for(self.layer.group_discard(self.group, self.channel), LAYER_OP_TIMEOUT_S)
            except Exception:  # the group entry expires on its own
                logger.debug("group_discard failed for %s", self.group, exc_info=True)

    async def wait(self, timeout: float) -> dict[str, Any] | None:
        """The wake-up message received (None: the poll interval passed, or polling)."""
        if timeout <= 0:
            return None
        if self.channel is None:
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))
            return None
        try:
            message: dict[str, Any] = await asyncio.wait_for(
                self.layer.receive(self.channel), timeout=min(timeout, FOLLOW_POLL_S)
            )
            return message
        except TimeoutError:
            return None  # no wake-up this interval: the caller reads the database anyway
        except Exception as exc:  # e.g. redis TimeoutError/ConnectionError: poll from now on
            _layer_state.failed("receive", exc)
            self.channel = None
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))
            return None


def _may_end_run(message: dict[str, Any] | None) -> bool:
    """Whether a wake-up calls for reading the run: its end, or anything not a plain run event.
    A run's other events (several per run) need no database read by a plain waiter."""
    if message is None or message.get("type") != "run.event":
        return True
    event = message.get("event")
    return not isinstance(event, dict) or event.get("type") in ("run.finished", "run.awaiting_approval")


def events_after(run_id: Any, seq: int) -> list[dict[str, Any]]:
    """The run's persisted events after ``seq``, in order (``seq``, ``type``, ``data``)."""
    from apps.runs.models import RunEvent

    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq").values("seq", "type", "data")
    return [dict(row) for row in rows]


def load_run(run_id: Any) -> Any:
    from apps.runs.models import Run

    return Run.objects.select_related("pool").get(pk=run_id)


def blocked_rules(run_id: Any) -> list[str]:
    """Names of the checks that blocked the run (never their findings)."""
    from apps.runs.models import RunEvent

    names: list[str] = []
    for data in RunEvent.objects.filter(run_id=run_id, type="guardrail.checked").values_list(
        "data", flat=True
    ):
        if not isinstance(data, dict) or not data.get("blocked"):
            continue
        for check in data.get("checks") or []:
            if (
                isinstance(check, dict)
                and check.get("status") == "intervened"
                and check.get("action") == "block"
            ):
                names.append(f"{data.get('stage')}:{check.get('name')}")
    return names


def run_deadline(run: Any) -> float:
    """The ``time.monotonic()`` instant a /v1 client stops waiting for ``run``: the run's own
    deadline (``RUN_TIMEOUT_S`` after it was created) plus ``FOLLOW_GRACE_S`` for its verdict."""
    from django.utils import timezone

    left = float(settings.RUN_TIMEOUT_S)
    deadline_at = getattr(run, "deadline_at", None)
    if deadline_at is not None:
        left = min(left, (deadline_at - timezone.now()).total_seconds())
    return time.monotonic() + max(0.0, left) + FOLLOW_GRACE_S


def provider_wait_ms(run_id: Any) -> float | None:
    """How long the run waited on model providers (recorded by the sink on ``run.finished``)."""
    from apps.runs.models import RunEvent

    data = (
        RunEvent.objects.filter(run_id=run_id, type="run.finished")
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    value = data.get("provider_ms") if isinstance(data, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _load_ended(run_id: Any) -> tuple[Any, float | None]:
    run = load_run(run_id)
    return run, provider_wait_ms(run_id) if run.is_terminal else None


def approval_wait_left(run_id: Any) -> float:
    """Seconds a /v1 caller may still wait for the decision on the run's held plan
    (``constraints.approval.api_wait_s``); 0 when it must be answered now."""
    from django.utils import timezone

    from apps.runs.models import PlanApproval

    until = (
        PlanApproval.objects.filter(run_id=run_id, decision="pending")
        .order_by("-requested_at")
        .values_list("api_wait_until", flat=True)
        .first()
    )
    return max(0.0, (until - timezone.now()).total_seconds()) if until is not None else 0.0


async def wait_for_run(run: Any) -> Any:
    """The run once it is terminal (or paused for an approver past the policy's wait), or as it
    is at the client's deadline."""
    deadline = run_deadline(run)
    async with RunFollower(run.id) as follower:
        while True:
            current, waited_ms = await sync_to_async(_load_ended)(run.id)
            ended, may_wait = current.is_terminal, float("inf")
            if current.status == "awaiting_approval":  # answered once the policy's wait is over
                may_wait = await sync_to_async(approval_wait_left)(run.id)
                ended = may_wait <= 0
            # An approved run is given a fresh time limit: so is its caller.
            deadline = max(deadline, run_deadline(current))
            if ended or time.monotonic() >= deadline:
                state = _current_state.get()
                if state is not None and waited_ms is not None:
                    state.provider_ms = waited_ms
                return current
            until = min(deadline, time.monotonic() + may_wait)
            # Skip the read for events that cannot end the run; a quiet interval (a lost publish
            # included) still reads the database every FOLLOW_POLL_S.
            while not _may_end_run(await follower.wait(until - time.monotonic())):
                if time.monotonic() >= until:
                    break


@dataclass(frozen=True)
class RunUpdate:
    """One item of ``follow_run``: ``kind`` is ``event`` (``event`` set), ``keepalive`` (the
    stream was quiet for ``KEEPALIVE_S``) or ``final`` (``run`` set: the run as it ended)."""

    kind: str
    event: dict[str, Any] | None = None
    run: Any = None


async def follow_run(run: Any) -> AsyncIterator[RunUpdate]:
    """Every persisted event of ``run`` in ``seq`` order until ``run.finished`` (or the client's
    deadline), keep-alive ticks when quiet, then the final run row."""
    last_seq = 0
    deadline = run_deadline(run)
    last_sent = time.monotonic()
    next_check = time.monotonic() + STATUS_CHECK_S
    terminal_seen = False
    held_until: float | None = None  # set while the run's plan waits for an approver
    async with RunFollower(run.id) as follower:
        finished = False
        while not finished and time.monotonic() < deadline:
            for event in await sync_to_async(events_after)(run.id, last_seq):
                last_seq = event["seq"]
                yield RunUpdate("event", event=event)
                last_sent = time.monotonic()
                if event["type"] == "run.finished":
                    finished = True
                    break
                if event["type"] == "run.awaiting_approval":
                    held_until = time.monotonic() + await sync_to_async(approval_wait_left)(run.id)
            if not finished and held_until is not None and time.monotonic() >= held_until:
                current = await sync_to_async(load_run)(run.id)
                if current.status == "awaiting_approval":
                    break  # the policy's wait for an approver is over: the caller is answered now
                held_until = None
                deadline = max(deadline, run_deadline(current))
            if not finished and time.monotonic() >= next_check:
                # The events are the truth, but a run that vanished (deleted: DoesNotExist) or
                # ended without its run.finished row showing up must end the stream too.
                next_check = time.monotonic() + STATUS_CHECK_S
                if (await sync_to_async(load_run)(run.id)).is_terminal:
                    finished, terminal_seen = terminal_seen, True
                    continue  # read the events once more before giving up on run.finished
            if not finished:
                if time.monotonic() - last_sent > KEEPALIVE_S:
                    yield RunUpdate("keepalive")
                    last_sent = time.monotonic()
                wake = deadline if held_until is None else min(deadline, held_until)
                await follower.wait(wake - time.monotonic())
        # The Run row is updated in the same transaction as run.finished; read the verdict.
        final = await sync_to_async(load_run)(run.id)
    yield RunUpdate("final", run=final)


def failure_cause(exc: BaseException) -> str:
    """Which part failed, in words safe for a client (never the exception text: it may quote data)."""
    module = type(exc).__module__
    if module.startswith(("redis", "channels_redis")):
        part = "Redis (the channel layer)"
    elif module.startswith(("django.db", "psycopg", "sqlite3")):
        part = "the database"
    else:
        part = "the server"
    return f"{part} failed ({type(exc).__name__})"


def follow_failure_error(request: HttpRequest, run: Any, target: Target, exc: BaseException) -> OpenAIError:
    """The answer for a client whose wait broke after its run was created: it names the cause and
    the run (header, ``conductor`` field and message), so the client can look it up later."""
    from django.core.exceptions import ObjectDoesNotExist

    conductor = conductor_info(request, run, target)
    conductor["status"] = "unknown"
    if isinstance(exc, ObjectDoesNotExist):
        logger.warning("run %s was deleted while a /v1 client waited for it", run.id)
        return OpenAIError(
            410,
            f"Run {run.id} was deleted while this request waited for it.",
            type_="server_error",
            code="run_deleted",
            headers=no_retry(),
            conductor=conductor,
        )
    logger.error(
        "lost track of run %s while a /v1 client waited: %s", run.id, type(exc).__name__, exc_info=exc
    )
    return OpenAIError(
        503,
        f"Waiting for run {run.id} failed: {failure_cause(exc)}. The run itself goes on; "
        f"follow it at {conductor['url']}.",
        type_="server_error",
        code="run_follow_failed",
        headers=no_retry(),  # a retry would start a second run
        conductor=conductor,
    )


def count_tokens_sync(key: ApiKey, run: Any) -> None:
    """Charge the run's tokens to the key's per-minute token window."""
    # Accounting must never turn a finished run into an error for its client.
    try:
        ratelimit.add_tokens(key_prefix=key.prefix, tokens=run.input_tokens + run.output_tokens)
    except Exception:
        logger.warning("could not count the tokens of run %s", run.id, exc_info=True)


async def count_tokens(key: ApiKey, run: Any) -> None:
    await sync_to_async(count_tokens_sync)(key, run)


async def guarded_stream(
    body: AsyncGenerator[bytes, None],
    *,
    is_end: Callable[[bytes], bool],
    on_failure: Callable[[BaseException], Iterable[bytes]],
) -> AsyncIterator[bytes]:
    """``body``, but whatever fails after the run exists, the stream still ends: unless the
    piece that ``is_end`` recognises went out, ``on_failure(exc)`` supplies the protocol's error
    event and end marker."""
    ended = False
    try:
        async with contextlib.aclosing(body) as pieces:
            async for piece in pieces:
                ended = is_end(piece)
                yield piece
    except Exception as exc:
        if not ended:
            for piece in on_failure(exc):
                yield piece


def sse(payload: dict[str, Any] | str, *, event: str | None = None) -> bytes:
    """One server-sent event (``event:`` line only when named, as Anthropic and Responses use)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


SSE_KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients ignore it, proxies see a live stream


# --- the outcome -----------------------------------------------------------------------------------


def conductor_info(request: HttpRequest, run: Any, target: Target) -> dict[str, Any]:
    """The ``conductor`` field every /v1 answer carries: the run, its graph URL and totals."""
    return {
        "run_id": str(run.id),
        "url": run_url(request, run.id),
        "status": run.status,
        "pool": target.pool.slug,
        "preset": target.preset,
        "steps": run.step_count,
        "cost_usd": str(run.cost_usd) if run.cost_usd is not None else None,
        "policy_version_id": run.policy_version_id,
        "answer_held": bool(run.answer_held),
        "request_id": getattr(run, "request_id", "") or None,
    }


def held_info(run_id: Any) -> dict[str, Any]:
    """Which rules hold the answer and why (names only, never the findings or the answer)."""
    from apps.runs.selectors import held_reason, run_hold_rules

    rules = run_hold_rules(run_id)
    return {"rules": rules, "reason": held_reason(rules)}


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def usage(run: Any) -> Usage:
    """The run's whole token usage (conductor calls and every step)."""
    return Usage(run.input_tokens, run.output_tokens)


@dataclass(frozen=True)
class FinalAnswer:
    """What a succeeded run answers: ``text`` (None while held), ``tool_calls`` (OpenAI's shape:
    ``id``, ``type``, ``function: {name, arguments}``; empty while held), ``finish_reason``
    (``stop``, ``length``, ``tool_calls``, or ``content_filter`` while held) and ``held``."""

    text: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    held: bool


def final_answer(run: Any) -> FinalAnswer:
    """The answer of a succeeded run; the extras (finish reason, tool calls) come from its
    ``run.finished`` event. A held answer gives nothing away (see ``run_content_visible``)."""
    from apps.runs.models import RunEvent

    if run.answer_held:
        return FinalAnswer(None, [], "content_filter", True)
    data = (
        RunEvent.objects.filter(run_id=run.id, type="run.finished")
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    data = data if isinstance(data, dict) else {}
    calls = [c for c in data.get("tool_calls") or [] if isinstance(c, dict)]
    finish = str(data.get("finish_reason") or ("tool_calls" if calls else "stop"))
    return FinalAnswer(run.answer, calls, finish, False)


def awaiting_fields(run_id: Any) -> list[str]:
    """The policy fields whose action held the run's plan."""
    from apps.runs.models import PlanApproval

    row = (
        PlanApproval.objects.filter(run_id=run_id, decision="pending")
        .order_by("-requested_at")
        .values_list("fields", flat=True)
        .first()
    )
    return [str(f) for f in row or []]


def run_outcome_error(run: Any, conductor: dict[str, Any]) -> OpenAIError | None:
    """The error for a run that ended without a releasable answer, else None."""
    status = run.status
    if status == "succeeded":
        return None
    if status == "blocked":
        rules = blocked_rules(run.id)
        rule_text = f" (policy rule: {', '.join(rules)})" if rules else ""
        reason = run.error or run.status_reason or "blocked by policy"
        return OpenAIError(
            400,
            f"{reason}{rule_text}",
            code="content_policy_violation",
            headers=no_retry(),
            conductor=conductor,
        )
    if status == "cancelled":
        return OpenAIError(
            409, "The run was cancelled.", code="run_cancelled", headers=no_retry(), conductor=conductor
        )
    if status == "awaiting_approval":
        fields = ", ".join(awaiting_fields(run.id)) or "constraints.forecast.action"
        return OpenAIError(
            409,
            f"{run.error or 'The plan waits for an approver.'} (policy field: {fields}). Run {run.id} "
            "resumes once a team admin or reviewer approves its plan; follow it at its URL.",
            type_="approval_required",
            code="plan_awaiting_approval",
            headers=no_retry(),
            conductor=conductor,
        )
    if status in ("timed_out", "queued", "running"):
        message = (
            run.error or "The run timed out."
            if status == "timed_out"
            else "The run did not finish in time; follow it at its URL."
        )
        return OpenAIError(
            504, message, type_="server_error", code="run_timed_out", headers=no_retry(), conductor=conductor
        )
    if run.status_reason == "response_format_invalid":
        return OpenAIError(
            422,
            run.error or "The answer did not match the requested response_format.",
            param="response_format",
            code="response_format_invalid",
            headers=no_retry(),
            conductor=conductor,
        )
    return OpenAIError(
        502,
        run.error or "The run failed.",
        type_="server_error",
        code="run_failed",
        headers=no_retry(),
        conductor=conductor,
    )


def progress(event: dict[str, Any]) -> dict[str, Any] | None:
    """The ``conductor`` progress field for one run event (None for events not worth a chunk)."""
    kind, data, seq = event["type"], event.get("data") or {}, event["seq"]
    base = {"event": kind, "seq": seq}
    if data.get("holdable"):
        # The run's policy can hold its answer (require_review): a /v1 stream shows no model
        # output before the verdict — the final answer only arrives if it is not held.
        from apps.runs.selectors import withhold_event_data

        data = withhold_event_data(kind, data)
    if kind == "step.started":
        return {
            **base,
            "index": data.get("index"),
            "round": data.get("round"),
            "worker": data.get("worker_key"),
            "instruction": data.get("instruction"),
        }
    if kind == "step.delta":
        if data.get("withheld"):
            return None
        return {**base, "index": data.get("index"), "text": data.get("text")}
    if kind == "step.finished":
        return {**base, "index": data.get("index"), "status": data.get("status"), "usage": data.get("usage")}
    if kind == "plan.validated":
        plan = data.get("plan") or {}
        return {**base, "action": data.get("action"), "steps": len(plan.get("steps") or [])}
    if kind == "guardrail.checked":
        return {**base, "stage": data.get("stage"), "blocked": bool(data.get("blocked"))}
    return None
