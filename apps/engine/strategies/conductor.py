"""Strategies: each turns a request into plan(s) and executes them through the RunSession.

- `ConductorStrategy` — a model writes the plan (the product's namesake); presets `mini`/`ultra`.
- `SingleStrategy` — one step on one worker (the baseline every comparison needs).
- `MixtureOfAgentsStrategy` — N proposers in parallel, one aggregator that reads all of them.
- `PlannerExecutorVerifierStrategy` — the fixed three-step pipeline.

All of them share one interface (`Strategy.run(session) -> answer`) and every plan they make
goes through the same validation hooks and executor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, runtime_checkable

from apps.engine.events import EventType, StepStatus
from apps.engine.executor import execute_round
from apps.engine.plan import (
    Plan,
    PlanError,
    PlanStep,
    parse_plan,
    plan_json_schema,
    plan_to_text,
)
from apps.engine.pool import WorkerPool
from apps.engine.providers.base import ProviderError
from apps.engine.session import RunSession, StepRecord
from apps.engine.types import Limits, Message, Usage, WorkerResult

logger = logging.getLogger(__name__)

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


@runtime_checkable
class Strategy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def preset(self) -> str | None: ...

    def narrow_limits(self, limits: Limits) -> Limits:
        """The limits in force for this strategy (never looser than `limits`)."""
        ...

    def run(self, session: RunSession) -> str:
        """Plan and execute; return the answer or raise RunAborted."""
        ...


class _Base:
    name: ClassVar[str] = "base"
    preset: str | None = None

    def narrow_limits(self, limits: Limits) -> Limits:
        return limits


def _allowed(session: RunSession) -> list[int]:
    allowed = session.pool.allowed_indices(session.limits.allowed_workers)
    if not allowed:
        raise ProviderError("No worker in the pool is allowed by the limits in force.")
    # A worker whose breaker is open is left out of the planner's list (issue 44), unless every
    # allowed one is: then the steps themselves are skipped with `circuit_open`.
    down = session.pool.down_indices(allowed)
    return [i for i in allowed if i not in down] or allowed


def _default_worker(session: RunSession) -> int:
    allowed = _allowed(session)
    return session.pool.default_index if session.pool.default_index in allowed else allowed[0]


def _strongest(session: RunSession) -> int:
    # cost_rank is the only strength signal we have; ties go to the pool order (admin's choice).
    allowed = _allowed(session)
    return max(allowed, key=lambda i: (session.pool.workers[i].info.cost_rank, -i))


def _run_fixed(session: RunSession, plan: Plan, *, tolerant: bool = False) -> str:
    session.propose(round=1, attempt=1, source="fixed", plan=plan)
    execute_round(session, plan, round=1, allow_self=False, tolerant=tolerant)
    return session.answer()


# ----------------------------------------------------------------------------- fixed strategies


class SingleStrategy(_Base):
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
            index = _default_worker(session)
        elif isinstance(self.worker, str):
            found = session.pool.index_of(self.worker)
            if found is None:
                raise ProviderError(f"The worker {self.worker!r} is not in this pool.")
            index = found
        else:
            index = self.worker
        return _run_fixed(session, Plan((PlanStep(0, index, self.instruction, (), self.conversation),)))


class MixtureOfAgentsStrategy(_Base):
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
        allowed = _allowed(session)
        room = max(1, session.limits.max_steps - 1)
        proposers = self.proposers if self.proposers is not None else allowed
        proposers = proposers[: min(room, self.n or room)]
        aggregator = self.aggregator if self.aggregator is not None else _strongest(session)
        steps = [PlanStep(i, w, self.PROPOSE, ()) for i, w in enumerate(proposers)]
        steps.append(PlanStep(len(steps), aggregator, self.AGGREGATE, "all"))
        # A failed proposal is tolerated: the aggregator combines the proposals it has (issue 44).
        return _run_fixed(session, Plan(tuple(steps)), tolerant=True)


class PlannerExecutorVerifierStrategy(_Base):
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
        strong = _strongest(session)
        planner = self.planner if self.planner is not None else strong
        executor = self.executor if self.executor is not None else _default_worker(session)
        verifier = self.verifier if self.verifier is not None else strong
        plan = Plan(
            (
                PlanStep(0, planner, self.PLAN, ()),
                PlanStep(1, executor, self.EXECUTE, (0,)),
                PlanStep(2, verifier, self.VERIFY, (0, 1)),
            )
        )
        return _run_fixed(session, plan)


# ----------------------------------------------------------------------------- conductor


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    max_steps: int
    max_depth: int
    guidance: str
    cheap_first: bool


PRESETS: dict[str, Preset] = {
    "mini": Preset(
        "mini",
        max_steps=3,
        max_depth=1,
        guidance="Keep it small and fast: use as few steps as possible (one is often enough) and "
        "prefer the cheapest worker that can do each subtask.",
        cheap_first=True,
    ),
    "ultra": Preset(
        "ultra",
        max_steps=5,
        max_depth=2,
        guidance="Aim for the best possible answer: give the hard parts to the strongest workers, "
        "let steps check each other, and you may name yourself as the last step to review the "
        "results and plan further.",
        cheap_first=False,
    ),
}

SYSTEM_PROMPT = """You are the conductor of a team of AI workers. Do not answer the question yourself: \
write a short workflow in which workers answer it.

