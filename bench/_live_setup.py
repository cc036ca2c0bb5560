"""Shared set-up of the benchmarks that start a live product (api_overhead.py, gateway.py), and
the CPU reading they share with floor.py and ws_latency.py.

Call ``prepare(...)`` before ``django.setup()``: it writes a settings module for the bench's own
processes (daphne, Celery) and gives them a fresh database: a new SQLite file in the embedded
mode; in the distributed mode the PostgreSQL database DATABASE_URL names is dropped and recreated
(its name must end in ``_bench``, so a real database is never touched).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
_held: list[IO[str]] = []  # the work folder's lock, held for the life of this process


def die_with_parent() -> None:
    """``preexec_fn`` of a bench's child (daphne, Celery, LiteLLM): SIGTERM when the bench dies,
    however it dies. A daphne left behind by a killed bench went on claiming queued runs from the
    database the next bench recreated at the same path, and its CPU skewed that bench's figures
    (bench/API.md, tenth pass)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cpu_seconds(roots: Iterable[int]) -> float:
    """User + system CPU of ``roots`` and every live descendant (from /proc; 0 without it)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    wanted = set(roots)
    frontier = list(wanted)
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in wanted:
                wanted.add(child)
                frontier.append(child)
    return sum(times.get(pid, 0.0) for pid in wanted)


def _hold(work: Path) -> None:
    """One live bench per work folder: a second one refuses to start instead of recreating the
    database under the first."""
    lock = (work / ".lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another bench is running in {work}: wait for it (or stop it) first")
    _held.append(lock)
    # A plain SIGTERM (`timeout`, a CI stop) unwinds like Ctrl-C: the bench's own clean-up runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def prepare(*, mode: str, work: Path, name: str, sqlite_file: Path, extra_settings: str = "") -> None:
    work.mkdir(exist_ok=True)
    _hold(work)
    (work / f"{name}_settings.py").write_text(
        "from conductor_web.settings.local import *  # noqa\n"
        "DEBUG = False\n"
        f"CELERY_TASK_DEFAULT_QUEUE = '{name}'\n"
        "LOGGING['root']['level'] = 'WARNING'\n" + extra_settings
    )
    sys.path.insert(0, str(work))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(work), str(ROOT), os.environ.get("PYTHONPATH", "")])
    os.environ["DJANGO_SETTINGS_MODULE"] = f"{name}_settings"
    # The fake provider listens on its own loopback address (tests/fakes); egress to it is
    # opened, like the test settings do, and to nothing else.
    os.environ.setdefault("EGRESS_ALLOW", "127.0.13.1")
    if mode == "embedded":
        for var in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
            os.environ.pop(var, None)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{sqlite_file}{suffix}").unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{sqlite_file}"
        return
    missing = [v for v in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL") if not os.environ.get(v)]
    if missing:
        sys.exit(f"--mode distributed needs {', '.join(missing)}")
    recreate_database(os.environ["DATABASE_URL"])


def recreate_database(database_url: str) -> None:
    """Drop and create the PostgreSQL database ``database_url`` names; only a ``…_bench`` one."""
    import psycopg

    url = urlparse(database_url)
    db = url.path.lstrip("/")
    if not db.endswith("_bench"):
        sys.exit("use a database whose name ends with _bench: it is dropped and recreated")
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')


def wait_port(
    port: int, proc: subprocess.Popen[bytes], what: str, *, work: Path | None = None, timeout: float = 120
) -> None:
    """Until something listens on 127.0.0.1:``port``; exits naming ``what`` (and where its log
    is) if ``proc`` ends first or the port stays closed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"{what} exited early" + (f" (see {work})" if work else ""))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{what} did not start")


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
