"""Request overhead of ``POST /v1/chat/completions`` with an instant worker, vs. the engine alone.

Not a test: prints figures for bench/API.md. A loopback fake OpenAI server answers every call at
once (the conductor's plan: 2 steps; each worker: a short answer), so what is measured is the
product's own cost per request: key authentication and rate limit, validation, ``run_create``
(policy, budget, Run row, audit event), dispatch (thread pool or Celery), the engine with the
Django sink (RunEvent/Step/Run rows, audit events and channel publishes, one transaction per
step boundary) and the wait for the run's end. The same request through ``apps.engine.runner.run_request`` with a null sink in
this process is the baseline ("engine"). ``--model pool`` sends ``model: apibench-solo`` instead, a
one-worker pool: the pass-through (one provider call, no plan); its baseline is the same single
call through the engine (``strategy: single``).

``--queries N`` (embedded only) measures no latency: it sends N warm requests in this process
(Django's test client; the embedded runtime executes the run here too), counts every SQL statement
any thread sends and prints the statements per run grouped by kind, by table and by call site
(the innermost frame in ``apps/`` or ``conductor_web/``), then exits. ``--profile FILE`` (with
``--queries``) also writes a cProfile of those requests.

    .venv/bin/python bench/api_overhead.py --mode embedded
    .venv/bin/python bench/api_overhead.py --mode embedded --model pool --concurrency 1 --requests 50
    .venv/bin/python bench/api_overhead.py --mode embedded --model pool --queries 20
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_api_bench \\
      REDIS_URL=redis://127.0.0.1:6379/1 CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// \\
      .venv/bin/python bench/api_overhead.py --mode distributed

Embedded uses its own SQLite file (recreated). Distributed recreates the PostgreSQL database named
in DATABASE_URL and consumes its own Celery queue, so it never touches other data or workers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _live_setup import pct, prepare, wait_port  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--mode", choices=["embedded", "distributed"], default="embedded")
parser.add_argument("--concurrency", default="1,10,50")
parser.add_argument("--requests", type=int, default=0, help="requests per level (default: max(60, 4*c))")
parser.add_argument(
    "--model",
    choices=["mini", "pool"],
    default="mini",
    help="mini: conductor-mini on a 2-worker pool; pool: a one-worker pool's slug (pass-through)",
)
parser.add_argument("--queries", type=int, default=0, help="count SQL per warm run over N runs, then exit")
parser.add_argument("--profile", default="", help="with --queries: write a cProfile of the runs here")
parser.add_argument("--celery-concurrency", type=int, default=16)
parser.add_argument(
    "--shared-ssl",
    action="store_true",
    help="experiment: reuse one SSL context for every provider client (see bench/API.md)",
)
parser.add_argument(
    "--tag",
    default="",
    help="suffix for the bench's work dir and SQLite file, so two copies can run on one machine",
)
ARGS = parser.parse_args()

# Each OpenAI client builds a fresh SSL context (loading the CA bundle: ~60 ms of CPU under the
# GIL) and the product builds one client per worker twice per run. --shared-ssl measures the
# product with that cost removed, by caching the context in the bench processes only.
SHARED_SSL = (
    "import functools, httpcore2\n"
    "httpcore2.default_ssl_context = functools.lru_cache(maxsize=4)(httpcore2.default_ssl_context)\n"
    if ARGS.shared_ssl
    else ""
)

prepare(
    mode=ARGS.mode,
    work=Path(f"/tmp/conductor_api_bench{ARGS.tag}"),
    name="api_bench",
    sqlite_file=Path(f"/tmp/conductor_api_bench{ARGS.tag}.sqlite3"),
    extra_settings=SHARED_SSL,
)

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.api.services import apikey_create  # noqa: E402
from apps.engine.providers.gate import gate_without_policy  # noqa: E402
from apps.governance.services import membership_set, team_create  # noqa: E402
from apps.workers.services import pool_create  # noqa: E402
from tests.factories.workers import build_openai_compatible_pool  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402
from tests.fixtures.core import free_port  # noqa: E402

MODEL = "apibench-solo" if ARGS.model == "pool" else "conductor-mini"
PLAN = 'model_id = [0, 1]\nsubtasks = ["Solve.", "Check and answer."]\naccess_list = [[], [0]]'


def responder(request: dict[str, Any]) -> str:
    return PLAN if request.get("model") == "conductor" else "42"


def setup_data(server: FakeOpenAIServer) -> tuple[Any, str]:
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("apibench", password=uuid.uuid4().hex)
    team = team_create(actor=None, slug="apibench", name="API bench")
    membership_set(actor=None, team=team, user=user, role="admin")
    pool, _, workers, conductor = build_openai_compatible_pool(
        team=team,
        base_url=server.base_url,
        api_key="sk-bench-0000",
        slug="apibench",
        workers=[{"slug": f"apibench-{i}", "display_name": f"W{i}", "model_name": f"w{i}"} for i in range(2)],
        conductor={"slug": "apibench-c", "display_name": "C", "model_name": "conductor"},
        pool_name="Bench pool",
        provider_name="Instant fake",
    )
    key = apikey_create(
        actor=None,
        team=team,
        name="bench",
        principal=user,
        requests_per_minute=100_000,
        tokens_per_minute=100_000_000,
    )
    solo = pool_create(
        actor=None,
        team=team,
        slug="apibench-solo",
        name="Solo",
        workers=[workers[0]],
        default_worker=workers[0],
        conductor_worker=conductor,
    )
    return (solo if ARGS.model == "pool" else pool), key.plaintext


def start_processes(log_dir: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "conductor_web.asgi:application",
            ],
            cwd=ROOT,
            stdout=(log_dir / "daphne.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
    ]
    wait_port(port, procs[0], "daphne", timeout=60)
    if ARGS.mode == "distributed":
        log = log_dir / "celery.log"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "conductor_web",
                    "worker",
                    "-l",
                    "warning",
                    "-Q",
                    "api_bench",
                    "--pool",
                    "threads",
                    "--concurrency",
                    str(ARGS.celery_concurrency),
                    "--without-gossip",
                    "--without-mingle",
                    "-n",
                    f"apibench-{os.getpid()}@%h",
                ],
                cwd=ROOT,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
        time.sleep(4)  # the worker logs nothing at -l warning; give it time to connect
    return f"http://127.0.0.1:{port}", procs


async def api_level(base: str, key: str, concurrency: int, total: int) -> list[float]:
    latencies: list[float] = []
    failures: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(total):
        queue.put_nowait(i)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 6*7?"}]}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=300, limits=limits
    ) as client:

        async def worker() -> None:
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                elapsed = time.perf_counter() - started
                if response.status_code != 200 or response.json()["choices"][0]["message"]["content"] != "42":
                    failures.append(f"{response.status_code} {response.text[:200]}")
                else:
                    latencies.append(elapsed * 1000)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    if failures:
        print(f"  {len(failures)} failed requests, e.g. {failures[0]}", file=sys.stderr)
    return latencies


def engine_level(pool: Any, concurrency: int, total: int) -> list[float]:
    from apps.engine.events import NullSink
    from apps.engine.runner import run_request
    from apps.engine.strategies import build_strategy
    from apps.runs import integration

    engine_pool = integration.build_pool(pool, gate=gate_without_policy())

    def one(_: int) -> float:
        started = time.perf_counter()
        result = run_request(
            run_id=str(uuid.uuid4()),
            question="What is 6*7?",
            pool=engine_pool,
            strategy=(
                build_strategy("single", conversation=[{"role": "user", "content": "What is 6*7?"}])
                if ARGS.model == "pool"
                else build_strategy("conductor", preset="mini")
            ),
            sink=NullSink(),
        )
        assert result.answer == "42", result.to_dict()
        return (time.perf_counter() - started) * 1000

    with ThreadPoolExecutor(max_workers=concurrency) as pool_exec:
        return list(pool_exec.map(one, range(total)))


def site_of(frames: list[Any]) -> str:
    """The innermost frame of the product's own code (apps/, conductor_web/)."""
    for frame in reversed(frames):
        path = frame.filename
        if "/site-packages/" in path or not path.startswith(str(ROOT)):
            continue
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(("apps/", "conductor_web/")):
            return f"{rel}:{frame.lineno} {frame.name}"
    return "(outside apps/)"


