"""The engine's kept provider-call threads (issue #15): reused, never a queue behind an abandoned
call, a fresh context per call, and the cleanup hook run after each call."""

from __future__ import annotations

import contextvars
import os
import threading

import pytest

from apps.engine import threads
from apps.engine.events import RunStatus
from apps.engine.types import Limits

from .test_executor import run, steps
from .workers import FnWorker

WAIT_S = 10.0  # a safety net for a broken pool, not a pace

_mark: contextvars.ContextVar[str] = contextvars.ContextVar("_mark", default="unset")


def _call(fn) -> tuple[threading.Event, list[object]]:
    done = threading.Event()
    seen: list[object] = []

    def target() -> None:
        seen.append(fn())
        done.set()

    threads.spawn(target, name="test-call")
    return done, seen


def _settle() -> None:
    """Wait until the thread of the last call parked (spawn hands work to parked threads only)."""
    for _ in range(1000):
        with threads._lock:
            if threads._parked:
                return
        threading.Event().wait(0.005)


def test_sequential_calls_reuse_one_thread() -> None:
    first, seen = _call(threading.get_ident)
    assert first.wait(WAIT_S)
    _settle()
    before = threads.started()
    idents = []
    for _ in range(20):
        done, got = _call(threading.get_ident)
        assert done.wait(WAIT_S)
        idents.append(got[0])
        _settle()
    assert threads.started() == before, "a warm call must not start a thread"
    assert len(set(idents)) == 1 and idents[0] == seen[0]


def test_a_call_never_waits_behind_a_blocked_one() -> None:
    release = threading.Event()
    blocked, _ = _call(lambda: release.wait(WAIT_S))
    try:
        quick, got = _call(lambda: "answered")
        assert quick.wait(WAIT_S), "a second call waited for the first's thread"
        assert got == ["answered"]
        assert not blocked.is_set()
    finally:
        release.set()
    assert blocked.wait(WAIT_S)


def test_each_call_runs_in_its_callers_context_and_gets_its_own_name() -> None:
    def dirty() -> str:
        _mark.set("left by an earlier call")
        return _mark.get()

    done, got = _call(dirty)
    assert done.wait(WAIT_S) and got == ["left by an earlier call"]
    _settle()
    done, got = _call(lambda: (_mark.get(), threading.current_thread().name))
    assert done.wait(WAIT_S)
    assert got == [("unset", "test-call")]  # nothing an earlier call set on the thread
    # What the caller set (a run's request id) goes with the call, on a kept thread too (issue 44).
    _settle()
    token = _mark.set("the caller's")
    try:
        done, got = _call(lambda: _mark.get())
    finally:
        _mark.reset(token)
    assert done.wait(WAIT_S) and got == ["the caller's"]


def test_cleanup_runs_on_the_calls_thread_after_each_call() -> None:
    cleaned: list[int] = []
    threads.set_task_cleanup(lambda: cleaned.append(threading.get_ident()))
    try:
        done, got = _call(threading.get_ident)
        assert done.wait(WAIT_S)
        for _ in range(1000):
            if cleaned:
                break
            threading.Event().wait(0.005)
        assert cleaned == got
    finally:
        threads.set_task_cleanup(None)


def test_a_raising_call_keeps_the_thread_for_the_next() -> None:
    def boom() -> None:
        raise RuntimeError("provider internals")

    threads.spawn(boom, name="test-call")
    _settle()
    before = threads.started()
    done, got = _call(lambda: "still serving")
    assert done.wait(WAIT_S) and got == ["still serving"]
    assert threads.started() == before


def test_runs_start_no_thread_once_warm() -> None:
    """Through the executor: a one-step run's provider call goes to a kept thread."""
    ws = [FnWorker("w", "A")]
    run(steps((0, "x", [])), ws)
    _settle()
    before = threads.started()
    for _ in range(5):
        result, _ = run(steps((0, "x", [])), ws)
        assert result.status == RunStatus.SUCCEEDED and result.answer == "A"
        _settle()
    assert threads.started() == before


def test_an_abandoned_step_does_not_hold_up_the_next_run() -> None:
    slow = FnWorker("slow", "late", held=True)
    result, _ = run(steps((0, "x", [])), [slow], limits=Limits(step_timeout_s=0.1))
    assert result.reason == "step_timed_out"
    try:
        quick, _ = run(steps((0, "x", [])), [FnWorker("q", "quick")])
        assert quick.status == RunStatus.SUCCEEDED and quick.answer == "quick"
    finally:
        slow.release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
def test_a_forked_child_starts_its_own_thread() -> None:
    done, _ = _call(lambda: None)
    assert done.wait(WAIT_S)
    _settle()
    assert threads._parked, "the parent has a parked thread to forget"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's parked thread does not exist here
        ok = False
        try:
            child_done, got = _call(lambda: "child")
            ok = child_done.wait(WAIT_S) and got == ["child"]
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1", "the forked child handed its call to a thread it does not have"
