"""The engine's EventSink on the Django side.

Per step boundary, one transaction (``RunSink``): the RunEvent rows of the buffered events (seq
numbered by the sink), the Step/Run rows they change, and the audit events for run decisions;
after commit each event goes to the channel group ``run.<id>``. The engine's Emitter already
serialises calls per run, so seq order is the commit order; on SQLite the IMMEDIATE transaction
mode serialises writers across threads.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from django.db import IntegrityError, connection, transaction

from apps.audit.services import audit_batch
from apps.core.compiled import CompiledInsert
from apps.core.executor_db import keep_connection_healthy
from apps.engine.events import Event
from apps.governance.models import Team
from apps.runs import live, observers
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import team_may_hold
from apps.runs.sink import later
from apps.runs.sink.counters import NO_USAGE, _store_counters, _usage
from apps.runs.sink.publishing import publish_batch
from apps.runs.sink.records import EventRecords

logger = logging.getLogger(__name__)

# A run's events go in as plain INSERTs of a fixed shape: the ORM's per-call
# compilation of bulk_create/create cost more than the statements (issue #15).
_EVENT_INSERT = CompiledInsert(RunEvent)


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
# A one-step run whose client waits in this process stores its first events (run.started, the
# input check, step.started) with its answer, not before the provider call (apps.runs.sink.later);
# a call still running this long after has them stored then, for the run's live graph.
DEFERRED_START_FLUSH_S = 0.25


def _after_commit(
    run_id: UUID, batch: list[dict[str, Any]], views: list[observers.RunEventView], stamp: int | None
) -> None:
    """A committed batch, in seq order: each event to the viewers, then to the observers."""
    publish_batch(run_id, batch, access_stamp=stamp)
    for view in views:
        observers.notify_after_commit(view)


class RunSink(EventRecords):
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
        client_waits: bool = False,
    ) -> None:
        """``client_waits``: the run's client waits for it in this process (a plain /v1 run
        executed on its request's thread): a one-step run then defers its first store as a
        tapped one does (``DEFERRED_START_FLUSH_S``)."""
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
        self._start_scheduled = False  # a deferred store of the run's start is on its way
        # A /v1 stream in this process takes the released answer text as it comes (apps.runs.live).
        self._tap = live.tap_for(run.id)
        # Whether step.started waits for the answer (or DEFERRED_START_FLUSH_S) to be stored:
        # a one-step run whose client is served here, whom a store before the call only delays.
        self._defer_start = self._tap is not None or (client_waits and run.strategy == "single")
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
            self._store_or_journal(self._add(data))

    def flush(self) -> None:
        """Store and publish whatever is buffered (the engine's end, before a provider call);
        with nothing buffered, still write the answers the journal holds."""
        with self._lock:
            self._store_or_journal(bool(self._buffer))

    def _store_or_journal(self, store: bool) -> None:
        """Under the lock: flush the buffer when ``store``, else write the answers the journal
        holds (if any). A run that defers its start writes them only with a batch or before
        another provider call (``before_provider_call``): its answer is otherwise stored with its
        events in the run's last transaction, which forgets the journal, moments later."""
        if not store and (self._defer_start or not self._answers_to_journal()):
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

        A run that defers its start (``_defer_start``: a one-step run whose client is served in
        this process) journals its answers but stores its events with its answer instead: the
        store (a transaction, on an engine thread a connection of its own) stood between the
        client and the provider call. If the call is still running ``DEFERRED_START_FLUSH_S``
        later, they are stored then (``apps.runs.sink.later``)."""
        if not self._defer_start:
            self.flush()
            return
        with self._lock:
            if self._buffer and not self._start_scheduled:
                self._start_scheduled = True
                later.call_later(DEFERRED_START_FLUSH_S, self._store_deferred_start)
            if not self._answers_to_journal():
                return
            try:
                self._journal_answers()
            finally:
                if threading.get_ident() != self._owner_thread:
                    connection.close()

    def _store_deferred_start(self) -> None:
        """On the deferred-store thread: the events buffered before a provider call, if the
        engine has not stored them since (a fresh buffer is the engine's to store)."""
        with self._lock:
            if not self._buffer or time.monotonic() - self._buffered_at < DEFERRED_START_FLUSH_S / 2:
                return
            self._store_or_journal(True)  # not the owner thread: its connection is closed after

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
        if kind in _FLUSH_TYPES and not (kind == "step.started" and self._defer_start):
            return True  # a deferred start is stored with the answer (before_provider_call)
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

    @property
    def holdable(self) -> bool:
        """Decided once per run, from the policy in force when it starts (as the engine's hooks)."""
        if self._holdable is None:
            team = self._team if self._team is not None else Team.objects.get(pk=self.team_id)
            self._holdable = team_may_hold(team, self._access_stamp)
        return self._holdable
