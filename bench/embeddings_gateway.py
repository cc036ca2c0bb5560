"""``/v1/embeddings`` overhead (issue 45): the upstream directly vs this project, one run.

Not a test: prints the table for bench/API.md. One fast loopback fake OpenAI upstream
(``tests.fakes.openai_server``: deterministic vectors at once) answers every call. One load
generator (httpx, asyncio) sends ``POST /v1/embeddings`` (two short inputs, ``float``) at each
client level, interleaved target by target:

- ``direct``: the upstream itself (the floor);
- ``litellm``: the LiteLLM proxy in front of it, if ``.venv-bench/bin/litellm`` exists;
- ``embed``: this project, ``model: embed`` (a one-worker embedding pool): key, scope, limits,
  budget, the input policy (a redacting PII check, so the gate does real work), one audit row.

Overhead is client latency less the direct upstream's median at the same level. Kept apart from
``gateway.py`` (the chat/TTFT bench) so each stays one idea; it shares its live set-up.

    .venv/bin/python bench/embeddings_gateway.py                    # embedded: SQLite, daphne
    .venv/bin/python bench/embeddings_gateway.py --clients 1,8 --requests 100
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_embed_bench \\
      REDIS_URL=redis://127.0.0.1:6379/1 .venv/bin/python bench/embeddings_gateway.py --mode distributed
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _live_setup import cpu_seconds, die_with_parent, pct, prepare, wait_port  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--mode", choices=["embedded", "distributed"], default="embedded")
parser.add_argument("--clients", default="1,8,32")
parser.add_argument(
    "--requests", type=int, default=0, help="requests per target and level (default: max(60, 2c))"
)
parser.add_argument("--litellm", default=str(ROOT / ".venv-bench" / "bin" / "litellm"))
ARGS = parser.parse_args()

WORK = Path("/tmp/conductor_embeddings_bench")
prepare(mode=ARGS.mode, work=WORK, name="embeddings_bench", sqlite_file=WORK / "db.sqlite3")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.api.services import apikey_create  # noqa: E402
from apps.governance.services import membership_set, team_create  # noqa: E402
from apps.policies.services import policy_get_or_create, policy_publish, policy_save_draft  # noqa: E402
from apps.workers.services import pool_create, provider_create, worker_create  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402
from tests.fixtures.core import free_port  # noqa: E402

UPSTREAM_KEY = "sk-bench-0000"
LITELLM_KEY = f"sk-litellm-bench-{uuid.uuid4().hex}"
INPUTS = ["The quick brown fox jumps over the lazy dog.", "Pack my box with five dozen liquor jugs."]


def setup_data(server: FakeOpenAIServer) -> str:
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("embbench", password=uuid.uuid4().hex)
    team = team_create(actor=None, slug="embbench", name="Embeddings bench")
    membership_set(actor=None, team=team, user=user, role="admin")
    provider = provider_create(
        actor=None, slug="emb-fake", name="Instant fake", kind="openai_compatible", team=team,
        base_url=server.base_url, api_key=UPSTREAM_KEY,
    )  # fmt: skip
    worker = worker_create(
        actor=None,
        provider=provider,
        slug="embedder",
        display_name="Embedder",
        model_name="text-embedding-3-small",
    )
    pool_create(actor=None, team=team, slug="embed", name="Embed", workers=[worker], default_worker=worker)
    policy = policy_get_or_create(actor=None, team=team)
    spec = {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}}
    policy_publish(actor=None, version=policy_save_draft(actor=None, policy=policy, spec=spec))
    key = apikey_create(
        actor=None,
        team=team,
        name="bench",
        principal=user,
        requests_per_minute=100_000,
        tokens_per_minute=100_000_000,
    )
    return key.plaintext


def start_daphne() -> tuple[str, subprocess.Popen[bytes]]:
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
    log = (WORK / "daphne.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    wait_port(port, proc, "daphne", work=WORK)
    return f"http://127.0.0.1:{port}", proc


def start_litellm(upstream: str) -> tuple[str, subprocess.Popen[bytes]] | None:
    if not Path(ARGS.litellm).exists():
        print(f"no LiteLLM at {ARGS.litellm}: its row is left out", file=sys.stderr)
        return None
    config = WORK / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: embed\n    litellm_params:\n      model: openai/text-embedding-3-small\n"
        f"      api_base: {upstream}\n      api_key: {UPSTREAM_KEY}\n"
        f"litellm_settings:\n  telemetry: false\ngeneral_settings:\n  master_key: {LITELLM_KEY}\n"
    )
    port = free_port()
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_PROXY": "*"}
    env.pop("DATABASE_URL", None)
    cmd = [
        ARGS.litellm,
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    log = (WORK / "litellm.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent)
    wait_port(port, proc, "litellm", work=WORK)
    return f"http://127.0.0.1:{port}", proc


Result = tuple[list[float], float, int, float]


async def batch(base: str, key: str, model: str, pids: tuple[int, ...], clients: int, total: int) -> Result:
    """Latencies of the good answers (each checked: two vectors), wall seconds, failures, CPU."""
    latencies: list[float] = []
    failures: list[str] = []
    todo = iter(range(total))
    body = {"model": model, "input": INPUTS, "encoding_format": "float"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120, limits=limits
    ) as client:

        async def one_client() -> None:
            for _ in todo:
                t0 = time.perf_counter()
                try:
                    response = await client.post("/v1/embeddings", json=body)
                except httpx.HTTPError as exc:
                    failures.append(type(exc).__name__)
                    continue
                elapsed = (time.perf_counter() - t0) * 1000
                if response.status_code != 200 or len(response.json()["data"]) != len(INPUTS):
                    failures.append(f"{response.status_code} {response.text[:200]}")
                    continue
                latencies.append(elapsed)

        cpu0 = cpu_seconds(pids)
        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - started
        cpu = cpu_seconds(pids) - cpu0
    if failures:
        print(f"  {model}: {len(failures)} failed, e.g. {failures[0]}", file=sys.stderr)
    return latencies, wall, len(failures), cpu


def main() -> None:
    ThreadingHTTPServer.request_queue_size = 1024  # the fake's backlog of 5 resets at 32 clients
    server = FakeOpenAIServer()
    server.start()
    key = setup_data(server)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        base, daphne = start_daphne()
        procs.append(daphne)
        targets = [("direct", server.origin, UPSTREAM_KEY, "text-embedding-3-small", ())]
        litellm = start_litellm(server.base_url)
        if litellm is not None:
            procs.append(litellm[1])
            targets.append(("litellm", litellm[0], LITELLM_KEY, "embed", (litellm[1].pid,)))
        targets.append(("embed", base, key, "embed", (daphne.pid,)))
        for _, *target in targets:  # warm-up: imports, connections, caches
            asyncio.run(batch(*target, 2, 20))  # type: ignore[arg-type]
        results: dict[tuple[str, int], Result] = {}
        for clients in [int(c) for c in ARGS.clients.split(",")]:
            total = ARGS.requests or max(60, 2 * clients)
            for name, *target in targets:
                results[(name, clients)] = asyncio.run(batch(*target, clients, total))  # type: ignore[arg-type]
                print(
                    f"c={clients} {name}: p50 {statistics.median(results[(name, clients)][0]):.1f} ms",
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
    load = os.getloadavg()
    print(f"\nmode: {ARGS.mode}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print(
        "| clients | target | requests | p50 ms | p99 ms | overhead p50 / p95 ms | req/s | server CPU ms/req |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for clients in sorted({c for _, c in results}):
        direct_p50 = statistics.median(results[("direct", clients)][0])
        for name, *target in targets:
            lat, wall, failed, cpu = results[(name, clients)]
            if not lat:
                print(f"| {clients} | {name} | 0 | - | - | - | - | - |")
                continue
            over = [v - direct_p50 for v in lat]
            cpu_ms = f"{1000 * cpu / (len(lat) + failed):.1f}" if target[3] else "-"
            print(
                f"| {clients} | {name} | {len(lat)}{f' ({failed} failed)' if failed else ''} | "
                f"{statistics.median(lat):.1f} | {pct(lat, 0.99):.1f} | "
                f"{statistics.median(over):.1f} / {pct(over, 0.95):.1f} | {len(lat) / wall:.1f} | {cpu_ms} |"
            )


if __name__ == "__main__":
    main()
