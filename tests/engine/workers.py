"""In-process workers implementing the Worker protocol, for executor/strategy logic tests.
(Providers themselves are tested over real sockets against the fakes.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from decimal import Decimal

from apps.engine.providers.base import ProviderError, ProviderTimeout
from apps.engine.types import Message, Usage, WorkerInfo, WorkerResult

# A held call waits for release() at most this long: a safety net, so an executor that fails to
# abandon it fails the test's assertions instead of hanging the suite. Not a pace.
HOLD_LIMIT_S = 30.0


class FnWorker:
    """Answers with `reply` (a string or a function of the messages); records every call.

    ``held=True``: each call blocks until the test calls ``release()`` ("slow until I say so");
    with ``honour_timeout`` it gives up at the call's timeout like a provider. ``delay`` is
    simulated latency, for the scheduling tests where the pace itself is measured.
    """

    def __init__(
        self,
        key: str,
        reply: str | Callable[[list[Message]], str] = "ok",
        *,
        delay: float = 0.0,
        held: bool = False,
        fail: ProviderError | None = None,
        cost_rank: int = 1,
        fallback_key: str | None = None,
        usage: tuple[int, int] = (10, 5),
        cost: Decimal | None = Decimal("0.001"),
        honour_timeout: bool = False,
        timeout_s: float = 60.0,
        pieces: list[str] | None = None,
        strengths: str = "",
    ) -> None:
        self.info = WorkerInfo(
            key=key,
            name=key.title(),
            model=f"{key}-model",
            provider="test",
            strengths=strengths,
            cost_rank=cost_rank,
            fallback_key=fallback_key,
            timeout_s=timeout_s,
        )
        self.reply = reply
        self.delay = delay
        self.held = held
        self.released = threading.Event()
        self.started = threading.Event()  # set as the first call begins
        self.fail = fail
        self.usage = usage
        self.cost = cost
        self.honour_timeout = honour_timeout
        self.pieces = pieces
        self.calls: list[list[Message]] = []
        self.schemas: list[dict | None] = []
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)

    def complete(
        self,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        on_delta: Callable[[str], None] | None = None,
        json_schema: dict | None = None,
    ) -> WorkerResult:
        t0 = time.perf_counter()
        with self._lock:
            self.calls.append([dict(m) for m in messages])
            self.schemas.append(json_schema)
            self.starts.append(time.monotonic())
        self.started.set()
        # Held: until release(). Delay: the simulated latency the scheduling tests measure (a
        # release() cuts it short). A worker that honours its timeout gives up at it, like a provider.
        hold = HOLD_LIMIT_S if self.held else self.delay
        try:
            if hold:
                if self.honour_timeout and timeout is not None and timeout < hold:
                    if not self.released.wait(timeout):
                        raise ProviderTimeout(f"{self.info.key} timed out")
                else:
                    self.released.wait(hold)
            if self.fail is not None:
                raise self.fail
            text = self.reply(messages) if callable(self.reply) else self.reply
            if on_delta is not None:
                for piece in self.pieces or [text]:
                    on_delta(piece)
        finally:
            with self._lock:
                self.ends.append(time.monotonic())
                self._ended.notify_all()
        return WorkerResult(
            text=text,
            usage=Usage(*self.usage),
            latency_ms=(time.perf_counter() - t0) * 1000,
            model=self.info.model,
            cost_usd=self.cost,
            priced=self.cost is not None,
        )

    def release(self, join_timeout: float = 10) -> None:
        """Let held calls finish, and wait until every call begun so far has ended, its deltas
        included (nothing the calls do can happen after this). The engine keeps the threads the
        calls ran on (apps.engine.threads), so waiting for those threads to end would not do."""
        self.released.set()
        with self._ended:
            self._ended.wait_for(lambda: len(self.ends) >= len(self.starts), timeout=join_timeout)


class ScriptedConductor(FnWorker):
    """A conductor that answers successive planning calls from a list."""

    def __init__(self, replies: list[str], key: str = "conductor") -> None:
        self.replies = list(replies)
        super().__init__(key, self._next)

    def _next(self, messages: list[Message]) -> str:
        return self.replies.pop(0) if self.replies else "no plan"
