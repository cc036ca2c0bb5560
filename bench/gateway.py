"""Gateway overhead side by side: direct upstream, the LiteLLM proxy and this project, one run.

Not a test: prints the table for bench/API.md. One fast loopback fake OpenAI upstream
(``tests.fakes.openai_server``) answers every call at once. One load generator (httpx, asyncio)
sends ``POST /v1/chat/completions`` at 1/8/32/128 concurrent clients to, interleaved level by
level (every target gets a batch at one level before the next level starts):

- ``direct``: the upstream itself (the floor);
- ``litellm``: the LiteLLM proxy in front of the same upstream, if ``.venv-bench/bin/litellm``
  exists (``make bench-venv`` / the ``bench`` extra; never a runtime dependency of this project);
- ``pool``: this project, ``model: <pool slug>`` on a one-worker pool (a pass-through: one step);
- ``mini``: this project, ``conductor-mini`` on a 2-worker pool (a plan and 2 steps: 3 calls).

Overhead is client latency less the direct upstream's median at the same level; the table also
shows the gateways' own header (``x-conductor-overhead-ms`` / ``x-litellm-overhead-duration-ms``).

    .venv/bin/python bench/gateway.py                      # embedded: SQLite, threads in daphne
    .venv/bin/python bench/gateway.py --clients 1,8 --requests 40
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_gateway_bench \\
      REDIS_URL=redis://127.0.0.1:6379/1 CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// \\
      .venv/bin/python bench/gateway.py --mode distributed

Embedded uses its own SQLite file (recreated). Distributed recreates the PostgreSQL database named
in DATABASE_URL (its name must end in ``_bench``) and consumes its own Celery queue.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _live_setup import cpu_seconds, die_with_parent, pct, prepare, wait_port  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--mode", choices=["embedded", "distributed"], default="embedded")
parser.add_argument("--clients", default="1,8,32,128")
parser.add_argument(
    "--requests", type=int, default=0, help="requests per target and level (default: max(40, c))"
)
parser.add_argument("--run-threads", type=int, default=16, help="RUN_THREAD_WORKERS / Celery threads")
parser.add_argument("--litellm", default=str(ROOT / ".venv-bench" / "bin" / "litellm"))
parser.add_argument(
    "--rounds",
    type=int,
    default=1,
    help="repeat each level's interleaved batches; the ratio is the median of the rounds' ratios",
)
parser.add_argument(
    "--processes",
    type=int,
    default=1,
    help="WEB_PROCESSES: daphne processes (conductor_web.serve; distributed only)",
)
parser.add_argument(
    "--answer-words",
    type=int,
    default=1,
    help="words in each worker's answer (1: '42'); a streamed call gets one chunk per word",
)
parser.add_argument(
    "--stream",
    action="store_true",
    help="stream: true; the latency columns are then the time to the first content chunk (TTFT)",
)
parser.add_argument(
    "--chunk-delay-ms",
    type=float,
    default=0.0,
    help="the upstream's pause between streamed chunks (a model writing; with --answer-words)",
)
parser.add_argument(
    "--targets",
    default="direct,litellm,pool,mini",
    help="which targets to measure (a subset, e.g. 'pool' while a profiler watches one path)",
)
parser.add_argument(
    "--server",
    choices=["daphne", "uvicorn"],
    default="daphne",
    help="the ASGI server in front of this project (one process; uvicorn: WEB_SERVER=uvicorn)",
)
parser.add_argument(
    "--profile",
    default="",
    help="write a cProfile of the served process (every thread; bench/_profiled.py) to this file",
)
ARGS = parser.parse_args()

WORK = Path("/tmp/conductor_gateway_bench")
os.environ["RUN_THREAD_WORKERS"] = str(ARGS.run_threads)
prepare(mode=ARGS.mode, work=WORK, name="gateway_bench", sqlite_file=WORK / "db.sqlite3")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.api.services import apikey_create  # noqa: E402
from apps.governance.services import membership_set, team_create  # noqa: E402
from apps.workers.services import pool_create  # noqa: E402
from tests.factories.workers import build_openai_compatible_pool  # noqa: E402
from tests.fakes.base import FakeReply  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402
from tests.fixtures.core import free_port  # noqa: E402

PLAN = 'model_id = [0, 1]\nsubtasks = ["Solve.", "Check and answer."]\naccess_list = [[], [0]]'
UPSTREAM_KEY = "sk-bench-0000"
LITELLM_KEY = f"sk-litellm-bench-{uuid.uuid4().hex}"
PROMPT = [{"role": "user", "content": "What is 6*7?"}]


ANSWER = "42" if ARGS.answer_words <= 1 else " ".join(["42"] * ARGS.answer_words)


def responder(request: dict[str, Any]) -> Any:
    if request.get("model") == "conductor":
        return PLAN
    return FakeReply(ANSWER, chunk_delay=ARGS.chunk_delay_ms / 1000)


def setup_data(server: FakeOpenAIServer) -> str:
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("gwbench", password=uuid.uuid4().hex)
    team = team_create(actor=None, slug="gwbench", name="Gateway bench")
    membership_set(actor=None, team=team, user=user, role="admin")
    _pool, _, workers, conductor = build_openai_compatible_pool(
        team=team,
        base_url=server.base_url,
        api_key=UPSTREAM_KEY,
        slug="gw",
        workers=[{"slug": f"gw-{i}", "display_name": f"W{i}", "model_name": f"w{i}"} for i in range(2)],
        conductor={"slug": "gw-c", "display_name": "C", "model_name": "conductor"},
        pool_name="Bench pool",
        provider_name="Instant fake",
    )
    pool_create(
        actor=None,
        team=team,
        slug="solo",
        name="Solo",
        workers=[workers[0]],
        default_worker=workers[0],
        conductor_worker=conductor,
    )
    key = apikey_create(
        actor=None,
        team=team,
        name="bench",
        principal=user,
        requests_per_minute=100_000,
        tokens_per_minute=100_000_000,
    )
    return key.plaintext


def start_conductor() -> tuple[str, list[subprocess.Popen[bytes]]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "conductor_web.asgi:application",
    ]
    if ARGS.server == "uvicorn":
        # The product's option as shipped (WEB_SERVER=uvicorn: uvloop, httptools, access log on).
        os.environ["WEB_SERVER"] = "uvicorn"
        cmd = [*cmd[:2], "conductor_web.serve", "--host", "127.0.0.1", "--port", str(port)]
    if ARGS.profile:
        cmd[1:1] = [str(ROOT / "bench" / "_profiled.py"), ARGS.profile]
    if ARGS.processes > 1:
        os.environ["WEB_PROCESSES"] = str(ARGS.processes)
        cmd = [sys.executable, "-m", "conductor_web.serve", "--host", "127.0.0.1", "--port", str(port)]
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=(WORK / "daphne.log").open("wb"),
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    ]
    wait_port(port, procs[0], "daphne", work=WORK)
    if ARGS.mode == "distributed":
        celery = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "conductor_web",
            "worker",
            "-l",
            "warning",
            "-Q",
            "gateway_bench",
            "--pool",
            "threads",
            "--concurrency",
            str(ARGS.run_threads),
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"gwbench-{os.getpid()}@%h",
        ]
        log = (WORK / "celery.log").open("wb")
        procs.append(
            subprocess.Popen(
                celery, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )
        )
        time.sleep(4)  # the worker logs nothing at -l warning; give it time to connect
    return f"http://127.0.0.1:{port}", procs


def start_litellm(upstream: str) -> tuple[str, subprocess.Popen[bytes]] | None:
    if not Path(ARGS.litellm).exists():
        print(f"no LiteLLM at {ARGS.litellm}: its column is left out", file=sys.stderr)
        return None
    config = WORK / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fake\n"
        "    litellm_params:\n"
        "      model: openai/w0\n"
        f"      api_base: {upstream}\n"
        f"      api_key: {UPSTREAM_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"  # it refuses to start without one (and so authenticates, as we do)
    )
    port = free_port()
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_PROXY": "*"}
    env.pop("DATABASE_URL", None)  # no LiteLLM database: its plain proxy, as in its own benchmarks
    proc = subprocess.Popen(
        [
            ARGS.litellm,
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        stdout=(WORK / "litellm.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=die_with_parent,
    )
    wait_port(port, proc, "litellm", work=WORK)
    return f"http://127.0.0.1:{port}", proc


class Target:
    def __init__(
        self, name: str, base: str, key: str, model: str, header: str | None, pids: tuple[int, ...] = ()
    ) -> None:
        self.name, self.base, self.key, self.model, self.header = name, base, key, model, header
        self.pids = pids  # the server's processes (their descendants too): its CPU per request


Result = tuple[list[float], list[float], float, int, float]


async def batch(target: Target, clients: int, total: int) -> Result:
    """``total`` requests from ``clients`` concurrent clients: latencies of the good answers,
    self-reported overhead (the gateway's header), wall seconds, failures. Every answer is checked."""
    latencies: list[float] = []
    reported: list[float] = []
    failures: list[str] = []
    todo = iter(range(total))
    body = {"model": target.model, "messages": PROMPT}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=target.base, headers={"Authorization": f"Bearer {target.key}"}, timeout=300, limits=limits
    ) as client:

        async def one_streamed() -> None:
            # TTFT: until the first chunk with content; the whole answer is still checked.
            for _ in todo:
                t0 = time.perf_counter()
                first: float | None = None
                parts: list[str] = []
                try:
                    async with client.stream(
                        "POST", "/v1/chat/completions", json={**body, "stream": True}
                    ) as response:
                        header = response.headers.get(target.header) if target.header else None
                        async for line in response.aiter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            chunk = json.loads(line[6:])
                            for choice in chunk.get("choices") or ():
                                piece = (choice.get("delta") or {}).get("content")
                                if piece:
                                    parts.append(piece)
                                    if first is None:
                                        first = (time.perf_counter() - t0) * 1000
                except httpx.HTTPError as exc:
                    failures.append(f"{type(exc).__name__}")
                    continue
                if response.status_code != 200 or "".join(parts) != ANSWER or first is None:
                    failures.append(f"{response.status_code} {''.join(parts)[:100]!r}")
                    continue
                latencies.append(first)
                if header:
                    reported.append(float(header))

        async def one_client() -> None:
            if ARGS.stream:
                await one_streamed()
                return
            for _ in todo:
                t0 = time.perf_counter()
                try:
                    response = await client.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as exc:  # e.g. a reset connection: counted, not fatal
                    failures.append(f"{type(exc).__name__}")
                    continue
                elapsed = (time.perf_counter() - t0) * 1000
                if (
                    response.status_code != 200
                    or response.json()["choices"][0]["message"]["content"] != ANSWER
                ):
                    failures.append(f"{response.status_code} {response.text[:200]}")
                    continue
                latencies.append(elapsed)
                if target.header and response.headers.get(target.header):
                    reported.append(float(response.headers[target.header]))

        cpu0 = cpu_seconds(target.pids)
        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - started
        cpu = cpu_seconds(target.pids) - cpu0
    if failures:
        print(f"  {target.name}: {len(failures)} failed, e.g. {failures[0]}", file=sys.stderr)
    return latencies, reported, wall, len(failures), cpu


