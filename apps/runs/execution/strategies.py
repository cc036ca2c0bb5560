"""Which strategy a run executes (conductor, single, learned, a pass-through, a replay of one
step with its exact messages) and whether its model calls stream."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.engine.pool import WorkerPool
from apps.engine.strategies import build_strategy
from apps.learning.services import learned_strategy
from apps.runs import integration
from apps.runs.api_request import passthrough_strategy
from apps.runs.models import Run


def streams_upstream(run: Run) -> bool:
    """Whether the run's model calls stream (and its steps emit step.delta): not for a plain
    /v1 request under ``V1_UPSTREAM_STREAM=client``, whose client waits for the whole answer
    anyway; parsing a provider's stream chunk by chunk cost more than the call (issue #15)."""
    record = run.api_request if isinstance(run.api_request, dict) else {}
    return settings.V1_UPSTREAM_STREAM == "always" or record.get("stream") is not False


def _replay_question(run: Run) -> str:
    users = [m["content"] for m in run.replay_messages or [] if m.get("role") == "user"]
    return users[-1] if users else "(replay)"


def build_run_strategy(run: Run, engine_pool: WorkerPool) -> Any:
    if run.replay_messages:
        return _replay_strategy(run, engine_pool)
    if (passthrough := passthrough_strategy(run, engine_pool)) is not None:
        return passthrough
    if run.strategy == "conductor":
        return build_strategy("conductor", preset=run.preset or "mini")
    if run.strategy == "single":
        return build_strategy("single", worker=run.worker.slug if run.worker else None)
    if run.strategy == "learned":  # the team's router picks the arm (apps.learning, below runs)
        return learned_strategy(
            run_id=run.id,
            team_id=run.team_id,
            question=run.question,
            pool=engine_pool,
            effective=integration.policy_in_force(run.team, getattr(run, "access_stamp", None)).effective,
            classification=run.classification,
        )
    return build_strategy(run.strategy)


class _ReplayWorker:
    """Sends the stored messages verbatim instead of the context the executor builds."""

    def __init__(self, inner: Any, messages: list[dict[str, str]]) -> None:
        self.inner = inner
        self.info = inner.info
        self._messages = messages

    def complete(self, messages: Any, **kwargs: Any) -> Any:
        exact = [{"role": m["role"], "content": m["content"]} for m in self._messages]
        return self.inner.complete(exact, **kwargs)


def _replay_strategy(run: Run, engine_pool: WorkerPool) -> Any:
    key = run.worker.slug if run.worker else engine_pool.workers[engine_pool.default_index].info.key
    index = engine_pool.index_of(key)
    if index is None:
        raise ValueError(f"The worker {key!r} is not in the pool any more.")
    engine_pool.workers[index] = _ReplayWorker(engine_pool.workers[index], list(run.replay_messages or []))
    return build_strategy("single", worker=key, instruction="Replay of one step with its exact messages.")
