"""The plan model: steps, the conductor's own id, and the rules every plan obeys.

`build_plan` validates three raw lists from any source (a conductor's text, a stored plan, a
governance repair); `validate_plan` re-checks a built Plan with the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

CONDUCTOR_SELF = -1
MAX_PLAN_TEXT = 64 * 1024  # characters; conductor replies are a few hundred
MAX_INSTRUCTION_CHARS = 8000
MAX_STEP_TOOLS = 20
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,50}\.[A-Za-z0-9_.-]{1,128}$")

Access = tuple[int, ...] | Literal["all"]


class PlanError(ValueError):
    """An invalid plan; the message says which list, which index and what was wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class PlanStep:
    index: int  # global index (unique across recursion rounds)
    worker: int  # pool index, or CONDUCTOR_SELF
    instruction: str
    access: Access
    # A chat to send as it is instead of the built context (a pool model's tool conversation).
    messages: tuple[dict[str, Any], ...] | None = None
    # The step's tool access list (issue 43): the tools (<server>.<tool>) its worker may call.
    # Empty: none. The policy may still narrow it; it can never widen it.
    tools: tuple[str, ...] = ()

    @property
    def is_self(self) -> bool:
        return self.worker == CONDUCTOR_SELF

    def reads(self) -> tuple[int, ...]:
        """The concrete earlier step indices this step may read."""
        if self.access == "all":
            return tuple(range(self.index))
        return self.access


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[PlanStep, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.steps, tuple):
            object.__setattr__(self, "steps", tuple(self.steps))

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[PlanStep]:
        return iter(self.steps)

    @property
    def last(self) -> PlanStep:
        return self.steps[-1]

    @property
    def first_index(self) -> int:
        return self.steps[0].index if self.steps else 0

    @property
    def recurses(self) -> bool:
        return bool(self.steps) and self.steps[-1].is_self


# ----------------------------------------------------------------------------- validation

# ----------------------------------------------------------------------------- validation


def _describe_ids(pool_size: int, allow_self: bool) -> str:
    ids = f"0..{pool_size - 1}" if pool_size > 1 else "0"
    if allow_self:
        return f"{ids}, or {pool_size} (or -1) for the conductor itself"
    return ids


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def build_plan(
    model_id: object,
    subtasks: object,
    access_list: object,
    *,
    pool_size: int,
    max_steps: int = 5,
    allow_self: bool = True,
    index_offset: int = 0,
) -> Plan:
    """Validate three raw lists (from any source) and build a `Plan`, or raise `PlanError`."""
    if pool_size < 1:
        raise PlanError("the worker pool is empty")
    lists = {"model_id": model_id, "subtasks": subtasks, "access_list": access_list}
    for name, value in lists.items():
        if not isinstance(value, list | tuple):
            raise PlanError(f"{name} must be a list, got {type(value).__name__}")
    assert isinstance(model_id, list | tuple)
    assert isinstance(subtasks, list | tuple)
    assert isinstance(access_list, list | tuple)
    lengths = (len(model_id), len(subtasks), len(access_list))
    if len(set(lengths)) != 1:
        raise PlanError(
            "model_id, subtasks and access_list must have the same length, got "
            f"{lengths[0]}, {lengths[1]} and {lengths[2]}"
        )
    n = lengths[0]
    if n == 0:
        raise PlanError("the plan has no steps: model_id, subtasks and access_list are empty")
    if n > max_steps:
        raise PlanError(f"the plan has {n} steps; at most {max_steps} are allowed")

    steps: list[PlanStep] = []
    for i in range(n):
        g = index_offset + i
        worker = model_id[i]
        if not is_int(worker):
            raise PlanError(f"model_id[{i}]: worker ids must be integers, got {worker!r}"[:300])
        assert isinstance(worker, int)
        if worker in (CONDUCTOR_SELF, pool_size):
            if not allow_self:
                raise PlanError(
                    f"model_id[{i}]: the conductor itself ({worker}) may not be used here "
                    "(recursion is off or the depth limit is reached)"
                )
            if i != n - 1:
                raise PlanError(f"model_id[{i}]: the conductor itself may only be the last step")
            worker = CONDUCTOR_SELF
        elif not 0 <= worker < pool_size:
            raise PlanError(
                f"model_id[{i}]: unknown worker id {worker} (valid ids: {_describe_ids(pool_size, allow_self)})"
            )

        instruction = subtasks[i]
        if not isinstance(instruction, str):
            raise PlanError(f"subtasks[{i}]: instructions must be strings, got {type(instruction).__name__}")
        instruction = _clean_text(instruction).strip()
        if not instruction:
            raise PlanError(f"subtasks[{i}]: the instruction is empty")
        if len(instruction) > MAX_INSTRUCTION_CHARS:
            raise PlanError(
                f"subtasks[{i}]: the instruction is longer than {MAX_INSTRUCTION_CHARS} characters"
            )

        steps.append(PlanStep(g, worker, instruction, _validate_access(access_list[i], i, g)))
    return Plan(tuple(steps))


