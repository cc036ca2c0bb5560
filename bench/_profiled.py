"""Run a module (``python bench/_profiled.py OUT -m daphne …``) with cProfile in every thread.

cProfile alone sees only the main thread; a gateway's work is on its event loop thread and the
engine's threads. Each thread gets its own profile, timed by that thread's CPU clock (waiting on
a socket or a lock costs nothing: what is listed is what the process spends); SIGUSR1 merges them into ``OUT`` (pstats)
(the profiles stop there: ``bench/gateway.py --profile`` sends it just before stopping the server).
"""

from __future__ import annotations

import cProfile
import pstats
import runpy
import signal
import sys
import threading
import time
from typing import Any

OUT = sys.argv[1]
_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()
_run = threading.Thread.run


def _profiled_run(self: threading.Thread) -> None:
    profile = cProfile.Profile(time.thread_time)
    with _lock:
        _profiles.append(profile)
    profile.enable()
    try:
        _run(self)
    finally:
        profile.disable()


def _dump(*_: Any) -> None:
    with _lock:
        profiles = list(_profiles)
    stats: pstats.Stats | None = None
    for profile in profiles:
        profile.create_stats()  # disables it: this is the end of the measurement
        if not getattr(profile, "stats", None):
            continue
        if stats is None:
            stats = pstats.Stats(profile)
        else:
            stats.add(profile)
    if stats is not None:
        stats.dump_stats(OUT)


threading.Thread.run = _profiled_run  # type: ignore[method-assign]
main = cProfile.Profile(time.thread_time)
_profiles.append(main)
signal.signal(signal.SIGUSR1, _dump)
if sys.argv[2] != "-m":
    sys.exit("usage: _profiled.py OUT -m module [args]")
sys.argv = [sys.argv[3], *sys.argv[4:]]
main.enable()
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
