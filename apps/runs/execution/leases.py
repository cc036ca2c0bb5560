"""Leases: this process's executor identity, the runs it is executing and their heartbeat, and
the cancel token that notices a cancel request or a lost lease.

An executor id is ``<node>:<pid>:<nonce>``: a process on the same host can tell a dead owner
without waiting for its lease to expire (``_owner_is_dead``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.runs.models import Run, RunStatus
from apps.runs.sweeper import run_job

logger = logging.getLogger(__name__)

_identity: tuple[int, str] | None = None
_identity_lock = threading.Lock()
_inflight: set[str] = set()
_inflight_lock = threading.Lock()
_keepers: dict[str, tuple[int, threading.Thread]] = {}
_keeper_lock = threading.Lock()


def executor_id() -> str:
    """`<node>:<pid>:<nonce>` of this process; re-made after a fork. The node and pid let a
    process on the same host tell a dead owner without waiting for its lease to expire."""
    global _identity
    pid = os.getpid()
    identity = _identity
    if identity is None or identity[0] != pid:
        # Made once under a lock: two threads racing here (a run's and the lease keeper's) each
        # made a nonce, and the reaper then took the run from its own process as "an earlier
        # incarnation" (seen in test_killed_celery_worker_loses_no_run).
        with _identity_lock:
            if _identity is None or _identity[0] != pid:
                node = settings.RUN_EXECUTOR_NODE or socket.gethostname()
                _identity = (pid, f"{node}:{pid}:{uuid.uuid4().hex[:8]}")
            identity = _identity
    return identity[1]


def _owner_is_dead(owner: str) -> bool:
    """True only when the owner is provably gone: a process of this node that no longer exists."""
    parts = owner.split(":")
    if len(parts) < 3 or owner == executor_id():
        return False
    node, pid_text = ":".join(parts[:-2]), parts[-2]
    if node != _node() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True  # our pid but another nonce: an earlier incarnation that re-used the pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _track(run_id: str, running: bool) -> None:
    with _inflight_lock:
        if running:
            _inflight.add(run_id)
        else:
            _inflight.discard(run_id)


def heartbeat() -> int:
    """Push the lease expiry of every run this process is executing. Returns how many."""
    with _inflight_lock:
        ids = list(_inflight)
    if not ids:
        return 0
    return Run.objects.filter(pk__in=ids, lease_owner=executor_id(), status=RunStatus.RUNNING).update(
        lease_expires_at=timezone.now() + timedelta(seconds=float(settings.RUN_LEASE_S))
    )


def _node() -> str:
    return settings.RUN_EXECUTOR_NODE or socket.gethostname()


def _ensure_thread(name: str, target: Callable[[], None]) -> None:
    pid = os.getpid()
    current = _keepers.get(name)
    if current is not None and current[0] == pid and current[1].is_alive():
        return
    thread = threading.Thread(target=target, daemon=True, name=f"run-{name}")
    _keepers[name] = (pid, thread)
    thread.start()


def _tick(job: Callable[[], object], interval: float, what: str) -> None:
    while True:
        run_job(job, f"run {what} tick")
        time.sleep(interval)


def _heartbeat_loop() -> None:
    _tick(heartbeat, max(0.2, float(settings.RUN_LEASE_S) / 3), "lease heartbeat")


def start_heartbeat() -> None:
    """The heartbeat thread of this process (``start_lease_keeper`` without the reaper): wherever
    runs execute (thread pool, Celery, a request's thread, tests)."""
    with _keeper_lock:
        _ensure_thread("heartbeat", _heartbeat_loop)


class DbCancelToken:
    """The engine's CancelToken backed by `Run.cancel_requested` and the lease, read at most every
    `interval` s."""

    def __init__(
        self, run_id: UUID | str, interval: float = 0.5, owner: str | None = None, *, claimed: bool = False
    ) -> None:
        self.run_id = run_id
        self.owner = owner if owner is not None else executor_id()
        self.lease_lost = False
        self.interval = interval
        self._cancelled = False
        # ``claimed``: the run was just claimed, a claim that checked it was neither cancelled nor
        # taken, so the first read is due one interval from now (a pass-through ends before it).
        self._checked = time.monotonic() if claimed else 0.0
        self._lock = threading.Lock()
        self._owner = threading.get_ident()

    def cancel(self) -> None:
        self._cancelled = True

    def is_cancelled(self) -> bool:
        if self._cancelled:
            return True
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.interval:
                return False
            self._checked = now
        try:
            row = (
                Run.objects.filter(pk=self.run_id).values("cancel_requested", "status", "lease_owner").first()
            )
        finally:
            # Only an engine helper thread (short-lived) gives its connection back; the run's own
            # thread (a pool thread, a Celery thread) keeps it for the run's next query.
            if (
                threading.get_ident() != self._owner
                and threading.current_thread() is not threading.main_thread()
            ):
                connection.close()
        if (
            row is None
            or row["cancel_requested"]
            or row["status"] not in (RunStatus.QUEUED, RunStatus.RUNNING)
        ):
            # Deleted, cancel requested, or already ended by the sweep: stop working on it.
            self._cancelled = True
        elif row["lease_owner"] != self.owner:
            # Our lease was taken over (this process stalled past its expiry): stop, silently.
            self.lease_lost = True
            self._cancelled = True
        return self._cancelled