def _validate_access(raw: object, i: int, g: int) -> Access:
    if isinstance(raw, str):
        if raw.strip().lower() == "all":
            return "all"
        raise PlanError(
            f'access_list[{i}]: expected [], a list of earlier step indices or "all", got {raw!r}'[:300]
        )
    if not isinstance(raw, list | tuple):
        raise PlanError(
            f'access_list[{i}]: expected [], a list of earlier step indices or "all", got {type(raw).__name__}'
        )
    seen: set[int] = set()
    for j, ref in enumerate(raw):
        if not is_int(ref):
            raise PlanError(f"access_list[{i}][{j}]: step indices must be integers, got {ref!r}"[:300])
        assert isinstance(ref, int)
        if ref == g:
            raise PlanError(f"access_list[{i}]: step {g} cannot read its own output")
        if ref > g:
            raise PlanError(f"access_list[{i}]: step {g} cannot read step {ref}, which runs later")
        if ref < 0:
            raise PlanError(f"access_list[{i}][{j}]: step indices cannot be negative, got {ref}")
        seen.add(ref)
    return tuple(sorted(seen))


def validate_plan(plan: Plan, *, pool_size: int, max_steps: int = 5, allow_self: bool = True) -> Plan:
    """Re-check a Plan built elsewhere (e.g. a governance repair) with the parser's rules."""
    if not plan.steps:
        raise PlanError("the plan has no steps")
    offset = plan.steps[0].index
    for i, step in enumerate(plan.steps):
        if step.index != offset + i:
            raise PlanError(f"step {i}: index {step.index} breaks the numbering (expected {offset + i})")
    return build_plan(
        [s.worker for s in plan.steps],
        [s.instruction for s in plan.steps],
        [s.access if s.access == "all" else list(s.access) for s in plan.steps],
        pool_size=pool_size,
        max_steps=max_steps,
        allow_self=allow_self,
        index_offset=offset,
    )


def _clean_text(text: str) -> str:
    # Lone surrogates cannot be stored or sent as UTF-8; make them U+FFFD instead of failing later.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def tool_entry(raw: object) -> tuple[str, ...]:
    """One step's tool access list from raw data: well-formed names only, deduplicated, capped
    (issue 43). Anything malformed grants nothing."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        return ()
    names = [n.strip() for n in raw if isinstance(n, str) and _TOOL_NAME.match(n.strip())]
    return tuple(dict.fromkeys(names))[:MAX_STEP_TOOLS]


def with_tool_access(plan: Plan, access: Sequence[Sequence[str]] | None) -> Plan:
    """The plan with each step's tool access list (by position; missing entries grant nothing)."""
    if not access:
        return plan
    steps = [
        replace(step, tools=tuple(access[i])) if i < len(access) and not step.is_self else step
        for i, step in enumerate(plan.steps)
    ]
    return Plan(tuple(steps))


def single_step_plan(worker: int, instruction: str, *, index_offset: int = 0, access: Access = ()) -> Plan:
    return Plan((PlanStep(index_offset, worker, instruction, access),))
