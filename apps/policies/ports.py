"""What the policies app needs from apps above it, as ports filled at app ready.

Budgets and the plan forecast read run history, and the editor's forecast reads a pool's workers;
runs sit above policies and workers beside them, so neither is imported here: `apps.runs`
registers both ports in `RunsConfig.ready()` (runs may import policies and workers alike).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from apps.engine.types import WorkerInfo


@dataclass(frozen=True, slots=True)
class RunHistoryPort:
    # Priced spend of a team's runs created in [start, end).
    team_spend: Callable[[Any, datetime, datetime], Decimal]
    # The classification a stored run was created with ("" when unknown).
    run_classification: Callable[[str], str]
    # Output tokens of a worker's last succeeded steps, newest first, at most `limit`.
    recent_output_tokens: Callable[[str, int], Sequence[int]]


@dataclass(frozen=True, slots=True)
class WorkersPort:
    # The engine's view of one worker row (no client built, no model called).
    worker_info: Callable[[Any], WorkerInfo]


_run_history: RunHistoryPort | None = None
_workers: WorkersPort | None = None


def register_run_history(port: RunHistoryPort) -> None:
    global _run_history
    _run_history = port


def register_workers(port: WorkersPort) -> None:
    global _workers
    _workers = port


def run_history() -> RunHistoryPort:
    if _run_history is None:  # a setup bug (apps.runs not installed), never user input
        raise RuntimeError("the run history port is not registered (apps.runs is not ready)")
    return _run_history


def workers() -> WorkersPort:
    if _workers is None:
        raise RuntimeError("the workers port is not registered (apps.runs is not ready)")
    return _workers
