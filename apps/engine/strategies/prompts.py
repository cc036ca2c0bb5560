"""What the conductor is told: its presets, the prompts, and the tool catalogue (issue 43)."""

from __future__ import annotations

from dataclasses import dataclass

from apps.engine.session import RunSession


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


def tools_prompt(session: RunSession, *, constrained: bool) -> str:
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
