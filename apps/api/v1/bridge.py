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

The views are async: waiting for a run costs no thread. A run's progress is followed by joining its
channel group ``run.<id>`` (a wake-up) and reading ``RunEvent`` rows by ``seq`` (the truth), so no
event is lost or repeated whichever channel layer is configured.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings
from django.http import HttpRequest

from apps.api import ratelimit
from apps.api import selectors as api_sel
from apps.api.budgets import KeyBudgetExceeded, key_budget_check
from apps.api.models import ApiKey, ApiScope
from apps.api.v1.auth import authenticate, current_state, deny, request_state
from apps.api.v1.errors import ApiError, no_retry
from apps.api.v1.run_request import RunRequest
from apps.api.v1.shaping import failure_cause
from apps.api.v1.targets import Target, check_capabilities, resolve_model
from apps.core.compiled import CompiledGet, CompiledRead
from apps.core.executor_db import off_loop, release_while_waiting
from apps.engine.providers.gate import unreadable_field
from apps.runs import execution
from apps.runs import selectors as run_selectors
from apps.runs import services as run_services
from apps.runs.end_listener import RunEndListener, run_end_listener
from apps.runs.models import PlanApproval, Run, RunEvent, RunSource, RunStatus
from apps.runs.services import RunRefused
from apps.runs.sink import message_events, register_server_loop

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Started:
    key: ApiKey
    req: RunRequest
    target: Target
    run: Run
    # The run as it ended (or paused), when it executed on the request's thread (V1_INLINE_RUNS);
    # when ended, with its finished data and the provider time recorded (_answer_ended).
    ended: Any = None
    # A stream's run accepted for execution in this process (start_run(live=True)): the inline
    # slot it holds. The caller must hand it to ``execute_live`` (which releases the slot).
    live_slot: Any = None


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
        ended = _answer_ended(ended)  # on this thread: no second trip to one for the answer
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
            ended, _ = _with_finished_data(ended)
        return ended
    finally:
        started.live_slot.release()


def refusal_error(refused: Any) -> ApiError:
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

    def __init__(self, run_id: Any, *, ends_only: bool = False) -> None:
        self.run_id = run_id
        self.group = f"run.{run_id}"
        self.layer: Any = None
        self.channel: str | None = None
        # ends_only: the caller reads the run when it may have ended, never its events. Where
        # PostgreSQL announces run ends (apps.runs.end_listener) that is all it waits for: no group
        # join, no event batches received.
        self.ends_only = ends_only
        # Set together when the run-end listener wakes this follower instead of the layer.
        self._ends: RunEndListener | None = None
        self._ended: asyncio.Future[bool] | None = None
        # One receive outlives the poll intervals. It was wrapped in wait_for(FOLLOW_POLL_S), and
        # redis-py drops a connection whose read is cancelled: a waiting client reconnected to
        # Redis four times a second.
        self._receiving: asyncio.Future[dict[str, Any]] | None = None

    async def __aenter__(self) -> RunFollower:
        if self.ends_only:
            listener = run_end_listener()
            if listener is not None and listener.live:
                self._ends, self._ended = listener, listener.watch(self.run_id)
                return self
        try:
            from channels.layers import get_channel_layer

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
        if self._ends is not None and self._ended is not None:
            self._ends.unwatch(self.run_id, self._ended)
            return
        await self._stop_receiving()
        if self.layer is not None and self.channel is not None:
            try:
                await asyncio.wait_for(self.layer.group_discard(self.group, self.channel), LAYER_OP_TIMEOUT_S)
            except Exception:  # the group entry expires on its own
                logger.debug("group_discard failed for %s", self.group, exc_info=True)

    async def wait(self, timeout: float) -> dict[str, Any] | None:
        """The wake-up message received (None: the poll interval passed, or polling)."""
        if timeout <= 0:
            return None
        if self._ends is not None and self._ended is not None:
            ended = self._ended
            await asyncio.wait({ended}, timeout=min(timeout, FOLLOW_POLL_S))
            if not ended.done():
                return None  # the poll interval passed: the caller reads the database anyway
            # Watch again before the caller reads: an end after this read is announced too
            # (a run approved after awaiting_approval ends later).
            self._ended = self._ends.watch(self.run_id)
            return {"type": "run.end"}
        if self.channel is None:
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))
            return None
        if self._receiving is None:
            self._receiving = asyncio.ensure_future(self.layer.receive(self.channel))
        done, _ = await asyncio.wait({self._receiving}, timeout=min(timeout, FOLLOW_POLL_S))
        if not done:
            return None  # no wake-up this interval: the caller reads the database anyway
        received, self._receiving = self._receiving, None
        try:
            message: dict[str, Any] = received.result()
            return message
        except Exception as exc:  # e.g. redis TimeoutError/ConnectionError: poll from now on
            _layer_state.failed("receive", exc)
            self.channel = None
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))
            return None

    async def _stop_receiving(self) -> None:
        receiving, self._receiving = self._receiving, None
        if receiving is None:
            return
        receiving.cancel()
        await asyncio.wait({receiving})  # an outer cancellation still reaches the caller
        if not receiving.cancelled():
            receiving.exception()  # retrieved: the layer's failure (if any) ends with the follower


