"""Resume journal (issue 14): a re-queued run continues after its last completed call.

Every provider call a run makes (the conductor's planning, each step, a verifier, a model judge)
is written to `RunCall` by the run's sink at the first event after its answer, and before any
further provider call, so always before the events that report it are stored and published
(`RunSink._journal_answers`, issue 44): a kill after the answer never repeats the call. Rows are
keyed by what was asked: the worker, the exact messages and the generation options. When a lost run is re-queued, its next attempt runs the same strategy again;
the engine is deterministic given the same answers, so it asks the same questions in the same
shape, and each one already answered is served from the journal — no provider call, billed once
(the run's totals are reset at re-queue and the replayed usage counted again exactly once). The
first call that was in flight when the executor died, and everything after it, go to the
provider as usual. A journal row is only a cache of real answers, so fencing it is unnecessary.

Tool calls (issue 43) are journaled too, keyed by the step, the tool and its exact arguments
(`tool_digest`): the row is written in the transaction that stores the `ToolCall`, so once the
tool's answer is recorded a resumed attempt reads it from here and the MCP server is not called
again. A call waiting for an approver is not journaled: the resumed attempt makes it (once).

The journal holds model output like `Step` rows do; it is deleted when the run ends.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from uuid import UUID

from apps.engine.types import Usage, WorkerResult
from apps.runs.models import RunCall

# Per-call options that change nothing about the answer (so they don't key the journal).
_NOT_KEYED = {"timeout", "on_delta"}


def call_digest(worker_key: str, messages: Any, options: dict[str, Any]) -> str:
    keyed = {k: v for k, v in options.items() if k not in _NOT_KEYED and v is not None}
    blob = json.dumps([worker_key, messages, keyed], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def tool_digest(step_index: int | None, qualified: str, arguments: Any) -> str:
    blob = json.dumps(["tool", step_index, qualified, arguments], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def result_to_json(result: WorkerResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        if f.name == "outbound":
            continue  # the gate's record of the call is already an event; a replay sends nothing
        value = getattr(result, f.name)
        if isinstance(value, Usage):
            value = value.to_dict()
        elif isinstance(value, Decimal):
            value = str(value)
        out[f.name] = value
    return out


def result_from_json(data: dict[str, Any]) -> WorkerResult:
    known = {f.name for f in dataclasses.fields(WorkerResult)}
    values = {k: v for k, v in data.items() if k in known}
    values["usage"] = Usage(**values.get("usage", {}))
    cost = values.get("cost_usd")
    values["cost_usd"] = Decimal(cost) if cost is not None else None
    values["replayed"] = True
    return WorkerResult(**values)


class CallJournal:
    """The run's journal, loaded once per attempt; lookups pop so a call asked twice in one run
    is replayed twice only if it was answered twice."""

    def __init__(self, run_id: UUID | str, attempt: int) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self._lock = threading.Lock()
        self._answers: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        # A first attempt has nothing journaled (calls are journaled by an attempt and read only
        # by the next one, after a re-queue): no read (issue #15).
        rows = (
            RunCall.objects.filter(run_id=run_id).order_by("id").values_list("digest", "result")
            if attempt > 1
            else ()
        )
        for digest, result in rows:
            self._answers[digest].append(result)
        self.loaded = sum(len(q) for q in self._answers.values())
        self._pending: list[RunCall] = []
        self.stored = 0  # rows this attempt wrote
        # Called before each real provider call (the run's sink stores what was emitted so far).
        self.before_call: Callable[[], None] | None = None
        # Wall time with at least one provider call in flight (parallel calls count once): the
        # part of a run that is the providers', not ours (x-conductor-overhead-ms).
        self._in_flight = 0
        self._wait_started = 0.0
        self._waited_s = 0.0

    def call_started(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._wait_started = time.perf_counter()
            self._in_flight += 1

    def call_ended(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._waited_s += time.perf_counter() - self._wait_started

    @property
    def provider_ms(self) -> float:
        with self._lock:
            waited = self._waited_s
            if self._in_flight:
                waited += time.perf_counter() - self._wait_started
        return waited * 1000

    def take(self, digest: str) -> WorkerResult | None:
        with self._lock:
            queue = self._answers.get(digest)
            if not queue:
                return None
            return result_from_json(queue.popleft())

    def take_tool(self, digest: str) -> dict[str, Any] | None:
        """A journaled tool call's result (as ``record_tool`` stored it), popped; None if none."""
        with self._lock:
            queue = self._answers.get(digest)
            return queue.popleft() if queue else None

    def record_tool(self, digest: str, qualified: str, result: dict[str, Any]) -> None:
        """Written now, in the caller's transaction (the one storing the ToolCall row)."""
        RunCall.objects.create(
            run_id=self.run_id,
            digest=digest,
            worker_key=f"tool:{qualified}"[:100],
            attempt=self.attempt,
            result=result,
        )
        with self._lock:
            self.stored += 1

    def record(self, digest: str, worker_key: str, result: WorkerResult) -> None:
        """Called on the provider call's own thread: queued, not written there (that thread has
        no connection and ends with the call). The run's thread writes it with its next event."""
        with self._lock:
            self._pending.append(
                RunCall(
                    run_id=self.run_id,
                    digest=digest,
                    worker_key=worker_key[:100],
                    attempt=self.attempt,
                    result=result_to_json(result),
                )
            )

    @property
    def pending(self) -> bool:
        """Answers received and not yet written."""
        return bool(self._pending)

    def flush(self) -> None:
        """Write the queued answers (by the run's sink: on its own at the first event after them,
        or in the transaction of a batch)."""
        with self._lock:
            rows, self._pending = self._pending, []
        if rows:
            RunCall.objects.bulk_create(rows)
            self.stored += len(rows)

    def forget(self) -> None:
        """The run ended (in the caller's transaction): what is queued is never written, and the
        rows are deleted only if there are any (a one-call run's answer is journaled and deleted
        in the same transaction otherwise: two statements for nothing)."""
        with self._lock:
            self._pending = []
        if self.loaded or self.stored:
            forget(self.run_id)


