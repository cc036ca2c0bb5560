"""Strategies end to end: the conductor and workers are real SDK clients talking to the fakes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from apps.engine.events import EventType, ListSink, RunStatus
from apps.engine.plan import CONDUCTOR_SELF
from apps.engine.pool import WorkerPool
from apps.engine.providers import build_worker
from apps.engine.providers.gate import gate_without_policy
from apps.engine.runner import RunResult, run_request
from apps.engine.strategies import (
    ConductorStrategy,
    MixtureOfAgentsStrategy,
    PlannerExecutorVerifierStrategy,
    SingleStrategy,
    Strategy,
    build_strategy,
)
from apps.engine.types import Limits, WorkerInfo
from tests.fakes.anthropic_server import FakeAnthropicServer
from tests.fakes.base import FakeReply
from tests.fakes.openai_server import FakeOpenAIServer, openai_error

QUESTION = "What is 17 * 23?"


def make_pool(
    server: FakeOpenAIServer, n: int = 2, *, structured: bool = False, conductor: Any = None
) -> WorkerPool:
    workers = [
        build_worker(
            WorkerInfo(
                key=f"w{i}",
                name=f"Worker {i}",
                model=f"worker-{i}",
                provider="openai_compatible",
                strengths=f"skill-{i}",
                cost_rank=i + 1,
                timeout_s=10,
            ),
            base_url=server.base_url,
            api_key="sk-test",
            max_retries=0,
            gate=gate_without_policy(),
        )
        for i in range(n)
    ]
    if conductor is None:
        conductor = build_worker(
            WorkerInfo("cond", "The Conductor", "conductor-model", "openai_compatible", timeout_s=10),
            base_url=server.base_url,
            api_key="sk-test",
            max_retries=0,
            structured_outputs=structured,
            gate=gate_without_policy(),
        )
    return WorkerPool(workers, default_index=0, conductor=conductor)


def router(plans: list[Any]) -> Callable[[dict[str, Any]], Any]:
    """Conductor calls get the next scripted plan; workers answer '<model> says: <instruction>'."""
    queue = list(plans)

    def respond(req: dict[str, Any]) -> Any:
        if req["model"] == "conductor-model":
            return queue.pop(0) if queue else "I have no plan."
        return f"{req['model']} says: {req['messages'][-1]['content']}"

    return respond


def go(
    server: FakeOpenAIServer, strategy: Strategy, pool: WorkerPool | None = None, **kw: Any
) -> tuple[RunResult, ListSink]:
    sink = ListSink()
    result = run_request(
        run_id="run-1", question=QUESTION, pool=pool or make_pool(server), strategy=strategy, sink=sink, **kw
    )
    seqs = [e.seq for e in sink.events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert sink.events[-1].type == EventType.RUN_FINISHED
    return result, sink


def conductor_requests(server: FakeOpenAIServer) -> list[Any]:
    return [r for r in server.chat_requests() if r.json["model"] == "conductor-model"]


def worker_requests(server: FakeOpenAIServer, model: str) -> list[Any]:
    return [r for r in server.chat_requests() if r.json["model"] == model]


# ----------------------------------------------------------------------------- conductor


def test_conductor_scripted_plan(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router(
        [
            "Thinking...\n```python\nmodel_id = [0, 1]\nsubtasks = ['Draft an answer', 'Refine it']\naccess_list = [[], [0]]\n```"
        ]
    )
    result, sink = go(openai_fake, ConductorStrategy())
    assert result.status == RunStatus.SUCCEEDED
    assert result.answer == "worker-1 says: Refine it"
    # The refining worker saw exactly: question, step 0's instruction and output, its instruction.
    assert worker_requests(openai_fake, "worker-1")[0].messages == [
        {"role": "user", "content": QUESTION},
        {"role": "user", "content": "Draft an answer"},
        {"role": "assistant", "content": "worker-0 says: Draft an answer"},
        {"role": "user", "content": "Refine it"},
    ]
    prompt = conductor_requests(openai_fake)[0].messages[0]["content"]
    assert "0: Worker 0 - skill-0 - cost 1" in prompt and "1: Worker 1 - skill-1 - cost 2" in prompt
    assert "2: yourself (the conductor)" in prompt and "at most 5 steps" in prompt
    assert conductor_requests(openai_fake)[0].messages[1] == {"role": "user", "content": QUESTION}
    proposed = sink.of_type(EventType.PLAN_PROPOSED)
    assert len(proposed) == 1 and proposed[0].data["source"] == "conductor"
    assert proposed[0].data["plan"]["steps"][1]["worker_key"] == "w1"
    assert proposed[0].data["usage"]["input_tokens"] > 0
    types = sink.types()
    # The planning call streams: its text arrives as plan.delta events before plan.proposed.
    deltas = [e for e in sink.events if e.type == "plan.delta"]
    assert deltas and "".join(e.data["text"] for e in deltas) == proposed[0].data["raw"]
    assert {(e.data["round"], e.data["attempt"]) for e in deltas} == {(1, 1)}
    assert [t for t in types if t != "plan.delta"][:5] == [
        "run.started",
        "guardrail.checked",
        "plan.started",
        "plan.proposed",
        "plan.validated",
    ]
    assert types.index("plan.started") < types.index("plan.delta") < types.index("plan.proposed")
    # Conductor tokens count toward the run totals.
    all_in = sum(
        json.loads(json.dumps(e.data["usage"]))["input_tokens"]
        for e in sink.events
        if e.type in (EventType.PLAN_PROPOSED, EventType.STEP_FINISHED)
    )
    assert result.totals.input_tokens == all_in
    assert sink.events[-1].data["totals"]["steps"] == 2


def test_conductor_structured_output_schema(openai_fake: FakeOpenAIServer) -> None:
    # Constrained output is one object per step, so list lengths cannot disagree.
    openai_fake.responder = router(
        [json.dumps({"steps": [{"worker": 1, "subtask": "Answer", "access": []}]})]
    )
    result, _ = go(openai_fake, ConductorStrategy(), make_pool(openai_fake, structured=True))
    assert result.status == RunStatus.SUCCEEDED and result.answer == "worker-1 says: Answer"
    fmt = conductor_requests(openai_fake)[0].json["response_format"]
    assert fmt["type"] == "json_schema"
    step = fmt["json_schema"]["schema"]["properties"]["steps"]["items"]
    assert step["properties"]["worker"]["enum"] == [0, 1, 2]
    assert step["required"] == ["worker", "subtask", "access"]


def test_conductor_repair_round(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router(
        [
            "model_id = [0, 7]\nsubtasks = ['a', 'b']\naccess_list = [[], [0]]",
            "model_id = [0, 1]\nsubtasks = ['a', 'b']\naccess_list = [[], [0]]",
        ]
    )
    result, sink = go(openai_fake, ConductorStrategy())
    assert result.status == RunStatus.SUCCEEDED
    proposed = [e.data for e in sink.of_type(EventType.PLAN_PROPOSED)]
    assert [(p["source"], p["attempt"], p["plan"] is None) for p in proposed] == [
        ("conductor", 1, True),
        ("repair", 2, False),
    ]
    assert "model_id[1]: unknown worker id 7" in proposed[0]["error"]
    repair_msgs = conductor_requests(openai_fake)[1].messages
    assert repair_msgs[-2]["role"] == "assistant" and "[0, 7]" in repair_msgs[-2]["content"]
    assert "model_id[1]: unknown worker id 7" in repair_msgs[-1]["content"]


def test_conductor_fallback_is_recorded(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router(["no idea", "still no idea"])
    result, sink = go(openai_fake, ConductorStrategy())
    assert result.status == RunStatus.SUCCEEDED
    assert result.answer == "worker-0 says: Answer the question."
    proposed = [e.data for e in sink.of_type(EventType.PLAN_PROPOSED)]
    assert [p["source"] for p in proposed] == ["conductor", "repair", "fallback"]
    assert "Fell back" in proposed[-1]["error"] and "no plan found" in proposed[-1]["error"]
    assert proposed[-1]["plan"]["steps"][0]["worker_key"] == "w0"
    assert len(conductor_requests(openai_fake)) == 2


def test_mini_and_ultra_fall_back_to_different_plans(openai_fake: FakeOpenAIServer) -> None:
    """A conductor that writes no plan (a tiny demo model) still leaves mini and ultra distinct:
    mini answers in one step on the default worker, ultra has the strongest worker answer and
    another check it (reading step 0)."""
    plans = {}
    for preset in ("mini", "ultra"):
        openai_fake.responder = router(["no idea", "still no idea"])
        result, sink = go(openai_fake, build_strategy(f"conductor-{preset}"))
        assert result.status == RunStatus.SUCCEEDED
        fallback = sink.of_type(EventType.PLAN_PROPOSED)[-1].data
        assert fallback["source"] == "fallback"
        plans[preset] = [(s["worker_key"], s["access"]) for s in fallback["plan"]["steps"]]
    assert plans["mini"] == [("w0", [])]
    assert plans["ultra"] == [("w1", []), ("w0", [0])]
    assert "answer-and-check" in fallback["error"]


def test_conductor_provider_outage_falls_back(openai_fake: FakeOpenAIServer) -> None:
    def respond(req: dict[str, Any]) -> Any:
        if req["model"] == "conductor-model":
            return openai_error("unavailable")
        return "worker answer"

    openai_fake.responder = respond
    result, sink = go(openai_fake, ConductorStrategy())
    assert result.status == RunStatus.SUCCEEDED and result.answer == "worker answer"
    proposed = [e.data for e in sink.of_type(EventType.PLAN_PROPOSED)]
    assert [p["source"] for p in proposed] == ["conductor", "fallback"]
    assert "503" in proposed[0]["error"]


def test_conductor_recursion_appends_a_round(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router(
        [
            "model_id = [0, 2]\nsubtasks = ['Draft', 'Review the draft']\naccess_list = [[], 'all']",
            "model_id = [1]\nsubtasks = ['Polish the draft']\naccess_list = [[0]]",
        ]
    )
    result, sink = go(openai_fake, ConductorStrategy())
    assert result.status == RunStatus.SUCCEEDED
    assert result.answer == "worker-1 says: Polish the draft"
    started = [
        (e.data["index"], e.data["round"], e.data["worker_key"]) for e in sink.of_type(EventType.STEP_STARTED)
    ]
    assert started == [(0, 1, "w0"), (1, 1, "cond"), (2, 2, "w1")]
    assert [s.step.index for s in result.steps] == [0, 1, 2]
    assert result.steps[1].step.worker == CONDUCTOR_SELF
    replan = conductor_requests(openai_fake)[1].messages
    assert "Step 0 (Worker 0): Draft\nOutput: worker-0 says: Draft" in replan[1]["content"]
    assert "numbered from 2" in replan[1]["content"]
    # The last round's schema-free prompt no longer offers the conductor itself (depth 2 reached).
    assert "yourself (the conductor)" not in replan[0]["content"]
    assert worker_requests(openai_fake, "worker-1")[0].messages[1:3] == [
        {"role": "user", "content": "Draft"},
        {"role": "assistant", "content": "worker-0 says: Draft"},
    ]
    rounds = [e.data["round"] for e in sink.of_type(EventType.PLAN_VALIDATED)]
    assert rounds == [1, 2]


def test_recursion_is_bounded_by_max_depth(openai_fake: FakeOpenAIServer) -> None:
    always_self = "model_id = [0, 2]\nsubtasks = ['Draft', 'Again']\naccess_list = [[], 'all']"
    openai_fake.responder = router([always_self] * 10)
    result, sink = go(openai_fake, ConductorStrategy(), limits=Limits(max_depth=2))
    assert result.status == RunStatus.SUCCEEDED
    proposed = [e.data for e in sink.of_type(EventType.PLAN_PROPOSED)]
    assert max(p["round"] for p in proposed) == 2
    round2 = [p for p in proposed if p["round"] == 2]
    assert [p["source"] for p in round2] == ["conductor", "repair", "fallback"]
    assert "recursion is off or the depth limit is reached" in round2[0]["error"]
    assert round2[-1]["plan"]["steps"][0]["access"] == "all"
    assert len(conductor_requests(openai_fake)) == 3


def test_mini_preset_limits(openai_fake: FakeOpenAIServer) -> None:
    four = "model_id = [0, 0, 0, 0]\nsubtasks = ['a', 'b', 'c', 'd']\naccess_list = [[], [], [], 'all']"
    openai_fake.responder = router([four, "model_id = [1]\nsubtasks = ['x']\naccess_list = [[]]"])
    result, sink = go(openai_fake, ConductorStrategy("mini"), make_pool(openai_fake, structured=True))
    assert result.status == RunStatus.SUCCEEDED
    started = sink.events[0].data
    assert (
        started["preset"] == "mini"
        and started["limits"]["max_steps"] == 3
        and started["limits"]["max_depth"] == 1
    )
    first = conductor_requests(openai_fake)[0]
    assert (
        "at most 3 steps" in first.messages[0]["content"]
        and "yourself (the conductor)" not in first.messages[0]["content"]
    )
    assert "cheapest" in first.messages[0]["content"]
    step_schema = first.json["response_format"]["json_schema"]["schema"]["properties"]["steps"]["items"]
    assert step_schema["properties"]["worker"]["enum"] == [0, 1]
    assert "4 steps; at most 3" in sink.of_type(EventType.PLAN_PROPOSED)[0].data["error"]


def test_ultra_preset(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router(["model_id = [1]\nsubtasks = ['x']\naccess_list = [[]]"])
    _result, sink = go(openai_fake, build_strategy("conductor-ultra"))
    assert sink.events[0].data["preset"] == "ultra" and sink.events[0].data["limits"]["max_depth"] == 2
    assert "strongest" in conductor_requests(openai_fake)[0].messages[0]["content"]


def test_conductor_respects_allowed_workers(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router(
        [
            "model_id = [0]\nsubtasks = ['x']\naccess_list = [[]]",
            "model_id = [1]\nsubtasks = ['x']\naccess_list = [[]]",
        ]
    )
    result, sink = go(openai_fake, ConductorStrategy(), limits=Limits(allowed_workers=("w1",)))
    assert result.status == RunStatus.SUCCEEDED and result.answer == "worker-1 says: x"
    assert "not allowed" in sink.of_type(EventType.PLAN_PROPOSED)[0].data["error"]
    assert "0: Worker 0" not in conductor_requests(openai_fake)[0].messages[0]["content"]


def test_anthropic_conductor_uses_a_forced_tool(
    openai_fake: FakeOpenAIServer, anthropic_fake: FakeAnthropicServer
) -> None:
    anthropic_fake.responder = lambda req: FakeReply(
        tool_input={"model_id": [1], "subtasks": ["Compute it"], "access_list": [[]]}
    )
    openai_fake.responder = router([])
    conductor = build_worker(
        WorkerInfo("claude", "Claude", "claude-haiku-4-5", "anthropic"),
        base_url=anthropic_fake.base_url,
        api_key="sk-ant-x",
        gate=gate_without_policy(),
    )
    result, _ = go(openai_fake, ConductorStrategy(), make_pool(openai_fake, conductor=conductor))
    assert result.answer == "worker-1 says: Compute it"
    req = anthropic_fake.message_requests()[0].json
    assert req["tool_choice"]["type"] == "tool"
    assert "conductor" in req["system"]


# ----------------------------------------------------------------------------- baselines


def test_single_strategy(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router([])
    result, sink = go(openai_fake, SingleStrategy("w1"))
    assert result.answer == "worker-1 says: Answer the question."
    assert sink.of_type(EventType.PLAN_PROPOSED)[0].data["source"] == "fixed"
    assert conductor_requests(openai_fake) == []
    with pytest.raises(ValueError):
        build_strategy("nonsense")


def test_moa_shape(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router([])
    result, sink = go(openai_fake, MixtureOfAgentsStrategy(), make_pool(openai_fake, 3))
    plan = sink.of_type(EventType.PLAN_PROPOSED)[0].data["plan"]["steps"]
    assert [s["access"] for s in plan] == [[], [], [], "all"]
    assert [s["worker_key"] for s in plan] == [
        "w0",
        "w1",
        "w2",
        "w2",
    ]  # aggregator: strongest (highest cost rank)
    agg = worker_requests(openai_fake, "worker-2")[-1].messages
    assert sum(1 for m in agg if m["role"] == "assistant") == 3
    assert result.status == RunStatus.SUCCEEDED
    # The proposers run concurrently: all three started before any finished.
    types = [
        (e.type, e.data.get("index"))
        for e in sink.events
        if e.type in (EventType.STEP_STARTED, EventType.STEP_FINISHED)
    ]
    assert types[:3] == [
        (EventType.STEP_STARTED, 0),
        (EventType.STEP_STARTED, 1),
        (EventType.STEP_STARTED, 2),
    ]


def test_pev_shape(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router([])
    result, sink = go(openai_fake, PlannerExecutorVerifierStrategy(), make_pool(openai_fake, 2))
    plan = sink.of_type(EventType.PLAN_PROPOSED)[0].data["plan"]["steps"]
    assert [s["access"] for s in plan] == [[], [0], [0, 1]]
    assert [s["worker_key"] for s in plan] == ["w1", "w0", "w1"]
    assert result.answer.startswith("worker-1 says: Check the answer")


def test_pev_blocked_when_max_steps_too_small(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = router([])
    result, _sink = go(openai_fake, PlannerExecutorVerifierStrategy(), limits=Limits(max_steps=2))
    assert result.status == RunStatus.BLOCKED and "at most 2" in (result.error or "")


# ----------------------------------------------------------------------------- partial answers


def _round_two_fails(openai_fake: FakeOpenAIServer) -> None:
    plans = router(
        [
            "model_id = [0, 2]\nsubtasks = ['Draft', 'Review the draft']\naccess_list = [[], 'all']",
            "model_id = [1]\nsubtasks = ['Polish the draft']\naccess_list = [[0]]",
        ]
    )

    def respond(req: dict[str, Any]) -> Any:
        if req["model"] == "worker-1":
            return openai_error("server_error")  # round 2's only step; no retries, no fallback
        return plans(req)

    openai_fake.responder = respond


def test_a_failed_round_two_step_ends_with_round_ones_answer_marked_incomplete(
    openai_fake: FakeOpenAIServer,
) -> None:
    _round_two_fails(openai_fake)
    result, sink = go(openai_fake, ConductorStrategy())
    assert result.status == RunStatus.SUCCEEDED and result.reason == "partial"
    assert result.answer == "worker-0 says: Draft"  # round 1's last worker step
    finished = sink.of_type(EventType.RUN_FINISHED)[0].data
    assert finished["finish_reason"] == "length" and finished["error"] is None
    assert finished["incomplete"]["reason"] == "step_failed" and finished["incomplete"]["answer_step"] == 0
    assert "Step 2" in finished["incomplete"]["detail"]
    # The output guardrails saw the partial answer like any answer.
    assert [e.data["stage"] for e in sink.of_type(EventType.GUARDRAIL_CHECKED)][-1:] in ([], ["output"])


def test_partial_answers_off_the_run_fails_as_before(openai_fake: FakeOpenAIServer) -> None:
    _round_two_fails(openai_fake)
    result, _ = go(openai_fake, ConductorStrategy(), limits=Limits(partial_answers=False))
    assert result.status == RunStatus.FAILED and result.reason == "step_failed"
    assert result.answer is None


def test_no_completed_round_no_partial_answer(openai_fake: FakeOpenAIServer) -> None:
    plans = router(["model_id = [0, 1]\nsubtasks = ['Draft', 'Refine']\naccess_list = [[], [0]]"])

    def respond(req: dict[str, Any]) -> Any:
        return openai_error("server_error") if req["model"] == "worker-1" else plans(req)

    openai_fake.responder = respond
    result, _ = go(openai_fake, ConductorStrategy())
    # Step 0's draft is not an answer: the plan's answer step never ran.
    assert result.status == RunStatus.FAILED and result.reason == "step_failed"


# ----------------------------------------------------------------------------- re-plan around failure


def test_the_conductor_re_plans_around_a_failed_step(openai_fake: FakeOpenAIServer) -> None:
    """Issue 44: a step that failed in a round ending with the conductor itself is a result the
    conductor sees and routes around, not the end of the run."""
    plans = router(
        [
            "model_id = [0, 2]\nsubtasks = ['Draft', 'Review the draft']\naccess_list = [[], 'all']",
            "model_id = [1]\nsubtasks = ['Draft it yourself']\naccess_list = [[]]",
        ]
    )

    def respond(req: dict[str, Any]) -> Any:
        return openai_error("server_error") if req["model"] == "worker-0" else plans(req)

    openai_fake.responder = respond
    result, _ = go(openai_fake, ConductorStrategy())
    assert result.status == RunStatus.SUCCEEDED and result.reason == "completed"
    assert result.answer == "worker-1 says: Draft it yourself"
    assert [(r.step.index, r.status.value) for r in result.steps] == [
        (0, "failed"),
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    replan = conductor_requests(openai_fake)[1].messages[1]["content"]
    assert "Step 0 (Worker 0): Draft\nFAILED (no output):" in replan


def test_moa_aggregates_the_proposals_it_has(openai_fake: FakeOpenAIServer) -> None:
    def respond(req: dict[str, Any]) -> Any:
        if req["model"] == "worker-0":
            return openai_error("server_error")
        return f"{req['model']} says: {req['messages'][-1]['content'][:20]}"

    openai_fake.responder = respond
    result, _ = go(openai_fake, MixtureOfAgentsStrategy(), make_pool(openai_fake, 3))
    assert result.status == RunStatus.SUCCEEDED
    assert [r.status.value for r in result.steps] == ["failed", "succeeded", "succeeded", "succeeded"]
    agg = worker_requests(openai_fake, "worker-2")[-1].messages
    assert sum(1 for m in agg if m["role"] == "assistant") == 2  # the two proposals it has
    assert not any("worker-0" in str(m["content"]) for m in agg)


def test_moa_with_every_proposal_failed_fails_naming_a_failed_proposal(openai_fake: FakeOpenAIServer) -> None:
    openai_fake.responder = lambda req: openai_error("server_error")
    result, _ = go(openai_fake, MixtureOfAgentsStrategy(), make_pool(openai_fake, 2))
    assert result.status == RunStatus.FAILED and result.reason == "step_failed"
    assert [r.status.value for r in result.steps] == ["failed", "failed", "skipped"]
    assert (result.error or "").startswith(("Step 0 ", "Step 1 "))  # the first to fail (parallel)