Workers (id: name - what it is good at - relative cost 1 cheap .. 5 expensive):
{workers}

A workflow has up to {max_steps} steps, given as three lists of equal length:
model_id = [the worker id for each step]
subtasks = [a clear, self-contained instruction for each step]
access_list = [for each step: [] or a list of earlier step numbers whose outputs it may read, or "all"]
Steps are numbered from {first}. A step may only read steps numbered before it. Each worker sees \
the question, the outputs in its access list and its own instruction, nothing else. The output of \
the last step is the final answer, so the last step must produce it.
{self_rule}
Constraints in force: {constraints}
{guidance}

{reply_format}"""

LISTS_REPLY = """Reply with the three lists, like:
model_id = [{w}, {w}]
subtasks = ["Solve the problem step by step.", "Check the solution above and give the final answer."]
access_list = [[], "all"]
(A JSON object with the keys model_id, subtasks and access_list is also accepted.)"""

# Under constrained decoding the reply is one object per step (see plan_json_schema's "steps").
STEPS_REPLY = """Reply with a JSON object listing the steps in order, like:
{{"steps": [{{"worker": {w}, "subtask": "Solve the problem step by step.", "access": []}},
 {{"worker": {w}, "subtask": "Check the solution above and give the final answer.", "access": "all"}}]}}"""

REPAIR_PROMPT = """That workflow is invalid: {error}
Reply with the corrected workflow only, in the same format."""

REPLAN_PROMPT = """Question: {question}

Results so far:
{results}

You asked to review these results and continue. Write the next steps of the workflow. \
They are numbered from {first}; an access list may name any earlier step number above. \
The last new step must produce the final answer."""


TOOLS_PROMPT = """

Tools the workers may call (name - what it does):
{tools}
A step's worker may only call the tools you grant that step. Grant each step only the tools its \
instruction needs, {how}"""


def _tools_prompt(session: RunSession, *, constrained: bool) -> str:
    """The tool catalogue and how to grant tools per step (issue 43); empty without tools."""
    port = getattr(session, "tools", None)
    catalog = list(port.catalog()) if port is not None else []
    if not catalog:
        return ""
    lines = "\n".join(f"{t.name} - {' '.join(t.description.split())[:200]}" for t in catalog)
    how = (
        'with a "tools" list in that step\'s object, e.g. "tools": ["' + catalog[0].name + '"].'
        if constrained
        else "with a fourth list: tool_access = [for each step: [] or a list of tool names]."
    )
    return TOOLS_PROMPT.format(tools=lines, how=how)