def table_of(sql: str) -> tuple[str, str]:
    """The statement's kind (SELECT, INSERT, ...) and its first table."""
    kind = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    match = re.search(r'(?:FROM|INTO|UPDATE)\s+"?([A-Za-z0-9_]+)"?', sql)
    return kind, match.group(1) if match else "-"


def count_queries(total: int) -> None:
    """Statements per warm run, grouped by kind, table and call site (embedded: all in-process)."""
    import cProfile
    import json
    import threading
    import traceback
    from collections import Counter

    from django.db.backends.utils import CursorWrapper
    from django.test import Client

    server = FakeOpenAIServer(responder)
    server.start()
    _pool, key = setup_data(server)
    client = Client()
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "What is 6*7?"}]})

    def ask() -> None:
        resp = client.post(
            "/v1/chat/completions",
            data=body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}",
        )
        assert resp.status_code == 200, resp.content
        assert resp.json()["choices"][0]["message"]["content"] == "42", resp.content

    seen: list[tuple[str, str]] = []
    lock = threading.Lock()
    original = CursorWrapper._execute_with_wrappers  # type: ignore[attr-defined]

    def counting(self: Any, sql: str, params: Any, many: bool, executor: Any) -> Any:
        site = site_of(traceback.extract_stack()[:-1])
        with lock:
            seen.append((sql, site))
        return original(self, sql, params, many, executor)

    for _ in range(3):  # warm-up: imports and the per-process caches
        ask()
    # CPU per run, nothing counted: less sensitive to other load on the machine than wall time.
    plain_started, plain_cpu_started = time.perf_counter(), time.process_time()
    for _ in range(total):
        ask()
    plain_wall = time.perf_counter() - plain_started
    plain_cpu = time.process_time() - plain_cpu_started
    CursorWrapper._execute_with_wrappers = counting  # type: ignore[attr-defined]
    profiler = cProfile.Profile() if ARGS.profile else None
    try:
        if profiler is not None:
            profiler.enable()
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(total):
            ask()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(ARGS.profile)
    finally:
        CursorWrapper._execute_with_wrappers = original  # type: ignore[attr-defined]
        server.stop()
    per = len(seen) / total
    print(
        f"\nmodel: {MODEL}, {total} warm runs in process (all threads; the fake upstream's included):\n"
        f"  not counting: {plain_wall / total * 1000:.1f} ms wall, {plain_cpu / total * 1000:.1f} ms CPU per run\n"
        f"  counting:     {wall / total * 1000:.1f} ms wall, {cpu / total * 1000:.1f} ms CPU per run"
    )
    print(f"statements per run: {per:.1f}  (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    for title, counter in (
        ("by kind", Counter(table_of(sql)[0] for sql, _ in seen)),
        ("by table", Counter(" ".join(table_of(sql)) for sql, _ in seen)),
        ("by call site", Counter(site for _, site in seen)),
        ("by table and call site", Counter(f"{' '.join(table_of(sql))}  {site}" for sql, site in seen)),
    ):
        print(f"\n{title}:")
        for name, n in counter.most_common():
            print(f"  {n / total:6.1f}  {name}")