def _may_end_run(message: dict[str, Any] | None) -> bool:
    """Whether a wake-up calls for reading the run: its end, or anything not a plain run event.
    A run's other events (several per run) need no database read by a plain waiter."""
    events = None if message is None else message_events(message)
    if events is None:
        return True
    return any(
        not isinstance(event, dict) or event.get("type") in ("run.finished", "run.awaiting_approval")
        for event in events
    )


def events_after(run_id: Any, seq: int) -> list[dict[str, Any]]:
    """The run's persisted events after ``seq``, in order (``seq``, ``type``, ``data``)."""

    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq").values("seq", "type", "data")
    return [dict(row) for row in rows]


# A waiter's reads of its run, once or twice per run each: compiled once per process
# (apps.core.compiled, issue #15).
_RUN_WITH_POOL = CompiledGet(
    lambda vendor, run_id: Run.objects.select_related("pool").filter(pk=run_id), placeholders=[Run._meta.pk]
)
_FINISHED_DATA = CompiledRead(
    lambda vendor, run_id: (
        RunEvent.objects.filter(run_id=run_id, type="run.finished").order_by("-seq").values_list("data")[:1]
    ),
    placeholders=[Run._meta.pk],
)
_STATUS = CompiledRead(
    lambda vendor, run_id: Run.objects.filter(pk=run_id).values_list("status")[:1],
    placeholders=[Run._meta.pk],
)


def _uuid(run_id: Any) -> UUID:
    return run_id if isinstance(run_id, UUID) else UUID(str(run_id))


def load_run(run_id: Any) -> Any:
    """The run with its pool (raises Run.DoesNotExist)."""
    run = _RUN_WITH_POOL.first(_uuid(run_id))
    if run is None:
        raise Run.DoesNotExist(f"run {run_id} does not exist")
    return run


def run_deadline(run: Run) -> float:
    """The ``time.monotonic()`` instant a /v1 client stops waiting for ``run``: the run's own
    deadline (``RUN_TIMEOUT_S`` after it was created) plus ``FOLLOW_GRACE_S`` for its verdict."""
    from django.utils import timezone

    left = float(settings.RUN_TIMEOUT_S)
    deadline_at = getattr(run, "deadline_at", None)
    if deadline_at is not None:
        left = min(left, (deadline_at - timezone.now()).total_seconds())
    return time.monotonic() + max(0.0, left) + FOLLOW_GRACE_S


def finished_data(run_id: Any) -> dict[str, Any]:
    """The data of the run's ``run.finished`` event ({} before it is stored)."""

    rows = _FINISHED_DATA.rows(_uuid(run_id))
    data = rows[0][0] if rows else None
    return data if isinstance(data, dict) else {}


def provider_wait_ms(data: dict[str, Any]) -> float | None:
    """How long the run waited on model providers (recorded by the sink on ``run.finished``)."""
    value = data.get("provider_ms")
    return float(value) if isinstance(value, int | float) else None


def _is_running(run_id: Any) -> bool:
    """Whether the run is still queued or running: one narrow read, no model instances. A waiter
    asks this first (a fresh run almost never has an answer yet) and loads the run only when
    there is something to answer with (issue #15)."""
    rows = _STATUS.rows(_uuid(run_id))
    return bool(rows) and rows[0][0] in (RunStatus.QUEUED, RunStatus.RUNNING)


def _load_ended(run_id: Any) -> tuple[Any, float | None]:
    return _with_finished_data(load_run(run_id))


