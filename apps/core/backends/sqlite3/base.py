"""Django's SQLite backend, with this process's writers queued on a lock instead of SQLite's sleeps.

SQLite has one writer per database file; a transaction here starts with ``BEGIN IMMEDIATE``
(``transaction_mode``), which takes that writer lock at once. A second writer does not wait in a
queue: SQLite's busy handler retries it after sleeps of 1, 2, 5, 10 … up to 100 ms, so a writer
that could have gone 1 ms after the first one committed often went tens of milliseconds later.
At 8 concurrent ``/v1`` clients that put p95 at 0.7 s and p99 at 1.5 s for runs that take 30 ms
(bench/API.md). Here the threads of one process queue on one lock per database file, taken just
before ``BEGIN`` and released at commit, rollback or close, so the next writer starts as soon as
the lock is free. Other processes (a management command beside the server) still meet SQLite's
busy timeout, and a thread that cannot get the lock within it goes on to ``BEGIN`` and meets the
same timeout: what can fail, and how, is unchanged.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db.backends.sqlite3 import base

_writers: dict[str, threading.Lock] = {}
_writers_guard = threading.Lock()


def _writer_lock(name: str) -> threading.Lock:
    with _writers_guard:
        return _writers.setdefault(name, threading.Lock())


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False

    def _start_transaction_under_autocommit(self) -> None:
        if not self._holds_writer:
            timeout = float(self.settings_dict.get("OPTIONS", {}).get("timeout", 5))
            lock = _writer_lock(str(self.settings_dict["NAME"]))
            self._holds_writer = lock.acquire(timeout=timeout)
            self._writer = lock
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # unstubbed private hook
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        if self._holds_writer:
            self._holds_writer = False
            self._writer.release()

    def _commit(self) -> Any:
        try:
            return super()._commit()  # type: ignore[misc]  # unstubbed private hook
        finally:
            self._release_writer()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()  # type: ignore[misc]  # unstubbed private hook
        finally:
            self._release_writer()

    def _close(self) -> Any:
        try:
            return super()._close()  # type: ignore[misc]  # unstubbed private hook
        finally:
            self._release_writer()
