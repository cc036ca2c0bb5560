"""Issue #14 (websocket handshake): 100 real websocket clients over 5 live runs on a live daphne
all connect and each receives every event of its run exactly once, in order.

The runs' first workers wait at a gate until every client has its snapshot, so all 100 handshakes
(session + user lookup, permission check, snapshot) happen while the runs are about to stream.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client
from websockets.asyncio.client import connect

from apps.runs.models import Run, RunEvent
from tests.factories.api import make_api_key
from tests.fixtures.api import PLAN_TEXT

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

RUNS = 5
CLIENTS_PER_RUN = 20
TIMEOUT = 120


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _start_runs(server: Any, key: str) -> list[str]:
    ids = []
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        for i in range(RUNS):
            response = http.post(
                "/api/runs/", json={"question": f"question {i}"}, headers={"Authorization": f"Bearer {key}"}
            )
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
    return ids


async def _watch(url: str, headers: dict[str, str], ready: asyncio.Event, out: list[Any]) -> None:
    async with connect(url, additional_headers=headers, open_timeout=TIMEOUT, max_queue=None) as ws:
        out.append(json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)))
        ready.set()
        while True:
            message = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            out.append(message)
            if message.get("type") == "run.finished":
                return


async def _all_watch(server: Any, cookie: str, run_ids: list[str], gate: threading.Event) -> list[list[Any]]:
    headers = {"Cookie": cookie, "Origin": server.url}
    results: list[list[Any]] = [[] for _ in range(RUNS * CLIENTS_PER_RUN)]
    readies = [asyncio.Event() for _ in results]
    tasks = [
        asyncio.create_task(
            _watch(f"{server.ws_url}/ws/runs/{run_ids[i % RUNS]}/", headers, readies[i], results[i])
        )
        for i in range(len(results))
    ]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), TIMEOUT)
    gate.set()  # every client has its snapshot: let the runs stream
    await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)
    return results


def test_a_hundred_websocket_clients_over_five_runs_get_every_event(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, gate: threading.Event, alpha: Any, owner: Any
) -> None:
    def respond(request: dict[str, Any]) -> str:
        if request.get("model") == "fake-conductor-1":
            return PLAN_TEXT
        gate.wait(TIMEOUT)
        return "one two three four five six seven eight nine ten"  # streamed word by word

    fake_pool.server.responder = respond
    key = make_api_key(alpha, name="load key", principal=owner).plaintext
    run_ids = _start_runs(daphne_server, key)
    client = Client()
    client.force_login(owner)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"

    results = asyncio.run(_all_watch(daphne_server, cookie, run_ids, gate))

    expected = {
        run_id: list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
        for run_id in run_ids
    }
    assert all(Run.objects.get(pk=r).status == "succeeded" for r in run_ids)
    assert all(any(RunEvent.objects.filter(run_id=r, type="step.delta")) for r in run_ids)
    for i, messages in enumerate(results):
        run_id = run_ids[i % RUNS]
        snapshot, events = messages[0], messages[1:]
        assert snapshot["type"] == "snapshot" and snapshot["run"]["id"] == run_id
        seqs = [e["seq"] for e in events]
        # Every event after the snapshot, once, in order (the snapshot covers the rest).
        assert seqs == [s for s in expected[run_id] if s > snapshot["last_seq"]], (i, run_id)