def main() -> None:
    # The fake's ThreadingHTTPServer listens with a backlog of 5: at 32+ clients the direct
    # target's connections were reset. A real upstream's backlog, in this process only.
    ThreadingHTTPServer.request_queue_size = 1024
    server = FakeOpenAIServer(responder)
    server.start()
    key = setup_data(server)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        base, procs = start_conductor()
        # The fake's base_url ends in /v1 (what SDKs take); the load generator adds the full path.
        targets = [Target("direct", server.base_url.removesuffix("/v1"), UPSTREAM_KEY, "w0", None)]
        litellm = start_litellm(server.base_url) if "litellm" in ARGS.targets else None
        if litellm is not None:
            procs.append(litellm[1])
            targets.append(
                Target(
                    "litellm",
                    litellm[0],
                    LITELLM_KEY,
                    "fake",
                    "x-litellm-overhead-duration-ms",
                    (litellm[1].pid,),
                )
            )
        ours = tuple(proc.pid for proc in procs)
        targets += [
            Target("pool", base, key, "solo", "x-conductor-overhead-ms", ours),
            Target("mini", base, key, "conductor-mini", "x-conductor-overhead-ms", ours),
        ]
        wanted = set(ARGS.targets.split(","))
        targets = [target for target in targets if target.name in wanted]
        for target in targets:  # warm-up: imports, connections, first runs
            asyncio.run(batch(target, 2, 10))
        rounds: dict[tuple[str, int], list[Result]] = {}
        for clients in [int(c) for c in ARGS.clients.split(",")]:
            total = ARGS.requests or max(40, clients)
            # Every round interleaves all targets once more: the ratio column is the median of the
            # rounds' ratios, so one noisy minute on this shared machine does not decide it.
            for _ in range(max(1, ARGS.rounds)):
                for target in targets:
                    result = asyncio.run(batch(target, clients, total))
                    rounds.setdefault((target.name, clients), []).append(result)
                    lat = result[0] or [float("nan")]
                    print(f"c={clients} {target.name}: p50 {statistics.median(lat):.1f} ms", file=sys.stderr)
    finally:
        if ARGS.profile and procs:
            procs[0].send_signal(signal.SIGUSR1)
            time.sleep(3)  # merging the threads' profiles
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()
    print_table(targets, rounds)


