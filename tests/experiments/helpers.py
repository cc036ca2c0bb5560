"""A fake pool whose workers are right on purpose: the solver on maths, the planner on geography,
the critic never. The conductor plans THREE_STEP_PLAN (its last step is the critic: wrong)."""

from __future__ import annotations

import json
import threading
from typing import Any

from tests.fakes.base import FakeReply
from tests.fixtures.runs import CONDUCTOR_MODEL, THREE_STEP_PLAN
from tests.fixtures.waits import wait_runs

QUESTIONS = [
    ("What is 2 + 2?", "4", "math"),
    ("What is 3 * 5?", "15", "math"),
    ("What is the capital of France?", "Paris", "geo"),
    ("What is the capital of Italy?", "Rome", "geo"),
]
RIGHT_ON = {"fake-solver-1": "math", "fake-planner-1": "geo"}


def jsonl(questions: list[tuple[str, str, str]] = QUESTIONS) -> bytes:
    return "\n".join(json.dumps({"input": q, "reference": a, "tags": [t]}) for q, a, t in questions).encode()


class Responder:
    """Answers per model; ``gate`` (when set up) holds the workers until the test opens it."""

    def __init__(self, questions: list[tuple[str, str, str]] = QUESTIONS, gated: bool = False) -> None:
        self.questions = questions
        self.gate = threading.Event()
        if not gated:
            self.gate.set()

    def __call__(self, req: dict[str, Any]) -> Any:
        model = str(req.get("model"))
        if model == CONDUCTOR_MODEL:
            return FakeReply(json.dumps(THREE_STEP_PLAN))
        self.gate.wait(60)
        text = " ".join(str(m.get("content", "")) for m in req.get("messages") or [])
        for q, answer, tag in self.questions:
            if q in text:
                return FakeReply(answer if RIGHT_ON.get(model) == tag else "I do not know.")
        return FakeReply("I do not know.")


def wait_runs_settled(timeout_s: float = 90) -> None:
    """Until no run is queued or running: an experiment leaves many runs with the executors, and
    a test must not end (and its database be flushed) while one still writes (a flush that meets
    a run's transaction on PostgreSQL deadlocks). An experiment creates all its runs at start, so
    the runs still executing now are all there are; each one's events wake the wait."""
    from apps.runs.models import Run

    busy = ("queued", "running")
    ids = list(Run.objects.filter(status__in=busy).values_list("pk", flat=True))
    runs = wait_runs(ids, lambda run: run.status not in busy, timeout=timeout_s)
    assert all(run.status not in busy for run in runs), "runs still executing after the test"
