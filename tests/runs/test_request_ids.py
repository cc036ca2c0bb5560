"""A run's log lines name its own request on the process that executes it (issue 44)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.test_run_survival import Procs, poll_until
from tests.runtime import MODE

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def own_procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path, queue=f"reqid-{tmp_path.name[-8:]}")
    try:
        yield p
    finally:
        p.stop_all()


@pytest.mark.skipif(MODE != "distributed", reason="Celery workers run only in the distributed mode")
def test_a_celery_workers_lines_of_a_run_name_the_runs_request(
    own_procs: Procs, run_pool: Any, api_key: Any
) -> None:
    server = own_procs.daphne(V1_INLINE_RUNS="off")  # the run goes to the worker
    own_procs.worker()
    ids = []
    for question in ("First request.", "Second request."):
        reply = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": question}]},
            headers={"Authorization": f"Bearer {api_key[1]}"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        ids.append((reply.headers["x-request-id"], reply.headers["X-Conductor-Run"]))

    def worker_log() -> str:
        return "".join(p.read_text(errors="replace") for p in own_procs.tmp.glob("celery-*.log"))

    for request_id, run_id in ids:
        # The message header brought the id: the claim (before the run is read) names it.
        pattern = rf"\[{re.escape(request_id)}\] run {run_id} claimed by"
        poll_until(lambda p=pattern: re.search(p, worker_log()), 10, f"claim line of {run_id}")
    first_id, second_run = ids[0][0], ids[1][1]
    lines = [line for line in worker_log().splitlines() if second_run in line]
    assert lines and not any(first_id in line for line in lines), lines
