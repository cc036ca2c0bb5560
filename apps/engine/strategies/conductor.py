"""`ConductorStrategy`: a model writes the plan (the product's namesake), repairs it when it is
invalid, falls back visibly when it cannot, and may name itself to re-plan with the results."""

from __future__ import annotations

from dataclasses import replace

from apps.engine.events import EventType, StepStatus
from apps.engine.executor import execute_round
from apps.engine.plan import Plan, PlanError, PlanStep, parse_plan, plan_json_schema, plan_to_text
from apps.engine.providers.base import ProviderError
from apps.engine.session import RunSession, StepRecord
from apps.engine.strategies.base import StrategyBase, allowed_workers, default_worker, strongest_worker
from apps.engine.strategies.prompts import (
    LISTS_REPLY,
    PRESETS,
    REPAIR_PROMPT,
    REPLAN_PROMPT,
    STEPS_REPLY,
    SYSTEM_PROMPT,
    tools_prompt,
)
from apps.engine.types import Limits, Message, Usage, WorkerResult


class ConductorStrategy(StrategyBase):
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
        allowed = allowed_workers(session)
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
        return prompt + tools_prompt(session, constrained=self.constrained)

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

    def _checkallowed_workers(self, session: RunSession, plan: Plan) -> None:
        allowed = set(allowed_workers(session))
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
                    self._checkallowed_workers(session, plan)
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
        worker = default_worker(session)
        allowed = allowed_workers(session)
        if self.preset == "ultra" and len(allowed) > 1 and session.limits.max_steps >= 2:
            strongest = strongest_worker(session)
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
