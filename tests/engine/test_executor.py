"""Executor and runner behaviour with in-process workers (providers are tested over sockets)."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

from apps.engine.events import EventType, ListSink, RunStatus, StepStatus
from apps.engine.executor import execute_round
from apps.engine.hooks import (
    CheckResult,
    GuardrailOutcome,
    NoGovernance,
    PlanValidation,
    RunContext,
    StepGate,
    Violation,
)
from apps.engine.plan import Plan, PlanStep
from apps.engine.pool import WorkerPool
from apps.engine.providers.base import ProviderUnavailable
from apps.engine.runner import RunResult, run_request
from apps.engine.session import CancelToken, RunSession
from apps.engine.types import Limits, Message, Totals, WorkerInfo

from .workers import HOLD_LIMIT_S, FnWorker


class PlanStrategy:
    """Executes a given plan (the executor under test, without a planner)."""

    name = "test"
    preset = None

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def narrow_limits(self, limits: Limits) -> Limits:
        return limits

    def run(self, session: RunSession) -> str:
        session.propose(round=1, attempt=1, source="fixed", plan=self.plan)
        execute_round(session, self.plan, round=1)
        return session.answer()


def steps(*spec: tuple[int, str, object]) -> Plan:
    return Plan(
        tuple(
            PlanStep(i, w, instr, acc if acc == "all" else tuple(acc))
            for i, (w, instr, acc) in enumerate(spec)
        )
    )  # type: ignore[arg-type]


def run(plan: Plan, workers: list[FnWorker], **kw: object) -> tuple[RunResult, ListSink]:
    sink = ListSink()
    result = run_request(
        run_id="r1",
        question=str(kw.pop("question", "What is the question?")),
        pool=WorkerPool(workers, default_index=0),  # type: ignore[arg-type]
        strategy=PlanStrategy(plan),
        sink=sink,
        **kw,  # type: ignore[arg-type]
    )
    return result, sink


def finished(sink: ListSink) -> dict[int, dict]:
    return {e.data["index"]: e.data for e in sink.of_type(EventType.STEP_FINISHED)}


def assert_protocol(sink: ListSink) -> None:
    seqs = [e.seq for e in sink.events]
    assert seqs == list(range(1, len(seqs) + 1)), "seq must increase by one with no gaps"
    assert sink.events[0].type == EventType.RUN_STARTED
    assert sink.events[-1].type == EventType.RUN_FINISHED
    assert len(sink.of_type(EventType.RUN_FINISHED)) == 1
    for e in sink.events:
        json.dumps(e.to_dict())  # everything the websocket gets must be JSON


# ----------------------------------------------------------------------------- context isolation


def test_worker_sees_only_its_access_list() -> None:
    def echo(tag: str):
        return lambda messages: f"OUTPUT-{tag}"

    ws = [FnWorker(f"w{i}", echo(str(i))) for i in range(4)]
    plan = steps(
        (0, "instr-0", []),
        (1, "instr-1", []),
        (2, "instr-2", [0]),
        (3, "instr-3", [1]),
    )
    result, sink = run(plan, ws, question="THE-QUESTION")
    assert result.status == RunStatus.SUCCEEDED
    assert result.answer == "OUTPUT-3"
    expected: list[Message] = [
        {"role": "user", "content": "THE-QUESTION"},
        {"role": "user", "content": "instr-1"},
        {"role": "assistant", "content": "OUTPUT-1"},
        {"role": "user", "content": "instr-3"},
    ]
    assert ws[3].calls == [expected]
    blob = json.dumps(ws[3].calls)
    for foreign in ("OUTPUT-0", "OUTPUT-2", "instr-0", "instr-2"):
        assert foreign not in blob
    assert ws[0].calls == [
        [{"role": "user", "content": "THE-QUESTION"}, {"role": "user", "content": "instr-0"}]
    ]
    started = {e.data["index"]: e.data for e in sink.of_type(EventType.STEP_STARTED)}
    assert started[3]["messages"] == expected
    assert started[3]["access"] == [1]
    assert_protocol(sink)


def test_access_all_reads_every_earlier_step_in_order() -> None:
    ws = [FnWorker("a", lambda m: "A"), FnWorker("b", lambda m: "B"), FnWorker("c", lambda m: "C")]
    result, _ = run(steps((0, "x", []), (1, "y", []), (2, "z", "all")), ws)
    assert [m["content"] for m in ws[2].calls[0]] == ["What is the question?", "x", "A", "y", "B", "z"]
    assert result.answer == "C"


# ----------------------------------------------------------------------------- scheduling


def test_dependent_step_starts_before_unrelated_slow_step_finishes() -> None:
    fast = FnWorker("fast", "F")
    slow = FnWorker("slow", "S", held=True)

    def read(messages: list[Message]) -> str:
        # Only the reader lets the slow step end: if step 2 waited for step 1, it never would
        # (until the hold's safety limit, and then the order below fails).
        assert not slow.ends, "step 2 ran after the unrelated slow step ended"
        slow.released.set()
        return "R"

    reader = FnWorker("reader", read)
    final = FnWorker("final", "done")
    plan = steps((0, "fast", []), (1, "slow", []), (2, "reads fast", [0]), (3, "final", "all"))
    result, _ = run(plan, [fast, slow, reader, final])
    assert result.status == RunStatus.SUCCEEDED
    assert reader.starts[0] < slow.ends[0], "step 2 waits only for step 0"
    assert final.starts[0] >= slow.ends[0], "step 3 reads all, so it waits for the slow step"


def test_parallelism_is_bounded() -> None:
    # Calls meet in pairs: two run at once or none finishes (the barrier breaks and the steps fail).
    pair = threading.Barrier(2, timeout=HOLD_LIMIT_S)
    ws = [FnWorker(f"w{i}", lambda m: (pair.wait(), "x")[1]) for i in range(4)]
    plan = steps(*[(i, f"s{i}", []) for i in range(4)])
    active = 0
    peak = 0
    lock = threading.Lock()
    for w in ws:
        original = w.complete

        def wrapped(messages, _orig=original, **kw):  # type: ignore[no-untyped-def]
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
            try:
                return _orig(messages, **kw)
            finally:
                with lock:
                    active -= 1

        w.complete = wrapped  # type: ignore[method-assign]
    result, _ = run(plan, ws, limits=Limits(max_parallel=2))
    assert result.status == RunStatus.SUCCEEDED
    assert peak == 2


# ----------------------------------------------------------------------------- failures


def test_failed_step_skips_dependants_and_fails_run() -> None:
    bad = FnWorker("bad", fail=ProviderUnavailable("The test provider is unavailable (HTTP 503)."))
    ok = FnWorker("ok", "fine")
    plan = steps((0, "fails", []), (1, "needs 0", [0]), (1, "needs 1", [1]))
    result, sink = run(plan, [bad, ok])
    assert result.status == RunStatus.FAILED
    assert result.reason == "step_failed"
    assert "unavailable" in (result.error or "")
    fin = finished(sink)
    assert fin[0]["status"] == "failed"
    assert fin[1]["status"] == "skipped" and fin[2]["status"] == "skipped"
    assert ok.calls == []
    assert sink.events[-1].data["status"] == "failed"
    assert_protocol(sink)


def test_fallback_worker_takes_over_and_is_recorded() -> None:
    primary = FnWorker("primary", fail=ProviderUnavailable("down"), fallback_key="backup")
    backup = FnWorker("backup", "from backup")
    result, sink = run(steps((0, "do it", [])), [primary, backup])
    assert result.status == RunStatus.SUCCEEDED
    assert result.answer == "from backup"
    fin = finished(sink)[0]
    assert fin["worker_key"] == "backup" and fin["fallback_from"] == "primary"
    assert backup.calls == primary.calls  # same context on the fallback worker


def test_fallback_failure_fails_the_step_once() -> None:
    a = FnWorker("a", fail=ProviderUnavailable("a down"), fallback_key="b")
    b = FnWorker("b", fail=ProviderUnavailable("b down"), fallback_key="a")
    result, sink = run(steps((0, "x", [])), [a, b])
    assert result.status == RunStatus.FAILED
    assert len(a.calls) == 1 and len(b.calls) == 1  # no ping-pong between fallbacks
    assert finished(sink)[0]["fallback_from"] == "a"


def test_step_timeout_marks_step_timed_out() -> None:
    slow = FnWorker("slow", "late", held=True)  # ignores the timeout it is given
    result, sink = run(steps((0, "x", []), (0, "y", [0])), [slow], limits=Limits(step_timeout_s=0.2))
    # The run ended while the call was still held: the executor abandoned it at the timeout.
    assert slow.ends == []
    slow.release()
    assert result.status == RunStatus.FAILED
    assert result.reason == "step_timed_out"
    fin = finished(sink)
    assert fin[0]["status"] == "timed_out" and fin[0]["priced"] is False
    assert fin[1]["status"] == "skipped"
    assert result.totals.priced is False  # an abandoned call may have been billed
    assert_protocol(sink)


def test_provider_reported_timeout_is_timed_out() -> None:
    slow = FnWorker("slow", "late", held=True, honour_timeout=True)
    result, sink = run(steps((0, "x", [])), [slow], limits=Limits(step_timeout_s=0.2))
    slow.release()
    assert finished(sink)[0]["status"] == "timed_out"
    assert result.status == RunStatus.FAILED


def test_run_deadline() -> None:
    slow = FnWorker("slow", "late", held=True)
    result, sink = run(steps((0, "x", []), (0, "y", [0])), [slow], limits=Limits(run_timeout_s=0.3))
    assert slow.ends == []  # ended at the deadline, not when the held call would have
    slow.release()
    assert result.status == RunStatus.TIMED_OUT
    assert result.reason == "run_timeout"
    fin = finished(sink)
    assert fin[0]["status"] == "timed_out" and fin[1]["status"] == "skipped"
    assert_protocol(sink)


def test_late_result_of_abandoned_step_emits_nothing() -> None:
    slow = FnWorker("slow", "late", held=True, pieces=["a", "b"])
    result, sink = run(steps((0, "x", [])), [slow], limits=Limits(step_timeout_s=0.1))
    n = len(sink.events)
    slow.release()  # the late result and deltas arrive now, after run.finished; the call's thread ends
    assert len(sink.events) == n, "an abandoned call must not emit after run.finished"
    assert result.status == RunStatus.FAILED


def test_unexpected_worker_exception_is_a_plain_failure() -> None:
    boom = FnWorker("boom", lambda m: (_ for _ in ()).throw(RuntimeError("secret internals")))
    result, sink = run(steps((0, "x", [])), [boom])
    assert result.status == RunStatus.FAILED
    err = finished(sink)[0]["error"]
    assert "RuntimeError" in err and "secret internals" not in err


# ----------------------------------------------------------------------------- cancellation


def test_cancel_at_step_boundary() -> None:
    token = CancelToken()

    def first(messages: list[Message]) -> str:
        token.cancel()
        return "one"

    ws = [FnWorker("a", first), FnWorker("b", "two")]
    result, sink = run(steps((0, "x", []), (1, "y", [0])), ws, cancel=token)
    assert result.status == RunStatus.CANCELLED
    assert ws[1].calls == []
    assert finished(sink)[1]["status"] == "skipped"
    assert_protocol(sink)


def test_cancel_while_step_runs() -> None:
    token = CancelToken()
    slow = FnWorker("slow", "late", held=True)
    # Cancelled once the step is running (the worker holds it), not after a guessed delay.
    threading.Thread(target=lambda: slow.started.wait(10) and token.cancel(), daemon=True).start()
    result, sink = run(steps((0, "x", [])), [slow], cancel=token, limits=Limits(cancel_poll_s=0.05))
    assert slow.ends == []  # cancelled while the call was still held, not after it returned
    slow.release()
    assert result.status == RunStatus.CANCELLED
    assert sink.events[-1].data["status"] == "cancelled"


def test_cancelled_before_start() -> None:
    token = CancelToken()
    token.cancel()
    w = FnWorker("a")
    result, sink = run(steps((0, "x", [])), [w], cancel=token)
    assert result.status == RunStatus.CANCELLED and w.calls == []
    assert_protocol(sink)


class FlakyToken(CancelToken):
    def is_cancelled(self) -> bool:
        raise RuntimeError("db down")


def test_failing_cancel_token_does_not_kill_run() -> None:
    result, _ = run(steps((0, "x", [])), [FnWorker("a", "ok")], cancel=FlakyToken())
    assert result.status == RunStatus.SUCCEEDED


# ----------------------------------------------------------------------------- events & totals


def test_seq_monotonic_with_parallel_steps_and_deltas() -> None:
    ws = [FnWorker(f"w{i}", "abc", delay=0.01 * i, pieces=["a", "b", "c"]) for i in range(4)]
    plan = steps((0, "a", []), (1, "b", []), (2, "c", []), (3, "d", "all"))
    result, sink = run(plan, ws)
    assert result.status == RunStatus.SUCCEEDED
    assert_protocol(sink)
    assert len(sink.of_type(EventType.STEP_DELTA)) == 12
    types = sink.types()
    assert types[:2] == ["run.started", "guardrail.checked"]
    assert types[-2:] == ["guardrail.checked", "run.finished"]
    for i in range(4):  # per step: started → deltas → finished
        idx = [
            n
            for n, e in enumerate(sink.events)
            if e.data.get("index") == i and e.type != EventType.PLAN_PROPOSED
        ]
        kinds = [sink.events[n].type for n in idx]
        assert kinds[0] == EventType.STEP_STARTED and kinds[-1] == EventType.STEP_FINISHED


def test_totals_and_step_measurements() -> None:
    a = FnWorker("a", "x", usage=(100, 20), cost=Decimal("0.002"))
    b = FnWorker("b", "y", usage=(50, 10), cost=None)  # unpriced paid model
    result, sink = run(steps((0, "x", []), (1, "y", [0])), [a, b])
    fin = finished(sink)
    assert fin[0]["usage"] == {"input_tokens": 100, "output_tokens": 20}
    assert fin[0]["cost_usd"] == "0.002" and fin[0]["priced"] is True
    assert fin[1]["cost_usd"] is None and fin[1]["priced"] is False
    assert all(f["latency_ms"] >= 0 for f in fin.values())
    totals = sink.events[-1].data["totals"]
    assert totals["input_tokens"] == 150 and totals["output_tokens"] == 30
    assert totals["priced"] is False and totals["cost_usd"] == "0.002"  # a lower bound, flagged
    assert totals["steps"] == 2
    assert result.totals.total_tokens == 180


def test_no_governance_reports_not_run() -> None:
    _, sink = run(steps((0, "x", [])), [FnWorker("a")])
    checks = sink.of_type(EventType.GUARDRAIL_CHECKED)
    assert [c.data["stage"] for c in checks] == ["input", "output"]
    for c in checks:
        assert {ch["status"] for ch in c.data["checks"]} == {"not_run"}
    assert "passed" not in json.dumps([c.to_dict() for c in checks])


# ----------------------------------------------------------------------------- governance hooks


class Hooks(NoGovernance):
    def __init__(self, **kw: object) -> None:
        self.kw = kw
        self.gates: list[tuple[int, str]] = []

    def check_input(self, ctx: RunContext, text: str) -> GuardrailOutcome:
        if self.kw.get("block_input"):
            return GuardrailOutcome(
                [CheckResult("pii", "input", "failed", "block", "PII found")], text, True, "PII found"
            )
        return GuardrailOutcome(
            [CheckResult("pii", "input", "passed")], text.replace("alice@example.com", "[email]")
        )

    def validate_plan(self, ctx: RunContext, plan: Plan, pool: WorkerPool) -> PlanValidation:
        mode = self.kw.get("plan")
        if mode == "block":
            return PlanValidation(
                "blocked", [Violation("too_many_steps", "at most 1 step", None)], None, "at most 1 step"
            )
        if mode == "repair":
            repaired = Plan((PlanStep(0, 1, "repaired step", ()),))
            return PlanValidation(
                "repaired", [Violation("worker_not_allowed", "worker a not allowed", 0)], repaired
            )
        return PlanValidation("accepted", [], plan)

    def before_step(
        self, ctx: RunContext, step: PlanStep, worker_info: WorkerInfo, totals: Totals
    ) -> StepGate:
        self.gates.append((step.index, worker_info.key))
        if self.kw.get("block_step") == step.index:
            return StepGate.block("the team's cost budget ($1.00) is spent", "max_cost_usd")
        return StepGate.allow()

    def check_step_output(self, ctx: RunContext, step: PlanStep, text: str) -> GuardrailOutcome:
        redacted = text.replace("SECRET", "[redacted]")
        status = "intervened" if redacted != text else "passed"
        return GuardrailOutcome(
            [CheckResult("secrets", "step_output", status)],
            redacted,
            flags=["warn"] if redacted != text else [],
        )

    def check_output(self, ctx: RunContext, answer: str) -> GuardrailOutcome:
        if self.kw.get("block_output"):
            return GuardrailOutcome(
                [CheckResult("toxicity", "output", "failed", "block")], answer, True, "toxic"
            )
        return GuardrailOutcome([CheckResult("toxicity", "output", "passed")], answer)


def test_input_guardrail_redacts_what_workers_see_and_can_block() -> None:
    w = FnWorker("a", "ok")
    result, _ = run(steps((0, "x", [])), [w], hooks=Hooks(), question="mail alice@example.com")
    assert w.calls[0][0]["content"] == "mail [email]"
    assert result.status == RunStatus.SUCCEEDED
    w2 = FnWorker("a", "ok")
    result, sink = run(steps((0, "x", [])), [w2], hooks=Hooks(block_input=True))
    assert result.status == RunStatus.BLOCKED and result.reason == "input_blocked"
    assert w2.calls == []
    assert_protocol(sink)


def test_plan_validation_repair_and_block() -> None:
    a, b = FnWorker("a", "A"), FnWorker("b", "B")
    result, sink = run(steps((0, "orig", [])), [a, b], hooks=Hooks(plan="repair"))
    assert result.answer == "B" and a.calls == []
    val = sink.of_type(EventType.PLAN_VALIDATED)[0].data
    assert val["action"] == "repaired" and val["original"]["steps"][0]["worker_key"] == "a"
    assert val["plan"]["steps"][0]["worker_key"] == "b"
    result, sink = run(steps((0, "orig", [])), [FnWorker("a")], hooks=Hooks(plan="block"))
    assert result.status == RunStatus.BLOCKED and result.reason == "plan_blocked"
    assert sink.of_type(EventType.PLAN_VALIDATED)[0].data["action"] == "blocked"
    assert not sink.of_type(EventType.STEP_STARTED)


def test_before_step_gate_blocks_with_the_cap_named() -> None:
    ws = [FnWorker("a", "A"), FnWorker("b", "B")]
    hooks = Hooks(block_step=1)
    result, sink = run(steps((0, "x", []), (1, "y", [0])), ws, hooks=hooks)
    assert result.status == RunStatus.BLOCKED
    assert result.reason == "step_blocked:max_cost_usd"
    assert "cost budget" in (result.error or "")
    assert finished(sink)[1]["status"] == "blocked"
    assert ws[1].calls == []
    assert_protocol(sink)


def test_step_output_redaction_reaches_later_steps_and_flags() -> None:
    ws = [FnWorker("a", "the SECRET is 42"), FnWorker("b", lambda m: m[2]["content"])]
    result, sink = run(steps((0, "x", []), (1, "y", [0])), ws, hooks=Hooks())
    assert ws[1].calls[0][2]["content"] == "the [redacted] is 42"
    assert result.answer == "the [redacted] is 42"
    assert "warn" in result.flags
    step_checks = [e for e in sink.of_type(EventType.GUARDRAIL_CHECKED) if e.data["stage"] == "step_output"]
    assert [e.data["step"] for e in step_checks] == [0, 1]


def test_output_guardrail_block() -> None:
    result, sink = run(steps((0, "x", [])), [FnWorker("a")], hooks=Hooks(block_output=True))
    assert result.status == RunStatus.BLOCKED and result.reason == "output_blocked" and result.answer is None
    assert_protocol(sink)


class ExplodingHooks(NoGovernance):
    def check_output(self, ctx: RunContext, answer: str) -> GuardrailOutcome:
        raise ValueError("bug in a guardrail")


def test_unexpected_exception_still_ends_with_run_finished() -> None:
    result, sink = run(steps((0, "x", [])), [FnWorker("a")], hooks=ExplodingHooks())
    assert result.status == RunStatus.FAILED and result.reason == "internal_error"
    assert "bug in a guardrail" not in (result.error or "")
    assert_protocol(sink)


class BrokenSink:
    def __init__(self) -> None:
        self.n = 0

    def emit(self, event: object) -> None:
        self.n += 1
        raise OSError("sink down")


def test_broken_sink_does_not_break_the_run() -> None:
    sink = BrokenSink()
    result = run_request(
        run_id="r",
        question="q",
        pool=WorkerPool([FnWorker("a", "ok")]),
        strategy=PlanStrategy(steps((0, "x", []))),
        sink=sink,
    )
    assert result.status == RunStatus.SUCCEEDED and sink.n >= 6


def test_engine_limits_block_disallowed_workers() -> None:
    result, sink = run(
        steps((0, "x", [])), [FnWorker("a"), FnWorker("b")], limits=Limits(allowed_workers=("b",))
    )
    assert result.status == RunStatus.BLOCKED
    v = sink.of_type(EventType.PLAN_VALIDATED)[0].data
    assert v["violations"][0]["code"] == "worker_not_allowed"


def test_step_status_values_match_protocol() -> None:
    assert {s.value for s in StepStatus} == {
        "pending",
        "waiting",
        "running",
        "succeeded",
        "failed",
        "timed_out",
        "skipped",
        "blocked",
    }
    assert {s.value for s in RunStatus} == {
        "queued",
        "running",
        "succeeded",
        "failed",
        "blocked",
        "cancelled",
        "timed_out",
        "awaiting_approval",
    }