class ConductorStrategy(_Base):
    name = "conductor"

    def __init__(
        self,
        preset: str | None = None,
        *,
        constrained: bool = True,
        max_tokens: int = 768,
        max_instruction_chars: int | None = 400,
    ) -> None:
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        self.preset = preset
        self.constrained = constrained  # pass a JSON schema; providers that cannot honour it ignore it
        self.max_tokens = max_tokens
        self.max_instruction_chars = max_instruction_chars  # keeps constrained JSON short and complete

    def narrow_limits(self, limits: Limits) -> Limits:
        p = PRESETS.get(self.preset or "")
        if p is None:
            return limits
        return replace(
            limits, max_steps=min(limits.max_steps, p.max_steps), max_depth=min(limits.max_depth, p.max_depth)
        )

    # ------------------------------------------------------------------ prompts

    def system_prompt(self, session: RunSession, *, first: int, allow_self: bool) -> str:
        pool = session.pool
        allowed = _allowed(session)
        preset = PRESETS.get(self.preset or "")
        order = (
            sorted(allowed, key=lambda i: pool.workers[i].info.cost_rank)
            if preset and preset.cheap_first
            else allowed
        )
        lines = []
        for i in order:
            info = pool.workers[i].info
            strengths = info.strengths or ", ".join(info.tags) or "general tasks"
            # A one-slot worker (the local model) runs its steps one after another (issue 44).
            serial = " - runs one step at a time" if info.concurrency == 1 else ""
            lines.append(f"{i}: {info.name} - {strengths} - cost {info.cost_rank}{serial}")
        self_id = len(pool)
        if allow_self:
            lines.append(
                f"{self_id}: yourself (the conductor) - review the results so far and plan more steps"
            )
            self_rule = (
                f"You may use id {self_id} (yourself) only as the LAST step, to see the results and plan further; "
                "use it only when the question is hard enough to need a second round."
            )
        else:
            self_rule = ""
        constraints = [f"at most {session.limits.max_steps} steps"]
        if session.limits.allowed_workers is not None:
            constraints.append("only the worker ids listed above")
        if not allow_self:
            constraints.append("no further re-planning")
        prompt = SYSTEM_PROMPT.format(
            workers="\n".join(lines),
            max_steps=session.limits.max_steps,
            first=first,
            self_rule=self_rule,
            constraints="; ".join(constraints) + ".",
            guidance=preset.guidance if preset else "",
            reply_format=(STEPS_REPLY if self.constrained else LISTS_REPLY).format(w=order[0]),
        )
        return prompt + _tools_prompt(session, constrained=self.constrained)

    def _results_text(self, session: RunSession, self_step: PlanStep) -> str:
        parts = []
        for rec in session.outputs_for(self_step.reads()):
            if rec.step.is_self:
                continue
            name = session.pool.workers[rec.step.worker].info.name
            if rec.status == StepStatus.SUCCEEDED:
                parts.append(f"Step {rec.step.index} ({name}): {rec.step.instruction}\nOutput: {rec.output}")
            elif rec.status in (StepStatus.FAILED, StepStatus.TIMED_OUT, StepStatus.SKIPPED):
                # A failure is a result too (issue 44): the conductor re-plans around it.
                parts.append(
                    f"Step {rec.step.index} ({name}): {rec.step.instruction}\n"
                    f"{rec.status.value.upper()} (no output): {rec.error or 'no reason given'}"
                )
        return "\n\n".join(parts) or "(none)"

    # ------------------------------------------------------------------ planning

    def _check_allowed(self, session: RunSession, plan: Plan) -> None:
        allowed = set(_allowed(session))
        for i, step in enumerate(plan.steps):
            if not step.is_self and step.worker not in allowed:
                raise PlanError(
                    f"model_id[{i}]: worker {step.worker} is not allowed by the constraints in force"
                )

    def plan_round(
        self, session: RunSession, *, round: int, messages: list[Message], first: int, allow_self: bool
    ) -> tuple[Plan, list[WorkerResult]]:
        """Conductor attempt, up to `repair_rounds` repairs, then the recorded fallback."""
        pool_size = len(session.pool)
        schema = (
            plan_json_schema(
                pool_size,
                session.limits.max_steps,
                allow_self=allow_self,
                max_instruction_chars=self.max_instruction_chars,
                shape="steps",
                tools=[t.name for t in session.tools.catalog()] if session.tools is not None else (),
            )
            if self.constrained
            else None
        )
        results: list[WorkerResult] = []
        last_error = "no conductor model is configured"
        attempts = 1 + max(0, session.limits.repair_rounds)
        conductor = session.pool.conductor
        if conductor is not None:
            # Announced before the (possibly long) call, so the live graph shows planning at once.
            session.emitter.emit(
                EventType.PLAN_STARTED,
                {
                    "round": round,
                    "worker_key": session.conductor_key,
                    "worker_name": conductor.info.name,
                    "model": conductor.info.model,
                    "first": first,
                    # What the conductor is asked (its prompt after the input guardrails): the
                    # training export pairs it with the plan and the run's reward.
                    "messages": [dict(m) for m in messages],
                },
            )
            for attempt in range(1, attempts + 1):
                source = "conductor" if attempt == 1 else "repair"

                def on_delta(text: str, round: int = round, attempt: int = attempt) -> None:
                    # The planning node streams its output like a step does.
                    if text:
                        session.emitter.emit(
                            EventType.PLAN_DELTA, {"round": round, "attempt": attempt, "text": text}
                        )

                try:
                    result = session.call_conductor(
                        messages,
                        json_schema=schema,
                        max_tokens=self.max_tokens,
                        on_delta=on_delta,
                        round=round,
                    )
                except ProviderError as err:
                    # Retries already happened inside the provider; a repair prompt cannot fix an outage.
                    last_error = f"the conductor call failed: {err}"
                    session.propose(round=round, attempt=attempt, source=source, plan=None, error=str(err))
                    break
                results.append(result)
                try:
                    plan = parse_plan(
                        result.text,
                        pool_size=pool_size,
                        max_steps=session.limits.plan_bound,
                        allow_self=allow_self,
                        index_offset=first,
                    )
                    self._check_allowed(session, plan)
                except PlanError as err:
                    last_error = err.message
                    session.propose(
                        round=round,
                        attempt=attempt,
                        source=source,
                        plan=None,
                        raw=result.text,
                        error=err.message,
                        result=result,
                    )
                    messages = [
                        *messages,
                        {"role": "assistant", "content": result.text},
                        {"role": "user", "content": REPAIR_PROMPT.format(error=err.message)},
                    ]
                    continue
                session.propose(
                    round=round, attempt=attempt, source=source, plan=plan, raw=result.text, result=result
                )
                return plan, results
        # Fallback: never hidden — it is emitted as its own plan.proposed with the reason.
        fallback, what = self._fallback_plan(session, first)
        session.propose(
            round=round,
            attempt=attempts + 1 if session.pool.conductor is not None else 1,
            source="fallback",
            plan=fallback,
            error=f"Fell back to {what}: {last_error}",
        )
        return fallback, results

    def _fallback_plan(self, session: RunSession, first: int) -> tuple[Plan, str]:
        """The plan used when the conductor wrote none, shaped by the preset so mini and ultra
        differ even then (a tiny demo conductor rarely writes a valid plan): mini, one step on
        the default worker; ultra, the strongest worker answers and another checks it."""
        access: tuple[int, ...] | str = "all" if first > 0 else ()
        worker = _default_worker(session)
        allowed = _allowed(session)
        if self.preset == "ultra" and len(allowed) > 1 and session.limits.max_steps >= 2:
            strongest = _strongest(session)
            checker = worker if worker != strongest else next(i for i in allowed if i != strongest)
            plan = Plan(
                (
                    PlanStep(first, strongest, "Answer the question.", access),  # type: ignore[arg-type]
                    PlanStep(
                        first + 1,
                        checker,
                        f"Check the answer of step {first} for mistakes and give the corrected final answer.",
                        (first,),
                    ),
                )
            )
            return plan, "the ultra preset's answer-and-check plan"
        plan = Plan((PlanStep(first, worker, "Answer the question.", access),))  # type: ignore[arg-type]
        return plan, "a single step on the default worker"

    def run(self, session: RunSession) -> str:
        question = session.question
        max_depth = session.limits.max_depth
        round_, first = 1, 0
        self_step: PlanStep | None = None  # the previous round's "conductor itself" step
        messages: list[Message] = [
            {"role": "system", "content": self.system_prompt(session, first=0, allow_self=max_depth > 1)},
            {"role": "user", "content": question},
        ]
        while True:
            allow_self = round_ < max_depth
            plan, calls = self.plan_round(
                session, round=round_, messages=messages, first=first, allow_self=allow_self
            )
            if self_step is not None:
                self._finish_self_step(session, self_step, round_ - 1, plan, calls, messages)
            final = execute_round(session, plan, round=round_, allow_self=allow_self)
            if not final.recurses:
                return session.answer()
            # The conductor named itself: re-plan with the outputs its access list allows.
            session.checkpoint()
            self_step = final.last
            round_ += 1
            first = self_step.index + 1
            note = f"\n\nYour note for this review: {self_step.instruction}"
            messages = [
                {
                    "role": "system",
                    "content": self.system_prompt(session, first=first, allow_self=round_ < max_depth),
                },
                {
                    "role": "user",
                    "content": REPLAN_PROMPT.format(
                        question=question, results=self._results_text(session, self_step), first=first
                    )
                    + note,
                },
            ]
            conductor = session.pool.conductor
            session.emitter.emit(
                EventType.STEP_STARTED,
                {
                    "index": self_step.index,
                    "round": round_ - 1,
                    "worker_key": session.conductor_key,
                    "worker_name": conductor.info.name if conductor is not None else "conductor",
                    "instruction": self_step.instruction,
                    "access": list(self_step.reads()),
                    "messages": messages,
                },
            )

    def _finish_self_step(
        self,
        session: RunSession,
        step: PlanStep,
        round_: int,
        next_plan: Plan,
        calls: list[WorkerResult],
        messages: list[Message],
    ) -> None:
        # The calls' usage and cost are on their plan.proposed events (and in the run totals);
        # repeating them on this step would double count them in any per-step sum.
        rec = StepRecord(
            step,
            round_,
            StepStatus.SUCCEEDED,
            session.conductor_key,
            output="Planned the next round:\n" + plan_to_text(next_plan, pool_size=len(session.pool)),
            usage=Usage(),
            latency_ms=sum(r.latency_ms for r in calls),
            messages=messages,
        )
        session.record(rec)
        session.count_step()
        session.emit_step_finished(rec)


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
