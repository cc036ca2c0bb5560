"""Plan parser: the forms conductor models emit, precise errors, and property tests."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.engine.plan import (
    CONDUCTOR_SELF,
    MAX_PLAN_TEXT,
    Plan,
    PlanError,
    PlanStep,
    parse_plan,
    plan_from_dict,
    plan_json_schema,
    plan_to_dict,
    plan_to_text,
    validate_plan,
)

PAPER_STYLE = """
Let me think about which workers suit this question. Worker 2 is strong at maths.

```python
model_id = [2, 0, 1]
subtasks = ["Solve the equation step by step.", "Check the algebra in the solution.", "Write the final answer."]
access_list = [[], [0], "all"]
```
"""


def test_parses_python_lists_in_fence_with_prose() -> None:
    plan = parse_plan(PAPER_STYLE, pool_size=3)
    assert [s.worker for s in plan] == [2, 0, 1]
    assert plan.steps[1].access == (0,)
    assert plan.steps[2].access == "all"
    assert plan.steps[2].reads() == (0, 1)
    assert plan.steps[0].instruction.startswith("Solve")


def test_parses_json_object_and_aliases() -> None:
    text = (
        'Here is the plan: {"worker_ids": [0, 1], "instructions": ["a", "b"], "access_list": [[], [0]]} done.'
    )
    plan = parse_plan(text, pool_size=2)
    assert [s.worker for s in plan] == [0, 1]
    fenced = "```json\n" + json.dumps({"workers": [1], "subtasks": ["x"], "access_list": ["all"]}) + "\n```"
    assert parse_plan(fenced, pool_size=2).steps[0].access == "all"


def test_parses_steps_objects_and_nested_plan() -> None:
    text = json.dumps(
        {
            "plan": {
                "steps": [{"worker": 0, "instruction": "a"}, {"worker": 1, "instruction": "b", "access": [0]}]
            }
        }
    )
    plan = parse_plan(text, pool_size=2)
    assert [s.access for s in plan] == [(), (0,)]


def test_takes_last_complete_plan() -> None:
    text = (
        "Draft:\nmodel_id = [0]\nsubtasks = ['draft']\naccess_list = [[]]\n"
        "Better:\nmodel_id = [1, 0]\nsubtasks = ['final a', 'final b']\naccess_list = [[], [0]]\n"
    )
    plan = parse_plan(text, pool_size=2)
    assert [s.instruction for s in plan] == ["final a", "final b"]


def test_json_then_python_takes_the_later() -> None:
    text = '{"model_id": [0], "subtasks": ["json"], "access_list": [[]]}\nmodel_id = [1]\nsubtasks = ["py"]\naccess_list = [[]]'
    assert parse_plan(text, pool_size=2).steps[0].instruction == "py"


def test_tolerates_json_literals_inside_python_assignment_and_raw_newlines() -> None:
    text = 'model_id = [0]\nsubtasks = ["line one\nline two"]\naccess_list = [[]]'
    assert parse_plan(text, pool_size=1).steps[0].instruction == "line one\nline two"


def test_conductor_self_by_pool_size_or_minus_one() -> None:
    for self_id in (3, -1):
        plan = parse_plan(
            f"model_id = [0, {self_id}]\nsubtasks = ['a', 'review']\naccess_list = [[], 'all']", pool_size=3
        )
        assert plan.steps[-1].worker == CONDUCTOR_SELF
        assert plan.recurses


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("model_id = [0, 1]\nsubtasks = ['a']\naccess_list = [[], []]", "same length, got 2, 1 and 2"),
        (
            "model_id = [0]\nsubtasks = ['a']\naccess_list = [[0]]",
            "access_list[0]: step 0 cannot read its own output",
        ),
        (
            "model_id = [0, 0]\nsubtasks = ['a', 'b']\naccess_list = [[1], []]",
            "access_list[0]: step 0 cannot read step 1, which runs later",
        ),
        ("model_id = [7]\nsubtasks = ['a']\naccess_list = [[]]", "model_id[0]: unknown worker id 7"),
        (
            "model_id = [0, 1]\nsubtasks = ['a', '  ']\naccess_list = [[], []]",
            "subtasks[1]: the instruction is empty",
        ),
        (
            "model_id = [True]\nsubtasks = ['a']\naccess_list = [[]]",
            "model_id[0]: worker ids must be integers",
        ),
        (
            "model_id = [0, 0]\nsubtasks = ['a', 'b']\naccess_list = [[], [False]]",
            "access_list[1][0]: step indices must be integers",
        ),
        (
            "model_id = [1.0]\nsubtasks = ['a']\naccess_list = [[]]",
            "model_id[0]: worker ids must be integers",
        ),
        ("model_id = [0]\nsubtasks = [3]\naccess_list = [[]]", "subtasks[0]: instructions must be strings"),
        (
            "model_id = [0]\nsubtasks = ['a']\naccess_list = ['some']",
            'access_list[0]: expected [], a list of earlier step indices or "all"',
        ),
        (
            "model_id = [0, 0]\nsubtasks = ['a', 'b']\naccess_list = [[], [-1]]",
            "access_list[1][0]: step indices cannot be negative",
        ),
        (
            "model_id = [2, 0]\nsubtasks = ['a', 'b']\naccess_list = [[], []]",
            "model_id[0]: the conductor itself may only be the last step",
        ),
        ("model_id = []\nsubtasks = []\naccess_list = []", "the plan has no steps"),
        ("model_id = [0]\nsubtasks = ['a']", "missing access_list"),
        ("The answer is 42.", "no plan found"),
        ("model_id = [0]\nsubtasks = ['a']\naccess_list = [[]", "access_list is unterminated"),
        ("model_id = [0]\nsubtasks = [x]\naccess_list = [[]]", "subtasks is not a plain list literal"),
        ("model_id = __import__('os').system('x')\nsubtasks=['a']\naccess_list=[[]]", "missing model_id"),
    ],
)
def test_precise_errors(text: str, fragment: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_plan(text, pool_size=2)
    assert fragment in str(info.value)


def test_too_many_steps_and_size_bound() -> None:
    six = "model_id = [0,0,0,0,0,0]\nsubtasks = ['a','b','c','d','e','f']\naccess_list = [[],[],[],[],[],[]]"
    with pytest.raises(PlanError, match="6 steps; at most 5"):
        parse_plan(six, pool_size=1)
    assert len(parse_plan(six, pool_size=1, max_steps=6)) == 6
    with pytest.raises(PlanError, match="the limit is"):
        parse_plan("x" * (MAX_PLAN_TEXT + 1), pool_size=1)


def test_self_rejected_when_recursion_off() -> None:
    with pytest.raises(PlanError, match="recursion is off"):
        parse_plan(
            "model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], 'all']",
            pool_size=1,
            allow_self=False,
        )


def test_index_offset_for_later_rounds() -> None:
    plan = parse_plan(
        "model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[1], [3, 4]]", pool_size=2, index_offset=4
    )
    assert [s.index for s in plan] == [4, 5]
    assert plan.steps[0].access == (1,)
    assert plan.steps[1].reads() == (3, 4)
    with pytest.raises(PlanError, match="step 4 cannot read step 5"):
        parse_plan("model_id = [0]\nsubtasks = ['a']\naccess_list = [[5]]", pool_size=2, index_offset=4)


def test_never_evaluates_code(tmp_path: object) -> None:
    evil = "model_id = [0]\nsubtasks = [open('/etc/passwd').read()]\naccess_list = [[]]"
    with pytest.raises(PlanError):
        parse_plan(evil, pool_size=1)


def test_deep_nesting_is_a_plan_error() -> None:
    deep = "model_id = " + "[" * 5000 + "]" * 5000 + "\nsubtasks = ['a']\naccess_list = [[]]"
    with pytest.raises(PlanError):
        parse_plan(deep, pool_size=1)
    deep_json = '{"model_id": ' + "[" * 5000 + "]" * 5000 + "}"
    with pytest.raises(PlanError):
        parse_plan(deep_json, pool_size=1)


def test_dict_roundtrip_and_text_roundtrip() -> None:
    plan = parse_plan(PAPER_STYLE, pool_size=3)
    d = plan_to_dict(plan, ["a", "b", "c"])
    assert d["steps"][0]["worker_key"] == "c"
    assert json.loads(json.dumps(d)) == d
    assert plan_from_dict(d) == plan
    assert parse_plan(plan_to_text(plan, pool_size=3), pool_size=3) == plan
    with pytest.raises(PlanError):
        plan_from_dict({"steps": [{"index": 0, "worker": 0, "instruction": "x", "access": [0]}]})


def test_json_schema_shape() -> None:
    schema = plan_json_schema(3, 4)
    assert schema["properties"]["model_id"]["items"]["enum"] == [0, 1, 2, 3]
    assert schema["properties"]["model_id"]["maxItems"] == 4
    assert plan_json_schema(3, 4, allow_self=False)["properties"]["model_id"]["items"]["enum"] == [0, 1, 2]
    assert (
        plan_json_schema(2, 3, max_instruction_chars=99)["properties"]["subtasks"]["items"]["maxLength"] == 99
    )
    strict = plan_json_schema(2, 3, strict=True)
    assert "maxItems" not in json.dumps(strict) and "minLength" not in json.dumps(strict)


def test_validate_plan_checks_numbering() -> None:
    bad = Plan((PlanStep(0, 0, "a", ()), PlanStep(2, 0, "b", ())))
    with pytest.raises(PlanError, match="breaks the numbering"):
        validate_plan(bad, pool_size=1)


# ----------------------------------------------------------------------------- properties

POOL = 4


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[object], list[object], list[object]]:
    n = draw(st.integers(1, 5))
    workers = [draw(st.integers(0, POOL - 1)) for _ in range(n)]
    if draw(st.booleans()):
        workers[-1] = POOL  # the conductor itself, last
    instructions = [draw(st.text(min_size=1, max_size=40).filter(lambda s: s.strip())) for _ in range(n)]
    access: list[object] = []
    for i in range(n):
        if i and draw(st.booleans()):
            access.append("all")
        else:
            access.append(sorted(draw(st.sets(st.integers(0, i - 1), max_size=i))) if i else [])
    return workers, instructions, access


def render(lists: tuple[list[object], list[object], list[object]], style: int) -> str:
    w, i, a = lists
    if style == 0:
        return f"model_id = {w!r}\nsubtasks = {i!r}\naccess_list = {a!r}"
    if style == 1:
        return json.dumps({"model_id": w, "subtasks": i, "access_list": a})
    if style == 2:
        return f"Reasoning first.\n```python\nmodel_id = {w!r}\nsubtasks = {json.dumps(i)}\naccess_list = {json.dumps(a)}\n```\nDone."
    return (
        "```json\n" + json.dumps({"worker_ids": w, "instructions": i, "access_list": a}, indent=2) + "\n```"
    )


def check_valid(plan: Plan, max_steps: int = 5) -> None:
    assert 1 <= len(plan) <= max_steps
    for pos, step in enumerate(plan):
        assert step.index == pos
        assert step.worker == CONDUCTOR_SELF or 0 <= step.worker < POOL
        assert step.instruction.strip()
        assert all(0 <= r < step.index for r in step.reads())
        if step.is_self:
            assert pos == len(plan) - 1


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(plans(), st.integers(0, 3))
def test_generated_plans_roundtrip(
    lists: tuple[list[object], list[object], list[object]], style: int
) -> None:
    plan = parse_plan(render(lists, style), pool_size=POOL)
    check_valid(plan)
    assert [CONDUCTOR_SELF if w == POOL else w for w in lists[0]] == [s.worker for s in plan]
    assert [str(x).strip() for x in lists[1]] == [s.instruction for s in plan]


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(plans(), st.integers(0, 3), st.data())
def test_mutated_plans_parse_or_plan_error(
    lists: tuple[list[object], list[object], list[object]], style: int, data: st.DataObject
) -> None:
    text = render(lists, style)
    ops = data.draw(
        st.lists(
            st.tuples(st.integers(0, 2), st.integers(0, max(0, len(text))), st.text(max_size=4)), max_size=4
        )
    )
    for op, pos, s in ops:
        if op == 0:
            text = text[:pos] + text[pos + 1 :]
        elif op == 1:
            text = text[:pos] + s + text[pos:]
        else:
            text = text[:pos] + s + text[pos + len(s) :]
    try:
        plan = parse_plan(text, pool_size=POOL, max_steps=5)
    except PlanError as err:
        assert str(err)
        return
    check_valid(plan)


@settings(max_examples=300)
@given(st.text(max_size=300))
def test_arbitrary_text_parse_or_plan_error(text: str) -> None:
    try:
        plan = parse_plan(text, pool_size=POOL)
    except PlanError:
        return
    check_valid(plan)


@settings(max_examples=200)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
        ),
        max_leaves=20,
    ),
    st.sampled_from(["model_id", "subtasks", "access_list", "workers"]),
)
def test_wrong_types_are_plan_errors(value: object, which: str) -> None:
    base: dict[str, object] = {"model_id": [0], "subtasks": ["a"], "access_list": [[]]}
    base[which] = value
    try:
        text = json.dumps(base)
    except (ValueError, TypeError):
        return
    try:
        plan = parse_plan(text, pool_size=POOL)
    except PlanError:
        return
    check_valid(plan)
