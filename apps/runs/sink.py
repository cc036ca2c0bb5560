"""The engine's EventSink on the Django side.

Per step boundary, one transaction (``RunSink``): the RunEvent rows of the buffered events (seq
numbered by the sink), the Step/Run rows they change, and the audit events for run decisions;
after commit each event goes to the channel group ``run.<id>``. The engine's Emitter already
serialises calls per run, so seq order is the commit order; on SQLite the IMMEDIATE transaction
mode serialises writers across threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any, ClassVar
from uuid import UUID

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import IntegrityError, connection, transaction

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.services import audit_batch, audit_record
from apps.core.compiled import CompiledInsert, execute, update_where
from apps.core.executor_db import keep_connection_healthy
from apps.engine.events import Event, EventType
from apps.governance.access_version import TABLE as ACCESS_TABLE
from apps.governance.models import Team
from apps.runs import live, observers
from apps.runs.journal import forget as forget_calls
from apps.runs.models import Run, RunEvent, RunStatus, Step
from apps.runs.reviews import maybe_sample_for_review, review_request, review_sample_rate
from apps.runs.selectors import team_may_hold
from apps.workers.models import Worker

logger = logging.getLogger(__name__)

# A run's events and fresh steps go in as plain INSERTs of a fixed shape: the ORM's per-call
# compilation of bulk_create/create cost more than the statements (issue #15).
_EVENT_INSERT = CompiledInsert(RunEvent)
_STEP_INSERT = CompiledInsert(Step)
# A sweep may already have ended the run (timed_out): the verdict is written only over a live run.
_LIVE = {"status": (RunStatus.QUEUED, RunStatus.RUNNING)}


@dataclass(frozen=True, slots=True)
class BatchUsage:
    """What a batch's events add to the run's counters: the conductor's usage (plan.proposed) and
    each ended step's (step.finished). ``cost_usd`` None: nothing priced (the cost stays as it
    is, NULL included); ``unpriced``: some call could not be priced (``priced`` turns false)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal | None = None
    unpriced: bool = False
    steps: int = 0


NO_USAGE = BatchUsage()


@cache
def _counters_sql(vendor: str, fenced: bool) -> str:
    qn = connection.ops.quote_name
    greatest = "GREATEST" if vendor == "postgresql" else "MAX"  # Django's Greatest on each
    seq, cost = qn("last_seq"), qn("cost_usd")
    adds = ", ".join(f"{qn(c)} = {qn(c)} + %s" for c in ("input_tokens", "output_tokens", "step_count"))
    where = f"{qn('id')} = %s" + (
        f" AND {qn('lease_owner')} = %s AND {qn('attempts')} = %s" if fenced else ""
    )
    # Identifiers from model metadata (quoted); every value is a parameter. One text for every
    # batch: adding zeros costs the database nothing, compiling an ORM UPDATE with expressions
    # for each batch cost more than the statement (issue #15). It also returns the access version
    # the batch is published with (apps.runs.ws_access): no round trip of its own.
    return (
        f"UPDATE {qn(Run._meta.db_table)} SET {seq} = {greatest}({seq}, %s), {adds}, "  # noqa: S608
        f"{cost} = CASE WHEN %s THEN COALESCE({cost}, 0) + CAST(%s AS NUMERIC) ELSE {cost} END, "
        f"{qn('priced')} = ({qn('priced')} AND %s) WHERE {where} "
        f"RETURNING (SELECT {qn('stamp')} FROM {qn(ACCESS_TABLE)} WHERE {qn('id')} = 1)"
    )


def _store_counters(
    run_id: Any, last_seq: int, usage: BatchUsage, *, owner: str | None = None, attempt: int = 0
) -> tuple[int, int | None]:
    """Move the run's last_seq to ``last_seq`` (never back) and add ``usage`` to its counters, in
    one UPDATE. With ``owner``, the batch's lease fence: the row changes only if this executor
    still holds the run (same owner, same attempt). Returns the rows changed and the access
    version (``apps.governance.access_version``) read by the same statement."""
    pk = Run._meta.pk.get_db_prep_value(run_id, connection)  # type: ignore[union-attr]
    params: list[Any] = [
        last_seq,
        usage.input_tokens,
        usage.output_tokens,
        usage.steps,
        usage.cost_usd is not None,
        usage.cost_usd if usage.cost_usd is not None else Decimal(0),
        not usage.unpriced,
        pk,
    ]
    if owner is not None:
        params += [owner, attempt]
    # Bound on the server, prepared once per connection (apps.core.compiled.execute): one of
    # these per batch was a tenth of the sink's database time bound in Python (issue #15).
    changed, rows = execute(
        connection, _counters_sql(connection.vendor, owner is not None), params, fetch=True
    )
    return changed, (rows[0][0] if rows else None)


