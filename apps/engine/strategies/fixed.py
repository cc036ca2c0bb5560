"""The fixed strategies: plans the code writes, not a model (the baselines comparisons need)."""

from __future__ import annotations

from typing import Any

from apps.engine.plan import Plan, PlanStep
from apps.engine.providers.base import ProviderError
from apps.engine.session import RunSession
from apps.engine.strategies.base import (
    StrategyBase,
    allowed_workers,
    default_worker,
    run_fixed,
    strongest_worker,
)


class SingleStrategy(StrategyBase):
    name = "single"

    def __init__(
        self,
        worker: int | str | None = None,
        *,
        instruction: str = "Answer the question.",
        conversation: list[dict[str, Any]] | None = None,
    ) -> None:
        self.worker = worker  # pool index, worker key, or None for the pool default
        self.instruction = instruction
        # A chat the worker receives as it is (an API pool model's tool conversation).
        self.conversation = tuple(dict(m) for m in conversation) if conversation else None

    def run(self, session: RunSession) -> str:
        if self.worker is None:
            index = default_worker(session)
        elif isinstance(self.worker, str):
            found = session.pool.index_of(self.worker)
            if found is None:
                raise ProviderError(f"The worker {self.worker!r} is not in this pool.")
            index = found
        else:
            index = self.worker
        return run_fixed(session, Plan((PlanStep(0, index, self.instruction, (), self.conversation),)))


class MixtureOfAgentsStrategy(StrategyBase):
    name = "moa"

    PROPOSE = "Answer the question as well as you can."
    AGGREGATE = (
        "You have seen several candidate answers to the question from other assistants. "
        "Critically combine them into one accurate, complete final answer. Reply with the answer only."
    )

    def __init__(
        self, proposers: list[int] | None = None, aggregator: int | None = None, *, n: int | None = None
    ) -> None:
        self.proposers = proposers
        self.aggregator = aggregator
        self.n = n

    def run(self, session: RunSession) -> str:
        allowed = allowed_workers(session)
        room = max(1, session.limits.max_steps - 1)
        proposers = self.proposers if self.proposers is not None else allowed
        proposers = proposers[: min(room, self.n or room)]
        aggregator = self.aggregator if self.aggregator is not None else strongest_worker(session)
        steps = [PlanStep(i, w, self.PROPOSE, ()) for i, w in enumerate(proposers)]
        steps.append(PlanStep(len(steps), aggregator, self.AGGREGATE, "all"))
        # A failed proposal is tolerated: the aggregator combines the proposals it has (issue 44).
        return run_fixed(session, Plan(tuple(steps)), tolerant=True)


class PlannerExecutorVerifierStrategy(StrategyBase):
    name = "pev"

    PLAN = "Do not answer yet. Write a short numbered plan (at most 5 steps) for answering the question."
    EXECUTE = "Carry out the plan above step by step and give a complete answer to the question."
    VERIFY = (
        "Check the answer above against the question and the plan. Fix any mistakes. "
        "Reply with the final, corrected answer only."
    )

    def __init__(
        self, planner: int | None = None, executor: int | None = None, verifier: int | None = None
    ) -> None:
        self.planner, self.executor, self.verifier = planner, executor, verifier

    def run(self, session: RunSession) -> str:
        strong = strongest_worker(session)
        planner = self.planner if self.planner is not None else strong
        executor = self.executor if self.executor is not None else default_worker(session)
        verifier = self.verifier if self.verifier is not None else strong
        plan = Plan(
            (
                PlanStep(0, planner, self.PLAN, ()),
                PlanStep(1, executor, self.EXECUTE, (0,)),
                PlanStep(2, verifier, self.VERIFY, (0, 1)),
            )
        )
        return run_fixed(session, plan)
