"""The run bridge: everything a ``/v1`` protocol adapter needs, whatever protocol it speaks.

An adapter (Chat Completions, Responses, Messages) does three things:

1. ``started = await off_loop(start_run, request, parse)`` — ``parse(body) -> RunRequest``
   (``apps.api.v1.run_request``) turns the protocol's JSON into the neutral ``RunRequest``;
   ``start_run`` authenticates the key (``apps.api.v1.auth``: 401/429 before any parsing), parses,
   checks the key's scope, resolves the model to a pool (``apps.api.v1.targets.resolve_model``),
   refuses what the pool cannot honour (``check_capabilities``), checks the token rate limit and
   creates the run (``run_create``: policy, budget, audit, dispatch). Every refusal is an
   ``ApiError`` (render it with ``errors.error_response(err, shape)``).
2. Follow the run: ``await wait_for_run(run)`` (plain) or ``async for update in follow_run(run)``
   (streaming: each persisted event in ``seq`` order, keep-alive ticks, then the final run).
3. Answer from the final run with ``apps.api.v1.shaping`` (outcome errors, final answer, usage,
   the ``conductor`` field, SSE) and ``auth.count_tokens`` (the key's token budget).

Headers: ``apps.api.v1.middleware`` puts ``x-request-id``, ``openai-processing-ms``, the
``x-ratelimit-*`` pairs and CORS on every ``/v1`` response; adapters add ``auth.run_headers(run,
url)``.

The views are async: waiting for a run costs no thread. Following a run lives in
``apps.api.v1.follow`` (re-exported here): its channel group ``run.<id>`` is a wake-up and its
``RunEvent`` rows by ``seq`` the truth, so no event is lost or repeated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from apps.api import ratelimit
from apps.api import selectors as api_sel
from apps.api.budgets import KeyBudgetExceeded, key_budget_check
from apps.api.models import ApiKey, ApiScope
from apps.api.v1.auth import authenticate, deny, request_state
from apps.api.v1.errors import ApiError, no_retry
from apps.api.v1.follow import (
    FOLLOW_GRACE_S,
    FOLLOW_POLL_S,
    KEEPALIVE_S,
    STATUS_CHECK_S,
    RunFollower,
    RunUpdate,
    _load_ended,
    _may_end_run,
    answer_ended,
    approval_wait_left,
    events_after,
    finished_data,
    follow_run,
    load_run,
    provider_wait_ms,
    run_deadline,
    wait_for_run,
    with_finished_data,
)
from apps.api.v1.run_request import RunRequest
from apps.api.v1.shaping import failure_cause
from apps.api.v1.targets import Target, check_capabilities, resolve_model
from apps.engine.providers.gate import unreadable_field
from apps.runs import execution
from apps.runs import selectors as run_selectors
from apps.runs import services as run_services
from apps.runs.models import Run, RunSource
from apps.runs.services import RunRefused

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    key: ApiKey
    req: RunRequest
    target: Target
    run: Run
    # The run as it ended (or paused), when it executed on the request's thread (V1_INLINE_RUNS);
    # when ended, with its finished data and the provider time recorded (answer_ended).
    ended: Run | None = None
    # A stream's run accepted for execution in this process (start_run(live=True)): the inline
    # slot it holds. The caller must hand it to ``execute_live`` (which releases the slot).
    live_slot: threading.BoundedSemaphore | None = None


def api_request_record(req: RunRequest, target: Target) -> dict[str, Any]:
    """What the run row keeps of the request so execution can honour it (see
    ``apps.runs.execution``): generation options, and for a pool model with tools the
    conversation that goes to the worker as it is."""
    # ``stream``: whether the client follows the run as a stream (V1_UPSTREAM_STREAM).
    record: dict[str, Any] = {"options": req.options.to_dict(), "stream": bool(req.stream)}
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
    *,
    live: bool = False,
) -> Started:
    """``_start_run``, with any failure of a part (the database busy past its timeout, Redis)
    turned into a 503 naming the part: no run was started, and the client hears why in its
    protocol's error shape rather than an HTML 500.

    ``live``: the caller can execute a streamed pass-through itself (``execute_live``) and take
    its answer from a tap (``apps.runs.live``); when it is accepted so, ``Started.live_slot`` is set."""
    try:
        return _start_run(request, parse, prepare, live=live)
    except ApiError:
        raise
    except Exception as exc:
        logger.exception("could not start a run")
        raise ApiError(503, f"No run was started: {failure_cause(exc)}.", type_="server_error") from exc


def _start_run(
    request: HttpRequest,
    parse: Callable[[bytes], RunRequest],
    prepare: Callable[[RunRequest, ApiKey], RunRequest] | None = None,
    *,
    live: bool = False,
) -> Started:
    """Authenticate, parse, authorise, resolve, check and create the run. Raises ApiError.

    ``prepare(req, key)`` (optional) completes the parsed request with what only the key may
    read, e.g. the history of a ``previous_response_id``; it runs after the scope check."""

    key = authenticate(request)
    req = parse(request.body)
    refusal = api_sel.scope_refusal(key, ApiScope.RUNS_WRITE)
    if refusal is not None:
        raise deny(key, 403, "insufficient_scope", refusal, detail=ApiScope.RUNS_WRITE)
    if prepare is not None:
        req = prepare(req, key)
    unreadable = unreadable_field(req.messages, options=req.options)
    if unreadable is not None:
        # Every provider request passes the outbound gate, which refuses a field it cannot read
        # (issue 39): the client hears which one now, before a run starts.
        raise ApiError(
            400,
            f"The field {unreadable.path} cannot be checked by the policy ({unreadable.why}); "
            "no run was started.",
            param=unreadable.path,
            code="unreadable_field",
        )
    target = resolve_model(key, req.model)
    check_capabilities(target, req)
    tokens = request_state(request).tokens or ratelimit.check_tokens(
        key_prefix=key.prefix, limit=key.tokens_per_minute
    )
    if not tokens.allowed:
        raise ApiError(
            429,
            f"Rate limit reached: {tokens.limit} tokens per minute for this key. Try again in {tokens.retry_after_s}s.",
            type_="tokens",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(tokens.retry_after_s)},
        )
    check_key_budget(request, key)
    record = api_request_record(req, target)
    inline = execution.inline_wanted(stream=req.stream, passthrough=target.passthrough, live=live)
    slot = execution.take_inline_slot(inline)
    try:
        run = _create(request, key, req, target, record, execute_here=slot is not None)
        if slot is not None and req.stream:
            # Accepted claimed by this process: the caller executes it (execute_live).
            started, slot = Started(key=key, req=req, target=target, run=run, live_slot=slot), None
            return started
        ended = _execute_here(run) if slot is not None else None
    finally:
        if slot is not None:
            slot.release()
    if ended is not None and ended.is_terminal:
        ended = answer_ended(ended)  # on this thread: no second trip to one for the answer
    return Started(key=key, req=req, target=target, run=run, ended=ended)


def check_key_budget(request: HttpRequest, key: ApiKey) -> None:
    """The key's own dollar budget (issue 42), before the run (and its team's budget): a spent
    hard budget refuses like a spent team budget, naming the key's; a soft one warns."""
    try:
        warning = key_budget_check(key)
    except KeyBudgetExceeded as exc:
        err = deny(
            key,
            429,
            "budget_exhausted",
            str(exc),
            detail=f"key {exc.window.name} budget ${exc.window.hard_usd}",
            type_="insufficient_quota",
        )
        err.headers["Retry-After"] = str(exc.retry_after_s)
        raise err from None
    request_state(request).budget_warning = warning


