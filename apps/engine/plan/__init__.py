"""The plan model and the parser for what conductor models really emit.

A plan is three parallel lists (Conductor paper, arXiv 2512.04388):

    model_id    = [2, 0, 1]                       # which worker runs each step
    subtasks    = ["Draft ...", "Check ...", "Answer ..."]
    access_list = [[], [0], "all"]                # earlier outputs each step may read

Step `i` may read `[]`, a list of earlier step indices, or `"all"` (every earlier step).
The last step's output is the answer.

**The conductor itself.** In a `Plan` the constant `CONDUCTOR_SELF` (= -1) names the conductor:
that step re-plans with the results so far (recursive test-time scaling). In text the conductor
may write either -1 or `pool_size` — the prompt lists the conductor as the entry after the last
worker, which small models follow more reliably than a negative id. It may only be the *last*
step of a plan (it decides what happens next, so nothing can come after it in the same round).

**Global indices.** Re-plans append steps after the earlier rounds' steps. `parse_plan(...,
index_offset=n)` numbers the new steps n, n+1, ...; their access lists use the same global
numbers and may name any earlier step (0..n-1 from earlier rounds, or earlier steps of the same
plan). The re-plan prompt presents the results with these numbers.

Parsing never evaluates code: list literals go through `ast.literal_eval` and objects through
`json`; deep nesting, huge numbers and oversized input become `PlanError`, never anything else.
"""

from apps.engine.plan.model import (
    CONDUCTOR_SELF,
    MAX_INSTRUCTION_CHARS,
    MAX_PLAN_TEXT,
    MAX_STEP_TOOLS,
    Access,
    Plan,
    PlanError,
    PlanStep,
    build_plan,
    single_step_plan,
    validate_plan,
    with_tool_access,
)
from apps.engine.plan.parse import extract_plan_lists, extract_tool_access, parse_plan
from apps.engine.plan.render import plan_from_dict, plan_json_schema, plan_to_dict, plan_to_text

__all__ = [
    "CONDUCTOR_SELF",
    "MAX_INSTRUCTION_CHARS",
    "MAX_PLAN_TEXT",
    "MAX_STEP_TOOLS",
    "Access",
    "Plan",
    "PlanError",
    "PlanStep",
    "build_plan",
    "extract_plan_lists",
    "extract_tool_access",
    "parse_plan",
    "plan_from_dict",
    "plan_json_schema",
    "plan_to_dict",
    "plan_to_text",
    "single_step_plan",
    "validate_plan",
    "with_tool_access",
]
