"""The answer step streams through the output gate in a real engine run (issue 45): its
``step.delta`` events carry only released text, a block stops the provider call and ends the run
naming the rule, and ``run.finished`` records the digest of what was released."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from apps.engine.events import EventType, ListSink, RunStatus
from apps.engine.pool import WorkerPool
from apps.engine.runner import run_request
from apps.engine.strategies import ConductorStrategy
from apps.policies.hooks import PolicyHooks
from apps.policies.spec import EffectivePolicy, parse_spec
from tests.engine.workers import FnWorker
from tests.policies.helpers import plan_text

TERMS = {
    "enabled": True,
    "action": "block",
    "terms": [{"pattern": "insider trading", "message": "No insider trading."}],
}


def run(pieces: list[str], spec: dict[str, Any]) -> tuple[Any, ListSink]:
    worker = FnWorker("w", "".join(pieces), pieces=pieces)
    conductor = FnWorker("conductor", plan_text([0], pool_size=1))
    pool = WorkerPool([worker], default_index=0, conductor=conductor)
    hooks = PolicyHooks(effective=EffectivePolicy(parse_spec(spec)), team=None, run_id="r1")
    sink = ListSink()
    result = run_request(
        run_id="r1",
        question="q",
        pool=pool,
        strategy=ConductorStrategy(None),
        sink=sink,
        hooks=hooks,
        limits=hooks.effective.engine_limits(),
    )
    return result, sink


def answer_deltas(sink: ListSink) -> str:
    return "".join(e.data["text"] for e in sink.of_type(EventType.STEP_DELTA) if e.data.get("answer"))


def test_a_card_split_across_pieces_is_masked_in_the_stream_and_the_answer() -> None:
    spec = {"guardrails": {"output": {"pii": {"enabled": True, "action": "redact", "types": ["card"]}}}}
    result, sink = run(["Pay with 4111 1111 ", "1111 1111 today."], spec)
    assert result.status == RunStatus.SUCCEEDED
    streamed = answer_deltas(sink)
    assert "4111" not in streamed and streamed == result.answer == "Pay with [REDACTED:card] today."
    finished = sink.of_type(EventType.RUN_FINISHED)[-1].data
    assert finished["released"]["sha256"] == hashlib.sha256(result.answer.encode()).hexdigest()
    # No step.delta of the answer step carries raw text.
    assert all(e.data.get("answer") for e in sink.of_type(EventType.STEP_DELTA))


def test_a_blocked_term_mid_answer_ends_the_run_naming_the_rule() -> None:
    spec = {"guardrails": {"output": {"blocked_terms": TERMS}}}
    result, sink = run(["All about insi", "der trad", "ing and more ", "text after."], spec)
    assert result.status == RunStatus.BLOCKED and result.reason == "output_blocked"
    assert "guardrails.output.blocked_terms" in result.error and "No insider trading." in result.error
    streamed = answer_deltas(sink)
    assert streamed == "All about " and "insi" not in streamed
    checks = [e for e in sink.of_type(EventType.GUARDRAIL_CHECKED) if e.data["stage"] == "output"]
    assert checks and checks[-1].data["blocked"]


def test_require_review_streams_nothing() -> None:
    spec = {"guardrails": {"output": {"pii": {"enabled": True, "action": "require_review"}}}}
    result, sink = run(["Mail ceo@", "example.com now"], spec)
    assert result.status == RunStatus.SUCCEEDED and "require_review" in result.flags
    assert answer_deltas(sink) == ""


def test_step_output_checks_apply_to_the_stream_too() -> None:
    spec = {"guardrails": {"step_output": {"pii": {"enabled": True, "action": "redact", "types": ["email"]}}}}
    result, sink = run(["Mail ceo@exa", "mple.com now"], spec)
    assert answer_deltas(sink) == result.answer == "Mail [REDACTED:email] now"


def test_without_checks_the_pieces_pass_through_as_they_come() -> None:
    result, sink = run(["one ", "two ", "three"], {})
    deltas = [e.data["text"] for e in sink.of_type(EventType.STEP_DELTA) if e.data.get("answer")]
    assert deltas == ["one ", "two ", "three"] and result.answer == "one two three"


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_provider_streams_pass_the_gate_on_a_real_socket(kind: str) -> None:
    """The answering worker's provider stream (OpenAI-compatible and Anthropic SDKs against their
    fakes on loopback) goes through the gate: a card split across chunks is masked, a blocked term
    split across chunks stops the call with nothing of it released."""
    from apps.engine.providers import build_worker
    from apps.engine.providers.gate import gate_without_policy
    from apps.engine.types import WorkerInfo
    from tests.fakes.anthropic_server import FakeAnthropicServer
    from tests.fakes.base import FakeReply
    from tests.fakes.openai_server import FakeOpenAIServer

    server = (FakeAnthropicServer if kind == "anthropic" else FakeOpenAIServer)(api_key="sk-stream-test")
    server.start()
    try:
        worker = build_worker(
            WorkerInfo(key="w", name="W", model="m-1", provider=kind),
            base_url=server.base_url,
            api_key="sk-stream-test",
            max_retries=0,
            gate=gate_without_policy(),
        )

        def go(chunks: list[str], spec: dict[str, Any]) -> tuple[Any, ListSink]:
            server.script(FakeReply(chunks=chunks))
            pool = WorkerPool(
                [worker], default_index=0, conductor=FnWorker("conductor", plan_text([0], pool_size=1))
            )
            hooks = PolicyHooks(effective=EffectivePolicy(parse_spec(spec)), team=None, run_id="r1")
            sink = ListSink()
            result = run_request(
                run_id="r1",
                question="q",
                pool=pool,
                strategy=ConductorStrategy(None),
                sink=sink,
                hooks=hooks,
                limits=hooks.effective.engine_limits(),
            )
            return result, sink

        card = {"guardrails": {"output": {"pii": {"enabled": True, "action": "redact", "types": ["card"]}}}}
        result, sink = go(["Card 4111 1111 ", "1111 1111 ok"], card)
        assert result.status == RunStatus.SUCCEEDED
        assert answer_deltas(sink) == result.answer == "Card [REDACTED:card] ok"
        result, sink = go(
            ["About insi", "der trad", "ing and ", "more."],
            {"guardrails": {"output": {"blocked_terms": TERMS}}},
        )
        assert result.status == RunStatus.BLOCKED and "guardrails.output.blocked_terms" in result.error
        assert answer_deltas(sink) == "About "
    finally:
        server.stop()


class _CutWorker(FnWorker):
    """Streams ``pieces`` and then fails, as a provider whose connection drops mid-answer."""

    def complete(self, messages: Any, **kw: Any) -> Any:  # type: ignore[override]
        from apps.engine.providers.base import ProviderUnavailable

        on_delta = kw.get("on_delta")
        self.calls.append(messages)
        for piece in self.pieces or []:
            if on_delta is not None:
                on_delta(piece)
        raise ProviderUnavailable("the connection dropped")


@pytest.mark.parametrize("pieces", [["Half an ans"], []])
def test_no_fallback_once_part_of_the_answer_was_released(pieces: list[str]) -> None:
    """A fallback worker would write a different answer after the client already has the start
    of this one: once anything was released the step fails; before that the fallback runs."""
    cut = _CutWorker("w", "", pieces=pieces, fallback_key="backup")
    backup = FnWorker("backup", "Backup answer.", pieces=["Backup ", "answer."])
    pool = WorkerPool(
        [cut, backup], default_index=0, conductor=FnWorker("conductor", plan_text([0], pool_size=2))
    )
    hooks = PolicyHooks(effective=EffectivePolicy(parse_spec({})), team=None, run_id="r1")
    sink = ListSink()
    result = run_request(
        run_id="r1",
        question="q",
        pool=pool,
        strategy=ConductorStrategy(None),
        sink=sink,
        hooks=hooks,
        limits=hooks.effective.engine_limits(),
    )
    if pieces:
        assert result.status == RunStatus.FAILED and not backup.calls
        assert answer_deltas(sink) == "Half an ans"
    else:
        assert result.status == RunStatus.SUCCEEDED and result.answer == "Backup answer." == answer_deltas(
            sink
        )
