"""Dispatch of run execution: Celery in distributed mode, a thread pool in the embedded mode."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

_executor: ThreadPoolExecutor | None = None


def thread_executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=settings.RUN_THREAD_WORKERS, thread_name_prefix="run")
    return _executor


def thread_executor_alive() -> bool:
    return not getattr(thread_executor(), "_shutdown", False)
