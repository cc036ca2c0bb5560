"""Partial answers through the official SDKs (issue 44): an `ultra` run on the fake pool whose
round-2 step times out ends with round 1's answer, marked partial the way each protocol says
"cut short" (Chat Completions ``finish_reason: length``, Responses ``status: incomplete``,
Messages ``stop_reason: max_tokens``) and under the ``conductor.incomplete`` extension."""

from __future__ import annotations

import json
import threading
from typing import Any

import anthropic
import openai
import pytest

from apps.runs.models import Run, RunEvent
from tests.factories.policies import publish_policy
from tests.fakes.base import FakeReply
from tests.fixtures.runs import CONDUCTOR_MODEL, worker_answer

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

MODEL = "conductor-ultra:fake"
# Round 1: the planner, then the conductor itself (index 3: the pool has three workers) re-plans.
ROUND_1 = {
    "model_id": [0, 3],
    "subtasks": ["Outline how to answer.", "Review and plan on."],
    "access_list": [[], "all"],
}
# Round 2: the solver, which answers long after the policy's step timeout.
ROUND_2 = {"model_id": [1], "subtasks": ["Solve it using the outline."], "access_list": [[0]]}
SLOW_S = 8.0


@pytest.fixture
def round_two_times_out(fake_pool: Any, alpha: Any) -> Any:
    publish_policy(alpha, {"constraints": {"caps": {"step_timeout_s": 1}}})

    def respond(req: dict[str, Any]) -> FakeReply:
        messages = req.get("messages") or []
        if req.get("model") == CONDUCTOR_MODEL:
            replanning = any("fake-planner-1 says" in str(m.get("content")) for m in messages)
            return FakeReply(json.dumps(ROUND_2 if replanning else ROUND_1))
        reply = worker_answer(str(req.get("model")), messages)
        return FakeReply(reply, delay=SLOW_S if req.get("model") == "fake-solver-1" else 0.0)

    fake_pool.server.responder = respond
    return fake_pool


def _round_one_answer() -> str:
    return worker_answer("fake-planner-1", [{"role": "user", "content": "Outline how to answer."}])


def _assert_run_partial(run_id: str) -> None:
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.status_reason) == ("succeeded", "partial")
    assert run.answer == _round_one_answer()
    assert "timed out" in run.error  # why it is partial, for its page (never as the answer)
    steps = {s.index: s.status for s in run.steps.all()}
    assert steps[0] == "succeeded" and steps[2] == "timed_out"
    finished = RunEvent.objects.get(run_id=run_id, type="run.finished").data
    assert finished["incomplete"]["reason"] == "step_timed_out" and finished["incomplete"]["answer_step"] == 0


def test_chat_completions_answers_round_one_with_finish_reason_length(
    round_two_times_out: Any, sdk: openai.OpenAI
) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Partial, chat?"}]
    )
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content == _round_one_answer()
    conductor = json.loads(raw.text)["conductor"]
    assert conductor["incomplete"]["reason"] == "step_timed_out"
    _assert_run_partial(conductor["run_id"])


def test_chat_completions_stream_ends_with_finish_reason_length(
    round_two_times_out: Any, sdk: openai.OpenAI
) -> None:
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Partial, streamed?"}], stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"] and text == _round_one_answer()
    last = [c for c in chunks if (c.model_extra or {}).get("conductor")][-1]
    assert last.model_extra["conductor"]["incomplete"]["reason"] == "step_timed_out"


def test_responses_is_incomplete_with_the_runs_reason(round_two_times_out: Any, sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model=MODEL, input="Partial, responses?")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "step_timed_out"
    assert response.output_text == _round_one_answer()
    conductor = (response.model_extra or {})["conductor"]
    assert conductor["incomplete"]["reason"] == "step_timed_out"
    _assert_run_partial(conductor["run_id"])


