"""Parallel steps on a one-slot worker (issue 44, items 4-5): before and after slots.

    .venv/bin/python bench/one_slot_parallel.py [--root DIR] [--steps 3] [--tokens 40]
        [--token-ms 20] [--timeout 1.5] [--runs 3]

Not a test: prints figures for bench/RUNS.md. ``--root`` is the checkout whose engine runs (this
one by default; an export of an older commit measures "before"). No Django, no network: the
product's ``LocalWorker`` in front of a stand-in llama model that generates one token every
``--token-ms`` and yields it (as llama-cpp's stream does; closing the stream stops it), so a call
takes ``tokens * token_ms``. The real SmolLM2 varies far more from call to call
on a shared machine; the stand-in makes both versions see the same model.

Scenario A (item 4): ``--steps`` independent steps on the local worker plus an answer step reading
them, the step timeout ``--timeout`` longer than one call and shorter than the queue.
Scenario B (item 5): a cancel at 0.3 s abandons a long generation (``--tokens`` * 5);
how long the model stays busy after the run ended is the time the next step would wait.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PARSER = argparse.ArgumentParser()
PARSER.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
PARSER.add_argument("--steps", type=int, default=3)
PARSER.add_argument("--tokens", type=int, default=40)
PARSER.add_argument("--token-ms", type=float, default=20.0)
PARSER.add_argument("--timeout", type=float, default=1.5)
PARSER.add_argument("--runs", type=int, default=3)
ARGS = PARSER.parse_args()
sys.path.insert(0, ARGS.root)

from apps.engine.events import ListSink  # noqa: E402
from apps.engine.plan import Plan, PlanStep  # noqa: E402
from apps.engine.pool import WorkerPool  # noqa: E402
from apps.engine.providers import local  # noqa: E402
from apps.engine.providers.gate import gate_without_policy  # noqa: E402
from apps.engine.runner import run_request  # noqa: E402
from apps.engine.session import CancelToken  # noqa: E402
from apps.engine.types import Limits, WorkerInfo  # noqa: E402
from tests.engine.test_executor import PlanStrategy  # noqa: E402


class PacedLlama:
    """One token every ``token_ms``; stops at ``max_tokens`` or when its stream is closed."""

    def __init__(self, token_ms: float) -> None:
        self.pace = token_ms / 1000
        self.busy_until = 0.0  # when the last generation ended (monotonic)
        self.generating = 0

    def close(self) -> None:  # the provider frees models at exit
        return None

    def create_chat_completion(self, **kwargs: Any) -> Any:
        stop = kwargs.get("stopping_criteria")
        limit = int(kwargs.get("max_tokens") or 16)
        self.generating += 1
        try:
            yield {"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]}
            for _ in range(limit):
                time.sleep(self.pace)
                if stop is not None and stop([0], [0.0]):
                    yield {"choices": [{"delta": {}, "finish_reason": "stop"}]}
                    return
                yield {"choices": [{"delta": {"content": "x"}, "finish_reason": None}]}
            yield {"choices": [{"delta": {}, "finish_reason": "length"}]}
        finally:
            self.generating -= 1
            self.busy_until = time.monotonic()


def local_worker(llm: PacedLlama, tokens: int) -> Any:
    path = Path(tempfile.mkdtemp(prefix="bench-slot-")) / "paced.gguf"
    path.write_bytes(b"stand-in")
    key = (str(path.resolve()), 512, 1)
    fields = local._Loaded.__dataclass_fields__
    guard = local.model_slot(str(path), n_ctx=512, n_threads=1) if "slot" in fields else threading.Lock()
    local._MODELS[key] = local._Loaded(llm, guard, key[0], lambda messages: 8)
    info = WorkerInfo(
        key="smol",
        name="SmolLM2",
        model="stand-in",
        provider="local",
        max_output_tokens=tokens,
        timeout_s=600,
    )
    return local.LocalWorker(info, gate=gate_without_policy(), model_path=str(path), n_ctx=512, n_threads=1)


def scenario_a() -> None:
    parts = [PlanStep(i, 0, f"part {i}", ()) for i in range(ARGS.steps)]
    plan = Plan((*parts, PlanStep(ARGS.steps, 0, "combine", tuple(range(ARGS.steps)))))
    call_s = ARGS.tokens * ARGS.token_ms / 1000
    print(
        f"A: {ARGS.steps} parallel steps + 1 answer step on a one-slot local worker; one call ≈ {call_s:.2f} s, "
        f"step timeout {ARGS.timeout} s"
    )
    walls = []
    for n in range(ARGS.runs):
        llm = PacedLlama(ARGS.token_ms)
        worker = local_worker(llm, ARGS.tokens)
        sink = ListSink()
        t0 = time.perf_counter()
        result = run_request(
            run_id=f"bench-a-{n}",
            question="q",
            pool=WorkerPool([worker]),
            strategy=PlanStrategy(plan),
            sink=sink,
            limits=Limits(step_timeout_s=ARGS.timeout, run_timeout_s=120, stream=False),
        )
        wall = time.perf_counter() - t0
        walls.append(wall)
        ended = [e.data for e in sink.events if e.type.value == "step.finished"]
        statuses = " ".join(f"{d['index']}:{d['status']}" for d in sorted(ended, key=lambda d: d["index"]))
        waits = [e.data.get("waited_ms") for e in sink.events if e.type.value == "step.running"]
        print(f"  run {n + 1}: {result.status.value:<10} wall={wall:.2f} s steps {statuses}")
        if waits:
            print(f"         waited for the slot (ms): {', '.join(f'{w:.0f}' for w in waits)}")
        errors = {d["error"] for d in ended if d.get("error")}
        for err in sorted(errors):
            print(f"         error: {err}")
    print(f"  median wall {statistics.median(walls):.2f} s")


def scenario_b() -> None:
    tokens = ARGS.tokens * 5
    llm = PacedLlama(ARGS.token_ms)
    worker = local_worker(llm, tokens)
    plan = Plan((PlanStep(0, 0, "write at length", ()),))
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    result = run_request(
        run_id="bench-b",
        question="q",
        pool=WorkerPool([worker]),
        strategy=PlanStrategy(plan),
        sink=ListSink(),
        cancel=cancel,
        limits=Limits(step_timeout_s=60, run_timeout_s=120, stream=False),
    )
    ended = time.monotonic()
    while llm.generating and time.monotonic() - ended < 60:
        time.sleep(0.005)
    busy = max(0.0, llm.busy_until - ended)
    print(
        f"B: a cancel at 0.3 s abandons a {tokens * ARGS.token_ms / 1000:.1f} s generation: run "
        f"{result.status.value}; the model stayed busy {busy:.2f} s after the run ended"
    )


if __name__ == "__main__":
    print(f"engine from {ARGS.root}")
    scenario_a()
    scenario_b()
