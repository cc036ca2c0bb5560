"""WorkerPool: the workers a run may use, the default worker and the conductor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from apps.engine.health import HealthPort, unavailable
from apps.engine.providers.base import Worker
from apps.engine.types import WorkerInfo


@dataclass(slots=True)
class WorkerPool:
    """Workers are addressed by position (the id the conductor writes) and by `info.key`.

    `default_index` is the worker used for single-step and fallback plans. `conductor` is the
    model that plans (ConductorStrategy needs it; other strategies ignore it)."""

    workers: list[Worker]
    default_index: int = 0
    conductor: Worker | None = None
    # Per-worker circuit breakers shared across processes (apps.engine.health); None: no breaker.
    health: HealthPort | None = None
    _by_key: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.workers = list(self.workers)
        if not self.workers:
            raise ValueError("a worker pool needs at least one worker")
        if not 0 <= self.default_index < len(self.workers):
            raise ValueError(
                f"default_index {self.default_index} is outside the pool (size {len(self.workers)})"
            )
        for i, w in enumerate(self.workers):
            if w.info.key in self._by_key:
                raise ValueError(f"duplicate worker key {w.info.key!r} in pool")
            self._by_key[w.info.key] = i

    def __len__(self) -> int:
        return len(self.workers)

    @property
    def infos(self) -> list[WorkerInfo]:
        return [w.info for w in self.workers]

    @property
    def keys(self) -> list[str]:
        return [w.info.key for w in self.workers]

    @property
    def default(self) -> Worker:
        return self.workers[self.default_index]

    def index_of(self, key: str) -> int | None:
        return self._by_key.get(key)

    def get(self, key: str) -> Worker | None:
        i = self._by_key.get(key)
        return None if i is None else self.workers[i]

    def allowed_indices(self, allowed_keys: Sequence[str] | None) -> list[int]:
        if allowed_keys is None:
            return list(range(len(self.workers)))
        allowed = set(allowed_keys)
        return [i for i, w in enumerate(self.workers) if w.info.key in allowed]

    def down_indices(self, indices: Sequence[int]) -> set[int]:
        """The indices among ``indices`` whose worker's breaker is open (not due a probe)."""
        down = unavailable(self.health, [self.workers[i].info.key for i in indices])
        return {i for i in indices if self.workers[i].info.key in down}
