"""Strategies: each turns a request into plan(s) and executes them through the RunSession.

- `ConductorStrategy` — a model writes the plan (the product's namesake); presets `mini`/`ultra`.
- `SingleStrategy` — one step on one worker (the baseline every comparison needs).
- `MixtureOfAgentsStrategy` — N proposers in parallel, one aggregator that reads all of them.
- `PlannerExecutorVerifierStrategy` — the fixed three-step pipeline.

All of them share one interface (`Strategy.run(session) -> answer`) and every plan they make
goes through the same validation hooks and executor.
"""

from apps.engine.pool import WorkerPool
from apps.engine.strategies.base import Strategy
from apps.engine.strategies.conductor import ConductorStrategy
from apps.engine.strategies.fixed import (
    MixtureOfAgentsStrategy,
    PlannerExecutorVerifierStrategy,
    SingleStrategy,
)
from apps.engine.strategies.prompts import PRESETS, Preset

__all__ = [
    "PRESETS",
    "ConductorStrategy",
    "MixtureOfAgentsStrategy",
    "PlannerExecutorVerifierStrategy",
    "Preset",
    "SingleStrategy",
    "Strategy",
    "WorkerPool",
    "build_strategy",
]


def build_strategy(name: str, *, preset: str | None = None, **kwargs: object) -> Strategy:
    """Strategy by name ("conductor", "single", "moa", "pev"), for the Django side."""
    name = name.lower()
    if name in ("conductor", "conductor-mini", "conductor-ultra"):
        if name != "conductor" and preset is None:
            preset = name.split("-", 1)[1]
        return ConductorStrategy(preset, **kwargs)  # type: ignore[arg-type]
    if name == "single":
        return SingleStrategy(**kwargs)  # type: ignore[arg-type]
    if name in ("moa", "mixture", "mixture_of_agents"):
        return MixtureOfAgentsStrategy(**kwargs)  # type: ignore[arg-type]
    if name in ("pev", "planner_executor_verifier"):
        return PlannerExecutorVerifierStrategy(**kwargs)  # type: ignore[arg-type]
    raise ValueError(f"unknown strategy {name!r}")