def _with_finished_data(run: Run) -> tuple[Any, float | None]:
    if not run.is_terminal:
        return run, None
    # Read once: the final answer's extras (finish reason, tool calls) come from the same row.
    # A run executed on this thread carries it already (as its sink stored it).
    data = getattr(run, "finished_data", None)
    if not isinstance(data, dict):
        data = finished_data(run.id)
    run.finished_data = data
    return run, provider_wait_ms(data)


def _answer_ended(ended: Any) -> Any:
    """An inline run's ending as the waiter would have read it (its provider time recorded)."""
    run, waited_ms = _with_finished_data(ended)
    state = current_state()
    if state is not None and waited_ms is not None:
        state.provider_ms = waited_ms
    return run


def approval_wait_left(run_id: Any) -> float:
    """Seconds a /v1 caller may still wait for the decision on the run's held plan
    (``constraints.approval.api_wait_s``); 0 when it must be answered now."""
    from django.utils import timezone

    until = (
        PlanApproval.objects.filter(run_id=run_id, decision="pending")
        .order_by("-requested_at")
        .values_list("api_wait_until", flat=True)
        .first()
    )
    return max(0.0, (until - timezone.now()).total_seconds()) if until is not None else 0.0


async def wait_for_run(run: Run, ended: Any = None) -> Any:
    """The run once it is terminal (or paused for an approver past the policy's wait), or as it
    is at the client's deadline. ``ended``: the run row as it came back from executing on the
    request's thread (``Started.ended``); when terminal it is answered at once."""
    if ended is not None and ended.is_terminal:
        return ended  # start_run already read its ending (_answer_ended)
    deadline = run_deadline(run)
    async with RunFollower(run.id, ends_only=True) as follower:
        if ended is None and await off_loop(_is_running, run.id):
            await _wake_or_poll(follower, deadline)
        while True:
            current, waited_ms = await off_loop(_load_ended, run.id)
            ended, may_wait = current.is_terminal, float("inf")
            if current.status == "awaiting_approval":  # answered once the policy's wait is over
                may_wait = await off_loop(approval_wait_left, run.id)
                ended = may_wait <= 0
            # An approved run is given a fresh time limit: so is its caller.
            deadline = max(deadline, run_deadline(current))
            if ended or time.monotonic() >= deadline:
                state = current_state()
                if state is not None and waited_ms is not None:
                    state.provider_ms = waited_ms
                return current
            await _wake_or_poll(follower, min(deadline, time.monotonic() + may_wait))


async def _wake_or_poll(follower: RunFollower, until: float) -> None:
    """Until a wake-up that may end the run, a quiet FOLLOW_POLL_S, or ``until``."""
    await release_while_waiting()  # an idle waiter holds no pooled connection
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
    run: Run | None = None


async def follow_run(run: Run) -> AsyncIterator[RunUpdate]:
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
            for event in await off_loop(events_after, run.id, last_seq):
                last_seq = event["seq"]
                yield RunUpdate("event", event=event)
                last_sent = time.monotonic()
                if event["type"] == "run.finished":
                    finished = True
                    break
                if event["type"] == "run.awaiting_approval":
                    held_until = time.monotonic() + await off_loop(approval_wait_left, run.id)
            if not finished and held_until is not None and time.monotonic() >= held_until:
                current = await off_loop(load_run, run.id)
                if current.status == "awaiting_approval":
                    break  # the policy's wait for an approver is over: the caller is answered now
                held_until = None
                deadline = max(deadline, run_deadline(current))
            if not finished and time.monotonic() >= next_check:
                # The events are the truth, but a run that vanished (deleted: DoesNotExist) or
                # ended without its run.finished row showing up must end the stream too.
                next_check = time.monotonic() + STATUS_CHECK_S
                if (await off_loop(load_run, run.id)).is_terminal:
                    finished, terminal_seen = terminal_seen, True
                    continue  # read the events once more before giving up on run.finished
            if not finished:
                if time.monotonic() - last_sent > KEEPALIVE_S:
                    yield RunUpdate("keepalive")
                    last_sent = time.monotonic()
                wake = deadline if held_until is None else min(deadline, held_until)
                await release_while_waiting()
                await follower.wait(wake - time.monotonic())
        # The Run row is updated in the same transaction as run.finished; read the verdict
        # (and that event's data: the answer's extras and usage).
        final, _ = await off_loop(_load_ended, run.id)
    yield RunUpdate("final", run=final)
