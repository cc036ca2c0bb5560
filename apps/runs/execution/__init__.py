"""Execution of runs, shared by both runtimes.

A run is *accepted* when its row is committed together with a `RunDispatch` outbox row.
`dispatch_pending` hands it to Celery (distributed) or to this process's thread pool (embedded);
if that fails (broker down) the outbox row stays and the lease keeper retries it, so the client
still gets its run id. `execute_run` claims the run with a conditional update (`queued →
running`, taking a LEASE: owner id + expiry a few seconds ahead), so a duplicate delivery does
nothing. Every process that executes runs renews its leases by heartbeat; a lease that expires,
or whose owner is a dead process on this host, sends the run back to the queue (`requeue_run`),
at most `RUN_MAX_ATTEMPTS` times, after which the run ends `failed` with the reason.

A re-queued run resumes (`apps.runs.journal`): its next attempt runs the strategy again, and every
provider call the lost attempt had answered (planning, steps, judges; journaled before the event
that reports it) is replayed from the resume journal instead of asked again, so it is billed
once; the first call that was in flight, and all after it, go to the provider. The lost attempt's
steps and usage are reset (the audit trail keeps what was discarded, and whether the restart
resumed or started clean) and rebuilt by the replay, and the new attempt's events continue the
run's `seq`, so websocket clients lose nothing and see nothing twice.

Every execution runs in a `contextvars` context of its own carrying only the run's request id
(the hand-off carries it: a Celery message header, the thread pool's task argument), and the
engine's provider-call threads run in a copy of it: each log line names its own request.

The package, re-exported here (NetBox style), from the bottom up: ``leases`` (executor identity,
heartbeat, cancel token), ``claim`` (the conditional UPDATEs), ``strategies`` (what a run
executes, replays included), ``runner`` (a claimed run through the engine), ``outbox`` (dispatch,
thread pool, drain), ``reaper`` (re-queue, lease keeper), ``inline`` (a /v1 run on the request's
thread). Import from here; patch a name in the module that looks it up.
"""

from __future__ import annotations

from apps.runs.execution.claim import Lease
from apps.runs.execution.inline import execute_here, give_back, inline_slot, inline_wanted, take_inline_slot
from apps.runs.execution.leases import DbCancelToken, executor_id, heartbeat, start_heartbeat
from apps.runs.execution.outbox import (
    REQUEST_ID_HEADER,
    RUN_EXECUTE_TASK,
    dispatch_pending,
    dispatch_run,
    drain_outbox,
    thread_executor,
    thread_executor_alive,
)
from apps.runs.execution.reaper import reap_runs, requeue_run, reset_for_next_attempt, start_lease_keeper
from apps.runs.execution.runner import ended_as_stored, execute_run, run_to_execute
from apps.runs.execution.strategies import build_run_strategy, streams_upstream

__all__ = [
    "REQUEST_ID_HEADER",
    "RUN_EXECUTE_TASK",
    "DbCancelToken",
    "Lease",
    "build_run_strategy",
    "dispatch_pending",
    "dispatch_run",
    "drain_outbox",
    "ended_as_stored",
    "execute_here",
    "execute_run",
    "executor_id",
    "give_back",
    "heartbeat",
    "inline_slot",
    "inline_wanted",
    "reap_runs",
    "requeue_run",
    "reset_for_next_attempt",
    "run_to_execute",
    "start_heartbeat",
    "start_lease_keeper",
    "streams_upstream",
    "take_inline_slot",
    "thread_executor",
    "thread_executor_alive",
]