def _create(
    request: HttpRequest,
    key: ApiKey,
    req: RunRequest,
    target: Target,
    record: dict[str, Any],
    *,
    execute_here: bool,
) -> Any:
    try:
        # Through the module, looked up per call: the seam tests replace to fail the store.
        return run_services.run_create(
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
            pool_allowed=True,  # resolve_model checked the key's pools (narrower than the actor's)
            team_allowed=target.team_allowed,  # asked for this actor and team (key.created_by, key.team)
            access_stamp=getattr(key, "access_stamp", None),
            execute_here=execute_here,
        )
    except RunRefused as refused:
        raise refusal_error(refused) from None


def _execute_here(run: Run) -> Any:
    """Execute the accepted run on this thread; the run as it ended, or None to follow it as any
    other. Never raises: the run is accepted, so a failure here must not become "no run was
    started"."""
    try:
        return execution.execute_here(run)
    except Exception as exc:
        logger.exception("run %s: inline execution failed; it is re-queued and followed", run.id)
        execution.give_back(run.id, f"inline execution failed ({type(exc).__name__})")
        return None


def execute_live(started: Started) -> Any:
    """Execute a run ``start_run(live=True)`` accepted for this process (on a request thread,
    while its stream is written); the run as it ended, with its finished data, or None to follow
    it as any other (see ``_execute_here``). Releases the run's inline slot."""
    try:
        ended = _execute_here(started.run)
        if ended is not None and ended.is_terminal:
            ended, _ = with_finished_data(ended)
        return ended
    finally:
        if started.live_slot is not None:
            started.live_slot.release()


def refusal_error(refused: RunRefused) -> ApiError:
    """``RunRefused`` (nothing stored, no model called) as the client's error."""
    if refused.code == "budget_exhausted":
        headers = no_retry()
        if refused.retry_after_s:
            headers["Retry-After"] = str(int(refused.retry_after_s))
        return ApiError(
            429, refused.message, type_="insufficient_quota", code="budget_exhausted", headers=headers
        )
    if refused.code == "pool_not_allowed":
        return ApiError(403, refused.message, param="model", code="pool_not_allowed", headers=no_retry())
    if refused.code == "pool_unavailable":
        return ApiError(
            503, refused.message, type_="server_error", code="pool_unavailable", headers=no_retry()
        )
    return ApiError(400, refused.message, param="messages", code="invalid_value")


def answer_buffered(started: Started) -> str | None:
    """Why the run's answer will not stream as it is written (None: it streams through the
    output gate): checks that need the whole answer, a hold, or a JSON response format."""
    if started.req.options.response_format is not None:
        return "a JSON response format is checked on the whole answer"
    return run_selectors.answer_buffered_reason(started.run)


# Following a run moved to apps.api.v1.follow; its names stay importable from here.
__all__ = [
    "FOLLOW_GRACE_S",
    "FOLLOW_POLL_S",
    "KEEPALIVE_S",
    "STATUS_CHECK_S",
    "RunFollower",
    "RunUpdate",
    "Started",
    "_load_ended",
    "_may_end_run",
    "answer_buffered",
    "api_request_record",
    "approval_wait_left",
    "check_key_budget",
    "events_after",
    "execute_live",
    "finished_data",
    "follow_run",
    "load_run",
    "provider_wait_ms",
    "refusal_error",
    "run_deadline",
    "start_run",
    "wait_for_run",
]
