"""The floor under a distributed run on this machine: what daphne and Celery cost with no project
code at all, and the runs/s ceiling that leaves on these two cores.

Not a test: prints figures for bench/API.md (issue #15). A distributed ``/v1`` run crosses at least
an HTTP request served by daphne and a Celery task through the broker, before any of this
project's work (authentication, policy, the run's rows, its audit events, the model call). This
measures those two parts alone, at the same concurrency as ``bench/gateway.py``:

- ``daphne``: a bare ASGI app (``bench/floor_parts.py``) answering a fixed chat completion to
  ``POST /v1/chat/completions`` from the same kind of load generator (httpx, asyncio);
- ``celery``: a no-op task with the project's run settings (JSON, late acks, prefetch 1, a
  16-thread pool) published from 32 threads to RabbitMQ and consumed by one worker.

CPU is read from /proc for each process (daphne, the worker, RabbitMQ's ``beam.smp``) and from
``getrusage`` for this one (the load generator and the publishers). The ceiling is the machine's
cores divided by the CPU of one request plus one task: runs/s that no implementation on daphne and
Celery could pass here, whatever it did per run (it leaves out PostgreSQL and every line of the
product).

    CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// .venv/bin/python bench/floor.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _live_setup import cpu_seconds, die_with_parent  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--clients", type=int, default=32)
parser.add_argument("--requests", type=int, default=3000)
parser.add_argument("--tasks", type=int, default=3000)
parser.add_argument("--threads", type=int, default=16, help="the worker's thread pool (RUN_THREAD_WORKERS)")
ARGS = parser.parse_args()
BROKER = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
QUEUE = f"conductor_floor_bench_{uuid.uuid4().hex[:8]}"
os.environ["FLOOR_QUEUE"] = QUEUE
os.environ["CELERY_BROKER_URL"] = BROKER
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")])}


def pids_named(fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if fragment in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=20)


def p50(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def spread(total: int, threads: int, call: Callable[[], None]) -> float:
    """``call()`` ``total`` times from ``threads`` threads; the wall seconds it took."""
    counts = iter(range(total))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if next(counts, None) is None:
                    return
            call()

    started = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - started


async def load(url: str, clients: int, total: int) -> tuple[float, int, list[float]]:
    body = {"model": "floor", "messages": [{"role": "user", "content": "What is six times seven?"}]}
    todo = iter(range(total))
    failures = 0
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one() -> None:
            nonlocal failures
            for _ in todo:
                t0 = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                latencies.append(1000 * (time.perf_counter() - t0))
                if response.status_code != 200 or response.json()["choices"][0]["message"]["content"] != "42":
                    failures += 1

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        return time.perf_counter() - started, failures, latencies


def measure_daphne() -> dict[str, float]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "floor_parts:app"],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        asyncio.run(load(url, ARGS.clients, 200))  # warm
        server0, own0 = cpu_seconds([proc.pid]), own_cpu()
        wall, failures, latencies = asyncio.run(load(url, ARGS.clients, ARGS.requests))
        server, own = cpu_seconds([proc.pid]) - server0, own_cpu() - own0
    finally:
        stop(proc)
    n = ARGS.requests
    return {
        "per_s": n / wall,
        "p50_ms": p50(latencies),
        "server_ms": 1000 * server / n,
        "client_ms": 1000 * own / n,
        "failures": failures,
    }


def queue_depth(name: str) -> tuple[int, int]:
    from kombu import Connection

    with Connection(BROKER) as conn:
        ok = conn.default_channel.queue_declare(name, passive=True)
        return int(ok.message_count), int(ok.consumer_count)


def measure_celery() -> dict[str, float]:
    from floor_parts import celery_app, noop

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "floor_parts:celery_app",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            str(ARGS.threads),
            "-Q",
            QUEUE,
            "-l",
            "warning",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    try:
        noop.apply_async(args=("warm",))
        deadline = time.monotonic() + 60
        while queue_depth(QUEUE) != (0, 1):
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not start consuming")
            time.sleep(0.2)
        rabbit = pids_named("beam.smp")

        def publish() -> None:
            # The queue exists (the worker declared it): no declaration per message, the
            # cheapest publish Celery makes.
            noop.apply_async(args=(str(uuid.uuid4()),), declare=[])

        worker0, rabbit0, own0 = cpu_seconds([worker.pid]), cpu_seconds(rabbit), own_cpu()
        started = time.perf_counter()
        spread(ARGS.tasks, ARGS.clients, publish)
        publish_cpu = own_cpu() - own0
        while queue_depth(QUEUE)[0]:
            time.sleep(0.05)
        # The last messages in flight are acked within a few ms; the worker's CPU settles.
        time.sleep(0.5)
        drained = time.perf_counter() - started - 0.5
        worker_cpu, rabbit_cpu = cpu_seconds([worker.pid]) - worker0, cpu_seconds(rabbit) - rabbit0
    finally:
        stop(worker)
        celery_app.connection_for_write().default_channel.queue_delete(QUEUE)
    n = ARGS.tasks
    return {
        "per_s": n / drained,
        "publish_ms": 1000 * publish_cpu / n,
        "worker_ms": 1000 * worker_cpu / n,
        "broker_ms": 1000 * rabbit_cpu / n,
    }


def measure_model_call() -> dict[str, float]:
    """The instant model call every run makes: the OpenAI SDK (as a worker calls it) against the
    fake upstream the benches use (``tests.fakes.openai_server``, its own process here), from the
    worker's thread count."""
    import openai

    upstream = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.openai_server"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    try:
        assert upstream.stdout is not None
        base_url = upstream.stdout.readline().decode().strip()
        client = openai.OpenAI(base_url=base_url, api_key="sk-floor", max_retries=0)
        messages = [{"role": "user", "content": "What is six times seven?"}]
        for _ in range(50):  # warm
            client.chat.completions.create(model="w0", messages=messages)  # type: ignore[arg-type]

        def call() -> None:
            answer = client.chat.completions.create(model="w0", messages=messages)  # type: ignore[arg-type]
            assert answer.choices[0].message.content

        own0, server0 = own_cpu(), cpu_seconds([upstream.pid])
        wall = spread(ARGS.requests, ARGS.threads, call)
        sdk, server = own_cpu() - own0, cpu_seconds([upstream.pid]) - server0
        one: list[float] = []
        for _ in range(200):  # one caller alone: the call's latency with nothing else running
            t0 = time.perf_counter()
            client.chat.completions.create(model="w0", messages=messages)  # type: ignore[arg-type]
            one.append(1000 * (time.perf_counter() - t0))
    finally:
        stop(upstream)
    n = ARGS.requests
    return {
        "per_s": n / wall,
        "sdk_ms": 1000 * sdk / n,
        "upstream_ms": 1000 * server / n,
        "alone_p50_ms": p50(one),
    }


