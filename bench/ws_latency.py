"""Event latency from the run sink to websocket viewers, on a live daphne, per channel layer.

Not a test: prints figures for bench/RUNS.md. A run executes inside daphne (embedded thread
executor) against a loopback fake OpenAI server that streams; N viewers watch it over
``/ws/runs/<id>/``. Latency per (viewer, event) = receive time - the event's ``ts`` (stamped by
the engine when it emits, so it includes the sink's transaction: RunEvent + Step/Run rows +
audit row, then the channel-layer publish and the websocket hop).

    .venv/bin/python bench/ws_latency.py --layer memory --viewers 1,10,100
    REDIS_URL=redis://127.0.0.1:6379/1 .venv/bin/python bench/ws_latency.py --layer redis --viewers 1,10,100

Uses its own SQLite database (``--db``, migrated on start) unless DATABASE_URL is set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _live_setup import cpu_seconds  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--layer", choices=["memory", "redis", "redis-pubsub"], default="memory")
parser.add_argument("--viewers", default="1,10,100")
parser.add_argument("--db", default="sqlite:////tmp/conductor_ws_bench.sqlite3")
parser.add_argument("--chunks", type=int, default=60, help="streamed chunks per worker answer")
parser.add_argument("--chunk-delay", type=float, default=0.01)
parser.add_argument(
    "--burst",
    type=int,
    default=0,
    help="instead: open this many sockets at once on --runs runs; time each handshake (connect to snapshot)",
)
parser.add_argument("--plan-delay", type=float, default=3.0, help="seconds the conductor takes to plan")
parser.add_argument(
    "--access-change-every",
    type=float,
    default=0.0,
    help="move the access version every this many seconds while viewers watch (each viewer then "
    "re-checks its session and access on its next batch: apps.runs.ws_access); 0: never",
)
parser.add_argument("--backlog", type=int, default=2048, help="daphne's listen backlog")
parser.add_argument("--runs", type=int, default=5, help="runs the --burst sockets spread over")
parser.add_argument(
    "--connect-timeout",
    type=int,
    default=5,
    help="daphne's --websocket_connect_timeout (its default: 5 s to accept a handshake)",
)
parser.add_argument(
    "--distinct-users",
    action="store_true",
    help="each viewer signs in as a user of its own (else all share one session: their re-checks "
    "of one access change are one shared job)",
)
ARGS = parser.parse_args()

os.environ["DJANGO_SETTINGS_MODULE"] = "conductor_web.settings.local"
os.environ.setdefault("DATABASE_URL", ARGS.db)
os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
os.environ.pop("CELERY_BROKER_URL", None)  # execute inside daphne, whatever the layer
if ARGS.layer == "memory":
    os.environ.pop("REDIS_URL", None)
elif not os.environ.get("REDIS_URL"):
    sys.exit("--layer redis needs REDIS_URL")
if ARGS.layer == "redis-pubsub":
    # channels-redis' pub/sub layer (one PUBLISH per group_send, one subscription per process),
    # through a throwaway settings module: the project settings stay untouched.
    Path("/tmp/conductor_ws_bench_settings.py").write_text(
        "from conductor_web.settings.local import *  # noqa\n"
        "CHANNEL_LAYERS = {'default': {'BACKEND': 'channels_redis.pubsub.RedisPubSubChannelLayer',"
        " 'CONFIG': {'hosts': [REDIS_URL]}}}\n"
    )
    sys.path.insert(0, "/tmp")
    os.environ["PYTHONPATH"] = "/tmp" + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["DJANGO_SETTINGS_MODULE"] = "conductor_ws_bench_settings"
os.environ.setdefault("DEBUG", "false")
# The fake provider listens on its own loopback address (tests/fakes); egress to it is opened,
# like the test settings do, and to nothing else.
os.environ.setdefault("EGRESS_ALLOW", "127.0.13.1")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import websockets  # noqa: E402
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model  # noqa: E402
from django.contrib.sessions.backends.db import SessionStore  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.governance.models import AccessVersion  # noqa: E402
from apps.governance.services import membership_set, team_create  # noqa: E402
from tests.factories.workers import build_openai_compatible_pool  # noqa: E402
from tests.fakes.base import FakeReply  # noqa: E402
from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402
from tests.fixtures.core import free_port  # noqa: E402

TERMINAL = {"succeeded", "failed", "blocked", "cancelled", "timed_out"}
PLAN = {
    "model_id": [0, 1, 2],
    "subtasks": ["Outline.", "Solve.", "Check and answer."],
    "access_list": [[], [0], [0, 1]],
}


def setup_data(server: FakeOpenAIServer) -> tuple[Any, Any]:
    call_command("migrate", verbosity=0)
    tag = str(int(time.time()))
    user = get_user_model().objects.create_user(f"wsbench{tag}", password="x")
    team = team_create(actor=None, slug=f"wsbench-{tag}", name=f"WS bench {tag}")
    membership_set(actor=None, team=team, user=user, role="member")
    pool, _, _, _ = build_openai_compatible_pool(
        team=team,
        base_url=server.base_url,
        api_key="sk-bench-0000",
        slug=f"wsb-{tag}",
        workers=[
            {"slug": f"wsb-{tag}-{i}", "display_name": f"W{i}", "model_name": f"w{i}"} for i in range(3)
        ],
        conductor={"slug": f"wsb-{tag}-c", "display_name": "C", "model_name": "conductor"},
        pool_name="Bench pool",
        provider_name="Bench fake",
    )
    return user, pool


def session_cookie(user: Any) -> str:
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return store.session_key or ""


def start_run(base: str, cookie: str, pool: Any) -> str:
    with httpx.Client(
        base_url=base, cookies={"sessionid": cookie}, follow_redirects=False, timeout=30
    ) as client:
        page = client.get("/playground/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text[:500]
        response = client.post(
            "/playground/",
            data={
                "csrfmiddlewaretoken": token.group(1),
                "prompt": "bench",
                "strategy": "conductor-mini",
                "pool": str(pool.pk),
            },
            headers={"Referer": base + "/playground/"},
        )
        assert response.status_code == 302, response.text[:2000]
        return response.headers["location"].split("run=")[1].split("&")[0]


async def viewer(
    url: str, cookie: str, origin: str, ready: asyncio.Event, samples: list[float], seqs: list[list[int]]
) -> None:
    async with websockets.connect(
        url, additional_headers={"Cookie": f"sessionid={cookie}", "Origin": origin}, max_size=None
    ) as ws:
        snapshot = json.loads(await ws.recv())
        assert snapshot["type"] == "snapshot"
        mine: list[int] = []
        seqs.append(mine)
        ready.set()
        while True:
            event = json.loads(await ws.recv())
            samples.append(time.time() - float(event["ts"]))
            mine.append(event["seq"])
            if event["type"] == "run.finished":
                return


def viewer_cookies(user: Any, cookie: str, n: int) -> list[str]:
    if not ARGS.distinct_users:
        return [cookie] * n
    team = user.memberships.get().team
    tag = f"{int(time.time())}{random.randrange(1000)}"
    cookies = []
    for i in range(n):
        other = get_user_model().objects.create_user(f"wsv{tag}-{i}", password="x")
        membership_set(actor=None, team=team, user=other, role="member")
        cookies.append(session_cookie(other))
    return cookies


async def measure(base: str, cookie: str, pool: Any, n: int, user: Any) -> dict[str, Any]:
    cookies = await asyncio.to_thread(viewer_cookies, user, cookie, n)  # before the run's clock starts
    run_id = await asyncio.to_thread(start_run, base, cookie, pool)
    url = base.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
    samples: list[float] = []
    seqs: list[list[int]] = []
    readies = [asyncio.Event() for _ in range(n)]
    tasks = [asyncio.create_task(viewer(url, cookies[i], base, readies[i], samples, seqs)) for i in range(n)]
    changes = 0

    async def change_access() -> None:
        # What a grant, a membership or a login does to the stamp (apps.governance.access_version).
        nonlocal changes
        await asyncio.gather(*(r.wait() for r in readies))
        while True:
            await asyncio.to_thread(
                AccessVersion.objects.filter(pk=1).update, stamp=random.randrange(1, 2**62)
            )
            changes += 1
            await asyncio.sleep(ARGS.access_change_every)

    changer = asyncio.create_task(change_access()) if ARGS.access_change_every > 0 else None
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    finally:
        if changer is not None:
            changer.cancel()
    ms = sorted(s * 1000 for s in samples)
    clean = all(s == sorted(set(s)) and s == list(range(s[0], s[-1] + 1)) for s in seqs)
    return {
        "viewers": n,
        "events_per_viewer": round(len(ms) / n),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        "max_ms": round(ms[-1], 2),
        "no_gaps_no_dupes": clean,
        **({"access_changes": changes} if ARGS.access_change_every > 0 else {}),
    }


async def burst_viewer(
    url: str, cookie: str, origin: str, out: dict[str, Any], settled: list[asyncio.Event]
) -> None:
    t0 = time.perf_counter()
    try:
        async with websockets.connect(
            url,
            additional_headers={"Cookie": f"sessionid={cookie}", "Origin": origin},
            max_size=None,
            open_timeout=120,
        ) as ws:
            snapshot = json.loads(await ws.recv())
            assert snapshot["type"] == "snapshot"
            out["handshake_s"] = time.perf_counter() - t0
            settled.pop().set()
            out["from_seq"] = snapshot["last_seq"]
            if snapshot["run"]["status"] in TERMINAL:
                out["events"] = []  # the run ended before this socket was in: the snapshot is all
                return
            seqs: list[int] = []
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 300))
                seqs.append(event["seq"])
                if event["type"] == "run.finished":
                    break
            out["events"] = seqs
    except Exception as exc:  # counted, not raised: the figure is how many made it
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
        if "handshake_s" not in out:
            settled.pop().set()


async def burst(base: str, cookie: str, pool: Any, n: int, runs: int, server_pid: int) -> dict[str, Any]:
    run_ids = [await asyncio.to_thread(start_run, base, cookie, pool) for _ in range(runs)]
    ws_base = base.replace("http://", "ws://")
    outs: list[dict[str, Any]] = [{} for _ in range(n)]
    # One event per socket, set when its handshake ended (snapshot or error): daphne's CPU time
    # from the first connect to then is the handshakes' (the runs are still planning).
    settled = [asyncio.Event() for _ in range(n)]
    everyone = list(settled)
    cpu0 = cpu_seconds([server_pid])
    t0 = time.perf_counter()
    viewers = asyncio.gather(
        *(
            burst_viewer(f"{ws_base}/ws/runs/{run_ids[i % runs]}/", cookie, base, outs[i], settled)
            for i in range(n)
        )
    )
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in everyone)), timeout=600)
    handshake_cpu = cpu_seconds([server_pid]) - cpu0
    await asyncio.wait_for(viewers, timeout=600)
    wall = time.perf_counter() - t0
    hs = sorted(o["handshake_s"] for o in outs if "handshake_s" in o)
    complete = [
        o
        for o in outs
        if "error" not in o
        and "events" in o
        and o["events"] == list(range(o["from_seq"] + 1, (o["events"] or [o["from_seq"]])[-1] + 1))
    ]
    return {
        "sockets": n,
        "runs": runs,
        "connected": len(hs),
        "failed": sum(1 for o in outs if "error" in o),
        "first_error": next((o["error"] for o in outs if "error" in o), None),
        "handshake_p50_s": round(statistics.median(hs), 3) if hs else None,
        "handshake_p95_s": round(hs[min(len(hs) - 1, int(len(hs) * 0.95))], 3) if hs else None,
        "handshake_max_s": round(hs[-1], 3) if hs else None,
        "every_event_to_the_end_no_gaps": len(complete),
        "of_which_joined_after_the_end": sum(1 for o in complete if not o["events"]),
        "server_cpu_ms_per_handshake": round(handshake_cpu * 1000 / n, 1),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    server = FakeOpenAIServer()
    server.start()
    words = [f"w{i} " for i in range(ARGS.chunks)]

    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == "conductor":
            # Long enough for 100 viewers to connect before the first counted event.
            return FakeReply(json.dumps(PLAN), delay=ARGS.plan_delay)
        return FakeReply("".join(words), chunks=words, chunk_delay=ARGS.chunk_delay)

    server.responder = respond
    user, pool = setup_data(server)
    cookie = session_cookie(user)
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = open(f"/tmp/ws_bench_daphne_{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            # The listen backlog (Twisted's default is 50) is what a burst of connects queues in.
            "-e",
            f"tcp:port={port}:interface=127.0.0.1:backlog={ARGS.backlog}",
            "--websocket_connect_timeout",
            str(ARGS.connect_timeout),
            "conductor_web.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        db = "postgresql" if "postgres" in os.environ["DATABASE_URL"] else "sqlite"
        print(f"layer={ARGS.layer} db={db} chunks/step={ARGS.chunks} chunk_delay={ARGS.chunk_delay}s")
        if ARGS.burst:
            print(json.dumps(asyncio.run(burst(base, cookie, pool, ARGS.burst, ARGS.runs, proc.pid))))
            return
        for n in [int(v) for v in ARGS.viewers.split(",")]:
            print(json.dumps(asyncio.run(measure(base, cookie, pool, n, user))))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # a thousand open sockets can outlast a polite stop
            proc.kill()
            proc.wait(10)
        server.stop()


if __name__ == "__main__":
    main()