class JournaledWorker:
    """A pool worker whose answers are journaled, and replayed on a resumed attempt."""

    def __init__(self, inner: Any, journal: CallJournal) -> None:
        self.inner = inner
        self.info = inner.info
        self.journal = journal

    def complete(self, messages: Any, **options: Any) -> WorkerResult:
        digest = call_digest(self.info.key, messages, options)
        replay = self.journal.take(digest)
        if replay is not None:
            on_delta = options.get("on_delta")
            if on_delta is not None and replay.text:
                on_delta(replay.text)  # a live viewer still sees the text arrive
            return replay
        if self.journal.before_call is not None:
            self.journal.before_call()
        self.journal.call_started()
        try:
            result: WorkerResult = self.inner.complete(messages, **options)
        finally:
            self.journal.call_ended()
        self.journal.record(digest, self.info.key, result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def journal_pool(engine_pool: Any, journal: CallJournal) -> Any:
    """Wrap every worker of the engine pool (and its conductor) in the run's journal."""
    engine_pool.workers = [JournaledWorker(w, journal) for w in engine_pool.workers]
    if engine_pool.conductor is not None:
        engine_pool.conductor = JournaledWorker(engine_pool.conductor, journal)
    # A preset's own conductor plans too: journaled like the pool's, so a resumed attempt replays
    # its plan instead of asking (and billing) it again.
    presets = getattr(engine_pool, "preset_conductors", None)
    if presets:
        engine_pool.preset_conductors = {name: JournaledWorker(w, journal) for name, w in presets.items()}
    return engine_pool


def forget(run_id: UUID | str) -> None:
    """The run ended: its journal is no longer needed (and holds model output)."""
    RunCall.objects.filter(run_id=run_id).delete()