# The in-memory channel layer keeps asyncio queues bound to the server's event loop; a sync
# thread must hand group_send to that loop instead of running it on a private loop.
_server_loop: asyncio.AbstractEventLoop | None = None


def register_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _server_loop
    _server_loop = loop


_publisher: tuple[int, asyncio.AbstractEventLoop] | None = None
_publisher_lock = threading.Lock()
_pending: set[asyncio.Task[None]] = set()  # keeps scheduled publishes alive until done


def _publisher_loop() -> asyncio.AbstractEventLoop:
    """One long-lived loop per process for network channel layers: channels-redis keeps its
    connection pool per event loop, so a fresh loop per publish (async_to_sync) would reconnect
    every time (measured: 15 ms vs 7 ms per group_send to 100 viewers)."""
    global _publisher
    with _publisher_lock:
        if _publisher is None or _publisher[0] != os.getpid() or _publisher[1].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True, name="run-publisher").start()
            _publisher = (os.getpid(), loop)
        return _publisher[1]


# The key of the access version in a published batch (apps.runs.ws_access reads it).
ACCESS_STAMP = "access_stamp"


def group_name(run_id: UUID | str) -> str:
    return f"run.{run_id}"


def publish(run_id: UUID | str, event: dict[str, Any]) -> None:
    """Send one protocol event to the websocket viewers of the run. Never raises."""
    publish_batch(run_id, [event])


def publish_batch(
    run_id: UUID | str, events: list[dict[str, Any]], *, access_stamp: int | None = None
) -> None:
    """Send a committed batch's events, in order, as one message (``run.events``; a lone event as
    ``run.event``) in one hop to the layer's loop. On channels-redis each message is a group
    lookup and a script, four round trips, and a wake-up of every process following the run:
    one per event was most of a Celery worker's publishing and of a waiting daphne's receiving
    (issue #15). ``access_stamp``: the access version read in the batch's transaction; each
    viewer compares it with its own and re-checks its access only when it changed
    (``apps.runs.ws_access``). Never raises."""
    if not events:
        return
    first, last = events[0], events[-1]
    stamp = {} if access_stamp is None else {ACCESS_STAMP: access_stamp}
    if len(events) == 1:
        _group_send(
            run_id, {"type": "run.event", "event": first, **stamp}, first.get("type"), first.get("seq")
        )
    else:
        _group_send(
            run_id,
            {"type": "run.events", "events": events, **stamp},
            f"{len(events)} events",
            f"{first.get('seq')}..{last.get('seq')}",
        )


def message_events(message: dict[str, Any]) -> list[Any] | None:
    """The events a layer message carries, in order (``run.event`` or a batch's ``run.events``);
    None for any other message."""
    kind = message.get("type")
    if kind == "run.event":
        return [message.get("event")]
    if kind == "run.events":
        events = message.get("events")
        return list(events) if isinstance(events, list) else [None]
    return None


def publish_review(run_id: UUID | str) -> None:
    """Tell the run's viewers that a reviewer decided (a held answer may now be released): each
    consumer re-reads what its viewer may see. Not a protocol event (no seq). Never raises."""
    _group_send(run_id, {"type": "run.reviewed", "run_id": str(run_id)}, "run.reviewed", None)


def on_run_saved(sender: Any, instance: Run, update_fields: Any = None, **kwargs: Any) -> None:
    """post_save of Run: a review decision (``apps.runs.reviews.run_review`` saves
    ``review_status``/``answer_held``) reaches the live viewers after commit."""
    if update_fields and "answer_held" in update_fields:
        run_id = instance.pk
        transaction.on_commit(lambda: publish_review(run_id))


def _group_send(run_id: UUID | str, message: dict[str, Any], kind: Any, seq: Any) -> None:
    _group_send_many(group_name(run_id), [message], kind, seq)


def send_to_group(group: str, message: dict[str, Any], what: str) -> None:
    """One message to a group the run fan-out carries (e.g. a session's sockets). Never raises."""
    _group_send_many(group, [message], what, None)


