"""In-process workers and plan builders for the policy tests (pure Python, no Django)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from decimal import Decimal

from apps.engine.plan import Plan, PlanStep
from apps.engine.types import Message, Usage, WorkerInfo, WorkerResult


class TagWorker:
    """A Worker-protocol worker with tags and prices; records every call's messages."""

    def __init__(
        self,
        key: str,
        reply: str | Callable[[list[Message]], str] = "ok",
        *,
        tags: Sequence[str] = (),
        cost_rank: int = 3,
        out_price: Decimal | None = None,
        max_output_tokens: int = 100,
        usage: tuple[int, int] = (10, 5),
        cost: Decimal | None = Decimal("0.001"),
    ) -> None:
        self.info = WorkerInfo(
            key=key,
            name=key.title(),
            model=f"{key}-model",
            provider="test",
            tags=tuple(tags),
            cost_rank=cost_rank,
            output_price_per_mtok=out_price,
            max_output_tokens=max_output_tokens,
        )
        self.reply = reply
        self.usage = usage
        self.cost = cost
        self.calls: list[list[Message]] = []
        self._lock = threading.Lock()

    def complete(
        self,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        on_delta=None,
        json_schema=None,
    ) -> WorkerResult:
        with self._lock:
            self.calls.append([dict(m) for m in messages])
        text = self.reply(messages) if callable(self.reply) else self.reply
        return WorkerResult(text, Usage(*self.usage), 1.0, self.info.model, self.cost, self.cost is not None)


def infos(*specs: tuple[str, Sequence[str]] | str) -> list[WorkerInfo]:
    out = []
    for s in specs:
        key, tags = (s, ()) if isinstance(s, str) else s
        out.append(WorkerInfo(key=key, name=key, model=key, provider="test", tags=tuple(tags)))
    return out


def linear_plan(workers: Sequence[int], *, offset: int = 0) -> Plan:
    """Step i reads step i-1; the last step reads all."""
    steps = []
    for i, w in enumerate(workers):
        g = offset + i
        access = "all" if i == len(workers) - 1 and i > 0 else ((g - 1,) if i > 0 else ())
        steps.append(PlanStep(g, w, f"do part {i}", access))
    return Plan(tuple(steps))


def plan_text(workers: Sequence[int], *, pool_size: int) -> str:
    from apps.engine.plan import plan_to_text

    return plan_to_text(linear_plan(workers), pool_size=pool_size)