def test_messages_stops_with_max_tokens(round_two_times_out: Any, api_server: Any, api_key: Any) -> None:
    claude = anthropic.Anthropic(base_url=api_server.url, api_key=api_key[1], max_retries=0, timeout=90)
    message = claude.messages.create(
        model=MODEL, max_tokens=512, messages=[{"role": "user", "content": "Partial, messages?"}]
    )
    assert message.stop_reason == "max_tokens"
    assert [b.text for b in message.content if b.type == "text"] == [_round_one_answer()]
    conductor = (message.model_extra or {})["conductor"]
    assert conductor["incomplete"]["reason"] == "step_timed_out"
    _assert_run_partial(conductor["run_id"])


def test_a_policy_that_denies_partial_answers_fails_the_run(
    round_two_times_out: Any, sdk: openai.OpenAI, alpha: Any
) -> None:
    publish_policy(alpha, {"constraints": {"caps": {"step_timeout_s": 1}, "partial_answers": "deny"}})
    with pytest.raises(openai.APIStatusError) as failed:
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Partial, denied?"}])
    run = Run.objects.get(question="Partial, denied?")
    assert (run.status, run.status_reason) == ("failed", "step_timed_out")
    assert failed.value.status_code == 502 and "timed out" in str(failed.value)


@pytest.fixture
def round_two_streams_then_stalls(fake_pool: Any, alpha: Any) -> Any:
    """Round 2's solver streams two pieces of its answer, then stalls past the step timeout."""
    publish_policy(alpha, {"constraints": {"caps": {"step_timeout_s": 1}}})
    resume = threading.Event()

    def respond(req: dict[str, Any]) -> FakeReply:
        messages = req.get("messages") or []
        if req.get("model") == CONDUCTOR_MODEL:
            replanning = any("fake-planner-1 says" in str(m.get("content")) for m in messages)
            return FakeReply(json.dumps(ROUND_2 if replanning else ROUND_1))
        if req.get("model") == "fake-solver-1":
            return FakeReply(chunks=[*FRAGMENT, "never sent"], pause_after=len(FRAGMENT), resume=resume)
        return FakeReply(worker_answer(str(req.get("model")), messages))

    fake_pool.server.responder = respond
    try:
        yield fake_pool
    finally:
        resume.set()


FRAGMENT = ("The solver's answer ", "begins like this")


def test_a_stream_that_released_part_of_a_later_answer_does_not_end_as_if_it_were_the_answer(
    round_two_streams_then_stalls: Any, sdk: openai.OpenAI
) -> None:
    """Issue 44: the client got part of round 2's answer, then the run ended partial with round 1's
    answer. The stream must not end with a success chunk (the client would take the fragment for
    the answer): it ends with the protocol's error, naming why and where the answer is."""
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Partial, after a fragment?"}], stream=True
    )
    received: list[str] = []
    with pytest.raises(openai.APIError) as ended:
        for chunk in stream:
            if chunk.choices:
                received.append(chunk.choices[0].delta.content or "")
                assert chunk.choices[0].finish_reason is None  # never a success ending
    assert "".join(received) == "".join(FRAGMENT)
    body = ended.value.body
    assert isinstance(body, dict) and body["code"] == "answer_superseded"
    assert "not the answer" in body["message"] and "timed out" in body["message"]
    run = Run.objects.get(question="Partial, after a fragment?")
    assert str(run.id) in body["message"]
    # Every other surface has the run's one answer: round 1's, marked partial.
    _assert_run_partial(str(run.id))


def test_a_messages_stream_that_released_part_of_a_later_answer_ends_with_an_error(
    round_two_streams_then_stalls: Any, api_server: Any, api_key: Any
) -> None:
    claude = anthropic.Anthropic(base_url=api_server.url, api_key=api_key[1], max_retries=0, timeout=90)
    received: list[str] = []
    with (
        pytest.raises(anthropic.APIError) as ended,
        claude.messages.stream(
            model=MODEL, max_tokens=512, messages=[{"role": "user", "content": "Partial, messages fragment?"}]
        ) as stream,
    ):
        for text in stream.text_stream:
            received.append(text)
    assert "".join(received) == "".join(FRAGMENT)
    assert "answer_superseded" in str(ended.value.body) and "not the answer" in str(ended.value.body)
    run = Run.objects.get(question="Partial, messages fragment?")
    _assert_run_partial(str(run.id))