def _group_send_many(group: str, messages: list[dict[str, Any]], kind: Any, seq: Any) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    # Named in the message: one process-wide membership fans it out to the run's local viewers
    # (apps.runs.fanout), which must know whose it is.
    named = [{**message, "group": group} for message in messages]

    async def send_all() -> None:
        for message in named:  # in seq order: viewers rely on it
            await layer.group_send(group, message)

    try:
        if isinstance(layer, InMemoryChannelLayer):
            loop = _server_loop
            if loop is None or loop.is_closed():
                return  # no websocket ever connected in this process: nobody to tell
            if not layer.groups.get(group):
                # Nobody in this process follows the run (a plain /v1 run's usual case): no hop to
                # the loop and no wait for it. Safe: every follower joins the group before it
                # reads the database, so whatever committed before its join is in that read.
                return
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(send_all())
            else:
                asyncio.run_coroutine_threadsafe(send_all(), loop).result(timeout=5)
        else:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run_coroutine_threadsafe(send_all(), _publisher_loop()).result(timeout=10)
            else:  # called from async code: schedule on the caller's loop
                task = running.create_task(send_all())
                _pending.add(task)
                task.add_done_callback(_pending.discard)
    except Exception:
        # Viewers recover from the database on reconnect; a publish failure must not fail the run.
        logger.exception("could not publish %s seq=%s to %s", kind, seq, group)


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def _ts(event: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(float(event["ts"]), tz=UTC)


# Events after which the engine waits (a provider call) or the run ends: the buffer is stored
# and published then. plan.started precedes the conductor call (a viewer sees the planning node
# during that wait), step.started the worker's. step.finished is one only while another step is
# still running (else the engine goes on at once: the next step, the output check, run.finished);
# any other provider call flushes first through the journal (RunSink.before_provider_call). An
# answered call is journaled at the first event after it, before any of this (_journal_answers).
# plan/step .waiting and .running (issue 44): the engine waits for a worker's slot, then its call.
_FLUSH_TYPES = frozenset(
    {
        "plan.started",
        "plan.waiting",
        "plan.running",
        "step.started",
        "step.waiting",
        "step.running",
        "run.finished",
        "run.awaiting_approval",
    }
)
# A buffer (e.g. a token stream) older than this is stored at the next event.
DELTA_FLUSH_S = 0.05
# The same when a /v1 stream in this process takes the answer from a tap (apps.runs.live): its
# client does not wait on the store, only the run's live graph does, which a quarter second
# serves. Fewer transactions per streamed answer: the fast pass-through's CPU.
TAPPED_DELTA_FLUSH_S = 0.25


def _after_commit(
    run_id: UUID, batch: list[dict[str, Any]], views: list[observers.RunEventView], stamp: int | None
) -> None:
    """A committed batch, in seq order: each event to the viewers, then to the observers."""
    publish_batch(run_id, batch, access_stamp=stamp)
    for view in views:
        observers.notify_after_commit(view)


# A RunSink method persisting one event type: (sink, event, event["data"]).
Handler = Callable[["RunSink", dict[str, Any], dict[str, Any]], None]


class RunSink:
    """EventSink persisting one run's events. Instances are per run and thread-safe.

    Events are buffered and stored in one transaction per *step boundary* (``_FLUSH_TYPES``, a
    step that finished while others run, any provider call, or a buffer older than
    ``DELTA_FLUSH_S``), not one per event: between two boundaries the engine emits without waiting
    on a provider, so batching costs a viewer no latency. The sink numbers what it stores (``seq`` continues from ``Run.last_seq``),
    so consecutive ``step.delta`` events of one step coalesce into one row and one publish with
    no gap in ``seq``; every stored event is published after its transaction commits.

    ``owner`` fences the run: a batch is stored only while this executor holds the lease for this
    attempt (checked inside the batch's transaction, under the run's row lock). ``journal`` (the resume journal) is written at the
    first event after each answer, before the events that report it are stored and published
    (``_journal_answers``), and its provider wait is recorded on ``run.finished`` as
    ``provider_ms``.
    """

    def __init__(
        self,
        run: Run,
        *,
        owner: str | None = None,
        journal: Any = None,
        workers: Mapping[str, tuple[int, str, str]] | None = None,
    ) -> None:
        self.run_id = run.id
        self.team_id = run.team_id
        self.policy_version_id = run.policy_version_id
        self.pool_id = run.pool_id
        self.strategy = run.strategy
        self.replay_messages = run.replay_messages
        self.flags: list[str] = []
        self._holdable: bool | None = None
        # Plan steps by index, so a step that never started (skipped/blocked) still shows its
        # instruction and access list.
        self._planned: dict[int, dict[str, Any]] = {}
        self.finished = False
        self.finished_data: dict[str, Any] | None = None
        # What this sink's run.finished wrote to the run row (its verdict and totals), once
        # committed; None when it wrote none (a sweep ended the run first) or when the run end
        # changed the row otherwise too (a review request): then the row must be read.
        self.verdict: dict[str, Any] | None = None
        self._staged_verdict: dict[str, Any] | None = None
        self.owner = owner
        # An attempt re-queued and claimed again by this same process has the same owner id: the
        # attempt number tells the stale one (still running after its lease expired) apart.
        self.attempt = run.attempts
        self.journal = journal
        self._seq = int(run.last_seq or 0)
        # No event stored by an earlier attempt: no Step row exists yet, so a started step is a
        # plain INSERT (no read, no savepoint) and its end a plain UPDATE (issue #15).
        self._fresh = self._seq == 0
        # index -> worker key of the steps whose start this sink stored (the row exists)
        self._created_steps: dict[int, str] = {}
        # Whether the batch's run.finished wrote the run's verdict and totals.
        self._verdict_written = False
        self._team = run.team if Run.team.is_cached(run) else None
        self._access_stamp: int | None = getattr(run, "access_stamp", None)
        # slug -> (pk, model, provider kind) of the pool's workers, from the cached pool rows.
        self._workers: Mapping[str, tuple[int, str, str]] = workers or {}
        metadata = (run.api_request or {}).get("metadata") if isinstance(run.api_request, dict) else None
        self._metadata: Mapping[str, Any] = metadata if isinstance(metadata, dict) else {}
        self._buffer: list[dict[str, Any]] = []
        self._buffered_at = 0.0
        self._running: set[Any] = set()  # indices of the steps started and not finished
        self._answer_sent = False  # the answer's first released text was flushed
        # A /v1 stream in this process takes the released answer text as it comes (apps.runs.live).
        self._tap = live.tap_for(run.id)
        self.transactions = 0  # batches committed (bench and tests read it)
        self.dropped = 0  # events not stored because another executor owns the run
        self._owner_thread = threading.get_ident()
        self._lock = threading.Lock()

    def emit(self, event: Event) -> None:
        data = event.to_dict()
        tap = self._tap
        # A holdable run's answer never streams (shaping.Streamed).
        if (
            tap is not None
            and data["type"] == "step.delta"
            and data["data"].get("answer")
            and not self.holdable
        ):
            tap.push(str(data["data"].get("text") or ""))
        with self._lock:
            store = self._add(data)
            if not store and not self._answers_to_journal():
                return
            try:
                if store:
                    self.flush_locked()
                else:
                    self._journal_answers()
            finally:
                if threading.get_ident() != self._owner_thread:
                    # Engine helper threads are short-lived; don't leave their connections open.
                    connection.close()

    def flush(self) -> None:
        """Store and publish whatever is buffered (the engine's end, before a provider call);
        with nothing buffered, still write the answers the journal holds."""
        with self._lock:
            if not self._buffer and not self._answers_to_journal():
                return
            try:
                if self._buffer:
                    self.flush_locked()
                else:
                    self._journal_answers()
            finally:
                if threading.get_ident() != self._owner_thread:
                    connection.close()

    def _answers_to_journal(self) -> bool:
        # Not after the run ended (its journal is forgotten, a late answer discarded), nor once
        # another executor took the run over (it may end it and forget the journal first).
        return self.journal is not None and not self.finished and not self.dropped and self.journal.pending

    def _journal_answers(self) -> None:
        """Answers received since the last batch are written at once, on their own (one INSERT),
        at the first event after them (step.finished at the latest) and before any further
        provider call: the events that report them are stored and published only after, and a
        kill in between does not repeat a call that was answered (issue 44). Cheaper than
        storing the buffer there too: the run's next boundary follows at once anyway."""
        if self._answers_to_journal():
            keep_connection_healthy()
            self.journal.flush()

    def before_provider_call(self) -> None:
        """The engine is about to wait on a model provider: what it emitted so far is stored and
        shown now, and its answers journaled (called by the resume journal's workers).

        A tapped run (a /v1 stream in this process takes its answer) journals its answers but
        stores its events with its first deltas instead: the store (a transaction, on an engine
        thread a connection of its own) was on the way to the client's first token."""
        if self._tap is None:
            self.flush()
            return
        with self._lock:
            if not self._answers_to_journal():
                return
            try:
                self._journal_answers()
            finally:
                if threading.get_ident() != self._owner_thread:
                    connection.close()

    # -- buffering --------------------------------------------------------------------------------

    def _add(self, event: dict[str, Any]) -> bool:
        """Buffer one engine event; True when the buffer must be stored now."""
        kind = event["type"]
        now = time.monotonic()
        last = self._buffer[-1] if self._buffer else None
        if (
            kind in ("step.delta", "plan.delta")
            and last is not None
            and last["type"] == kind
            and last["data"].get("index") == event["data"].get("index")
            and last["data"].get("round") == event["data"].get("round")
            and last["data"].get("attempt") == event["data"].get("attempt")
        ):
            # One row and one publish for a burst of tokens of one step.
            last["data"]["text"] = f"{last['data'].get('text') or ''}{event['data'].get('text') or ''}"
            last["ts"] = event["ts"]
        else:
            self._seq += 1
            event = {**event, "seq": self._seq}
            self._prepare(event)
            self._buffer.append(event)
            if last is None:
                self._buffered_at = now
        index = event["data"].get("index")
        if kind == "step.started":
            self._running.add(index)
        elif kind == "step.finished":
            self._running.discard(index)
            if self._running:
                return True  # the engine now waits on the other steps
        if kind in _FLUSH_TYPES and not (kind == "step.started" and self._tap is not None):
            return True  # a tapped run's step start is stored with its first deltas (before_provider_call)
        if (
            kind == "step.delta"
            and event["data"].get("answer")
            and not self._answer_sent
            and self._tap is None
        ):
            # The answer's first released text is stored and published at once: a streaming
            # client's time to first token (issue 45); the rest batches as other deltas. A client
            # served from a tap has it already: no transaction for it.
            self._answer_sent = True
            return True
        return now - self._buffered_at >= (DELTA_FLUSH_S if self._tap is None else TAPPED_DELTA_FLUSH_S)

    # -- persistence ------------------------------------------------------------------------------

    def flush_locked(self) -> None:
        batch = self._buffer
        if not batch:
            return
        keep_connection_healthy()
        views: list[observers.RunEventView] = []
        try:
            # audit_batch: this boundary's audit rows go in as one multi-row INSERT (issue #15).
            with transaction.atomic():
                with audit_batch():
                    last_seq = batch[-1]["seq"]
                    ends = batch[-1]["type"] == "run.finished"
                    # What the batch adds to the run's counters. A batch that ends the run writes
                    # the engine's totals instead (_on_run_finished); any other adds them with its
                    # fence, in the same UPDATE (issue #15).
                    usage = _usage(batch)
                    self._verdict_written = False
                    # The row lock orders this batch against a re-queue (which takes the same row):
                    # the fence, the new last_seq and the counters are one conditional UPDATE (it
                    # takes the lock).
                    stamp: int | None = None
                    if self.owner is not None:
                        fenced, stamp = _store_counters(
                            self.run_id,
                            last_seq,
                            NO_USAGE if ends else usage,
                            owner=self.owner,
                            attempt=self.attempt,
                        )
                        if not fenced:
                            # Fencing: another executor took the run over and owns its log now.
                            self.dropped += len(batch)
                            self._buffer = []
                            return
                    if self.journal is not None and batch[-1]["type"] != "run.finished":
                        # The answers these events report are journaled with them; a batch that ends
                        # the run forgets the journal instead (_on_run_finished).
                        self.journal.flush()
                    _EVENT_INSERT.execute(
                        [
                            RunEvent(run_id=self.run_id, seq=e["seq"], type=e["type"], data=e["data"])
                            for e in batch
                        ]
                    )
                    for event in batch:
                        handler = self._HANDLERS.get(event["type"])
                        if handler is not None:
                            handler(self, event, event["data"])
                        view = observers.RunEventView(
                            self.run_id,
                            self.team_id,
                            self.policy_version_id,
                            event,
                            self.pool_id,
                            self.strategy,
                            self._team.slug if self._team is not None else "",
                            team=self._team,
                            access_stamp=self._access_stamp,
                            metadata=self._metadata,
                            workers=self._workers,
                        )
                        views.append(view)
                    # A run end's usage counts unless its verdict was written (a sweep ended the run
                    # first: its verdict stands, and what the batch used still counts).
                    late = usage if ends and not self._verdict_written else NO_USAGE
                    if self.owner is None:  # unfenced (no lease): last_seq and counters here
                        _, stamp = _store_counters(self.run_id, last_seq, usage if not ends else late)
                    elif late is not NO_USAGE:
                        _store_counters(self.run_id, last_seq, late)
                # The observers last, just before the commit: the rollup rows they add to are
                # shared by every run of a team and pool in the hour, so each transaction
                # holds their locks from its upsert to its commit; taken earlier, the audit
                # INSERT and the rest of the batch were inside that window too (issue #15).
                observers.notify_in_transaction(views)
        except IntegrityError:
            # A second delivery of the same seq (should not happen: runs are claimed once).
            logger.warning(
                "duplicate events seq=%s..%s for run %s ignored",
                batch[0]["seq"],
                batch[-1]["seq"],
                self.run_id,
            )
            self._buffer = []
            return
        # Stored: from here the batch is the database's; a failure above keeps it for the next try.
        self._buffer = []
        self.transactions += 1
        run_id = self.run_id
        transaction.on_commit(lambda: _after_commit(run_id, batch, views, stamp))
        if batch[-1]["type"] == "run.finished":
            self.finished = True
            # As it was stored (a JSON round trip): what a caller on this thread answers with,
            # without reading it back (apps.runs.execution.execute_here).
            self.finished_data = json.loads(json.dumps(batch[-1]["data"]))
            if self._staged_verdict is not None:
                self.verdict = {**self._staged_verdict, "last_seq": batch[-1]["seq"]}

    def _prepare(self, event: dict[str, Any]) -> None:
        """What the sink adds to an engine event when it is buffered (once per stored event)."""
        kind = event["type"]
        data = event["data"]
        if kind == "step.started" and self.replay_messages is not None:
            # A replay sends the stored messages verbatim; record what the worker really saw.
            data["messages"] = self.replay_messages
        # Viewers who may not see a held answer must not see it streamed before the output
        # guardrail decides: the events of a run whose policy can hold it say so (see
        # apps.runs.selectors.run_may_be_held and apps.api.v1.shaping.progress).
        if kind == "run.started":
            data["holdable"] = self.holdable
        elif self.holdable:
            data["holdable"] = True
        if kind == "guardrail.checked":
            # Flags decide answer_held below, before the handlers run in the batch.
            for flag in data.get("flags") or []:
                if flag not in self.flags:
                    self.flags.append(flag)
        if kind == "run.finished":
            data["answer_held"] = self._is_held(data)
            if self.journal is not None:
                data["provider_ms"] = round(self.journal.provider_ms, 3)

    def _worker_id(self, slug: str) -> int | None:
        known = self._workers.get(slug)
        if known is not None:
            return known[0]
        return Worker.objects.filter(slug=slug).values_list("pk", flat=True).first()

    @property
    def holdable(self) -> bool:
        """Decided once per run, from the policy in force when it starts (as the engine's hooks)."""
        if self._holdable is None:
            team = self._team if self._team is not None else Team.objects.get(pk=self.team_id)
            self._holdable = team_may_hold(team, self._access_stamp)
        return self._holdable

    def _is_held(self, data: dict[str, Any]) -> bool:
        return (
            data.get("status") or RunStatus.FAILED
        ) == RunStatus.SUCCEEDED and "require_review" in self.flags

    def _audit(self, event_type: AuditEventType, payload: dict[str, Any]) -> None:
        audit_record(
            event_type=event_type,
            team=self.team_id,
            object_type="runs.run",
            object_id=str(self.run_id),
            run_id=self.run_id,
            policy_version_id=self.policy_version_id,
            payload=payload,
        )

    def _on_run_started(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        self._audit(
            AuditEventType.RUN_STARTED,
            {
                "strategy": data.get("strategy"),
                "preset": data.get("preset"),
                "workers": [w.get("key") for w in data.get("workers") or []],
                "conductor": (data.get("conductor") or {}).get("key"),
                "limits": data.get("limits"),
            },
        )

    def _on_guardrail_checked(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        stage = data.get("stage")
        stage_events: dict[str | None, AuditEventType] = {
            "input": AuditEventType.RUN_INPUT_CHECKED,
            "step_output": AuditEventType.RUN_STEP_OUTPUT_CHECKED,
            "outbound": AuditEventType.RUN_OUTBOUND_CHECKED,  # the outbound gate (issue 39)
        }
        event_type = stage_events.get(stage, AuditEventType.RUN_OUTPUT_CHECKED)
        checks = [
            {k: c.get(k) for k in ("name", "stage", "status", "action", "detail")}
            for c in data.get("checks") or []
        ]
        self._audit(
            event_type,
            {
                "stage": stage,
                "step": data.get("step"),
                "checks": checks,
                "blocked": data.get("blocked"),
                "flags": data.get("flags"),
            },
        )

    @staticmethod
    def _plan_digest(plan: dict[str, Any] | None) -> list[dict[str, Any]] | None:
        if not plan:
            return None
        return [
            {
                "index": s.get("index"),
                "worker_key": s.get("worker_key"),
                "access": s.get("access"),
                "instruction": content_sha256(s.get("instruction")),
            }
            for s in plan.get("steps") or []
        ]

    def _on_plan_proposed(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        self._audit(
            AuditEventType.RUN_PLAN_PROPOSED,
            {
                "round": data.get("round"),
                "attempt": data.get("attempt"),
                "source": data.get("source"),
                "plan": self._plan_digest(data.get("plan")),
                "error": data.get("error"),
                "usage": data.get("usage"),
            },
        )

    def _on_plan_validated(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        for s in (data.get("plan") or {}).get("steps") or []:
            if isinstance(s, dict) and isinstance(s.get("index"), int):
                self._planned[s["index"]] = s
        self._audit(
            AuditEventType.RUN_PLAN_VALIDATED,
            {
                "round": data.get("round"),
                "action": data.get("action"),
                "violations": data.get("violations"),
                "original": self._plan_digest(data.get("original")),
                "plan": self._plan_digest(data.get("plan")),
                "reason": data.get("reason"),
            },
        )

    def _on_step_started(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        fields = {
            "round": data.get("round") or 1,
            "worker_key": data.get("worker_key") or "",
            "worker_name": data.get("worker_name") or "",
            "instruction": data.get("instruction") or "",
            "access": data.get("access") or [],
            "messages": data.get("messages") or [],
            "status": "running",
            "started_at": _ts(event),
            "worker_id": self._worker_id(data.get("worker_key") or ""),
        }
        index = data["index"]
        if self._fresh and index not in self._created_steps:
            _STEP_INSERT.execute([Step(run_id=self.run_id, index=index, **fields)])
        else:
            Step.objects.update_or_create(run_id=self.run_id, index=index, defaults=fields)
        self._created_steps[index] = str(fields["worker_key"])
        self._audit(
            AuditEventType.RUN_STEP_STARTED,
            {
                "index": data["index"],
                "round": data.get("round"),
                "worker_key": data.get("worker_key"),
                "access": data.get("access"),
                "messages": content_sha256(_messages_text(data.get("messages"))),
            },
        )

    # Issue 44: a step waits for its worker's slot (no call yet), then runs once the call starts.
    def _on_step_waiting(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        update_where(Step, (self.run_id, data["index"]), {"status": "waiting"}, where=("run", "index"))

    def _on_step_running(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        update_where(Step, (self.run_id, data["index"]), {"status": "running"}, where=("run", "index"))

    def _on_step_finished(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        usage = data.get("usage") or {}
        planned = self._planned.get(data["index"], {})
        access = planned.get("access")
        ended = {
            "status": data.get("status") or "failed",
            "output": data.get("output") or "",
            "error": data.get("error") or "",
            "fallback_from": data.get("fallback_from") or "",
            "input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
            "cost_usd": _decimal(data.get("cost_usd")),
            "priced": bool(data.get("priced", True)),
            "latency_ms": data.get("latency_ms"),
            "finished_at": _ts(event),
        }
        if data.get("worker_key"):
            ended["worker_key"] = data["worker_key"]
        if data["index"] in self._created_steps:
            # This sink stored the step's start (with this worker, unless the end names another):
            # one UPDATE, no read (issue #15).
            ended.setdefault("worker_key", self._created_steps[data["index"]])
            update_where(Step, (self.run_id, data["index"]), ended, where=("run", "index"))
            step = Step(run_id=self.run_id, index=data["index"], **ended)
        else:
            step, _ = Step.objects.get_or_create(
                run_id=self.run_id,
                index=data["index"],
                defaults={
                    "round": data.get("round") or 1,
                    "worker_key": data.get("worker_key") or planned.get("worker_key") or "",
                    "instruction": planned.get("instruction") or "",
                    "access": access if isinstance(access, list) else [],
                },
            )
            for name, value in ended.items():
                setattr(step, name, value)
            step.save()
        self._audit(
            AuditEventType.RUN_STEP_FINISHED,
            {
                "index": data["index"],
                "status": step.status,
                "worker_key": step.worker_key,
                "fallback_from": data.get("fallback_from"),
                "usage": usage,
                "cost_usd": data.get("cost_usd"),
                "priced": step.priced,
                "latency_ms": step.latency_ms,
                "output": content_sha256(step.output),
                "error": step.error,
            },
        )

    def _on_run_finished(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        totals = data.get("totals") or {}
        status = data.get("status") or RunStatus.FAILED
        held = self._is_held(data)
        incomplete = data.get("incomplete") if isinstance(data.get("incomplete"), dict) else {}
        updates: dict[str, Any] = {
            "status": status,
            "status_reason": data.get("reason") or "",
            # A partial answer's run keeps why it is partial (the failed step) for its page.
            "error": data.get("error") or incomplete.get("detail") or "",
            "answer": data.get("answer") or "",
            "input_tokens": int(totals.get("input_tokens") or 0),
            "output_tokens": int(totals.get("output_tokens") or 0),
            "cost_usd": _decimal(totals.get("cost_usd")),
            "priced": bool(totals.get("priced", True)),
            "latency_ms": totals.get("latency_ms"),
            "step_count": int(totals.get("steps") or 0),
            "finished_at": _ts(event),
        }
        if held:
            updates["answer_held"] = True
        # A sweep may already have ended the run (timed_out): keep that verdict.
        ended = update_where(Run, self.run_id, updates, only_if=_LIVE)
        # The engine's totals replace what the batch's events add to the counters.
        self._verdict_written = bool(ended)
        self._audit(
            AuditEventType.RUN_FINISHED,
            {
                "status": status,
                "reason": data.get("reason"),
                "error": data.get("error"),
                "answer": content_sha256(data.get("answer")),
                # What streaming clients received of the answer (issue 45): for a run that
                # succeeded, the same digest as the answer's; for a blocked one, what got out.
                **({"released": data["released"]} if isinstance(data.get("released"), dict) else {}),
                "answer_held": held,
                "flags": list(self.flags),
                "totals": totals,
                # A partial answer (reason "partial"): which failure it stands in for (issue 44).
                "incomplete": data.get("incomplete"),
            },
        )
        self._staged_verdict = None
        if ended:
            # The resume journal is done with (and holds output).
            if self.journal is not None:
                self.journal.forget()
            else:
                forget_calls(self.run_id)
            if not self._queue_for_review():
                self._staged_verdict = updates

    def _on_run_awaiting_approval(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        """The plan waits for an approver: the run pauses (lease given back, journal kept)."""
        observers.plan_hold()(
            run_id=self.run_id,
            team_id=self.team_id,
            policy_version_id=self.policy_version_id,
            owner=self.owner,
            at=_ts(event),
            data=data,
        )

    # Which method persists which event type, written out so each handler's one caller is the
    # lookup above and a grep for a handler finds it here. Types without one only go to the log.
    _HANDLERS: ClassVar[Mapping[str, Handler]] = {
        EventType.RUN_STARTED: _on_run_started,
        EventType.GUARDRAIL_CHECKED: _on_guardrail_checked,
        EventType.PLAN_PROPOSED: _on_plan_proposed,
        EventType.PLAN_VALIDATED: _on_plan_validated,
        EventType.STEP_STARTED: _on_step_started,
        EventType.STEP_WAITING: _on_step_waiting,
        EventType.STEP_RUNNING: _on_step_running,
        EventType.STEP_FINISHED: _on_step_finished,
        EventType.RUN_FINISHED: _on_run_finished,
        EventType.RUN_AWAITING_APPROVAL: _on_run_awaiting_approval,
    }

    def _queue_for_review(self) -> bool:
        """warn / require_review guardrails put the run in the review queue; others may be
        sampled. True when the run row may have been changed for it."""
        review_flags = [flag for flag in self.flags if flag in REVIEW_FLAGS]
        if review_flags:
            review_request(
                run=Run.objects.get(pk=self.run_id), reason="guardrail", details={"flags": review_flags}
            )
            return True
        if review_sample_rate() > 0:  # most deployments sample nothing: no read then
            maybe_sample_for_review(Run.objects.get(pk=self.run_id))
            return True
        return False


def _usage(batch: list[dict[str, Any]]) -> BatchUsage:
    """What a batch's events add to the run's counters."""
    tokens = {"input_tokens": 0, "output_tokens": 0}
    cost: Decimal | None = None
    unpriced = False
    steps = 0
    for event in batch:
        kind = event["type"]
        if kind not in ("plan.proposed", "step.finished"):
            continue
        data = event["data"]
        usage = data.get("usage") or {}
        for field in tokens:
            tokens[field] += int(usage.get(field) or 0)
        amount = _decimal(data.get("cost_usd"))
        if amount is not None:  # even 0: a priced run's cost is never left NULL
            cost = amount if cost is None else cost + amount
        if data.get("priced") is False:
            unpriced = True
        if kind == "step.finished":
            steps += 1
    if not (steps or unpriced or cost is not None or any(tokens.values())):
        return NO_USAGE
    return BatchUsage(cost_usd=cost, unpriced=unpriced, steps=steps, **tokens)


# Guardrail actions that ask a person to look at the run.
REVIEW_FLAGS = ("warn", "require_review")


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages if isinstance(m, dict))
