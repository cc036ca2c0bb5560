"""``python -m conductor_web.serve``: several daphne processes on one address (issue 15).

The settings refuse more than one process on the embedded backends (each process would have its
own in-memory channel layer and its own SQLite writer queue). In the distributed mode the
supervisor starts ``WEB_PROCESSES`` daphne children that share one port, replaces a child that
dies, and stops them all on SIGTERM.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.core import ROOT, subprocess_env

pytestmark = pytest.mark.runtime


def _embedded_env(**extra: str) -> dict[str, str]:
    env = subprocess_env(**extra)
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("processes", ["2", "8"])
def test_more_than_one_process_is_refused_on_the_embedded_backends(processes: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conductor_web.serve", "--port", "0"],
        cwd=ROOT,
        env=_embedded_env(WEB_PROCESSES=processes),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    # The refusal names the setting and what it needs, and nothing was started.
    assert f"WEB_PROCESSES={processes} needs DATABASE_URL=postgres" in out.stderr
    assert "REDIS_URL" in out.stderr
    assert "daphne processes on" not in out.stderr


def test_zero_processes_is_refused() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=_embedded_env(WEB_PROCESSES="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "WEB_PROCESSES must be at least 1, got 0" in out.stderr


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _healthz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_two_processes_share_one_port_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "conductor_web.serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=subprocess_env(WEB_PROCESSES="2"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        first = _wait_for(
            "two daphne children", lambda: (kids := _children(proc.pid)) and len(kids) == 2 and kids
        )
        # Both children are listening on the one port: each answers (the kernel spreads
        # connections over their sockets; a connection waits in a backlog until its child is up).
        assert all(_healthz(port) in (200, 503) for _ in range(6))
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        replaced = _wait_for(
            "a replacement child",
            lambda: (kids := _children(proc.pid)) and len(kids) == 2 and victim not in kids and kids,
        )
        assert len(replaced - first) == 1
        assert all(_healthz(port) in (200, 503) for _ in range(6))
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
    text = (tmp_path / "serve.log").read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert f"daphne process {victim} (slot" in text and "starting another" in text
    # SIGTERM stopped every child: none is left running.
    for kid in first | replaced:
        assert not Path(f"/proc/{kid}").exists() or "zombie" in Path(f"/proc/{kid}/status").read_text()
