"""Plain value types shared by every engine module (no behaviour, no Django)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

# A chat message: {"role": "system"|"user"|"assistant", "content": "..."}.
Message = dict[str, str]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as reported by the provider for one call."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)

    def to_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What the engine knows about a worker; `key` is the stable id used in events
    (the Django side passes the DB worker slug)."""

    key: str
    name: str
    model: str
    provider: str  # provider kind: "openai" | "openai_compatible" | "anthropic" | "local" | "test"
    strengths: str = ""
    tags: tuple[str, ...] = ()
    cost_rank: int = 3  # relative cost, 1 (cheapest) .. 5 (most expensive)
    input_price_per_mtok: Decimal | None = None  # USD per million input tokens, admin-configured
    output_price_per_mtok: Decimal | None = None
    max_output_tokens: int = 512
    timeout_s: float = 60.0
    fallback_key: str | None = None  # key of another pool worker to retry a failed step on
    # How many calls the worker takes at once (apps.engine.slots); None: no limit. The local
    # model is always 1. Steps beyond it wait (not running, no call timeout) for a slot.
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("WorkerInfo.key must not be empty")
        if not 1 <= self.cost_rank <= 5:
            raise ValueError(f"WorkerInfo.cost_rank must be 1..5, got {self.cost_rank}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"WorkerInfo.concurrency must be >= 1 or None, got {self.concurrency}")


@dataclass(frozen=True, slots=True)
class WorkerResult:
    """One completed call: text plus the measurements every event carries."""

    text: str
    usage: Usage
    latency_ms: float
    model: str
    cost_usd: Decimal | None
    priced: bool
    replayed: bool = False  # served from a resumed run's journal: no provider call this time
    # How the call ended ("stop", "length": cut at max_tokens, "tool_calls") and the tool calls it
    # made (OpenAI's shape: id, type, function {name, arguments}) when given tools (issue 22).
    finish_reason: str = "stop"
    tool_calls: tuple[dict[str, Any], ...] = ()
    # The outbound gate's interventions on this call's request (``apps.engine.hooks.CheckResult``:
    # field and rule, no content), for the caller to record (issue 39).
    outbound: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    """One embeddings call: a vector per input (in input order) and the call's measurements."""

    vectors: tuple[tuple[float, ...], ...]
    usage: Usage  # input tokens only (an embedding generates none)
    latency_ms: float
    model: str
    cost_usd: Decimal | None
    priced: bool
    outbound: tuple[Any, ...] = ()  # the outbound gate's interventions (field and rule only)


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard limits for one run (callers narrow them per policy; presets narrow them further).

    Re-exported from `apps.engine.runner`, where callers usually import it.
    """

    max_steps: int = 5  # per plan (per recursion round)
    max_depth: int = 2  # conductor rounds; 1 means no recursion
    max_parallel: int = 4
    step_timeout_s: float = 120.0
    run_timeout_s: float = 600.0
    max_tokens_per_step: int | None = None  # None: each worker's own max_output_tokens
    allowed_workers: tuple[str, ...] | None = None  # worker keys; None means the whole pool
    stream: bool = True  # emit step.delta events when the provider streams
    repair_rounds: int = 1  # invalid conductor plans get this many chances to fix themselves
    cancel_poll_s: float = 0.25  # how often a waiting run re-checks its CancelToken
    # Plans up to this many steps are parsed and handed to governance, which must repair or
    # block those over `max_steps` (a policy wants to see, and record, the over-long plan);
    # None means `max_steps`. `max_steps` stays what the conductor is told and what runs.
    accept_steps: int | None = None
    # A run whose plan cannot finish (a step failed after its retries and fallback) but that holds
    # the answer of an earlier completed round ends succeeded with that answer marked incomplete
    # (apps.engine.runner); False: it ends failed (policy constraints.partial_answers).
    partial_answers: bool = True

    @property
    def plan_bound(self) -> int:
        """The longest plan the parser accepts."""
        return max(self.max_steps, self.accept_steps or 0)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("Limits.max_steps must be >= 1")
        if self.max_depth < 1:
            raise ValueError("Limits.max_depth must be >= 1")
        if self.max_parallel < 1:
            raise ValueError("Limits.max_parallel must be >= 1")
        if self.step_timeout_s <= 0 or self.run_timeout_s <= 0:
            raise ValueError("Limits timeouts must be positive")

    def to_dict(self) -> dict[str, object]:
        return {
            "max_steps": self.max_steps,
            "accept_steps": self.plan_bound,
            "max_depth": self.max_depth,
            "max_parallel": self.max_parallel,
            "step_timeout_s": self.step_timeout_s,
            "run_timeout_s": self.run_timeout_s,
            "max_tokens_per_step": self.max_tokens_per_step,
            "allowed_workers": list(self.allowed_workers) if self.allowed_workers is not None else None,
            "partial_answers": self.partial_answers,
        }


@dataclass(slots=True)
class Totals:
    """Running totals for a run; conductor calls count too. `cost_usd` sums the priced calls;
    when `priced` is False at least one call had no known price, so the cost is a lower bound."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = field(default_factory=lambda: Decimal(0))
    priced: bool = True
    any_priced: bool = False
    latency_ms: float = 0.0
    steps: int = 0

    def add(self, usage: Usage, cost_usd: Decimal | None, priced: bool) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        if priced and cost_usd is not None:
            self.cost_usd += cost_usd
            self.any_priced = True
        else:
            self.priced = False

    def copy(self) -> Totals:
        return Totals(
            self.input_tokens,
            self.output_tokens,
            self.cost_usd,
            self.priced,
            self.any_priced,
            self.latency_ms,
            self.steps,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, object]:
        # Nothing priced and something unpriced: report None, never "$0".
        cost = str(self.cost_usd) if (self.any_priced or self.priced) else None
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": cost,
            "priced": self.priced,
            "latency_ms": round(self.latency_ms, 3),
            "steps": self.steps,
        }