def merged(parts: list[Result]) -> Result:
    """The rounds of one target and level as one batch: every latency, summed wall and CPU."""
    return (
        [v for part in parts for v in part[0]],
        [v for part in parts for v in part[1]],
        sum(part[2] for part in parts),
        sum(part[3] for part in parts),
        sum(part[4] for part in parts),
    )


def overhead_p50(results: dict[tuple[str, int], Any], name: str, clients: int) -> float | None:
    """p50 latency less the direct upstream's p50 at the same level (None without either)."""
    mine, direct = results.get((name, clients)), results.get(("direct", clients))
    if not mine or not mine[0] or not direct or not direct[0]:
        return None
    return float(statistics.median(mine[0]) - statistics.median(direct[0]))


def round_ratios(rounds: dict[tuple[str, int], list[Result]], name: str, clients: int) -> list[float]:
    """Each round's overhead p50 of ``name`` over LiteLLM's, measured in that same round."""
    ratios = []
    for i in range(len(rounds.get((name, clients), []))):
        one = {key: parts[i] for key, parts in rounds.items() if key[1] == clients and len(parts) > i}
        mine, lite = overhead_p50(one, name, clients), overhead_p50(one, "litellm", clients)
        if mine is not None and lite:
            ratios.append(mine / lite)
    return ratios


