"""The SQLite backend queues this process's writers on one lock per database file (issue 15).

SQLite's own busy handler retries a blocked ``BEGIN IMMEDIATE`` after growing sleeps (up to
100 ms), which put p99 at 1.5 s for 30 ms runs at 8 clients. The lock must never outlive the
transaction that took it: a leaked one would stop every other writer of the process.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction

from apps.audit.models import AuditChainHead
from apps.core.backends.sqlite3.base import _writer_lock
from tests.runtime import MODE

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(MODE != "embedded", reason="the embedded mode's SQLite backend"),
]


def _lock() -> threading.Lock:
    return _writer_lock(str(connection.settings_dict["NAME"]))


def _in_thread(fn: Any) -> Any:
    """``fn()`` on a thread of its own (its own connection), closed after; returns its result."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_the_lock_is_held_for_the_transaction_and_released_at_commit() -> None:
    def write() -> bool:
        with transaction.atomic():
            AuditChainHead.objects.get_or_create(pk=1)
            return _lock().locked()

    assert _in_thread(write) is True
    assert not _lock().locked()


def test_a_rolled_back_transaction_releases_it() -> None:
    def fail() -> None:
        with transaction.atomic():
            AuditChainHead.objects.get_or_create(pk=1)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _in_thread(fail)
    assert not _lock().locked()


def test_a_connection_closed_inside_a_transaction_releases_it() -> None:
    def close_midway() -> bool:
        with transaction.atomic():
            AuditChainHead.objects.get_or_create(pk=1)
            held = _lock().locked()
            connection.close()  # e.g. a worker thread giving up its connection after an error
        return held

    assert _in_thread(close_midway) is True
    assert not _lock().locked()


def test_a_second_writer_waits_on_the_lock_and_goes_when_the_first_commits() -> None:
    first_in, release, second_in = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with transaction.atomic():
            AuditChainHead.objects.get_or_create(pk=1)
            first_in.set()
            assert release.wait(30)
            order.append("first commits")

    def second() -> None:
        assert first_in.wait(30)
        with transaction.atomic():
            order.append("second begins")
            second_in.set()
            AuditChainHead.objects.filter(pk=1).update(seq=0)

    threads = [threading.Thread(target=lambda f=f: _run_closing(f)) for f in (first, second)]
    for thread in threads:
        thread.start()
    assert first_in.wait(30)
    assert not second_in.wait(0.3)  # the second writer is queued, not in a transaction
    release.set()
    for thread in threads:
        thread.join(60)
    assert order == ["first commits", "second begins"]
    assert not _lock().locked()


def _run_closing(fn: Any) -> None:
    try:
        fn()
    finally:
        connection.close()
