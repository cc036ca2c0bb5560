"""The one place that assembles what a worker sees (context isolation, see the package docstring)."""

from __future__ import annotations

from apps.engine.events import StepStatus
from apps.engine.plan import PlanStep
from apps.engine.session import StepRecord
from apps.engine.types import Message


def build_messages(question: str, step: PlanStep, records: dict[int, StepRecord]) -> list[Message]:
    """The whole context a worker receives for `step` (see the package docstring)."""
    if step.messages is not None:  # a pool model's chat, passed through as it is (issue 22)
        return [dict(m) for m in step.messages]
    messages: list[Message] = [{"role": "user", "content": question}]
    for i in step.reads():
        rec = records.get(i)
        if rec is None or rec.status != StepStatus.SUCCEEDED or rec.step.is_self:
            continue  # the conductor's own re-plan step has no answer text for workers
        messages.append({"role": "user", "content": rec.step.instruction})
        messages.append({"role": "assistant", "content": rec.output or ""})
    messages.append({"role": "user", "content": step.instruction})
    return messages
