"""A pool with one dead worker: time to answer before and after the circuit breaker (issue 44).

    .venv/bin/python bench/circuit_breaker.py [--runs 8] [--timeout 2]

Not a test: prints figures for bench/RUNS.md. Its own SQLite database in a temporary directory
(migrated), the loopback fake OpenAI server, and the engine run with the pool the product builds
(``build_engine_pool``). The dead worker accepts the connection and never answers (its
``timeout_s`` is ``--timeout``); its fallback answers at once. Every run is a single step pinned
to the dead worker, so each run either waits for the dead one and then falls back (no breaker),
or — once the breaker opened — goes straight to the fallback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARSER = argparse.ArgumentParser()
PARSER.add_argument("--runs", type=int, default=8)
PARSER.add_argument("--timeout", type=int, default=2)
ARGS = PARSER.parse_args()

TMP = tempfile.mkdtemp(prefix="bench-breaker-")
os.environ["DJANGO_SETTINGS_MODULE"] = "conductor_web.settings.local"
os.environ["DATABASE_URL"] = f"sqlite:///{TMP}/db.sqlite3"
for name in ("REDIS_URL", "CELERY_BROKER_URL"):
    os.environ.pop(name, None)
os.environ.setdefault("DEBUG", "false")
os.environ["EGRESS_ALLOW"] = "127.0.0.0/8"  # the loopback fake provider

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from apps.engine import NullSink, run_request  # noqa: E402
from apps.engine.providers.gate import gate_without_policy  # noqa: E402
from apps.engine.strategies import build_strategy  # noqa: E402
from apps.governance.services import team_create  # noqa: E402
from apps.workers.engine_adapter import build_engine_pool  # noqa: E402
from apps.workers.models import Worker  # noqa: E402
from tests.factories.workers import build_openai_compatible_pool  # noqa: E402
from tests.fakes.base import FakeReply  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402

KEY = "sk-bench-0000"
RELEASE = threading.Event()


def respond(req: dict) -> object:
    if req.get("model") == "dead-1":
        return FakeReply("too late", hold=RELEASE)  # connected, never answers (until the end)
    return "42"


def timed_runs(pool: object, *, breaker: bool, label: str) -> list[float]:
    out = []
    for i in range(ARGS.runs):
        engine_pool = build_engine_pool(pool, gate=gate_without_policy())
        if not breaker:
            engine_pool.health = None
        t0 = time.perf_counter()
        result = run_request(
            run_id=f"{label}-{i}",
            question="What is six times seven?",
            pool=engine_pool,
            strategy=build_strategy("single", worker="dead"),
            sink=NullSink(),
        )
        out.append(time.perf_counter() - t0)
        assert result.answer == "42", result
    return out


def main() -> None:
    call_command("migrate", verbosity=0)
    server = FakeOpenAIServer(api_key=KEY)
    server.responder = respond
    server.start()
    try:
        team = team_create(actor=None, slug="bench", name="Bench")
        pool, *_ = build_openai_compatible_pool(
            team=team,
            base_url=server.base_url,
            api_key=KEY,
            slug="bench",
            workers=[
                {"slug": "dead", "display_name": "Dead", "model_name": "dead-1"},
                {"slug": "live", "display_name": "Live", "model_name": "live-1"},
            ],
            conductor={"slug": "cond", "display_name": "Conductor", "model_name": "cond-1"},
            timeout_s=ARGS.timeout,
        )
        Worker.objects.filter(slug="dead").update(fallback=Worker.objects.get(slug="live"))
        for label, breaker in (("before (no breaker)", False), ("after (breaker)", True)):
            times = timed_runs(pool, breaker=breaker, label=label.split()[0])
            calls = sum(1 for r in server.chat_requests() if (r.json or {}).get("model") == "dead-1")
            print(
                f"{label:22} runs={len(times)} median={statistics.median(times):.3f} s "
                f"first={times[0]:.3f} s last={times[-1]:.3f} s total={sum(times):.1f} s "
                f"calls to the dead worker so far={calls}"
            )
            print("  per run:", " ".join(f"{t:.3f}" for t in times))
    finally:
        RELEASE.set()
        server.stop()


if __name__ == "__main__":
    main()
