"""Plan checks before execution: forecast a plan's tokens and cost, and check the forecast
against the policy (pure Python; the hooks pass the worker history in).

Output tokens per step: the mean of the worker's recent steps when it has a history, else its
``max_output_tokens`` (the most it may write: a forecast never assumes a cheaper step than the
worker can produce without evidence). Input tokens: the request and the subtask at ~4 characters
a token, plus the forecast output of every step the access list lets it read. Prices: the
engine's `price_call` (genai-prices for the models it knows, else the worker's configured
prices); a worker with neither is *unpriced* and named, never counted as $0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from apps.engine.hooks import Violation
from apps.engine.plan import Plan
from apps.engine.providers.pricing import price_call
from apps.engine.types import Usage, WorkerInfo
from apps.policies.constraints import BudgetRoom
from apps.policies.spec import Constraints

CHARS_PER_TOKEN = 4
PROMPT_OVERHEAD_TOKENS = 60  # the worker prompt's fixed framing


@dataclass(frozen=True, slots=True)
class StepForecast:
    index: int
    worker_key: str
    input_tokens: int
    output_tokens: int
    cost_usd: Decimal | None  # None: unpriced
    basis: str  # where the output length comes from


@dataclass(frozen=True, slots=True)
class PlanForecast:
    steps: tuple[StepForecast, ...]
    cost_usd: Decimal  # priced steps only
    unpriced: tuple[str, ...]  # worker keys without a price

    @property
    def total_tokens(self) -> int:
        return sum(s.input_tokens + s.output_tokens for s in self.steps)


def forecast_plan(
    plan: Plan, infos: Sequence[WorkerInfo], *, question: str, history: Mapping[str, float]
) -> PlanForecast:
    out: list[StepForecast] = []
    expected: dict[int, int] = {}
    for step in plan.steps:
        if step.is_self or not 0 <= step.worker < len(infos):
            continue  # a re-plan is forecast when its own plan arrives
        info = infos[step.worker]
        mean = history.get(info.key)
        if mean:
            output = min(round(mean), info.max_output_tokens)
            basis = "recent steps of this worker"
        else:
            output, basis = info.max_output_tokens, "the worker's max output tokens (no history)"
        reads = [i for i in step.reads() if i in expected]
        inp = (
            PROMPT_OVERHEAD_TOKENS
            + (len(question) + len(step.instruction)) // CHARS_PER_TOKEN
            + sum(expected[i] for i in reads)
        )
        cost, priced = price_call(info, Usage(inp, output))
        expected[step.index] = output
        out.append(StepForecast(step.index, info.key, inp, output, cost if priced else None, basis))
    priced_total = sum((s.cost_usd for s in out if s.cost_usd is not None), Decimal(0))
    unpriced = tuple(dict.fromkeys(s.worker_key for s in out if s.cost_usd is None))
    return PlanForecast(tuple(out), priced_total, unpriced)


def forecast_violations(
    fc: PlanForecast, c: Constraints, budgets: Sequence[BudgetRoom] = ()
) -> list[Violation]:
    """Every limit the forecast crosses, each naming the policy field that sets it."""
    found: list[Violation] = []
    cost, tokens = fc.cost_usd, fc.total_tokens

    # Codes tell what an approver may lift: a plan-check limit (forecast_over_limit) can be
    # approved; a run cap or the team's hard budget (forecast_over_cap / _budget) cannot.
    def over_cost(field: str, limit: Decimal, what: str, code: str = "forecast_over_limit") -> None:
        if cost > limit:
            found.append(
                Violation(
                    code,
                    f"{field}: the plan is forecast to cost ${cost:.6f}, above {what} (${limit})",
                )
            )

    def over_tokens(field: str, limit: int, code: str = "forecast_over_limit") -> None:
        if tokens > limit:
            found.append(
                Violation(
                    code,
                    f"{field}: the plan is forecast to use {tokens} tokens, above the limit ({limit})",
                )
            )

    f = c.forecast
    if f.max_cost_usd is not None:
        over_cost("constraints.forecast.max_cost_usd", f.max_cost_usd, "the plan limit")
    if f.max_tokens is not None:
        over_tokens("constraints.forecast.max_tokens", f.max_tokens)
    if c.caps.max_cost_usd is not None:
        over_cost(
            "constraints.caps.max_cost_usd", c.caps.max_cost_usd, "the run's cost cap", "forecast_over_cap"
        )
    if c.caps.max_total_tokens is not None:
        over_tokens("constraints.caps.max_total_tokens", c.caps.max_total_tokens, "forecast_over_cap")
    for room in budgets:
        over_cost(
            f"budgets.{room.name}.hard_usd",
            room.remaining,
            f"what the team's {room.name} budget has left",
            "forecast_over_budget",
        )
    return found