def main() -> None:
    if ARGS.queries:
        if ARGS.mode != "embedded":
            sys.exit("--queries counts this process's statements: embedded mode only")
        count_queries(ARGS.queries)
        return
    server = FakeOpenAIServer(responder)
    server.start()
    pool, key = setup_data(server)
    log_dir = Path(f"/tmp/conductor_api_bench{ARGS.tag}")
    base, procs = start_processes(log_dir)
    rows = []
    try:
        asyncio.run(api_level(base, key, 2, 6))  # warm-up: imports, connections, first runs
        for concurrency in [int(c) for c in ARGS.concurrency.split(",")]:
            total = ARGS.requests or max(60, 4 * concurrency)
            started = time.perf_counter()
            api = asyncio.run(api_level(base, key, concurrency, total))
            api_wall = time.perf_counter() - started
            engine_level(pool, concurrency, min(total, 10))  # warm-up
            started = time.perf_counter()
            engine = engine_level(pool, concurrency, total)
            engine_wall = time.perf_counter() - started
            rows.append((concurrency, total, api, api_wall, engine, engine_wall))
            print(
                f"c={concurrency}: api p50 {statistics.median(api):.1f} ms, engine p50 "
                f"{statistics.median(engine):.1f} ms",
                file=sys.stderr,
            )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()
    print(
        f"\nmode: {ARGS.mode}{' --shared-ssl' if ARGS.shared_ssl else ''}  (run threads in daphne: {os.environ.get('RUN_THREAD_WORKERS', '4')}"
        + (f", celery threads: {ARGS.celery_concurrency}" if ARGS.mode == "distributed" else "")
        + ")\n"
    )
    print(
        "| clients | requests | /v1 p50 ms | /v1 p99 ms | /v1 req/s | engine p50 ms | engine p99 ms "
        "| engine runs/s | overhead p50 ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for concurrency, total, api, api_wall, engine, engine_wall in rows:
        print(
            f"| {concurrency} | {total} | {statistics.median(api):.1f} | {pct(api, 0.99):.1f} | "
            f"{len(api) / api_wall:.1f} | {statistics.median(engine):.1f} | {pct(engine, 0.99):.1f} | "
            f"{len(engine) / engine_wall:.1f} | {statistics.median(api) - statistics.median(engine):.1f} |"
        )


if __name__ == "__main__":
    main()
