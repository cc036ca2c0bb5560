"""In-process workers implementing the Worker protocol, for executor/strategy logic tests.
(Providers themselves are tested over real sockets against the fakes.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from decimal import Decimal

from apps.engine.providers.base import ProviderError, ProviderTimeout
from apps.engine.types import Message, Usage, WorkerInfo, WorkerResult


class FnWorker:
    """Answers with `reply` (a string or a function of the messages); records every call."""

    def __init__(
        self,
        key: str,
        reply: str | Callable[[list[Message]], str] = "ok",
        *,
        delay: float = 0.0,
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
        if self.delay:
            if self.honour_timeout and timeout is not None and timeout < self.delay:
                time.sleep(timeout)
                raise ProviderTimeout(f"{self.info.key} timed out")
            time.sleep(self.delay)
        try:
            if self.fail is not None:
                raise self.fail
            text = self.reply(messages) if callable(self.reply) else self.reply
            if on_delta is not None:
                for piece in self.pieces or [text]:
                    on_delta(piece)
        finally:
            with self._lock:
                self.ends.append(time.monotonic())
        return WorkerResult(
            text=text,
            usage=Usage(*self.usage),
            latency_ms=(time.perf_counter() - t0) * 1000,
            model=self.info.model,
            cost_usd=self.cost,
            priced=self.cost is not None,
        )


class ScriptedConductor(FnWorker):
    """A conductor that answers successive planning calls from a list."""

    def __init__(self, replies: list[str], key: str = "conductor") -> None:
        self.replies = list(replies)
        super().__init__(key, self._next)

    def _next(self, messages: list[Message]) -> str:
        return self.replies.pop(0) if self.replies else "no plan"
