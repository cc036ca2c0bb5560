"""Which arms a request may use: the policy's own worker rule and the per-run cost cap decide.

An arm is a single allowed worker, MoA, PEV, or a conductor preset. A single-worker arm exists
only for a worker the policy allows for this request (``constraints.workers`` and, for a
confidential request, the local-only rule: `apps.policies.constraints.worker_problem`, the same
function the step gate applies). A composite arm exists when it has allowed workers to run on
(MoA: at least two; the conductor presets: a usable conductor model, the preset's own or the pool's). Every arm gets a forecast *upper
bound* of its cost from worker prices (each call writes its worker's ``max_output_tokens``); an
arm over ``constraints.caps.max_cost_usd`` is dropped, and so is an unpriced arm when a cap is
set — the router cannot show it stays under the cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from apps.engine.health import CIRCUIT_OPEN, unavailable
from apps.engine.pool import WorkerPool
from apps.engine.providers.pricing import price_call
from apps.engine.strategies import PRESETS
from apps.engine.types import Usage, WorkerInfo
from apps.learning.bandit import Arm
from apps.policies.constraints import is_confidential, worker_problem
from apps.policies.spec import Constraints

CHARS_PER_TOKEN = 4
PROMPT_OVERHEAD_TOKENS = 60


@dataclass(frozen=True)
class Excluded:
    arm: str
    reason: str


def _call_cost(info: WorkerInfo, base_url: str | None, input_tokens: int) -> Decimal | None:
    cost, priced = price_call(info, Usage(input_tokens, info.max_output_tokens), base_url=base_url)
    return cost if priced else None


def _sum(costs: Sequence[Decimal | None]) -> Decimal | None:
    if any(c is None for c in costs):
        return None
    return sum((c for c in costs if c is not None), Decimal(0))


def candidate_arms(
    *,
    question: str,
    pool: WorkerPool,
    constraints: Constraints,
    classification: str = "",
    max_steps: int | None = None,
) -> tuple[list[Arm], list[Excluded]]:
    """(arms the router may choose, arms left out with the rule that left them out).

    ``pool`` is the engine's `WorkerPool` (its workers carry ``info`` and maybe ``base_url``)."""
    confidential, _why = is_confidential(question, constraints, marked=classification)
    q_tokens = PROMPT_OVERHEAD_TOKENS + len(question) // CHARS_PER_TOKEN
    allowed: list[tuple[WorkerInfo, str | None]] = []
    excluded: list[Excluded] = []
    for worker in pool.workers:
        info = worker.info
        problem = worker_problem(info, constraints, confidential=confidential)
        if problem is not None:
            excluded.append(Excluded(f"single:{info.key}", problem[1]))
            continue
        allowed.append((info, getattr(worker, "base_url", None)))
    health = getattr(pool, "health", None)
    # A worker whose circuit breaker is open is no arm (issue 44), unless every allowed one is.
    down = unavailable(health, [info.key for info, _ in allowed])
    if down and len(down) < len(allowed):
        excluded.extend(
            Excluded(f"single:{key}", f"{CIRCUIT_OPEN}: its recent calls failed") for key in sorted(down)
        )
        allowed = [(info, url) for info, url in allowed if info.key not in down]

    arms: list[Arm] = [
        Arm(
            f"single:{info.key}", "single", worker=info.key, forecast_cost_usd=_call_cost(info, url, q_tokens)
        )
        for info, url in allowed
    ]
    if allowed:
        room = max(1, (max_steps or 5) - 1)
        strongest = max(allowed, key=lambda iu: iu[0].cost_rank)
        if len(allowed) >= 2:
            proposers = allowed[:room]
            reads = sum(i.max_output_tokens for i, _ in proposers)
            moa = _sum(
                [
                    *(_call_cost(i, u, q_tokens) for i, u in proposers),
                    _call_cost(*strongest, q_tokens + reads),
                ]
            )
            arms.append(Arm("moa", "moa", forecast_cost_usd=moa))
        else:
            excluded.append(Excluded("moa", "fewer than two workers are allowed for this request"))
        # PEV: planner and verifier on the strongest allowed worker, the executor on any: bound by
        # the strongest three times.
        s_info, s_url = strongest
        out = s_info.max_output_tokens
        pev = _sum(
            [
                _call_cost(s_info, s_url, q_tokens),
                _call_cost(s_info, s_url, q_tokens + out),
                _call_cost(s_info, s_url, q_tokens + 2 * out),
            ]
        )
        arms.append(Arm("pev", "pev", forecast_cost_usd=pev))
        own = getattr(pool, "preset_conductors", {})
        down = getattr(pool, "unavailable_presets", {})
        for name, preset in PRESETS.items():
            arm_id = f"conductor-{name}"
            # The preset's own conductor when the pool names one (issue 19), else the pool's.
            conductor = own.get(name) or getattr(pool, "conductor", None)
            if name in down:
                excluded.append(Excluded(arm_id, down[name]))
                continue
            if conductor is None:
                excluded.append(Excluded(arm_id, "the pool has no conductor model"))
                continue
            if unavailable(health, [conductor.info.key]):
                excluded.append(Excluded(arm_id, f"{CIRCUIT_OPEN}: its conductor's recent calls failed"))
                continue
            steps = min(preset.max_steps, max_steps or preset.max_steps) * preset.max_depth
            plan_cost = _call_cost(conductor.info, getattr(conductor, "base_url", None), q_tokens + 400)
            step_cost = _call_cost(s_info, s_url, q_tokens + out)
            total = _sum([plan_cost] * preset.max_depth + [step_cost] * steps)
            arms.append(Arm(arm_id, "conductor", preset=name, forecast_cost_usd=total))

    cap = constraints.caps.max_cost_usd
    if cap is None:
        return arms, excluded
    kept: list[Arm] = []
    for arm in arms:
        if arm.forecast_cost_usd is None:
            excluded.append(Excluded(arm.id, "unpriced, and constraints.caps.max_cost_usd is set"))
        elif arm.forecast_cost_usd > cap:
            excluded.append(
                Excluded(
                    arm.id,
                    f"forecast ${arm.forecast_cost_usd:.6f} is above constraints.caps.max_cost_usd (${cap})",
                )
            )
        else:
            kept.append(arm)
    return kept, excluded
