"""A plan's other forms: the JSON schema a conductor decodes into, the stored dict, the text."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from apps.engine.plan.model import CONDUCTOR_SELF, Access, Plan, PlanError, PlanStep, is_int, tool_entry


def plan_json_schema(
    pool_size: int,
    max_steps: int = 5,
    *,
    allow_self: bool = True,
    strict: bool = False,
    max_instruction_chars: int | None = None,
    shape: Literal["lists", "steps"] = "lists",
    tools: Sequence[str] = (),
) -> dict:
    """JSON schema for constrained decoding of a plan object: the three lists (``lists``), or
    ``{"steps": [{"worker", "subtask", "access"}]}`` (``steps``). `strict=True` keeps only the
    keywords OpenAI strict structured outputs accept (no minItems/maxItems/minLength).
    `max_instruction_chars` bounds each subtask string, so a grammar-constrained small model
    cannot ramble until max_tokens cuts the JSON off unterminated."""
    ids = list(range(pool_size)) + ([pool_size] if allow_self else [])
    ints: dict[str, Any] = {"type": "integer", "enum": ids}
    text: dict[str, Any] = {"type": "string"}
    index: dict[str, Any] = {"type": "integer"}
    if not strict:
        text["minLength"] = 1
        index["minimum"] = 0
        if max_instruction_chars is not None:
            text["maxLength"] = max_instruction_chars

    def arr(items: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": items}
        if not strict:
            out["minItems"] = 1
            out["maxItems"] = max_steps
        return out

    access_item = {"anyOf": [{"type": "string", "enum": ["all"]}, {"type": "array", "items": index}]}
    if shape == "steps":
        # One object per step: equal list lengths hold by construction, which three parallel
        # arrays cannot express in JSON schema (small grammar-constrained models get it wrong).
        step: dict[str, Any] = {
            "type": "object",
            "properties": {"worker": ints, "subtask": text, "access": access_item},
            "required": ["worker", "subtask", "access"],
            "additionalProperties": False,
        }
        if tools:
            # The step's tool access list (issue 43): only names the run may grant.
            step["properties"]["tools"] = {"type": "array", "items": {"type": "string", "enum": list(tools)}}
            if strict:
                step["required"].append("tools")  # strict structured outputs require every key
        return {
            "type": "object",
            "properties": {"steps": arr(step)},
            "required": ["steps"],
            "additionalProperties": False,
        }
    return {
        "type": "object",
        "properties": {
            "model_id": arr(ints),
            "subtasks": arr(text),
            "access_list": arr(access_item),
        },
        "required": ["model_id", "subtasks", "access_list"],
        "additionalProperties": False,
    }


def plan_to_dict(
    plan: Plan,
    worker_keys: Sequence[str] | None = None,
    *,
    conductor_key: str | None = None,
) -> dict[str, Any]:
    """JSON-safe form used in events and persistence; `worker_key` is filled when keys are given."""

    def key(worker: int) -> str | None:
        if worker == CONDUCTOR_SELF:
            return conductor_key
        if worker_keys is not None and 0 <= worker < len(worker_keys):
            return worker_keys[worker]
        return None

    return {
        "steps": [
            {
                "index": s.index,
                "worker": s.worker,
                "worker_key": key(s.worker),
                "instruction": s.instruction,
                "access": "all" if s.access == "all" else list(s.access),
                # Only when granted, so a plan without tools keeps its stored form (and digest).
                **({"tools": list(s.tools)} if s.tools else {}),
            }
            for s in plan.steps
        ]
    }


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    """Rebuild a Plan from `plan_to_dict` output; raises PlanError on malformed data."""
    steps_raw = data.get("steps") if isinstance(data, Mapping) else None
    if not isinstance(steps_raw, list) or not steps_raw:
        raise PlanError("plan data must have a non-empty 'steps' list")
    steps: list[PlanStep] = []
    for i, s in enumerate(steps_raw):
        if not isinstance(s, Mapping):
            raise PlanError(f"steps[{i}] must be an object")
        index, worker, instruction, access = (
            s.get("index"),
            s.get("worker"),
            s.get("instruction"),
            s.get("access"),
        )
        if not is_int(index) or not is_int(worker):
            raise PlanError(f"steps[{i}]: index and worker must be integers")
        if not isinstance(instruction, str) or not instruction.strip():
            raise PlanError(f"steps[{i}]: instruction must be a non-empty string")
        assert isinstance(index, int) and isinstance(worker, int)
        if access == "all":
            acc: Access = "all"
        elif isinstance(access, list) and all(is_int(a) and 0 <= a < index for a in access):
            acc = tuple(sorted(set(access)))
        else:
            raise PlanError(f"steps[{i}]: access must be 'all' or a list of earlier step indices")
        if i and index != steps[-1].index + 1:
            raise PlanError(f"steps[{i}]: indices must be consecutive")
        steps.append(PlanStep(index, worker, instruction, acc, tools=tool_entry(s.get("tools"))))
    return Plan(tuple(steps))


def plan_to_text(plan: Plan, *, pool_size: int | None = None) -> str:
    """The three-list text form (as the paper writes it); the conductor is written as
    `pool_size` when given, since that is how the prompt lists it."""
    self_id = pool_size if pool_size is not None else CONDUCTOR_SELF
    workers = [self_id if s.is_self else s.worker for s in plan.steps]
    access = ["all" if s.access == "all" else list(s.access) for s in plan.steps]
    text = (
        f"model_id = {workers!r}\n"
        f"subtasks = {json.dumps([s.instruction for s in plan.steps], ensure_ascii=False)}\n"
        f"access_list = {json.dumps(access)}"
    )
    if any(s.tools for s in plan.steps):
        text += f"\ntool_access = {json.dumps([list(s.tools) for s in plan.steps])}"
    return text
