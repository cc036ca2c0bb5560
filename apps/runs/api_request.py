"""What a run started from ``/v1`` must honour (issue 22), read from ``Run.api_request``.

``apps.api.v1.bridge`` stores the request's generation options (and, for a pool model with tools,
the chat to pass through) on the run; execution reads them back here on either runtime, so a
Celery worker honours exactly what the web process accepted.
"""

from __future__ import annotations

from typing import Any

from apps.engine.generation import GenerationOptions
from apps.engine.strategies import build_strategy
from apps.runs.models import Run


def generation_for(run: Run) -> GenerationOptions | None:
    """The generation options for the worker that writes the run's answer (None: none asked)."""
    record = run.api_request if isinstance(run.api_request, dict) else {}
    options = GenerationOptions.from_dict(record.get("options"))
    return None if options.is_default else options


def passthrough_strategy(run: Run, engine_pool: Any) -> Any | None:
    """A pool model's tool conversation: one step on the pool's default worker, which receives
    the client's chat as it is (tool calls and results included). None for every other run."""
    record = run.api_request if isinstance(run.api_request, dict) else {}
    conversation = record.get("conversation")
    if not isinstance(conversation, list) or not conversation:
        return None
    key = engine_pool.workers[engine_pool.default_index].info.key
    return build_strategy(
        "single", worker=key, instruction="Answer the conversation.", conversation=conversation
    )
