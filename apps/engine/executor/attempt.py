"""One attempt at a step, and the daemon thread that makes its call.

The thread reports to the scheduler only through its inbox (`Began` when a waiting attempt gets
its worker's slot, `Outcome` when the call ends); the scheduler alone touches the run's state.
"""

from __future__ import annotations

import itertools
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apps.engine import calls, slots
from apps.engine.health import CIRCUIT_OPEN
from apps.engine.plan import PlanStep
from apps.engine.providers.base import DeltaCallback, ProviderError, Worker
from apps.engine.session import RunSession
from apps.engine.tools_loop import complete_with_tools
from apps.engine.types import Message, WorkerResult

logger = logging.getLogger(__name__)

_attempt_ids = itertools.count(1)


def next_attempt_id() -> int:
    return next(_attempt_ids)


def round_ms(ms: float) -> float:
    return float(f"{ms:.1f}")


def grace(timeout: float) -> float:
    # Small grace so a provider that honours `timeout` reports its own ProviderTimeout first.
    return min(0.5, 0.1 * timeout)


def circuit_text(worker: Worker) -> str:
    return (
        f"{CIRCUIT_OPEN}: not called, the worker “{worker.info.name}” failed repeatedly in recent "
        "calls and waits for its probe."
    )


@dataclass(slots=True)
class Attempt:
    id: int
    step: PlanStep
    worker: Worker
    messages: list[Message]
    started: float  # when its call started (or, while waiting, when it began to wait)
    deadline: float  # its call's deadline; infinite while it waits for a slot
    fallback_from: str | None = None
    live: bool = True  # False once abandoned: late deltas/results are dropped
    waiting: bool = False  # waits for its worker's slot: no call yet, no timeout running
    call: calls.CallScope = field(default_factory=calls.CallScope)

    def abandon(self, reason: str) -> None:
        self.live = False
        self.call.cancel(reason)  # the provider stops the call (apps.engine.calls)


@dataclass(slots=True)
class Began:
    """A waiting attempt got its slot: its call (and its timeout) starts now."""

    attempt_id: int
    at: float
    timeout: float


@dataclass(slots=True)
class Outcome:
    attempt_id: int
    result: WorkerResult | None
    error: ProviderError | None
    elapsed_ms: float


Inbox = queue.Queue[Outcome | Began]


@dataclass(slots=True)
class WorkerCall:
    """What the call thread needs, fixed when the attempt is launched."""

    session: RunSession
    att: Attempt
    slot: slots.Slot | None
    waiting: bool  # the slot was taken at launch: wait for it before calling
    timeout: float
    call_timeout: Callable[[], float]  # the timeout a call that waited gets when it starts
    max_tokens: int
    extra: dict[str, Any]
    on_delta: DeltaCallback | None
    inbox: Inbox


def run_call(job: WorkerCall) -> None:
    """The body of an attempt's thread: wait for the slot if need be, call, report the outcome."""
    att, slot = job.att, job.slot
    call_timeout_s = job.timeout
    if job.waiting:
        assert slot is not None
        # Bounded by the run's deadline: the scheduler abandons the attempt then.
        if not slot.acquire(give_up=lambda: not att.live):
            return  # abandoned while it waited: the scheduler already ended the step
        if not att.live:  # abandoned just as the slot came free: no call
            slot.release()
            return
        call_timeout_s = job.call_timeout()
        job.inbox.put(Began(att.id, time.monotonic(), call_timeout_s))
    t0 = time.perf_counter()
    result: WorkerResult | None = None
    error: ProviderError | None = None
    try:
        with calls.scope(att.call), slots.held(slot):
            # Issue 43: a step granted tools runs the bounded tool loop (apps.engine.tools_loop).
            result = complete_with_tools(
                job.session,
                att.step,
                att.worker,
                att.messages,
                max_tokens=job.max_tokens,
                timeout=call_timeout_s,
                extra=job.extra,
            )
            if result is None:
                result = att.worker.complete(
                    att.messages,
                    max_tokens=job.max_tokens,
                    timeout=call_timeout_s,
                    on_delta=job.on_delta,
                    **job.extra,
                )
    except ProviderError as err:
        error = err
    except Exception as err:
        # Unknown failure inside a provider: keep the details in the log, show plain words.
        logger.exception("worker %s raised unexpectedly", att.worker.info.key)
        error = ProviderError(f"The worker failed unexpectedly ({type(err).__name__}).")
    finally:
        if slot is not None:
            slot.release()
    job.inbox.put(Outcome(att.id, result, error, (time.perf_counter() - t0) * 1000))