def print_table(targets: list[Target], rounds: dict[tuple[str, int], list[Result]]) -> None:
    """Each target and level over all its rounds; the ratio column from the rounds one by one."""
    results = {key: merged(parts) for key, parts in rounds.items()}
    load = os.getloadavg()
    print(
        f"\nmode: {ARGS.mode}, server {ARGS.server}, run threads {ARGS.run_threads}, daphne processes {ARGS.processes}, answer words {ARGS.answer_words}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    if ARGS.stream:
        print(
            f"streamed (chunk delay {ARGS.chunk_delay_ms:g} ms): p50/p99 and overhead are time to the first content chunk (TTFT)\n"
        )
    print(
        "| clients | target | requests | p50 ms | p99 ms | overhead p50 / p95 / p99 ms | "
        "own header p50 ms | req/s | server CPU ms/req | p50 overhead ÷ LiteLLM's |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for clients in sorted({c for _, c in results}):
        direct = results.get(("direct", clients))
        # Without the direct target (e.g. one target under a profiler) overhead is latency.
        direct_p50 = statistics.median(direct[0]) if direct and direct[0] else 0.0
        for target in targets:
            lat, reported, wall, failed, cpu = results[(target.name, clients)]
            if not lat:
                print(f"| {clients} | {target.name} | 0 | - | - | - | - | - | - | - |")
                continue
            over = [v - direct_p50 for v in lat]
            own = f"{statistics.median(reported):.1f}" if reported else "-"
            cpu_ms = f"{1000 * cpu / (len(lat) + failed):.1f}" if target.pids else "-"
            ratios = (
                round_ratios(rounds, target.name, clients) if target.name not in ("direct", "litellm") else []
            )
            ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
            if len(ratios) > 1:
                ratio += " (rounds: " + ", ".join(f"{r:.2f}" for r in ratios) + ")"
            print(
                f"| {clients} | {target.name} | {len(lat)}{f' ({failed} failed)' if failed else ''} | {statistics.median(lat):.1f} | {pct(lat, 0.99):.1f} | "
                f"{statistics.median(over):.1f} / {pct(over, 0.95):.1f} / {pct(over, 0.99):.1f} | {own} | "
                f"{len(lat) / wall:.1f} | {cpu_ms} | {ratio} |"
            )


if __name__ == "__main__":
    main()