def main() -> None:
    cores = os.cpu_count() or 1
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {cores} cores", flush=True)
    d = measure_daphne()
    c = measure_celery()
    m = measure_model_call()
    print()
    print("| part | per second | CPU ms per unit, by process | p50 ms |")
    print("|---|---:|---|---:|")
    print(
        f"| daphne, bare ASGI answer, {ARGS.clients} clients | {d['per_s']:.0f} req/s | daphne "
        f"{d['server_ms']:.2f}, load generator {d['client_ms']:.2f} | {d['p50_ms']:.1f} |"
    )
    print(
        f"| Celery no-op task, {ARGS.clients} publishing threads, {ARGS.threads}-thread worker | "
        f"{c['per_s']:.0f} tasks/s | publisher {c['publish_ms']:.2f}, worker {c['worker_ms']:.2f}, "
        f"RabbitMQ {c['broker_ms']:.2f} | - |"
    )
    print(
        f"| the model call: OpenAI SDK → the bench's fake upstream, {ARGS.threads} threads | "
        f"{m['per_s']:.0f} calls/s | SDK {m['sdk_ms']:.2f}, fake upstream {m['upstream_ms']:.2f} | "
        f"{m['alone_p50_ms']:.1f} (one caller alone) |"
    )
    floor = d["server_ms"] + d["client_ms"] + c["publish_ms"] + c["worker_ms"] + c["broker_ms"]
    print()
    print(
        f"one request + one task: {floor:.2f} ms of CPU; on {cores} cores at most "
        f"{1000 * cores / floor:.0f} runs/s with no project code, no PostgreSQL and no model call"
    )
    floor += m["sdk_ms"] + m["upstream_ms"]
    print(
        f"with the model call: {floor:.2f} ms; at most {1000 * cores / floor:.0f} runs/s "
        "(still no project code and no PostgreSQL)"
    )
    if d["failures"]:
        print(f"daphne: {d['failures']} failed requests", file=sys.stderr)


if __name__ == "__main__":
    main()
