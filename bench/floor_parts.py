"""The two parts of a distributed run that no code of this project runs: a bare ASGI answer from
daphne and a no-op Celery task. Imported by ``bench/floor.py`` (in daphne and in the worker)."""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

ANSWER = json.dumps(
    {
        "id": "chatcmpl-floor",
        "object": "chat.completion",
        "created": 0,
        "model": "floor",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the request body and answers a fixed chat completion: daphne's own cost per request."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(ANSWER)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": ANSWER})


# The project's Celery settings for runs (conductor_web.settings.base): JSON, late acks, one
# message prefetched per thread, results ignored.
celery_app = Celery(
    "floor", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
)
celery_app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_default_queue=os.environ.get("FLOOR_QUEUE", "conductor_floor_bench"),
    worker_hijack_root_logger=False,
)


@celery_app.task(name="floor.noop")
def noop(run_id: str) -> None:
    """A run's task with nothing to do."""
